//! Where rucx's warnings go, in a process of their own each (tracing's global subscriber is per
//! process): an application without any logging setup gets them on stderr at `RUCX_LOG_LEVEL`
//! (default warn); one that installs its own `tracing` subscriber, before or after rucx first
//! logged, gets them there instead, once, without a panic.
//!
//! Each test runs `probe` (ignored) again in a child copy of this binary. The probe makes rucx
//! warn for real: `RUCX_TSL` (a typo of `RUCX_TLS`) when the transport context is built, and a
//! tcp interface that cannot open (`RUCX_TCP_MAX_IOV=bogus`) when a UCP worker is created; its
//! application subscriber writes to stdout, so each stream shows who printed what.
use std::process::{Command, Output};
use std::time::Duration;

const TYPO: &str = "unknown environment variable RUCX_TSL; did you mean RUCX_TLS?";
const UNUSABLE: &str = "ucp: tcp/lo not used:";
const DEBUG_LINE: &str = "async: context created";

fn run(mode: &str, env: &[(&str, &str)]) -> (String, String) {
    let exe = std::env::current_exe().expect("path of the test executable");
    let mut cmd = Command::new(exe);
    cmd.args(["probe", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("LOG_TEST_PROBE", mode)
        .env("RUCX_TSL", "tcp")
        .env("RUCX_TCP_MAX_IOV", "bogus")
        .env("RUCX_NET_DEVICES", "lo")
        .env_remove("RUCX_LOG_LEVEL")
        .env_remove("RUCX_TLS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start a child copy of the test binary");
    let out: Output = rucx_testkit::child::wait_output(child, Duration::from_secs(60));
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(0), "stdout:\n{o}\nstderr:\n{e}");
    assert!(o.contains("PROBE-DONE"), "stdout:\n{o}\nstderr:\n{e}");
    (o, e)
}

fn count(text: &str, what: &str) -> usize {
    text.matches(what).count()
}

#[test]
fn without_setup_warnings_reach_stderr() {
    let (o, e) = run("none", &[]);
    assert_eq!(count(&e, TYPO), 1, "stderr:\n{e}");
    assert_eq!(count(&e, UNUSABLE), 1, "stderr:\n{e}");
    assert!(e.contains("WARN"), "stderr:\n{e}");
    assert!(!e.contains(DEBUG_LINE), "debug shown at the default level:\n{e}");
    assert!(!o.contains(TYPO) && !o.contains(UNUSABLE), "stdout:\n{o}");
}

#[test]
fn without_setup_log_level_debug_shows_debug_lines() {
    let (_, e) = run("none", &[("RUCX_LOG_LEVEL", "debug")]);
    assert!(e.contains(DEBUG_LINE) && e.contains("DEBUG"), "stderr:\n{e}");
    assert_eq!(count(&e, TYPO), 1, "stderr:\n{e}");
}

#[test]
fn without_setup_log_level_error_hides_warnings() {
    let (_, e) = run("none", &[("RUCX_LOG_LEVEL", "error")]);
    assert!(!e.contains(TYPO) && !e.contains(UNUSABLE), "stderr:\n{e}");
}

#[test]
fn a_bad_log_level_is_reported_and_warn_used() {
    let (_, e) = run("none", &[("RUCX_LOG_LEVEL", "loud")]);
    assert!(
        e.contains("RUCX_LOG_LEVEL") && e.contains("using warn"),
        "stderr:\n{e}"
    );
    assert_eq!(count(&e, TYPO), 1, "stderr:\n{e}");
}

#[test]
fn subscriber_installed_before_takes_them() {
    let (o, e) = run("before", &[]);
    assert_eq!(count(&o, TYPO), 1, "stdout:\n{o}");
    assert_eq!(count(&o, UNUSABLE), 1, "stdout:\n{o}");
    assert!(!e.contains(TYPO) && !e.contains(UNUSABLE), "printed twice:\n{e}");
}

#[test]
fn subscriber_installed_after_takes_them_from_then_on() {
    let (o, e) = run("after", &[]);
    // Before the application's subscriber: stderr; after: only the subscriber.
    assert_eq!(count(&e, TYPO), 1, "stderr:\n{e}");
    assert!(!o.contains(TYPO), "stdout:\n{o}");
    assert_eq!(count(&o, UNUSABLE), 1, "stdout:\n{o}");
    assert!(!e.contains(UNUSABLE), "printed twice:\n{e}");
}

/// An example, like any application that does not set logging up, shows rucx's warnings.
#[test]
fn an_example_shows_the_warnings() {
    let out = Command::new(rucx_testkit::child::example("ucp_embed"))
        .env("RUCX_TSL", "tcp")
        .env_remove("RUCX_LOG_LEVEL")
        .output()
        .expect("run the ucp_embed example");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert_eq!(count(&e, TYPO), 1, "stderr:\n{e}");
}

fn install_app_subscriber() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
}

/// Not a test of its own: the child-process half of the tests above.
#[test]
#[ignore = "run by the other tests in a child process"]
fn probe() {
    let Ok(mode) = std::env::var("LOG_TEST_PROBE") else {
        return;
    };
    if mode == "before" {
        install_app_subscriber();
    }
    let uct_ctx = rucx::context();
    if mode == "after" {
        install_app_subscriber();
    }
    let ctx = ucp::Context::builder(uct_ctx)
        .config("TLS", "tcp,self")
        .build()
        .expect("ucp context");
    let _worker = ucp::Worker::new(&ctx).expect("ucp worker (self still works)");
    println!("PROBE-DONE");
}
