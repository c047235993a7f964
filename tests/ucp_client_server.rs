//! Runs the `ucp_client_server` example: a server and a client process over tcp on loopback
//! for each `-c` mode, with small messages and with messages above the rendezvous threshold;
//! the progress lines; one client after another; a second concurrent client rejected; a peer
//! killed mid-transfer reported on the other side; mismatched sizes and bad command lines.
//! (`scripts/netns-client-server.sh` runs it between two network namespaces and cuts the link.)
//!
//! `cargo test -p rucx` builds the examples first; with a target filter build it yourself:
//! `cargo build -p rucx --example ucp_client_server`.
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// The command-line parser's unit tests.
#[allow(dead_code)]
#[path = "../examples/ucp_client_server/args.rs"]
mod args;

fn example() -> PathBuf {
    rucx_testkit::child::example("ucp_client_server")
}

/// Loopback only; a rendezvous threshold the large messages cross (tcp on loopback alone
/// sets it at several MiB).
const LO: [(&str, &str); 3] = [
    ("RUCX_TLS", "tcp"),
    ("RUCX_NET_DEVICES", "lo"),
    ("RUCX_RNDV_THRESH", "65536"),
];
/// A failure guard, not a timing assertion.
const DEADLINE: Duration = Duration::from_secs(120);

/// A running example whose stdout and stderr are collected by threads (a long run never
/// blocks on a full pipe); killed on drop.
struct Proc {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

struct Done {
    code: Option<i32>,
    out: String,
    err: String,
}

impl std::fmt::Display for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.out, self.err
        )
    }
}

