//! Runs the `uct_hello_world` example binary: loopback (`-l`) with every AM flavour, server and
//! client as two processes, and the error paths (exit codes and hints).
//!
//! `cargo test -p rucx` builds the examples before running the tests; with a target filter
//! (`--test hello_world`) build them first: `cargo build -p rucx --example uct_hello_world`.
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Transports that can connect two processes on this host, tried in order for the two-process
/// test (the first one present is used).
const CROSS_PROCESS: &[(&str, &str)] = &[("tcp", "lo")];

fn example() -> PathBuf {
    rucx_testkit::child::example("uct_hello_world")
}

fn spawn(args: &[&str]) -> Child {
    Command::new(example())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uct_hello_world")
}

/// Waits for `child`, killing it after `limit` (the example has its own deadlines; this is a
/// safety net so a bug cannot hang the test suite).
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = finish(spawn(args), Duration::from_secs(60));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

fn assert_delivered(args: &[&str], size: usize) {
    let (rc, out, err) = run(args);
    assert_eq!(rc, 0, "{args:?} failed\nstdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains(&format!("[server] received {size} bytes")),
        "{args:?}: {out}"
    );
    assert!(out.contains("(intact)"), "{args:?}: {out}");
    assert!(out.contains("[client] the server confirmed"), "{args:?}: {out}");
}

#[test]
fn loopback_delivers_with_every_flavour() {
    for flavour in ["-i", "-b", "-z"] {
        assert_delivered(&["-l", flavour], 16);
        assert_delivered(&["-l", flavour, "-s", "1000"], 1000);
    }
    // Smallest messages: one byte (bcopy/zcopy), the 8-byte header alone (short).
    assert_delivered(&["-l", "-b", "-s", "1"], 1);
    assert_delivered(&["-l", "-z", "-s", "1"], 1);
    assert_delivered(&["-l", "-i", "-s", "8"], 8);
}

#[test]
fn loopback_rejects_what_the_transport_cannot_send() {
    let (rc, _, err) = run(&["-l", "-i", "-s", "4"]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("UCS_ERR_EXCEEDS_LIMIT") && err.contains("hint:"),
        "{err}"
    );
    let (rc, _, err) = run(&["-l", "-b", "-s", "100000000"]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("does not fit am_bcopy"), "{err}");
}

#[test]
fn bad_command_lines_exit_2_with_usage() {
    for args in [
        &["-x"][..],
        &["-s"],
        &["-s", "many"],
        &["-l", "-n", "host"],
        &["-s", "0"],
        &["stray"],
    ] {
        let (rc, _, err) = run(args);
        assert_eq!(rc, 2, "{args:?}: {err}");
        assert!(err.contains("Usage:"), "{args:?}: {err}");
    }
    for help in ["-h", "--help"] {
        let (rc, out, _) = run(&[help]);
        assert_eq!(rc, 0, "{help}");
        assert!(out.contains("-z") && out.contains("am_zcopy"), "{help}: {out}");
    }
}

#[test]
fn unknown_transport_fails_with_a_hint() {
    let (rc, _, err) = run(&["-l", "-t", "nosuch", "-d", "dev0"]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("UCS_ERR_NO_DEVICE") && err.contains("rucx-info -d"),
        "{err}"
    );
}

