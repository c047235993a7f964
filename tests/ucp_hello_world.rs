//! Runs the `ucp_hello_world` example binary: both workers in one process, then server and
//! client as two processes over tcp/lo, and a bad server address; and the README's `ucp_embed`.
//!
//! `cargo test -p rucx` builds the examples first; with a target filter build it yourself:
//! `cargo build -p rucx --example ucp_hello_world`.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn example() -> PathBuf {
    example_named("ucp_hello_world")
}

fn example_named(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let p = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        p.exists(),
        "{} is not built: `cargo build -p rucx --example {name}`",
        p.display()
    );
    p
}

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(example());
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("start ucp_hello_world")
}

/// Waits for `child`, killing it after a minute (a safety net: the example has its own deadlines).
fn finish(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The client's report: lanes, one protocol line per size, intact echoes.
fn check_report(out: &Output, transport: &str) {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout:\n{o}\nstderr:\n{e}");
    assert!(o.contains("lane[0]:"), "no lanes shown:\n{o}");
    assert!(o.contains(transport), "no {transport} lane:\n{o}");
    assert!(o.contains("eager short"), "no short protocol line:\n{o}");
    assert!(o.contains("fragments"), "no fragmented protocol line:\n{o}");
    assert!(o.contains("all echoes intact"), "{o}");
}

#[test]
fn in_one_process() {
    let out = finish(spawn(&[], &[("RUCX_TLS", "tcp"), ("RUCX_NET_DEVICES", "lo")]));
    check_report(&out, "tcp/lo -> tcp/lo");
}

#[test]
fn server_and_client_processes() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let env = [("RUCX_TLS", "tcp"), ("RUCX_NET_DEVICES", "lo")];
    let mut server = spawn(&["--server", &port], &env);
    let mut first = String::new();
    BufReader::new(server.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("waiting for a client"), "server said {first:?}");
    let client = finish(spawn(&["--client", &format!("127.0.0.1:{port}")], &env));
    check_report(&client, "tcp/lo -> tcp/lo");
    let s = finish(server);
    assert_eq!(s.status.code(), Some(0), "server stderr:\n{}", text(&s.stderr));
    assert!(text(&s.stdout).contains("done"), "{}", text(&s.stdout));
}

#[test]
fn no_server_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let out = finish(spawn(&["--client", &format!("127.0.0.1:{port}")], &[]));
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
