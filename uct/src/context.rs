//! The module registry: built-in transports plus `.so` plugins found on disk.
//!
//! Lookup order for plugins (`libuct_<name>.so`, entry symbol `rucx_module_<name>`):
//! `RUCX_MODULE_DIR` (colon list), then the running executable's directory and its `rucx/`
//! subfolder. `RUCX_MODULES` (allow list, `^` denies) filters by module name, built-ins included.
//! When a built-in and a plugin have the same name, the built-in wins and the plugin is listed as
//! shadowed: the linked-in code is what the application was built and tested with.
//! A plugin that cannot be used (not a shared library, missing dependency such as
//! `libibverbs.so.1`, no entry symbol, other ABI version, init failure) is skipped with one
//! `warn` line naming the file and the reason; everything else keeps working.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use ucs::config::Overrides;
use ucs::{Error, Result, Status};

use crate::component::{cstr, Component, Md};
use uct_transport::abi::{self, RawConfigField, RawHostApi, RawModule, ABI_VERSION};
use uct_transport::types::TlResource;

/// How a module was obtained, or why it is not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleStatus {
    /// Linked into the application.
    Builtin,
    /// Loaded from a plugin file.
    Loaded,
    /// A plugin with the name of a built-in module; the built-in is used.
    Shadowed,
    /// Excluded by `RUCX_MODULES`.
    Denied,
    /// Could not be used; the reason says why and what to do.
    Failed(String),
}

/// One module found (or linked in).
#[derive(Clone, Debug)]
pub struct ModuleInfo {
    /// The module's name, e.g. `tcp` (its plugin is `libuct_<name>.so`).
    pub name: String,
    /// The plugin file it was loaded (or failed to load) from; `None` when linked in.
    pub path: Option<PathBuf>,
    /// Linked in, loaded, shadowed or failed (and why).
    pub status: ModuleStatus,
}

/// A config variable some module reads (for `rucx-info -c`).
#[derive(Clone, Debug)]
pub struct ModuleConfigVar {
    /// The module declaring it.
    pub module: String,
    /// The variable's name, as the module's table declares it.
    pub name: String,
    /// Default value.
    pub default: String,
    /// One-line description.
    pub doc: String,
    /// The value's syntax (as [`ucs::config::ConfigKind::spec`] writes it).
    pub kind: String,
}

/// The set of usable components. `Send + Sync`: it only refers to `'static` module tables.
///
/// ```
/// // The self transport linked in, no plugins; configuration set in code wins over RUCX_*.
/// let ctx = uct::Context::builder()
///     .builtin(uct_self::module())
///     .plugins(false)
///     .config("SELF_SEG_SIZE", "16k")
///     .build();
/// let (md, res) = ctx.find_resource("self", "memory0")?;
/// assert_eq!((md.name(), res.tl_name.as_str()), ("self", "self"));
/// // Asking for what is not there says what to do.
/// let e = ctx.find_resource("tcp", "eth9").unwrap_err();
/// assert_eq!(e, uct::Status::NoDevice);
/// assert!(e.context().unwrap().contains("rucx-info -d"));
/// # Ok::<(), uct::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    modules: Vec<ModuleInfo>,
    components: Vec<Component>,
    vars: Vec<ModuleConfigVar>,
    /// Configuration set in code, for every memory domain and interface opened through it.
    settings: Overrides,
}

/// Builds a [`Context`].
pub struct ContextBuilder {
    builtins: Vec<&'static RawModule>,
    plugins: bool,
    settings: Overrides,
}

fn host_api() -> &'static RawHostApi {
    static API: OnceLock<RawHostApi> = OnceLock::new();
    API.get_or_init(|| {
        let level = match ucs::log::max_level().into_level() {
            None => 0,
            Some(tracing::Level::ERROR) => 1,
            Some(tracing::Level::WARN) => 2,
            Some(tracing::Level::INFO) => 3,
            Some(tracing::Level::DEBUG) => 4,
            Some(tracing::Level::TRACE) => 5,
        };
        RawHostApi {
            abi_version: ABI_VERSION,
            log_level: level,
            log: crate::host::host_log,
            set_error: crate::host::host_set_error,
        }
    })
}

