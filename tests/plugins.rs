//! The plugin loader: good plugins load, bad ones are skipped with a reason, built-ins win over
//! plugins of the same name, plugin logs reach the host's subscriber, and no example or tool
//! binary links libibverbs or libfabric.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use rucx_testkit::modules::{plugin_file, target_dir};
use uct::{Context, ModuleStatus};

/// A fresh directory under the target dir (tests run in parallel threads: unique names).
fn scratch(name: &str) -> PathBuf {
    let d = target_dir()
        .join("plugin-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gcc(dir: &Path, out: &str, src: &str, extra: &[&str]) {
    let c = dir.join(format!("{out}.c"));
    std::fs::write(&c, src).unwrap();
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(out))
        .arg(&c)
        .args(extra)
        .current_dir(dir)
        .status()
        .expect("gcc runs");
    assert!(st.success(), "gcc failed for {out}");
}

/// Builds a context that only searches `dir` for plugins, from a child process so the
/// environment variable does not leak into other tests: runs this test binary filtered to
/// `probe_modules`, which prints the module table.
fn modules_in(dir: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "probe_modules", "--nocapture", "--include-ignored"])
        .env("RUCX_MODULE_DIR", dir)
        .env("PLUGIN_TEST_PROBE", "1")
        .env("RUCX_LOG_LEVEL", "warn")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "probe failed:\n{s}");
    s
}

/// Not a test of its own: the child-process half of `modules_in`.
#[test]
#[ignore = "run by the other tests in a child process"]
fn probe_modules() {
    if std::env::var("PLUGIN_TEST_PROBE").is_err() {
        return;
    }
    ucs::log::init();
    let ctx = Context::builder().builtin(uct_self::module()).build();
    for m in ctx.modules() {
        println!("MODULE {} {:?}", m.name, m.status);
    }
    // Everything else still works.
    assert!(ctx.find_resource("self", "memory0").is_ok());
}

#[test]
fn bad_plugins_are_skipped_with_a_reason() {
    let dir = scratch("bad");
    // Not a shared library at all.
    std::fs::write(dir.join("libuct_junk.so"), b"this is not an ELF file").unwrap();
    // A real shared library without the rucx entry symbol.
    gcc(
        &dir,
        "libuct_plain.so",
        "int plain_function(void) { return 1; }\n",
        &[],
    );
    // A plugin whose dependency is missing: link against a library, then remove it.
    gcc(&dir, "libgone.so", "int gone(void) { return 2; }\n", &[]);
    gcc(
        &dir,
        "libuct_needy.so",
        "int gone(void); int needy(void) { return gone(); }\n",
        &["-L.", "-lgone"],
    );
    std::fs::remove_file(dir.join("libgone.so")).unwrap();
    // A plugin speaking another ABI version.
    gcc(
        &dir,
        "libuct_future.so",
        "struct m { unsigned abi; const char *name; void *init; unsigned long nc; void *c; unsigned long ncfg; void *cfg; };\n\
         static struct m desc = { 999, \"future\", 0, 0, 0, 0, 0 };\n\
         const struct m *rucx_module_future(void) { return &desc; }\n",
        &[],
    );
    let out = modules_in(&dir);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("MODULE {name} ")))
            .unwrap_or("")
            .to_string()
    };
    assert!(line("junk").contains("Failed"), "{out}");
    assert!(line("plain").contains("not a rucx plugin"), "{out}");
    assert!(
        line("needy").contains("Failed") && out.contains("libgone.so"),
        "missing dependency named:\n{out}"
    );
    assert!(line("future").contains("ABI version 999"), "{out}");
    assert!(line("self").contains("Builtin"), "{out}");
    // One warn line per skipped plugin, naming the file.
    for f in [
        "libuct_junk.so",
        "libuct_plain.so",
        "libuct_needy.so",
        "libuct_future.so",
    ] {
        let n = out
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(f))
            .count();
        assert_eq!(n, 1, "expected one warning for {f}:\n{out}");
    }
}

