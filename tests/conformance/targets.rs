//! The transports the suite runs on ("targets"), and the macro that instantiates every test once
//! per target (UCX's `UCT_INSTANTIATE_TEST_CASE`).
//!
//! A target says how to build the [`uct::Context`] (modules linked in, or `.so` plugins found on
//! disk), which transport and device to open, how endpoints connect, and whether sender and
//! receiver share a worker. A target whose module or device is absent is skipped with a printed
//! note, unless it is `required` (the `self` targets), in which case its absence is a failure.
//!
//! Test names read `<module>::<test>::<target>`, so `cargo test --test conformance tcp_lo` runs
//! everything on tcp and `cargo test --test conformance am_short` one test on every target.

use uct::Module as RawModule;

/// Where the transport's code comes from.
#[derive(Clone, Copy, Debug)]
pub enum Modules {
    /// Linked in: `Context::builder().builtin(m()).plugins(false)`.
    Builtin(fn() -> &'static RawModule),
    /// Loaded from `libuct_<module>.so` (`Context::builder().plugins(true)`); the module must
    /// report `ModuleStatus::Loaded`.
    Plugin(&'static str),
}

/// Which device of the transport to open.
#[derive(Clone, Copy, Debug)]
pub enum Dev {
    Named(&'static str),
    /// The first device the transport reports (hardware names differ per machine).
    First,
}

/// Connection model (`UCT_IFACE_FLAG_CONNECT_TO_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connect {
    ToIface,
    ToEp,
}

/// Whether sender and receiver interfaces share a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    Shared,
    Separate,
}

#[derive(Debug)]
pub struct Target {
    pub name: &'static str,
    pub modules: Modules,
    pub tl: &'static str,
    pub dev: Dev,
    pub connect: Connect,
    pub workers: Workers,
    /// Absence is a failure, not a skip.
    pub required: bool,
}

// ================================================================================================
// THE TARGET LIST. To add a transport: add an entry to `TARGETS` and its name to the list in
// `conformance_test!` below (both here, nothing else to change).
//
// tcp: runs linked in (`uct_tcp::module`) and as a plugin (libuct_tcp.so, which the test build
// puts into target/<profile>/deps); both skip with a note when the host has no `lo`.
// rc_verbs/ud_verbs: plugin only. libuct_ib.so is found when it was built into the same target dir
// (`cargo test --workspace` does; `cargo test -p rucx` alone does not, uct-ib not being a
// dependency of the root package) or lies in RUCX_MODULE_DIR; skipped without an RDMA device.
// ================================================================================================
pub static TARGETS: &[Target] = &[
    Target {
        name: "self_builtin",
        modules: Modules::Builtin(uct_self::module),
        tl: "self",
        dev: Dev::Named("memory0"),
        connect: Connect::ToIface,
        workers: Workers::Shared,
        required: true,
    },
    Target {
        name: "self_builtin_2w",
        modules: Modules::Builtin(uct_self::module),
        tl: "self",
        dev: Dev::Named("memory0"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        required: true,
    },
    Target {
        name: "self_plugin",
        modules: Modules::Plugin("self"),
        tl: "self",
        dev: Dev::Named("memory0"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        required: true,
    },
    Target {
        name: "tcp_builtin",
        modules: Modules::Builtin(uct_tcp::module),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        required: false,
    },
    Target {
        name: "tcp_lo_iface",
        modules: Modules::Plugin("tcp"),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        required: false,
    },
    Target {
        name: "tcp_lo_ep",
        modules: Modules::Plugin("tcp"),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToEp,
        workers: Workers::Separate,
        required: false,
    },
    Target {
        name: "rc_verbs",
        modules: Modules::Plugin("ib"),
        tl: "rc_verbs",
        dev: Dev::First,
        connect: Connect::ToEp,
        workers: Workers::Separate,
        required: false,
    },
    Target {
        name: "ud_verbs",
        modules: Modules::Plugin("ib"),
        tl: "ud_verbs",
        dev: Dev::First,
        connect: Connect::ToEp,
        workers: Workers::Separate,
        required: false,
    },
    Target {
        name: "ud_verbs_iface",
        modules: Modules::Plugin("ib"),
        tl: "ud_verbs",
        dev: Dev::First,
        connect: Connect::ToIface,
        workers: Workers::Separate,
        required: false,
    },
];

/// Instantiates `fn $test(&Setup)` (defined in the invoking module) once per target, as
/// `#[test] fn <target>()` inside `mod $test`.
macro_rules! conformance_test {
    ($($test:ident),* $(,)?) => {
        $(
            mod $test {
                per_target!(super::$test;
                    self_builtin self_builtin_2w self_plugin tcp_builtin tcp_lo_iface tcp_lo_ep rc_verbs ud_verbs
                    ud_verbs_iface);
            }
        )*
    };
}
// ================================================================================================

macro_rules! per_target {
    ($f:path; $($target:ident)*) => {
        $(
            #[test]
            fn $target() {
                $crate::fixture::run(stringify!($target), $f);
            }
        )*
    };
}

/// The target called `name`.
pub fn find(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

#[test]
fn target_names_are_unique() {
    for (i, t) in TARGETS.iter().enumerate() {
        assert!(
            TARGETS[..i].iter().all(|o| o.name != t.name),
            "duplicate target {}",
            t.name
        );
    }
}
