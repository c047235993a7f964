//! Runs the `ucp_hello_world` example binary: the local mode (the README's first command), a
//! server and a client process in each wake mode (`-b`, `-w`, `-f`), each peer-failure
//! emulation (`-e send|recv|keepalive`: the survivor exits 0), a bad command line and a missing
//! server; and the README's `ucp_embed`.
//!
//! `cargo test -p rucx` builds the examples first; with a target filter build them yourself:
//! `cargo build -p rucx --examples`.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn example_named(name: &str) -> PathBuf {
    rucx_testkit::child::example(name)
}

/// Loopback only, so that the lanes are the same on every machine; a rendezvous threshold
/// that the 4 MiB round trip crosses (tcp on loopback alone sets it higher).
const LO: [(&str, &str); 3] = [
    ("RUCX_TLS", "tcp"),
    ("RUCX_NET_DEVICES", "lo"),
    ("RUCX_RNDV_THRESH", "1048576"),
];

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(example_named("ucp_hello_world"));
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("start ucp_hello_world")
}

/// Waits for `child`, killing it after two minutes (a safety net only).
fn finish(child: Child) -> Output {
    rucx_testkit::child::wait_output(child, Duration::from_secs(120))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_ok(out: &Output, who: &str) -> String {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{who}: stdout:\n{o}\nstderr:\n{e}");
    o
}

/// The client's report: the message, lanes, protocols, one line per size, intact echoes.
fn check_report(o: &str) {
    assert!(
        o.contains("received a 16-byte message: \"UCP hello world!\""),
        "{o}"
    );
    assert!(o.contains("lane[0]: tcp/lo -> tcp/lo"), "no tcp/lo lane:\n{o}");
    assert!(o.contains("eager short"), "no short protocol line:\n{o}");
    assert!(o.contains("in fragments"), "no fragmented size:\n{o}");
    assert!(o.contains("rendezvous"), "no rendezvous size:\n{o}");
    assert!(o.contains("all round trips intact"), "{o}");
}

/// Starts a server on a free port (`-p 0`); returns it and the port it printed.
fn server(flags: &[&str]) -> (Child, String) {
    let mut args = vec!["--server", "-p", "0"];
    args.extend_from_slice(flags);
    let mut s = spawn(&args, &LO);
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
    (s, port)
}

fn client(port: &str, flags: &[&str]) -> Child {
    let mut args = vec!["-n", "127.0.0.1", "-p", port];
    args.extend_from_slice(flags);
    spawn(&args, &LO)
}

#[test]
fn local_mode() {
    let out = finish(spawn(&[], &LO));
    let o = assert_ok(&out, "local mode");
    assert!(o.contains("local mode: a server and a client process"), "{o}");
    check_report(&o);
    assert!(o.contains("server: echoed"), "{o}");
}

fn pair(wake: &str) {
    let (s, port) = server(&[wake]);
    let c = finish(client(&port, &[wake]));
    let s = finish(s);
    check_report(&assert_ok(&c, "client"));
    let so = assert_ok(&s, "server");
    assert!(so.contains("the client closed its endpoint"), "{so}");
}

#[test]
fn server_and_client_busy_polling() {
    pair("-b");
}

#[test]
fn server_and_client_worker_wait() {
    pair("-w");
}

#[test]
fn server_and_client_event_fd() {
    pair("-f");
}

/// `-e MODE`: one side kills itself (the server when `server_dies`); the other must detect
/// it and exit 0.
fn failure(mode: &str, wake: &str, server_dies: bool) {
    let (s, port) = server(&[wake, "-e", mode]);
    let c = finish(client(&port, &[wake, "-e", mode]));
    let s = finish(s);
    let (dead, alive) = if server_dies { (&s, &c) } else { (&c, &s) };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(dead.status.signal(), Some(9), "{}", text(&dead.stderr));
    let o = assert_ok(alive, "survivor");
    assert!(o.contains("peer failure detected"), "{o}");
}

#[test]
fn server_dies_client_detects() {
    failure("send", "-b", true);
}

#[test]
fn client_dies_server_send_fails() {
    failure("recv", "-w", false);
}

#[test]
fn client_dies_server_idle_detects() {
    failure("keepalive", "-f", false);
}

#[test]
fn bad_command_line() {
    for args in [
        &["-e", "later"][..],
        &["--server", "-n", "host"],
        &["-s", "0"],
        &["-x"],
    ] {
        let out = finish(spawn(args, &[]));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("Usage:"), "{args:?}");
    }
}

#[test]
fn no_server_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let out = finish(client(&port, &[]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("connect to 127.0.0.1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn readme_embedding_example() {
    let c = Command::new(example_named("ucp_embed"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(c);
    let o = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{o}\n{}", text(&out.stderr));
    assert!(
        o.contains("server got \"hello\"") && o.contains("lane[0]: tcp/"),
        "{o}"
    );
}
