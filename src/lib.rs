//! rucx umbrella crate: re-exports the layers and builds the default transport context.
#![forbid(unsafe_code)]
pub use ucp;
pub use ucs;
pub use uct;

/// The transport modules linked into rucx, in priority order. A plugin file with the same name
/// as one of these is listed as shadowed and not loaded.
pub fn builtin_modules() -> Vec<&'static uct::Module> {
    vec![uct_self::module(), uct_tcp::module(), uct_sm::module()]
}

/// A context builder with every built-in module ([`builtin_modules`]) and plugin discovery on;
/// adjust it (e.g. `.plugins(false)`) before `build()`.
pub fn context_builder() -> uct::ContextBuilder {
    // Before the uct context warns about unknown RUCX_* variables: the UCP ones are known.
    ucp::config::register();
    builtin_modules()
        .into_iter()
        .fold(uct::Context::builder(), |b, m| b.builtin(m))
        .plugins(true)
}

/// The default context: built-in modules plus plugins found on disk (`RUCX_MODULE_DIR`, the
/// executable's directory). `RUCX_MODULES` filters both.
pub fn context() -> uct::Context {
    context_builder().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_has_the_builtin_self_transport() {
        let ctx = context_builder().plugins(false).build();
        let m = ctx
            .modules()
            .iter()
            .find(|m| m.name == "self")
            .expect("self module listed");
        assert_eq!(m.status, uct::ModuleStatus::Builtin);
        let (md, res) = ctx.find_resource("self", "memory0").expect("self/memory0 found");
        assert_eq!(res.tl_name.as_str(), "self");
        assert_eq!(md.component().name(), "self");
    }
}
