//! `rucx-info`: the report sections (`-v`, `-d`, `-c`, `-m`, `-e`), each written into a `String` so
//! they can be tested without running the binary.

pub mod config;
pub mod devices;
pub mod modules;
pub mod ucp;
pub mod units;

use std::fmt::Write as _;

/// `-v`: version, plugin ABI version and the modules linked in.
pub fn version(ctx: &uct::Context, out: &mut String) {
    let builtin: Vec<&str> = ctx
        .modules()
        .iter()
        .filter(|m| m.status == uct::ModuleStatus::Builtin)
        .map(|m| m.name.as_str())
        .collect();
    let _ = writeln!(out, "# rucx version {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(out, "# plugin ABI version {}", uct::PLUGIN_ABI_VERSION);
    let _ = writeln!(out, "# built-in modules: {}", builtin.join(", "));
}