fn drain(from: impl Read + Send + 'static, into: &Arc<Mutex<String>>) -> std::thread::JoinHandle<()> {
    let into = into.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            let mut s = into.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    })
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut c = Command::new(example());
        c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, v) in LO {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("start ucp_client_server");
        let (out, err) = (Arc::default(), Arc::default());
        let readers = vec![
            drain(child.stdout.take().unwrap(), &out),
            drain(child.stderr.take().unwrap(), &err),
        ];
        Proc {
            child: Some(child),
            out,
            err,
            readers,
        }
    }

    /// Waits until stdout has `n` lines containing `pat` (panics after the deadline or when
    /// the process ended without them).
    fn wait_lines(&mut self, pat: &str, n: usize) {
        let start = Instant::now();
        loop {
            if self
                .out
                .lock()
                .unwrap()
                .lines()
                .filter(|l| l.contains(pat))
                .count()
                >= n
            {
                return;
            }
            let ended = self.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if ended || start.elapsed() > DEADLINE {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "no {n} lines with {pat:?}:\n{}\n{}",
                    self.out.lock().unwrap(),
                    self.err.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.as_mut().unwrap().kill();
    }

    /// Waits for the exit (killing it after the deadline) and collects the output.
    fn finish(mut self) -> Done {
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() && start.elapsed() < DEADLINE {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let take = |s: &Arc<Mutex<String>>| std::mem::take(&mut *s.lock().unwrap());
        Done {
            code: status.code(),
            out: take(&self.out),
            err: take(&self.err),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A server on a free port (`-p 0`) with `flags`; returns it and its port.
fn server(flags: &[&str]) -> (Proc, String) {
    let mut args = vec!["-l", "127.0.0.1", "-p", "0"];
    args.extend_from_slice(flags);
    let mut s = Proc::spawn(&args);
    s.wait_lines("waiting for a connection", 1);
    let out = s.out.lock().unwrap().clone();
    let port = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no port in {out:?}"))
        .to_owned();
    (s, port)
}

fn client(port: &str, flags: &[&str]) -> Proc {
    let mut args = vec!["-a", "127.0.0.1", "-p", port];
    args.extend_from_slice(flags);
    Proc::spawn(&args)
}

/// `iters` messages of `size` bytes with `-c api`; checks both sides' reports.
fn transfer(api: &str, iters: u64, size: usize) -> (Done, Done) {
    let (i, s) = (iters.to_string(), size.to_string());
    let flags = ["-c", api, "-i", &i, "-s", &s];
    let (srv, port) = server(&[&flags[..], &["--once"]].concat());
    let c = client(&port, &flags).finish();
    let srv = srv.finish();
    assert_eq!(c.code, Some(0), "client: {c}");
    assert_eq!(srv.code, Some(0), "server: {srv}");
    assert!(
        srv.out
            .contains(&format!("received {iters} messages of {size} bytes: all intact")),
        "{srv}"
    );
    assert!(
        srv.out
            .contains(&format!("iteration 1/{iters}: received {size} bytes by {api}")),
        "{srv}"
    );
    assert!(srv.out.contains(&format!("iteration {iters}/{iters}:")), "{srv}");
    assert!(srv.out.contains("closed the connection"), "{srv}");
    assert!(c.out.contains("all at the server"), "{c}");
    assert!(c.out.contains("the server closed the connection"), "{c}");
    (c, srv)
}

/// Above the threshold tag and am go by rendezvous (the client says; the AM server sees it);
/// streams have no rendezvous.
fn large(api: &str) {
    let (c, srv) = transfer(api, 5, 1_000_000);
    match api {
        "stream" => assert!(c.out.contains("by stream (eager)"), "{c}"),
        _ => assert!(c.out.contains("(rendezvous)"), "{c}"),
    }
    if api == "am" {
        assert!(srv.out.contains("by am (rendezvous)"), "{srv}");
    }
}

#[test]
fn stream_small() {
    transfer("stream", 100, 16);
}

#[test]
fn stream_large() {
    large("stream");
}

#[test]
fn tag_small() {
    let (c, _) = transfer("tag", 100, 16);
    assert!(c.out.contains("(eager short)"), "{c}");
}

#[test]
fn tag_large() {
    large("tag");
}

#[test]
fn am_small() {
    transfer("am", 100, 16);
}

#[test]
fn am_large() {
    large("am");
}

#[test]
fn default_mode_is_stream_and_progress_lines_every_2000() {
    let (srv, port) = server(&["-i", "4001", "-s", "8", "--once"]);
    let c = client(&port, &["-i", "4001", "-s", "8"]).finish();
    let srv = srv.finish();
    assert_eq!(c.code, Some(0), "{c}");
    assert_eq!(srv.code, Some(0), "{srv}");
    let lines: Vec<&str> = srv.out.lines().filter(|l| l.starts_with("iteration ")).collect();
    let want = [
        "iteration 1/4001:",
        "iteration 2000/4001:",
        "iteration 4000/4001:",
        "iteration 4001/4001:",
    ];
    assert_eq!(lines.len(), want.len(), "{srv}");
    for (l, w) in lines.iter().zip(want) {
        assert!(
            l.starts_with(w) && l.contains("by stream") && l.ends_with("(intact)"),
            "{l}"
        );
    }
}

#[test]
fn serves_one_client_after_another() {
    let (mut srv, port) = server(&["-c", "tag", "-i", "50"]);
    for n in 1..=2 {
        let c = client(&port, &["-c", "tag", "-i", "50"]).finish();
        assert_eq!(c.code, Some(0), "client {n}: {c}");
        srv.wait_lines("closed the connection", n);
    }
    srv.wait_lines("waiting for a connection", 3);
    srv.kill();
    let srv = srv.finish();
    assert_eq!(srv.out.matches("all intact").count(), 2, "{srv}");
}

/// Without `--once` a client that fails (a wrong message) or falls silent (it sent one of 50
/// messages and waits) is dropped with a line on stderr, and the next client is served.
#[test]
fn failed_and_silent_clients_are_dropped_and_the_next_served() {
    let (mut srv, port) = server(&["-c", "tag", "-i", "50", "-s", "16", "--idle", "1"]);
    // (Their own exit status says only how the connection ended for them.)
    let _wrong = client(&port, &["-c", "tag", "-i", "50", "-s", "32"]).finish();
    let _silent = client(&port, &["-c", "tag", "-i", "1", "-s", "16"]).finish();
    let good = client(&port, &["-c", "tag", "-i", "50", "-s", "16"]).finish();
    assert_eq!(good.code, Some(0), "{good}");
    srv.wait_lines("all intact", 1);
    srv.kill();
    let srv = srv.finish();
    assert_eq!(srv.err.matches(": dropped").count(), 2, "{srv}");
    assert!(srv.err.contains("UCS_ERR_MESSAGE_TRUNCATED"), "{srv}");
    assert!(
        srv.err.contains("nothing from the peer for 1 s (--idle)"),
        "{srv}"
    );
}

/// A second client while the first is served is rejected; the first one killed, the server
/// reports its failure.
#[test]
fn second_client_rejected_and_killed_client_reported() {
    let (srv, port) = server(&["-c", "am", "-i", "1000000000", "--once"]);
    let mut first = client(&port, &["-c", "am", "-i", "1000000000"]);
    first.wait_lines("iteration 1/", 1);
    let second = client(&port, &["-c", "am", "-i", "1000000000"]).finish();
    assert_eq!(second.code, Some(1), "{second}");
    assert!(second.err.contains("UCS_ERR_REJECTED"), "{second}");
    first.kill();
    let _ = first.finish();
    let srv = srv.finish();
    assert!(srv.out.contains("rejecting the client at 127.0.0.1:"), "{srv}");
    assert_eq!(srv.code, Some(1), "{srv}");
    assert!(
        srv.err
            .contains("ucp_client_server: server: the client at 127.0.0.1:")
            && srv.err.contains("UCS_ERR_"),
        "{srv}"
    );
}

#[test]
fn killed_server_reported_by_the_client() {
    for api in ["stream", "tag"] {
        let (mut srv, port) = server(&["-c", api, "-i", "1000000000", "-s", "1000", "--once"]);
        let c = client(&port, &["-c", api, "-i", "1000000000", "-s", "1000"]);
        srv.wait_lines("iteration 2000/", 1);
        srv.kill();
        let c = c.finish();
        assert_eq!(c.code, Some(1), "{c}");
        assert!(
            c.err.contains("ucp_client_server: client: iteration") && c.err.contains("UCS_ERR_"),
            "{c}"
        );
    }
}

/// The server checks every message (the client learns of it only as the connection's end).
#[test]
fn mismatched_sizes_are_an_error() {
    for (api, want) in [("tag", "UCS_ERR_MESSAGE_TRUNCATED"), ("am", "expected 16 bytes")] {
        let (srv, port) = server(&["-c", api, "-s", "16", "-i", "10", "--once"]);
        let _ = client(&port, &["-c", api, "-s", "32", "-i", "10"]).finish();
        let srv = srv.finish();
        assert_eq!(srv.code, Some(1), "{srv}");
        assert!(srv.err.contains(want), "{srv}");
    }
}

#[test]
fn bad_command_line() {
    for a in [
        &["-c", "rma"][..],
        &["-a", "127.0.0.1", "-p", "0"],
        &["-s", "0"],
        &["-x"],
    ] {
        let d = Proc::spawn(a).finish();
        assert_eq!(d.code, Some(2), "{a:?}: {d}");
        assert!(d.err.contains("Usage:"), "{a:?}: {d}");
    }
}

#[test]
fn no_server_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let c = client(&port, &[]).finish();
    assert_eq!(c.code, Some(1), "{c}");
    assert!(c.err.contains(&format!("connect to 127.0.0.1:{port}")), "{c}");
}
