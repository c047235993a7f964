//! docs/config.md lists every variable `rucx-info -c` prints, with the same default
//! (regenerate it with scripts/gen-config-doc.sh).
use std::process::Command;

#[test]
fn config_doc_is_current() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rucx-info"));
    cmd.arg("-c");
    for (k, _) in std::env::vars() {
        if k.starts_with("RUCX_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut n = 0;
    for line in text.lines().filter(|l| l.starts_with("RUCX_")) {
        let (name, default) = line.split_once('=').unwrap();
        let row = format!("| `{name}` | `{}` |", default.replace('|', "\\|"));
        assert!(doc.contains(&row), "docs/config.md lacks or has another default for {name} (expected row starting {row}); run scripts/gen-config-doc.sh");
        n += 1;
    }
    assert!(n >= 20, "rucx-info -c printed only {n} variables");
}
