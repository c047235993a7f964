//! Runs the `rucx-info` binary and checks that each section is sane.
use std::process::Command;

fn info(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rucx-info"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run rucx-info");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

fn ok(args: &[&str]) -> String {
    let (rc, out, err) = info(args, &[]);
    assert_eq!(rc, 0, "rucx-info {args:?}\nstdout:\n{out}\nstderr:\n{err}");
    out
}

#[test]
fn version_names_the_abi() {
    let out = ok(&["-v"]);
    assert!(
        out.contains(&format!("# rucx version {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    assert!(
        out.contains(&format!("# plugin ABI version {}", uct::PLUGIN_ABI_VERSION)),
        "{out}"
    );
    assert!(out.contains("built-in modules: self"), "{out}");
}

#[test]
fn devices_list_the_self_transport_with_its_caps() {
    let out = ok(&["-d"]);
    for needle in [
        "# Memory domain: self",
        "#     Component: self",
        "#      Transport: self",
        "#         Device: memory0",
        "#           Type: loopback",
        "am_short: <= ",
        "latency: ",
        "bandwidth: ",
        "connection: to iface",
        "device address: 8 bytes",
        "flags: AM_SHORT|",
        "atomic_cswap: 32, 64 bit",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    // Every line is a comment, as in ucx_info.
    assert!(out.lines().all(|l| l.starts_with('#')), "{out}");
    // -t filters transports; an unknown one is an error naming the ones there are.
    let (rc, none, err) = info(&["-d", "-t", "nosuch"], &[]);
    assert_eq!(rc, 1, "{err}");
    assert!(!none.contains("Transport:"), "{none}");
    assert!(
        err.contains("no transport \"nosuch\"") && err.contains("self"),
        "{err}"
    );
    let self_only = ok(&["-dt", "self"]);
    assert!(self_only.contains("#      Transport: self"));
    // No limit reads as such, not as a number.
    assert!(self_only.contains("put_short: unlimited"), "{self_only}");
}

#[test]
fn config_lists_variables_with_docs_and_values() {
    let (rc, out, err) = info(&["-c"], &[("RUCX_SELF_SEG_SIZE", "16k")]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("\nRUCX_SELF_SEG_SIZE=16k\n"), "{out}");
    assert!(out.contains("RUCX_LOG_LEVEL="), "{out}");
    assert!(!out.contains("INVALID"), "{out}");
    // A variable with a syntax of its own says it.
    assert!(
        out.contains("# syntax: auto or a non-negative integer\nRUCX_TCP_KEEPCNT="),
        "{out}"
    );
    // An invalid value is marked, and the exit status says so.
    let (rc, out, err) = info(&["-c"], &[("RUCX_TCP_TX_SEG_SIZE", "12q")]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        out.contains("# INVALID: RUCX_TCP_TX_SEG_SIZE=12q is invalid: expected a memory size"),
        "{out}"
    );
    assert!(
        err.contains("1 configuration variable(s) have invalid values"),
        "{err}"
    );
    let (_, out, _) = info(&["-c"], &[("RUCX_SELF_SEG_SIZE", "16k")]);
    let mut last_comment = false;
    for l in out.lines().filter(|l| !l.is_empty()) {
        if l.starts_with('#') {
            last_comment = true;
        } else {
            assert!(l.starts_with("RUCX_") && l.contains('='), "bad line {l:?}");
            assert!(last_comment, "{l} has no documentation above it");
            last_comment = false;
        }
    }
}

#[test]
fn modules_report_builtins_and_broken_plugins() {
    let dir = std::env::temp_dir().join(format!("rucx-info-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("libuct_broken.so"), b"not an ELF file").unwrap();
    let (rc, out, err) = info(&["-m"], &[("RUCX_MODULE_DIR", dir.to_str().unwrap())]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("self") && l.contains("Builtin")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("broken") && l.contains("Failed")),
        "{out}"
    );
    assert!(out.contains("reason: "), "{out}");

    let (rc, out, _) = info(&["-m"], &[("RUCX_MODULES", "^self")]);
    assert_eq!(rc, 0);
    assert!(
        out.lines().any(|l| l.starts_with("self") && l.contains("Denied")),
        "{out}"
    );
}

#[test]
fn usage_and_bad_options() {
    assert!(ok(&["-h"]).contains("Usage: rucx-info"));
    assert!(ok(&["--help"]).contains("Usage: rucx-info"));
    for bad in [&[][..], &["-x"], &["-d", "extra"], &["-t"]] {
        let (rc, _, err) = info(bad, &[]);
        assert_eq!(rc, 2, "{bad:?}: {err}");
        assert!(err.contains("Usage:"), "{bad:?}: {err}");
    }
}

#[test]
fn endpoint_report_shows_lanes_and_protocols() {
    // To itself: the self transport takes every lane.
    let (rc, out, err) = info(&["-e"], &[("RUCX_TLS", "self,tcp"), ("RUCX_NET_DEVICES", "lo")]);
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(out.contains("# UCP endpoint to its own worker"), "{out}");
    assert!(
        out.contains("# lane[0]: self/memory0 -> self/memory0  am"),
        "{out}"
    );
    assert!(
        out.contains("eager short") && out.contains("fragments of"),
        "{out}"
    );
    // To a second worker: tcp; a forced threshold shows in the ranges.
    let env = [
        ("RUCX_TLS", "self,tcp"),
        ("RUCX_NET_DEVICES", "lo"),
        ("RUCX_BCOPY_THRESH", "0"),
    ];
    let (rc, out, err) = info(&["-e", "-p"], &env);
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(out.contains("# lane[0]: tcp/lo -> tcp/lo  am"), "{out}");
    assert!(
        !out.contains("eager short") && out.contains("eager bcopy"),
        "{out}"
    );
    // -p alone is a usage error; nothing usable is an error naming RUCX_TLS.
    assert_eq!(info(&["-p"], &[]).0, 2);
    let (rc, _, err) = info(&["-e"], &[("RUCX_TLS", "nosuch")]);
    assert_eq!(rc, 1);
    assert!(err.contains("RUCX_TLS"), "{err}");
}
