//! Contexts for tests: a transport module linked in, or the plugin (`libuct_<name>.so`) this
//! build produced. A module that is missing or does not load is a failure that says how to
//! build it, never a skip.

use std::path::PathBuf;

use uct::{Context, ContextBuilder, ModuleStatus};

/// Where a transport's code comes from.
#[derive(Clone, Copy, Debug)]
pub enum Modules {
    /// Linked in (`uct_tcp::module`, ...).
    Builtin(fn() -> &'static uct::Module),
    /// Loaded from `libuct_<name>.so`, built by the crate `uct-<name>-plugin` (see
    /// [`plugin_context`] for where it is looked for).
    Plugin(&'static str),
}

/// A context with `m` in it; panics, saying how to build it, when a plugin is missing or
/// fails to load.
pub fn context(m: Modules) -> Context {
    context_with(m, &[])
}

/// [`context`] with configuration set in code (`(name, value)`, names without `RUCX_`), which
/// the memory domains it opens see (a device that configuration enables, for instance).
pub fn context_with(m: Modules, config: &[(&str, &str)]) -> Context {
    match m {
        Modules::Builtin(module) => config
            .iter()
            .fold(
                Context::builder().builtin(module()).plugins(false),
                |b, (k, v)| b.config(k, v),
            )
            .build(),
        Modules::Plugin(name) => plugin_with(name, config),
    }
}

/// A context with only `module`, linked in (no plugins searched).
pub fn builtin(module: &'static uct::Module) -> Context {
    Context::builder().builtin(module).plugins(false).build()
}

/// A context with the plugins [`plugin_context`] finds, in which plugin `name` loaded.
pub fn plugin(name: &str) -> Context {
    plugin_with(name, &[])
}

/// [`plugin`] with configuration set in code.
fn plugin_with(name: &str, config: &[(&str, &str)]) -> Context {
    let ctx = config
        .iter()
        .fold(plugin_context(), |b, (k, v)| b.config(k, v))
        .build();
    match ctx.modules().iter().find(|m| m.name == name) {
        Some(m) if m.status == ModuleStatus::Loaded => ctx,
        Some(m) => panic!(
            "transport module {name} ({}) is {:?}; {}",
            m.path.as_ref().map_or("?".into(), |p| p.display().to_string()),
            m.status,
            build_hint(name)
        ),
        None => panic!(
            "transport module {name}: libuct_{name}.so is in none of {:?}; {}",
            search_dirs(),
            build_hint(name)
        ),
    }
}

/// How to build plugin `name`.
fn build_hint(name: &str) -> String {
    format!("build it with `cargo build --workspace` (or `cargo build -p uct-{name}-plugin`)")
}

/// `target/<profile>` of this build (test executables live in its `deps/`; the directory
/// varies with `CARGO_TARGET_DIR`, so it is derived from the executable's path).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps layout")
        .to_path_buf()
}

/// Where a build puts the plugins: `target/<profile>/deps` (next to the test executables) and
/// `target/<profile>` (where `cargo build` copies them).
pub fn plugin_dirs() -> [PathBuf; 2] {
    let profile = target_dir();
    [profile.join("deps"), profile]
}

/// The folders a plugin context searches: [`plugin_dirs`], then `RUCX_MODULE_DIR`.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = plugin_dirs().to_vec();
    if let Some(env) = std::env::var_os("RUCX_MODULE_DIR") {
        dirs.extend(std::env::split_paths(&env).filter(|d| !d.as_os_str().is_empty()));
    }
    dirs
}

/// This build's `libuct_<name>.so` (the first of [`plugin_dirs`] that has it); panics, saying
/// how to build it, when it was not built.
pub fn plugin_file(name: &str) -> PathBuf {
    let file = format!("libuct_{name}.so");
    plugin_dirs()
        .iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{file} is in neither of {:?}: {}",
                plugin_dirs(),
                build_hint(name)
            )
        })
}

/// A context builder that finds this build's plugins first: `MODULE_DIR` set in code to
/// [`plugin_dirs`], ahead of the folders the user set in `RUCX_MODULE_DIR`.
pub fn plugin_context() -> ContextBuilder {
    let dirs = std::env::join_paths(search_dirs()).expect("plugin folders without ':'");
    let dirs = dirs.into_string().expect("plugin folders named in UTF-8");
    Context::builder().plugins(true).config("MODULE_DIR", &dirs)
}
