//! The module descriptor, the plugin entry point and its logging bridge.

use super::*;

fn leak_cstr(s: &str) -> *const c_char {
    let c = CString::new(s.replace('\0', " ")).unwrap_or_default();
    Box::leak(c.into_boxed_c_str()).as_ptr()
}

/// Builds a module descriptor (once; modules are never unloaded, so it is leaked).
pub fn build_module(
    name: &'static CStr,
    init: unsafe extern "C" fn(*const RawHostApi) -> RawStatus,
    components: &'static [RawComponent],
    config: &[&'static ucs::config::ConfigTable],
) -> &'static RawModule {
    let fields: Vec<RawConfigField> = config
        .iter()
        .flat_map(|t| t.fields.iter().map(move |f| (t, f)))
        .map(|(t, f)| RawConfigField {
            name: leak_cstr(&format!("{}{}", t.prefix, f.name)),
            default: leak_cstr(f.default),
            doc: leak_cstr(f.doc),
            kind: leak_cstr(&f.kind.spec()),
        })
        .collect();
    let fields: &'static [RawConfigField] = Box::leak(fields.into_boxed_slice());
    Box::leak(Box::new(RawModule {
        abi_version: ABI_VERSION,
        name: name.as_ptr(),
        init,
        num_components: components.len(),
        components: components.as_ptr(),
        num_config: fields.len(),
        config: fields.as_ptr(),
    }))
}

static HOST_LOG: std::sync::OnceLock<(RawLogFn, u8)> = std::sync::OnceLock::new();

fn forward_log(level: u8, target: &str, msg: &str) {
    if let Some((f, max)) = HOST_LOG.get() {
        if level <= *max {
            // SAFETY: the host's log function takes borrowed byte ranges valid for the call.
            unsafe { f(level, target.as_ptr(), target.len(), msg.as_ptr(), msg.len()) }
        }
    }
}

/// The `init` every plugin exports: checks the ABI version and routes this plugin's `tracing`
/// events to the host application's subscriber, filtered by the host's level.
///
/// # Safety
/// `host` must point to a valid [`RawHostApi`].
pub unsafe extern "C" fn plugin_init(host: *const RawHostApi) -> RawStatus {
    guard(|| {
        // SAFETY: the caller passes a valid table.
        let host = unsafe { &*host };
        if host.abi_version != ABI_VERSION {
            return Status::Unsupported.as_raw();
        }
        let _ = HOST_LOG.set((host.log, host.log_level));
        crate::error_context::set_host(host.set_error);
        crate::log_bridge::install_forwarding(forward_log, host.log_level);
        0
    })
}

/// Declares a module: `pub fn module() -> &'static RawModule`, its descriptor, which an
/// application links in with `uct::ContextBuilder::builtin` and a plugin crate publishes with
/// [`export_plugin!`](crate::export_plugin).
///
/// ```ignore
/// uct_transport::declare_module!(tcp, COMPONENTS, [&TCP_CONFIG]);
/// ```
#[macro_export]
macro_rules! declare_module {
    ($name:ident, $components:expr, [$($table:expr),* $(,)?]) => {
        /// This module's descriptor (for registering it as a built-in, or exporting it from a
        /// plugin).
        pub fn module() -> &'static $crate::abi::RawModule {
            static M: std::sync::OnceLock<&'static $crate::abi::RawModule> = std::sync::OnceLock::new();
            M.get_or_init(|| {
                $crate::export::build_module(
                    {
                        const N: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
                            concat!(stringify!($name), "\0").as_bytes(),
                        ) {
                            Ok(c) => c,
                            Err(_) => panic!("bad module name"),
                        };
                        N
                    },
                    $crate::export::plugin_init,
                    &$components,
                    &[$($table),*],
                )
            })
        }
    };
}

/// Defines the entry symbol `rucx_module_<name>` of a plugin library, returning the descriptor
/// of `$module` (a module's `module` function). Used once, by the thin `cdylib` crate that
/// builds `libuct_<name>.so`; the name must match the file's.
///
/// ```ignore
/// uct_transport::export_plugin!(tcp, uct_tcp::module);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($name:ident, $module:path) => {
        /// The plugin entry symbol: returns this module's descriptor (null if building it
        /// panicked).
        #[export_name = concat!("rucx_module_", stringify!($name))]
        pub extern "C" fn __rucx_module_entry() -> *const $crate::abi::RawModule {
            std::panic::catch_unwind($module).map_or(std::ptr::null(), |m| m as *const _)
        }
    };
}