fn config_vars(m: &RawModule) -> &'static [RawConfigField] {
    if m.num_config == 0 || m.config.is_null() {
        return &[];
    }
    // SAFETY: the descriptor points to `num_config` 'static entries.
    unsafe { std::slice::from_raw_parts(m.config, m.num_config) }
}

fn components(m: &'static RawModule) -> &'static [abi::RawComponent] {
    if m.num_components == 0 || m.components.is_null() {
        return &[];
    }
    // SAFETY: the descriptor points to `num_components` 'static entries.
    unsafe { std::slice::from_raw_parts(m.components, m.num_components) }
}

impl ContextBuilder {
    /// Adds a linked-in module (`uct_tcp::module()`, ...).
    pub fn builtin(mut self, m: &'static RawModule) -> Self {
        self.builtins.push(m);
        self
    }

    /// Whether to look for plugins on disk (default: yes).
    pub fn plugins(mut self, yes: bool) -> Self {
        self.plugins = yes;
        self
    }

    /// Sets configuration variable `name` (with or without `RUCX_`, e.g. `TCP_SNDBUF`,
    /// `MODULES`) for this context: it wins over the environment for the modules it loads and
    /// every memory domain and interface opened through it (an interface's own
    /// [`IfaceParams::config`](crate::IfaceParams::config) wins over it). UCX's
    /// `ucp_config_modify`. Names are checked when a memory domain or interface is opened.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.settings.set(name, value);
        self
    }

    /// Builds the context.
    pub fn build(self) -> Context {
        let mut ctx = Context {
            modules: Vec::new(),
            components: Vec::new(),
            vars: Vec::new(),
            settings: self.settings,
        };
        for m in self.builtins {
            let name = cstr(m.name);
            if !ucs::module::allowed_with(name, &ctx.settings) {
                ctx.modules.push(ModuleInfo {
                    name: name.into(),
                    path: None,
                    status: ModuleStatus::Denied,
                });
                continue;
            }
            ctx.add(name, None, m, ModuleStatus::Builtin);
        }
        if self.plugins {
            for (name, path) in
                ucs::module::find_in(&ucs::module::search_dirs_with(&ctx.settings), "libuct_", ".so")
            {
                let status = if ctx
                    .modules
                    .iter()
                    .any(|i| i.name == name && i.status == ModuleStatus::Builtin)
                {
                    ucs::info!(module = %name, path = %path.display(), "plugin shadowed by the built-in module of the same name");
                    ModuleStatus::Shadowed
                } else if !ucs::module::allowed_with(&name, &ctx.settings) {
                    ModuleStatus::Denied
                } else {
                    match load_plugin(&name, &path) {
                        Ok(m) => {
                            ctx.add(&name, Some(path), m, ModuleStatus::Loaded);
                            continue;
                        }
                        Err(reason) => {
                            ucs::warn!("skipping plugin {}: {reason}", path.display());
                            ModuleStatus::Failed(reason)
                        }
                    }
                };
                ctx.modules.push(ModuleInfo {
                    name,
                    path: Some(path),
                    status,
                });
            }
        }
        ctx.register_config();
        ctx
    }
}

fn load_plugin(name: &str, path: &std::path::Path) -> std::result::Result<&'static RawModule, String> {
    let lib: &'static libloading::Library = ucs::module::open(path).map_err(|e| e.to_string())?;
    let sym = abi::entry_symbol(name);
    // SAFETY: the entry symbol of a rucx plugin has this signature; a file that merely has the
    // name is caught by the ABI version check below before anything else is used.
    let entry: libloading::Symbol<unsafe extern "C" fn() -> *const RawModule> =
        unsafe { lib.get(sym.as_bytes()) }.map_err(|_| format!("not a rucx plugin (no symbol {sym})"))?;
    // SAFETY: calling the plugin's entry point, which catches its own panics.
    let m = unsafe { entry() };
    if m.is_null() {
        return Err("the entry point returned no module descriptor".into());
    }
    // SAFETY: non-null descriptor pointer into the never-unloaded library.
    let m: &'static RawModule = unsafe { &*m };
    if m.abi_version != ABI_VERSION {
        return Err(format!(
            "ABI version {} but this program speaks {ABI_VERSION}: rebuild the plugin with the same rucx version",
            m.abi_version
        ));
    }
    if cstr(m.name) != name {
        return Err(format!(
            "descriptor names module {:?}, file names {name:?}",
            cstr(m.name)
        ));
    }
    // SAFETY: version checked; init catches panics on its side.
    let st = unsafe { (m.init)(host_api()) };
    if st != 0 {
        return Err(format!("initialisation failed: {}", Status::from_raw(st)));
    }
    Ok(m)
}

