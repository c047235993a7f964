//! This test binary run again as a child process, running one (ignored) test of its own, with
//! its output read line by line while the parent keeps progressing.

use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use crate::wait::Progress;

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this test binary again as a child process running only the (ignored) test `test`,
/// with `env` added; stdin and stdout are pipes (the child notices our exit through its
/// stdin), and its stderr is drained into ours by a thread (rucx logs there without setup: an
/// unread pipe would fill and block the child).
pub fn spawn_self(test: &str, env: &[(&str, &str)]) -> ChildGuard {
    let exe = std::env::current_exe().expect("path of the test executable");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start a child copy of the test binary");
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(|l| l.ok()) {
                eprintln!("[child] {line}");
            }
        });
    }
    ChildGuard(child)
}

/// Collects a child's stdout lines in the background; [`Lines::wait`] lets a test wait for one.
pub struct Lines {
    rx: Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(out: impl std::io::Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// The rest of the first line (seen or arriving within `limit`) that contains `prefix`
    /// (the test harness of a child may print its own text in front), progressing `p`
    /// meanwhile (a peer may be waiting for it).
    pub fn wait(&mut self, prefix: &str, limit: Duration, p: &(impl Progress + ?Sized)) -> Option<String> {
        let start = Instant::now();
        let mut closed = false;
        loop {
            if let Some(l) = self
                .seen
                .iter()
                .find_map(|l| l.find(prefix).map(|i| &l[i + prefix.len()..]))
            {
                return Some(l.trim().to_string());
            }
            if closed || start.elapsed() > limit {
                return None;
            }
            match self.rx.try_recv() {
                Ok(l) => self.seen.push(l),
                Err(TryRecvError::Empty) => {
                    if p.progress() == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                // The child closed stdout: only what was seen counts.
                Err(TryRecvError::Disconnected) => closed = true,
            }
        }
    }
}

/// The built binary of example `name` (`target/<profile>/examples/`); fails the test, saying
/// how to build it, when it is missing (`cargo test -p rucx` builds the examples first).
pub fn example(name: &str) -> std::path::PathBuf {
    let p = crate::modules::target_dir()
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        p.exists(),
        "{} is not built: `cargo build -p rucx --example {name}` (add `--features tokio` for ucp_async)",
        p.display()
    );
    p
}

/// Waits for `child` and collects its output, killing it after `limit` (a safety net: the
/// programs tested have deadlines of their own).
pub fn wait_output(mut child: Child, limit: Duration) -> std::process::Output {
    let start = Instant::now();
    while child.try_wait().expect("wait for a child process").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect a child's output")
}