#[test]
fn builtin_shadows_plugin_of_same_name() {
    let so = plugin_file("self");
    assert!(so.exists(), "{} is built with the tests", so.display());
    let dir = scratch("shadow");
    std::fs::copy(&so, dir.join("libuct_self.so")).unwrap();
    let out = modules_in(&dir);
    assert!(out.contains("MODULE self Builtin"), "{out}");
    assert!(out.contains("MODULE self Shadowed"), "{out}");
}

#[test]
fn plugin_loads_and_is_denied_by_rucx_modules() {
    let so = plugin_file("self");
    let dir = scratch("deny");
    std::fs::copy(&so, dir.join("libuct_self.so")).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "probe_plugin_only", "--nocapture", "--include-ignored"])
        .env("RUCX_MODULE_DIR", &dir)
        .env("PLUGIN_TEST_PROBE", "1")
        .env("RUCX_MODULES", "^self")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("MODULE self Denied"), "{s}");
}

#[test]
#[ignore = "run by the other tests in a child process"]
fn probe_plugin_only() {
    if std::env::var("PLUGIN_TEST_PROBE").is_err() {
        return;
    }
    let ctx = Context::builder().build();
    for m in ctx.modules() {
        println!("MODULE {} {:?}", m.name, m.status);
    }
}

/// Collects formatted events (the host application's own subscriber).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(b).into_owned());
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
#[ignore = "run by plugin_logs_reach_host_subscriber in a child process"]
fn probe_plugin_log() {
    if std::env::var("PLUGIN_TEST_PROBE").is_err() {
        return;
    }
    // "stderr": the application sets no logging up; rucx writes the forwarded events itself.
    let own_subscriber = std::env::var("PLUGIN_TEST_PROBE").as_deref() != Ok("stderr");
    let cap = Capture::default();
    let c2 = cap.clone();
    if own_subscriber {
        tracing_subscriber::fmt()
            .with_writer(move || c2.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    }
    let ctx = Context::builder().build();
    assert_eq!(
        ctx.modules()
            .iter()
            .find(|m| m.name == "self")
            .map(|m| m.status.clone()),
        Some(ModuleStatus::Loaded)
    );
    let (md, _) = ctx.find_resource("self", "memory0").unwrap();
    let w = uct::Worker::with_async_mode(uct::AsyncMode::Poll).unwrap();
    // Misuse is reported in the error, which names the bad device, across the plugin boundary.
    let e = uct::Iface::open(&md, &w, uct::IfaceParams::new("self", "no-such-device"))
        .expect_err("opening a device that does not exist");
    assert_eq!(e, uct::Status::NoDevice, "{e}");
    assert!(
        e.context().is_some_and(|c| c.contains("no-such-device")),
        "the error does not name the device: {e:?}"
    );
    // A message for an AM id without handler: the plugin logs a warning, which reaches this
    // subscriber.
    let iface = uct::Iface::open(&md, &w, uct::IfaceParams::new("self", "memory0")).unwrap();
    let ep = iface
        .ep_create_connected(&iface.device_address().unwrap(), &iface.address().unwrap())
        .unwrap();
    ep.am_short(7, 0, b"nobody listens").unwrap();
    w.progress();
    let logs = cap.0.lock().unwrap().join("");
    if !own_subscriber {
        assert!(logs.is_empty(), "{logs}");
        println!("PLUGIN-LOG-OK");
        return;
    }
    assert!(
        logs.contains("rucx::plugin") && logs.contains("no handler installed"),
        "plugin log not forwarded:\n{logs}"
    );
    println!("PLUGIN-LOG-OK");
}

#[test]
fn plugin_logs_reach_host_subscriber() {
    let so = plugin_file("self");
    let dir = scratch("log");
    std::fs::copy(&so, dir.join("libuct_self.so")).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "probe_plugin_log", "--nocapture", "--include-ignored"])
        .env("RUCX_MODULE_DIR", &dir)
        .env("PLUGIN_TEST_PROBE", "1")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && s.contains("PLUGIN-LOG-OK"), "{s}");
}

