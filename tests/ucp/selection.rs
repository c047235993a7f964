//! Transport selection with every plugin loaded: a resource that duplicates a usable native
//! one (libfabric's `shm` next to posix, `tcp;ofi_rxm/lo` next to tcp/lo) is left out unless
//! `RUCX_TLS` names its transport.

use ucp::{Context, Features};

/// The resources of a context over this build's plugins with `RUCX_TLS=tls`, every device
/// allowed; `None` when nothing is usable.
fn resources(tls: &str) -> Option<Vec<String>> {
    let uct = rucx_testkit::modules::plugin_context().build();
    Context::builder(uct)
        .features(Features::AM)
        .config("TLS", tls)
        .config("NET_DEVICES", "all")
        .config("SHM_DEVICES", "all")
        .build()
        .ok()
        .map(|c| c.resource_names())
}

fn has(names: &[String], r: &str) -> bool {
    names.iter().any(|n| n == r)
}

#[test]
fn duplicates_are_left_out_unless_named() {
    let Some(ofi) = resources("ofi") else {
        println!("SKIP no ofi device (libuct_ofi.so not built, or libfabric offers nothing)");
        return;
    };
    let all = resources("all").expect("native transports");
    // Which ofi devices duplicate which native resource (uct-ofi's device::duplicate_of).
    let pairs = [("ofi/shm", "posix/memory"), ("ofi/tcp;ofi_rxm/lo", "tcp/lo")];
    let mut checked = 0;
    for (dup, native) in pairs {
        if !has(&ofi, dup) || !has(&all, native) {
            continue;
        }
        checked += 1;
        assert!(!has(&all, dup), "RUCX_TLS=all: {dup} next to {native}: {all:?}");
        let deny = resources("^ud").unwrap();
        assert!(!has(&deny, dup), "RUCX_TLS=^ud: {dup} next to {native}: {deny:?}");
        let named = resources(&format!("{},ofi", native.split('/').next().unwrap())).unwrap();
        assert!(
            has(&named, dup) && has(&named, native),
            "RUCX_TLS names ofi: {dup} is there: {named:?}"
        );
        // Without the native resource the duplicate is what serves the device.
        let without = resources(&format!("^{}", native.split('/').next().unwrap())).unwrap();
        assert!(has(&without, dup), "native denied: {dup} is there: {without:?}");
    }
    // Devices that duplicate nothing stay (none here but verbs, efa, ...).
    for r in ofi.iter().filter(|r| !pairs.iter().any(|(d, _)| d == r)) {
        if !r.contains("tcp") && !r.contains("udp") && !r.contains("sockets") {
            assert!(has(&all, r), "{r} duplicates nothing: {all:?}");
        }
    }
    println!("{checked} duplicate pairs checked; RUCX_TLS=all: {all:?}");
}

/// RUCX_TLS naming only native transports: no ofi resource (its component is not even asked for
/// devices).
#[test]
fn unselected_plugin_gives_no_resource() {
    let names = resources("tcp,posix,self").expect("native transports");
    assert!(names.iter().all(|n| !n.starts_with("ofi/")), "{names:?}");
}
