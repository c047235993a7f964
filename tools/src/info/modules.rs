//! `-m`: the modules found (built-in and plugins) and what became of each.

use std::fmt::Write as _;

use uct::{ModuleInfo, ModuleStatus};

/// One line: name, status, location (and the reason for a failure).
pub fn line(m: &ModuleInfo, out: &mut String) {
    let place = m
        .path
        .as_ref()
        .map_or_else(|| "(linked in)".to_string(), |p| p.display().to_string());
    let status = match &m.status {
        ModuleStatus::Builtin => "Builtin",
        ModuleStatus::Loaded => "Loaded",
        ModuleStatus::Shadowed => "Shadowed",
        ModuleStatus::Denied => "Denied",
        ModuleStatus::Failed(_) => "Failed",
    };
    let _ = write!(out, "{:<10} {status:<9} {place}", m.name);
    match &m.status {
        ModuleStatus::Failed(reason) => {
            let _ = writeln!(out, "\n{:21}reason: {reason}", "");
        }
        ModuleStatus::Shadowed => {
            let _ = writeln!(out, " (the built-in {} is used)", m.name);
        }
        ModuleStatus::Denied => {
            let _ = writeln!(out, " (excluded by RUCX_MODULES)");
        }
        _ => out.push('\n'),
    }
}

/// Writes the search path and every module.
pub fn report(modules: &[ModuleInfo], out: &mut String) {
    let dirs: Vec<String> = ucs::module::search_dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let _ = writeln!(
        out,
        "# plugin search path (RUCX_MODULE_DIR, then the executable's directory and its rucx/):"
    );
    for d in &dirs {
        let _ = writeln!(out, "#   {d}");
    }
    let _ = writeln!(out, "# {:<10} {:<9} location", "module", "status");
    if modules.is_empty() {
        let _ = writeln!(out, "# < no modules >");
    }
    for m in modules {
        line(m, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        let mut s = String::new();
        line(
            &ModuleInfo {
                name: "self".into(),
                path: None,
                status: ModuleStatus::Builtin,
            },
            &mut s,
        );
        let failed = ModuleStatus::Failed("missing libibverbs.so.1".into());
        line(
            &ModuleInfo {
                name: "ib".into(),
                path: Some("/x/libuct_ib.so".into()),
                status: failed,
            },
            &mut s,
        );
        assert_eq!(
            s,
            "self       Builtin   (linked in)\nib         Failed    /x/libuct_ib.so\n                     reason: missing libibverbs.so.1\n"
        );
    }
}