#[test]
fn plugin_logs_reach_stderr_without_a_subscriber() {
    let so = plugin_file("self");
    let dir = scratch("log-stderr");
    std::fs::copy(&so, dir.join("libuct_self.so")).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "probe_plugin_log", "--nocapture", "--include-ignored"])
        .env("RUCX_MODULE_DIR", &dir)
        .env("PLUGIN_TEST_PROBE", "stderr")
        .env_remove("RUCX_LOG_LEVEL")
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success() && o.contains("PLUGIN-LOG-OK"), "{o}\n{e}");
    assert!(
        e.contains("WARN") && e.contains("rucx::plugin") && e.contains("no handler installed"),
        "the plugin's warning is not on stderr:\n{e}"
    );
}

#[test]
fn example_and_tool_binaries_do_not_link_libibverbs_or_libfabric() {
    let t = target_dir();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args([
        "build",
        "-p",
        "rucx",
        "--example",
        "uct_hello_world",
        "-p",
        "rucx-tools",
        "--bins",
    ]);
    if t.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().unwrap().success(),
        "building the example and tools failed"
    );
    let mut checked = 0;
    for p in [
        t.join("examples/uct_hello_world"),
        t.join("rucx-info"),
        t.join("rucx-perftest"),
    ] {
        assert!(p.exists(), "{} was not built", p.display());
        let out = Command::new("ldd").arg(&p).output().expect("ldd");
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(
            !s.contains("libibverbs"),
            "{} links libibverbs:\n{s}",
            p.display()
        );
        assert!(
            !s.contains("libfabric"),
            "{} links libfabric (only libuct_ofi.so may):\n{s}",
            p.display()
        );
        checked += 1;
    }
    assert!(checked > 0, "no example/tool binary found under {}", t.display());
}

/// libfabric missing (hidden in a private mount namespace: /dev/null bound over it): the ofi
/// plugin is skipped with the reason, everything else loads and runs. Needs root and unshare,
/// and libuct_ofi.so (`cargo build -p uct-ofi-plugin`); skipped otherwise.
#[test]
fn ofi_plugin_without_libfabric_is_skipped_and_the_rest_runs() {
    let Some(dir) = rucx_testkit::modules::plugin_dirs()
        .into_iter()
        .find(|d| d.join("libuct_ofi.so").is_file())
    else {
        eprintln!("skipped: libuct_ofi.so not built");
        return;
    };
    let ldd = Command::new("ldd")
        .arg(dir.join("libuct_ofi.so"))
        .output()
        .expect("ldd");
    let ldd = String::from_utf8_lossy(&ldd.stdout).to_string();
    let Some(lib) = ldd
        .lines()
        .find(|l| l.contains("libfabric"))
        .and_then(|l| l.split("=>").nth(1))
        .and_then(|r| r.split_whitespace().next())
    else {
        panic!("libuct_ofi.so does not link libfabric:\n{ldd}");
    };
    let script = format!(
        "mount --bind /dev/null {lib} && exec {} --exact probe_modules --nocapture --include-ignored",
        std::env::current_exe().unwrap().display()
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .env("RUCX_MODULE_DIR", &dir)
        .env("PLUGIN_TEST_PROBE", "1")
        .env("RUCX_LOG_LEVEL", "warn")
        .output();
    let Ok(out) = out else {
        eprintln!("skipped: no unshare");
        return;
    };
    let s = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && (s.contains("Operation not permitted") || s.contains("mount:")) {
        eprintln!("skipped: cannot hide libfabric here (needs root):\n{s}");
        return;
    }
    assert!(
        out.status.success(),
        "the probe failed with libfabric hidden:\n{s}"
    );
    let ofi = s.lines().find(|l| l.starts_with("MODULE ofi ")).unwrap_or("");
    assert!(ofi.contains("Failed"), "ofi should fail to load:\n{s}");
    assert!(
        s.lines()
            .any(|l| l.contains("WARN") && l.contains("libuct_ofi.so")),
        "one warning naming the plugin expected:\n{s}"
    );
    assert!(s.contains("MODULE self Builtin"), "{s}");
}
