//! The transports the suite runs on ("targets"), and the macro that instantiates every test once
//! per target (UCX's `UCT_INSTANTIATE_TEST_CASE`).
//!
//! A target says where the transport's code comes from (linked in, or the `.so` plugin this
//! build produced), which transport and device to open, how endpoints connect, and whether
//! sender and receiver share a worker; the test kit (`rucx-testkit`) opens it. A target whose
//! module is missing or does not load fails, saying how to build it. Only a target on hardware
//! (`Dev::First`) may find no device on a host (RDMA targets on a host without RDMA): it is
//! skipped with a printed note.
//!
//! Test names read `<module>::<test>::<target>`, so `cargo test --test conformance tcp_lo` runs
//! everything on tcp and `cargo test --test conformance am_short` one test on every target.

use rucx_testkit::{device, modules, Connect, Dev, Modules, Setup, Workers};
use uct::ModuleStatus;

#[derive(Debug)]
pub struct Target {
    pub name: &'static str,
    pub modules: Modules,
    pub tl: &'static str,
    pub dev: Dev,
    pub connect: Connect,
    pub workers: Workers,
    /// Configuration set in code for every interface, unless the environment sets the variable
    /// (`RUCX_<name>`).
    pub defaults: &'static [(&'static str, &'static str)],
}

