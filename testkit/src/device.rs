//! The device to test a transport on: a named one, which must exist (`lo`, `memory0`), or the
//! first one the transport reports (hardware names differ per machine, and a host may have
//! none: an RDMA transport on a host without RDMA, the one case a test is skipped).

use ucs::config::Overrides;
use uct::{Context, Md};

/// Which device of a transport.
#[derive(Clone, Copy, Debug)]
pub enum Dev {
    /// This device; its absence is a failure.
    Named(&'static str),
    /// The first device the transport reports, narrowed to the ports of the device that
    /// `RUCX_IB_DEVICE` names (`rxe0`) when it is set. None at all: the caller skips.
    First,
    /// The first device whose name starts with this (`verbs;ofi_rxm/`); none: the caller skips.
    Prefix(&'static str),
}

/// A transport on a device, with the memory domain that has it.
#[derive(Clone)]
pub struct Resource {
    pub tl: String,
    pub dev: String,
    md: Md,
    /// The context's configuration set in code, for the memory domains opened later.
    settings: Overrides,
}

impl Resource {
    /// The memory domain found with the resource.
    pub fn md(&self) -> &Md {
        &self.md
    }

    /// A new memory domain of the resource's component, with the context's configuration.
    pub fn md_open(&self) -> Md {
        self.md
            .component()
            .md_open_with(self.md.name(), &self.settings)
            .unwrap_or_else(|e| panic!("[{}/{}] md_open: {e}", self.tl, self.dev))
    }
}

/// Transport `tl` on `dev` in `ctx`. `None` only for [`Dev::First`] when the transport reports
/// no device; everything else that is missing or fails panics, naming it. Only the components
/// offering `tl` are asked (another plugin failing to open its memory domains must not matter).
pub fn find(ctx: &Context, tl: &str, dev: Dev) -> Option<Resource> {
    let offering: Vec<_> = ctx
        .components()
        .iter()
        .filter(|c| c.transport_names().contains(&tl))
        .collect();
    assert!(
        !offering.is_empty(),
        "no module offers transport {tl}; modules: {:?}",
        ctx.modules()
    );
    let wanted = std::env::var("RUCX_IB_DEVICE").ok().filter(|w| !w.is_empty());
    let mut seen = Vec::new();
    for c in offering {
        let mut names = c
            .md_resources()
            .unwrap_or_else(|e| panic!("{tl}: listing the memory domains of {}: {e}", c.name()));
        // A device the context's configuration enables is not listed (listing sees only the
        // environment): a named one is tried as a memory domain of that name.
        if let Dev::Named(want) = dev {
            if !names.iter().any(|n| n == want) {
                names.push(want.to_owned());
            }
        }
        for name in names {
            // Memory domains that cannot serve are listed with their reason; they hold no
            // resources to test.
            let Ok(md) = c.md_open_with(&name, ctx.settings()) else {
                continue;
            };
            let res = md
                .tl_resources()
                .unwrap_or_else(|e| panic!("{tl}: the resources of memory domain {name}: {e}"));
            for r in res.into_iter().filter(|r| r.tl_name.as_str() == tl) {
                let d = r.dev_name.as_str();
                seen.push(d.to_owned());
                let hit = match dev {
                    Dev::Named(want) => d == want,
                    Dev::First => wanted.as_ref().is_none_or(|w| d.starts_with(&format!("{w}:"))),
                    Dev::Prefix(p) => d.starts_with(p),
                };
                if hit {
                    return Some(Resource {
                        tl: tl.to_owned(),
                        dev: d.to_owned(),
                        md,
                        settings: ctx.settings().clone(),
                    });
                }
            }
        }
    }
    match dev {
        Dev::Named(want) => panic!("transport {tl} has no device {want}; its devices: {seen:?}"),
        Dev::First if !seen.is_empty() => panic!(
            "transport {tl}: RUCX_IB_DEVICE={} names none of its devices {seen:?}",
            wanted.unwrap_or_default()
        ),
        Dev::First | Dev::Prefix(_) => None,
    }
}
