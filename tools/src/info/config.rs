//! `-c`: every registered config variable with its current value, in `ucx_info -c`'s
//! `NAME=value` form, each preceded by its documentation as `#` comment lines.
//! Call it after building the context, so the modules' tables are registered.

use std::fmt::Write as _;

use ucs::config::ConfigEntry;

/// Formats one variable.
pub fn entry(e: &ConfigEntry, out: &mut String) {
    for doc in e.doc.lines().filter(|l| !l.trim().is_empty()) {
        let _ = writeln!(out, "# {}", doc.trim_end());
    }
    let set = if e.is_set {
        format!(" (set; default: {})", e.default)
    } else {
        String::new()
    };
    let _ = writeln!(out, "# syntax: {}{set}", e.syntax);
    if let Some(err) = &e.error {
        let _ = writeln!(out, "# INVALID: {err}");
    }
    let _ = writeln!(out, "{}={}\n", e.full_name, e.value);
}

/// Writes every variable from [`ucs::config::dump`]; returns how many have invalid values.
pub fn report(out: &mut String) -> usize {
    let all = ucs::config::dump();
    if all.is_empty() {
        let _ = writeln!(out, "# < no configuration variables registered >");
    }
    for e in &all {
        entry(e, out);
    }
    all.iter().filter(|e| e.error.is_some()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_then_assignment() {
        let e = ConfigEntry {
            table: "tcp",
            full_name: "RUCX_TCP_TX_SEG_SIZE".into(),
            value: "64k".into(),
            default: "8k",
            doc: "Size of a send segment.\nLarger values use more memory.",
            syntax: "memory units".into(),
            is_set: true,
            error: None,
        };
        let mut s = String::new();
        entry(&e, &mut s);
        assert_eq!(
            s,
            "# Size of a send segment.\n# Larger values use more memory.\n# syntax: memory units (set; default: 8k)\nRUCX_TCP_TX_SEG_SIZE=64k\n\n"
        );
    }
}