// ================================================================================================
// THE TARGET LIST. To add a transport: add an entry to `TARGETS` and its name to the list in
// `conformance_test!` below (both here, nothing else to change).
//
// self and tcp (on `lo`, which every host has) are required: linked in, and as plugins
// (libuct_self.so, libuct_tcp.so from `cargo build`).
// posix, sysv and cma (shared memory, device `memory`): linked in, and as the libuct_sm.so plugin.
// rc_verbs/ud_verbs: plugin only (libuct_ib.so from `cargo build --workspace` or
// `cargo build -p uct-ib-plugin`); skipped on a host without an RDMA device. ud_verbs declares a
// silent peer dead after UD_TIMEOUT (30 s by default): 2 s keeps it well inside the suite's
// deadline (`rucx_testkit::DEADLINE`), so the peer-failure tests can see it.
// ofi_*: plugin only (libuct_ofi.so, `cargo build -p uct-ofi-plugin`, needs libfabric);
// tcp;ofi_rxm and shm exist wherever libfabric does; verbs;ofi_rxm only with an RDMA device
// (skipped elsewhere; runs in the soft-RoCE VM). ofi_*_msg: the connected (FI_EP_MSG) devices,
// tcp's enabled by the target's configuration.
// ================================================================================================
pub static TARGETS: &[Target] = &[
    Target {
        name: "self_builtin",
        modules: Modules::Builtin(uct_self::module),
        tl: "self",
        dev: Dev::Named("memory0"),
        connect: Connect::ToIface,
        workers: Workers::Shared,
        defaults: &[],
    },
    Target {
        name: "self_builtin_2w",
        modules: Modules::Builtin(uct_self::module),
        tl: "self",
        dev: Dev::Named("memory0"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "self_plugin",
        modules: Modules::Plugin("self"),
        tl: "self",
        dev: Dev::Named("memory0"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "tcp_builtin",
        modules: Modules::Builtin(uct_tcp::module),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "tcp_builtin_1w",
        modules: Modules::Builtin(uct_tcp::module),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToIface,
        workers: Workers::Shared,
        defaults: &[],
    },
    Target {
        name: "tcp_builtin_ep_1w",
        modules: Modules::Builtin(uct_tcp::module),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToEp,
        workers: Workers::Shared,
        defaults: &[],
    },
    Target {
        name: "tcp_lo_iface",
        modules: Modules::Plugin("tcp"),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "tcp_lo_ep",
        modules: Modules::Plugin("tcp"),
        tl: "tcp",
        dev: Dev::Named("lo"),
        connect: Connect::ToEp,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "posix_builtin",
        modules: Modules::Builtin(uct_sm::module),
        tl: "posix",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "posix_builtin_1w",
        modules: Modules::Builtin(uct_sm::module),
        tl: "posix",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Shared,
        defaults: &[],
    },
    Target {
        name: "posix_plugin",
        modules: Modules::Plugin("sm"),
        tl: "posix",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "sysv_builtin",
        modules: Modules::Builtin(uct_sm::module),
        tl: "sysv",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "sysv_plugin",
        modules: Modules::Plugin("sm"),
        tl: "sysv",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "cma_builtin",
        modules: Modules::Builtin(uct_sm::module),
        tl: "cma",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "cma_plugin",
        modules: Modules::Plugin("sm"),
        tl: "cma",
        dev: Dev::Named("memory"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "rc_verbs",
        modules: Modules::Plugin("ib"),
        tl: "rc_verbs",
        dev: Dev::First,
        connect: Connect::ToEp,
        workers: Workers::Separate,
        defaults: &[],
    },
    Target {
        name: "ud_verbs",
        modules: Modules::Plugin("ib"),
        tl: "ud_verbs",
        dev: Dev::First,
        connect: Connect::ToEp,
        workers: Workers::Separate,
        defaults: &[("UD_TIMEOUT", "2s")],
    },
    Target {
        name: "ud_verbs_iface",
        modules: Modules::Plugin("ib"),
        tl: "ud_verbs",
        dev: Dev::First,
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[("UD_TIMEOUT", "2s")],
    },
    Target {
        name: "ofi_tcp",
        modules: Modules::Plugin("ofi"),
        tl: "ofi",
        dev: Dev::Named("tcp;ofi_rxm/lo"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[("OFI_PEER_TIMEOUT", "2s")],
    },
    Target {
        name: "ofi_shm",
        modules: Modules::Plugin("ofi"),
        tl: "ofi",
        dev: Dev::Named("shm"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[("OFI_PEER_TIMEOUT", "2s")],
    },
    Target {
        name: "ofi_verbs",
        modules: Modules::Plugin("ofi"),
        tl: "ofi",
        dev: Dev::Prefix("verbs;ofi_rxm/"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[("OFI_PEER_TIMEOUT", "2s")],
    },
    Target {
        name: "ofi_tcp_msg",
        modules: Modules::Plugin("ofi"),
        tl: "ofi",
        dev: Dev::Named("tcp/lo"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        // tcp's connected endpoints are off by default (tcp;ofi_rxm serves tcp)
        defaults: &[("OFI_PROVIDER", "tcp")],
    },
    Target {
        name: "ofi_verbs_msg",
        modules: Modules::Plugin("ofi"),
        tl: "ofi",
        dev: Dev::Prefix("verbs/"),
        connect: Connect::ToIface,
        workers: Workers::Separate,
        defaults: &[],
    },
];

/// Instantiates `fn $test(&Setup)` (defined in the invoking module) once per target, as
/// `#[test] fn <target>()` inside `mod $test`.
macro_rules! conformance_test {
    ($($test:ident),* $(,)?) => {
        $(
            mod $test {
                per_target!(super::$test;
                    self_builtin self_builtin_2w self_plugin tcp_builtin tcp_builtin_1w tcp_builtin_ep_1w
                    tcp_lo_iface tcp_lo_ep posix_builtin posix_builtin_1w posix_plugin sysv_builtin
                    sysv_plugin cma_builtin cma_plugin rc_verbs ud_verbs ud_verbs_iface ofi_tcp ofi_shm
                    ofi_verbs ofi_tcp_msg ofi_verbs_msg);
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
                $crate::targets::run(stringify!($target), $f);
            }
        )*
    };
}

/// The target called `name`.
pub fn find(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

impl Target {
    /// The target opened: its module (which must be there), its device (`None`, after a note,
    /// when a `Dev::First` target finds none on this host) and layout.
    pub fn setup(&'static self) -> Option<Setup> {
        let config: Vec<(&str, &str)> = self
            .defaults
            .iter()
            .filter(|(var, _)| std::env::var_os(format!("RUCX_{var}")).is_none())
            .copied()
            .collect();
        // the memory domains see the target's configuration too (OFI_PROVIDER enables devices)
        let ctx = modules::context_with(self.modules, &config);
        let Some(res) = device::find(&ctx, self.tl, self.dev) else {
            println!(
                "SKIP [{}] target unavailable: no {} device on this host",
                self.name, self.tl
            );
            return None;
        };
        let setup = Setup::new(self.name, res).layout(self.connect, self.workers);
        Some(config.iter().fold(setup, |s, (var, value)| s.config(var, value)))
    }
}

/// Runs `test` on the target called `name` (skipping with a note when its device is absent).
pub fn run(name: &str, test: fn(&Setup)) {
    let t = find(name).unwrap_or_else(|| panic!("target {name} is instantiated but not in TARGETS"));
    if let Some(s) = t.setup() {
        test(&s);
    }
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

/// The `.so` the plugin targets use is the one this test build produced.
#[test]
fn self_plugin_comes_from_the_test_build() {
    let ctx = modules::plugin("self");
    let m = ctx
        .modules()
        .iter()
        .find(|m| m.name == "self")
        .expect("self plugin found");
    let path = m.path.as_ref().expect("plugin path").canonicalize().unwrap();
    assert_eq!(
        path,
        modules::plugin_file("self").canonicalize().unwrap(),
        "loaded from elsewhere"
    );
    // Built in and plugin side by side: the built-in wins, the plugin is listed as shadowed.
    let both = modules::plugin_context().builtin(uct_self::module()).build();
    let st: Vec<_> = both
        .modules()
        .iter()
        .filter(|m| m.name == "self")
        .map(|m| m.status.clone())
        .collect();
    assert_eq!(st, vec![ModuleStatus::Builtin, ModuleStatus::Shadowed]);
}
