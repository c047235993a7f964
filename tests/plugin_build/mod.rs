//! Builds the transports' `.so` plugins for tests that load them. Cargo builds only the rlib of
//! a dependency, so a test that needs `libuct_<name>.so` asks cargo for it (cargo releases its
//! build lock while tests run, so the nested build is safe and a no-op when up to date).
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// `target/<profile>` of this test run (test executables live in `target/<profile>/deps`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps layout")
        .to_path_buf()
}

/// Makes sure `libuct_<name>.so` exists for each crate (`uct-self`, `uct-tcp`, ...) and returns
/// the directory holding them (use it as `RUCX_MODULE_DIR`).
pub fn ensure_plugins(crates: &[&str]) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir();
    let missing: Vec<&str> = crates
        .iter()
        .copied()
        .filter(|c| !dir.join(format!("lib{}.so", c.replace('-', "_"))).exists())
        .collect();
    if !missing.is_empty() {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.arg("build");
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        for c in &missing {
            cmd.args(["-p", c]);
        }
        let st = cmd.status().expect("run cargo");
        assert!(st.success(), "building plugins {missing:?} failed");
    }
    dir
}