#[test]
fn client_without_server_times_out() {
    let port = free_port().to_string();
    let start = Instant::now();
    let (rc, _, err) = run(&["-n", "127.0.0.1", "-p", &port, "-T", "0.5"]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("timed out") && err.contains("UCS_ERR_TIMED_OUT"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(20));
}

/// Server and client in two processes; returns (server, client) exit codes and outputs.
fn two_processes(tl: &str, dev: &str, extra: &[&str]) -> [(i32, String, String); 2] {
    two_processes_with(tl, dev, extra, &[])
}

/// [`two_processes`] with extra environment variables for both.
fn two_processes_with(
    tl: &str,
    dev: &str,
    extra: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> [(i32, String, String); 2] {
    let port = free_port().to_string();
    let mut common = vec!["-t", tl, "-d", dev, "-p", &port, "-T", "20"];
    common.extend_from_slice(extra);
    let start = |args: &[&str]| {
        Command::new(example())
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start uct_hello_world")
    };
    let server = start(&common);
    // The client retries connecting until the server listens.
    let mut client_args = common.clone();
    client_args.extend_from_slice(&["-n", "127.0.0.1"]);
    let client = start(&client_args);
    [server, client].map(|c| {
        let out = finish(c, Duration::from_secs(60));
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    })
}

#[test]
fn two_processes_exchange_addresses_and_self_refuses_them() {
    // self cannot cross processes: both sides get through the out-of-band exchange and then
    // report the peer unreachable, with the hint to use -l or a network transport.
    let [s, c] = two_processes("self", "memory0", &[]);
    for (who, (rc, out, err)) in [("server", &s), ("client", &c)] {
        assert_eq!(*rc, 1, "{who}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(
            err.contains("UCS_ERR_UNREACHABLE") && err.contains("-l"),
            "{who}: {err}"
        );
    }
}

#[test]
fn two_processes_deliver_over_a_network_transport() {
    let ctx = rucx::context();
    let Some(&(tl, dev)) = CROSS_PROCESS
        .iter()
        .find(|(tl, dev)| ctx.find_resource(tl, dev).is_ok())
    else {
        eprintln!("skipped: no transport of {CROSS_PROCESS:?} is built in yet");
        return;
    };
    for flavour in ["-i", "-b", "-z"] {
        let [s, c] = two_processes(tl, dev, &[flavour, "-s", "100"]);
        assert_eq!(s.0, 0, "server {flavour}\nstdout:\n{}\nstderr:\n{}", s.1, s.2);
        assert_eq!(c.0, 0, "client {flavour}\nstdout:\n{}\nstderr:\n{}", c.1, c.2);
        assert!(
            s.1.contains("[server] received 100 bytes") && s.1.contains("(intact)"),
            "{}",
            s.1
        );
        assert!(c.1.contains("the server confirmed"), "{}", c.1);
    }
}

/// The ofi transport (plugin libuct_ofi.so, built by `cargo build --workspace` or
/// `cargo build -p uct-ofi-plugin`) over `tcp;ofi_rxm` on loopback, every AM flavour.
#[test]
fn two_processes_deliver_over_ofi() {
    let so = rucx_testkit::modules::plugin_dirs()
        .into_iter()
        .find(|d| d.join("libuct_ofi.so").is_file());
    let Some(dir) = so else {
        eprintln!("skipped: libuct_ofi.so not built (cargo build -p uct-ofi-plugin)");
        return;
    };
    let env = [("RUCX_MODULE_DIR", dir.as_os_str())];
    for (flavour, size) in [("-i", "40"), ("-b", "100"), ("-z", "1000")] {
        let [s, c] = two_processes_with("ofi", "tcp;ofi_rxm/lo", &[flavour, "-s", size], &env);
        assert_eq!(s.0, 0, "server {flavour}\nstdout:\n{}\nstderr:\n{}", s.1, s.2);
        assert_eq!(c.0, 0, "client {flavour}\nstdout:\n{}\nstderr:\n{}", c.1, c.2);
        assert!(
            s.1.contains(&format!("[server] received {size} bytes")) && s.1.contains("(intact)"),
            "{}",
            s.1
        );
        assert!(c.1.contains("the server confirmed"), "{}", c.1);
    }
}

// The receiver's checker, exercised directly: damaged messages must not pass as intact.
#[allow(dead_code)]
#[path = "../examples/uct_hello_world/pattern.rs"]
mod pattern;

#[test]
fn the_checker_catches_damaged_messages() {
    for len in [1, 2, 8, 16, 1000, 70_000] {
        assert_eq!(pattern::check(&pattern::message(len)), Ok(()), "len {len}");
    }
    let m = pattern::message(100);
    assert!(pattern::check(&[]).is_err());
    assert!(pattern::check(&m[..99]).is_err(), "truncated");
    assert!(pattern::check(&[&m[..], &[0]].concat()).is_err(), "extra byte");
    let mut flipped = m.clone();
    flipped[50] ^= 1;
    assert!(pattern::check(&flipped).is_err(), "bit flip");
    let mut repeated = m.clone();
    repeated.copy_within(0..26, 26);
    assert!(pattern::check(&repeated).is_err(), "repeated chunk");
    assert!(pattern::preview(&pattern::message(1000)).ends_with("...\""));
}
