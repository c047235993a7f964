//! `rucx-perftest` server and client as two processes on 127.0.0.1: one is killed with
//! SIGKILL and the other must exit with an error (status 255 and a message saying why), never
//! wait for ever. UCT and UCP tests, latency and bandwidth loops, over tcp and posix, killing
//! the server and killing the client, most runs in the measured loop and some while the two
//! are still setting up or warming up.
//!
//! The bound on the survivor's exit is generous ([`EXIT_BOUND`]: a loaded 2-core host starts
//! a debug build slowly); the observed times are printed, not asserted (`--nocapture`).

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest the survivor may take to exit after its peer's SIGKILL.
const EXIT_BOUND: Duration = Duration::from_secs(10);
/// How long the two may take to reach the point where one is killed.
const START_BOUND: Duration = Duration::from_secs(120);

/// A child process whose stdout and stderr are collected as they come.
struct Proc {
    child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

fn collect(mut r: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(n) = r.read(&mut b) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().push_str(&String::from_utf8_lossy(&b[..n]));
        }
    })
}

impl Proc {
    fn spawn(args: &[String], env: &[(&str, &str)]) -> Proc {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rucx-perftest"));
        c.args(args)
            .env("RUCX_LOG_LEVEL", "warn")
            .env("RUCX_NET_DEVICES", "lo")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("rucx-perftest starts");
        let (out, err) = (Arc::default(), Arc::default());
        let readers = vec![
            collect(child.stdout.take().unwrap(), Arc::clone(&out)),
            collect(child.stderr.take().unwrap(), Arc::clone(&err)),
        ];
        Proc {
            child,
            out,
            err,
            readers,
        }
    }

    fn stdout_has(&self, s: &str) -> bool {
        self.out.lock().unwrap().contains(s)
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Kills the process if it still runs; returns its output.
    fn finish(mut self) -> (String, String) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let out = self.out.lock().unwrap().clone();
        let err = self.err.lock().unwrap().clone();
        (out, err)
    }
}

/// A port nobody listens on now (the server binds it right after; it listens on all
/// addresses, the client connects over 127.0.0.1).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One run: `test` over `tls` (UCP: `RUCX_TLS`; UCT: `-x`/`-d`), the `victim` side killed
/// once the client reports a measured row (`in_loop`) or as soon as both printed their
/// header. Returns how long the survivor took to exit.
fn one_run(api_args: &str, tls: &str, kill_server: bool, in_loop: bool, delay_ms: u64) -> Duration {
    let what = format!(
        "{api_args} over {tls}, killing the {} {}",
        if kill_server { "server" } else { "client" },
        if in_loop {
            "in the measured loop"
        } else {
            "at the start"
        }
    );
    let port = free_port().to_string();
    let env = [("RUCX_TLS", tls)];
    let mut server = Proc::spawn(&["-p".into(), port.clone()], &env);
    let start = Instant::now();
    while !server.stdout_has("Waiting for connection") {
        if start.elapsed() > START_BOUND || server.exited().is_some() {
            let (so, se) = server.finish();
            panic!("{what}: the server did not listen\n{so}\n{se}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut args: Vec<String> = vec!["127.0.0.1".into(), "-p".into(), port];
    args.extend(api_args.split_whitespace().map(String::from));
    args.extend(["-n", "1000000000"].map(String::from));
    let mut client = Proc::spawn(&args, &env);
    // Both running the test: the server printed the test's header, the client a result row
    // (measured loop) or the table's header.
    let mark = if in_loop { "[thread 0]" } else { "Stage" };
    while !(server.stdout_has("Message size") && client.stdout_has(mark)) {
        if start.elapsed() > START_BOUND || server.exited().is_some() || client.exited().is_some() {
            let (co, ce) = client.finish();
            let (so, se) = server.finish();
            panic!("{what}: the test never got going\nclient:\n{co}\n{ce}\nserver:\n{so}\n{se}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(delay_ms));
    let (mut victim, mut survivor) = if kill_server {
        (server, client)
    } else {
        (client, server)
    };
    victim.child.kill().expect("SIGKILL"); // std's kill is SIGKILL
    let killed = Instant::now();
    let status = loop {
        if let Some(st) = survivor.exited() {
            break Some(st);
        }
        if killed.elapsed() > EXIT_BOUND {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = killed.elapsed();
    let _ = victim.finish();
    let (out, err) = survivor.finish();
    let Some(status) = status else {
        panic!("{what}: the survivor still ran {EXIT_BOUND:?} after its peer's SIGKILL\n{out}\n{err}");
    };
    assert_eq!(
        status.code(),
        Some(255),
        "{what}: the survivor's exit status\n{out}\n{err}"
    );
    assert!(
        err.contains("Failed to run test:"),
        "{what}: the survivor says why it failed\n{out}\n{err}"
    );
    println!("{what}: exited in {took:?}");
    took
}

/// 24 runs in a row: UCT and UCP, latency and bandwidth, tcp and posix, either side killed.
#[test]
fn survivor_exits_with_an_error_after_peer_sigkill() {
    let uct = |tl: &str, test: &str| match tl {
        "tcp" => format!("-t {test} -x tcp -d lo"),
        _ => format!("-t {test} -x posix -d memory"),
    };
    let mut times = Vec::new();
    let mut i = 0u64;
    for round in 0..3 {
        for tl in ["tcp", "posix"] {
            let cases = [
                uct(tl, if round == 1 { "am_bw" } else { "am_lat" }),
                format!("-t {}", ["tag_lat", "tag_bw", "ucp_am_lat"][round]),
            ];
            for api in &cases {
                for kill_server in [true, false] {
                    // One run in three kills during setup or warm-up; the others in the loop,
                    // at varied moments.
                    let in_loop = i % 3 != 2;
                    let delay = (i * 37) % 300;
                    times.push(one_run(api, tl, kill_server, in_loop, delay));
                    i += 1;
                }
            }
        }
    }
    times.sort();
    println!(
        "{} runs: the survivor exited {:?} (median) / {:?} (max) after the SIGKILL",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
