//! Runs the `rpc` example: server and client threads in hot (busy polling) and warm (event fd,
//! `Worker::wait`) mode, and a server and a client process. The example checks every result
//! itself (echo and transform, arguments up to rendezvous sizes) and exits 1 on a wrong one.
//!
//! `cargo test -p rucx` builds the examples first; with a target filter build it yourself:
//! `cargo build -p rucx --example rpc`.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn example() -> PathBuf {
    rucx_testkit::child::example("rpc")
}

/// Sizes from eager short to rendezvous: `RNDV_THRESH` puts the last one above the threshold
/// (which tcp on loopback alone sets at several MiB).
const SIZES: &str = "8,2000,100000,1048576";
const RNDV_THRESH: &str = "262144";

fn spawn(args: &[&str]) -> Child {
    Command::new(example())
        .args(args)
        .env("RUCX_TLS", "tcp")
        .env("RUCX_NET_DEVICES", "lo")
        .env("RUCX_RNDV_THRESH", RNDV_THRESH)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rpc")
}

/// Waits for `child`, killing it after two minutes (a safety net only).
fn finish(child: Child) -> Output {
    rucx_testkit::child::wait_output(child, Duration::from_secs(120))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The client's table: every size, the rendezvous one among them, every reply correct.
fn check_client(out: &Output) {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout:\n{o}\nstderr:\n{e}");
    for size in SIZES.split(',') {
        assert!(
            o.lines().any(|l| l.split_whitespace().next() == Some(size)),
            "no line for {size} bytes:\n{o}"
        );
    }
    assert!(o.contains("rendezvous"), "no rendezvous size:\n{o}");
    assert!(o.contains("p99"), "{o}");
    // 3 sizes x (20 + 2 warm-up) calls, 1 MiB: 2 + 1 (a tenth from 256 KiB up): all checked.
    assert!(o.contains("all 69 replies correct"), "{o}");
}

#[test]
fn local_hot() {
    let out = finish(spawn(&["--local", "-m", "hot", "-i", "20", "-s", SIZES]));
    check_client(&out);
    assert!(text(&out.stdout).contains("served 70 calls"));
}

#[test]
fn local_warm() {
    let out = finish(spawn(&["--local", "-m", "warm", "-i", "20", "-s", SIZES]));
    check_client(&out);
}

#[test]
fn server_and_client_processes() {
    let mut s = spawn(&["--server", "-p", "0", "-m", "warm"]);
    let mut first = String::new();
    BufReader::new(s.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let port = first
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .unwrap_or_else(|| panic!("server said {first:?}"))
        .to_owned();
    let c = finish(spawn(&[
        "-n",
        "127.0.0.1",
        "-p",
        &port,
        "-m",
        "warm",
        "-i",
        "20",
        "-s",
        SIZES,
    ]));
    check_client(&c);
    let s = finish(s);
    assert_eq!(s.status.code(), Some(0), "{}", text(&s.stderr));
    assert!(text(&s.stdout).contains("served 70 calls"), "{}", text(&s.stdout));
}

#[test]
fn bad_command_line() {
    let out = finish(spawn(&["-m", "lukewarm"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("usage: rpc"));
}

#[test]
fn help_prints_the_usage_and_exits_0() {
    for flag in ["-h", "--help"] {
        let out = Command::new(example()).arg(flag).output().expect("run rpc");
        let o = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "rpc {flag}:\n{o}{}",
            text(&out.stderr)
        );
        assert!(o.starts_with("usage: rpc ") && o.contains("--server"), "{o}");
    }
    // A wrong argument is still a usage error.
    let out = Command::new(example()).arg("--bogus").output().expect("run rpc");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("usage: rpc "));
}