impl Context {
    /// A builder with no built-ins.
    pub fn builder() -> ContextBuilder {
        ContextBuilder {
            builtins: Vec::new(),
            plugins: true,
            settings: Overrides::new(),
        }
    }

    fn add(&mut self, name: &str, path: Option<PathBuf>, m: &'static RawModule, status: ModuleStatus) {
        let module: &'static str = cstr(m.name);
        for c in components(m) {
            self.components.push(Component { raw: c, module });
        }
        for f in config_vars(m) {
            self.vars.push(ModuleConfigVar {
                module: name.into(),
                name: cstr(f.name).into(),
                default: cstr(f.default).into(),
                doc: cstr(f.doc).into(),
                kind: cstr(f.kind).into(),
            });
        }
        self.modules.push(ModuleInfo {
            name: name.into(),
            path,
            status,
        });
    }

    /// Makes the modules' variables known to `ucs::config` (dump, unknown-variable warnings).
    fn register_config(&self) {
        for m in &self.modules {
            let fields: Vec<_> = self
                .vars
                .iter()
                .filter(|v| v.module == m.name)
                .map(|v| ucs::config::DynField::new(&v.name, &v.default, &v.doc, &v.kind))
                .collect();
            if !fields.is_empty() {
                let _ = ucs::config::register_dynamic(&m.name, "", fields);
            }
        }
        ucs::config::warn_unknown_env_vars();
    }

    /// Every module found, with its status.
    pub fn modules(&self) -> &[ModuleInfo] {
        &self.modules
    }

    /// Usable components.
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    /// Config variables declared by the modules.
    pub fn config_vars(&self) -> &[ModuleConfigVar] {
        &self.vars
    }

    /// The configuration set in code with [`ContextBuilder::config`].
    pub fn settings(&self) -> &Overrides {
        &self.settings
    }

    /// The component named `name`.
    pub fn component(&self, name: &str) -> Option<Component> {
        self.components.iter().copied().find(|c| c.name() == name)
    }

    /// Finds transport `tl` on device `dev`: opens the memory domain that has it.
    pub fn find_resource(&self, tl: &str, dev: &str) -> Result<(Md, TlResource)> {
        for c in &self.components {
            if !c.transport_names().contains(&tl) {
                continue;
            }
            for md_name in c.md_resources()? {
                // A memory domain a module lists but cannot open (a device that cannot serve,
                // listed with its reason) does not hide the others.
                let md = match c.md_open_with(&md_name, &self.settings) {
                    Ok(md) => md,
                    Err(e) => {
                        ucs::debug!("{}: memory domain {md_name} not used: {e}", c.name());
                        continue;
                    }
                };
                if let Some(r) = md
                    .tl_resources()?
                    .into_iter()
                    .find(|r| r.tl_name.as_str() == tl && r.dev_name.as_str() == dev)
                {
                    return Ok((md, r));
                }
            }
        }
        if self.components.is_empty() {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "no transport {tl} on device {dev}: this context has no transport modules (add \
                     built-ins with ContextBuilder::builtin, e.g. rucx::context_builder(), or let it \
                     find plugins)"
                ),
            ));
        }
        Err(Error::new(
            Status::NoDevice,
            format!("no transport {tl} on device {dev}: rucx-info -d lists the transports and devices"),
        ))
    }

    /// Every (memory domain, resource) pair, opening each memory domain once.
    pub fn resources(&self) -> Result<Vec<(Md, TlResource)>> {
        let mut out = Vec::new();
        for c in &self.components {
            for md_name in c.md_resources()? {
                let md = match c.md_open_with(&md_name, &self.settings) {
                    Ok(md) => md,
                    Err(e) => {
                        ucs::debug!("{}: memory domain {md_name} not used: {e}", c.name());
                        continue;
                    }
                };
                for r in md.tl_resources()? {
                    out.push((md.clone(), r));
                }
            }
        }
        Ok(out)
    }
}
