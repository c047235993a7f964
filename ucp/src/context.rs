//! The UCP context: the features an application wants, and the transport resources it may
//! use — every resource of the uct context's modules (built-in and plugins alike) that
//! `RUCX_TLS`, `RUCX_NET_DEVICES` and `RUCX_SHM_DEVICES` allow.
//!
//! `Send + Sync`: it holds names and the uct context (static module tables) only; each worker
//! opens its own memory domains and interfaces.

use std::sync::Arc;

use ucs::config::Overrides;
use ucs::{Error, Result, Status};
use uct::DeviceType;

use crate::config::{self, Allowed, TlsFilter, UcpConfig};

/// The features an application will use (UCX's `UCP_FEATURE_*`), combined with `|` and given
/// to [`ContextBuilder::features`] (default: [`Features::AM`]).
///
/// They choose what lane selection looks for (RMA and atomic lanes are only selected when
/// asked for) and which operations a worker of the context accepts: an operation of a feature
/// the context was built without fails with [`Status::Unsupported`] and a message naming the
/// missing feature (UCX's parameter checks answer `UCS_ERR_INVALID_PARAM` there; rucx treats it
/// as an operation the context does not support, as it does for transports without it).
/// Resources that cannot serve a wanted feature are still opened; lane selection picks the
/// ones that can.
///
/// ```
/// use ucp::Features;
///
/// let f = Features::AM | Features::TAG;
/// assert!(f.contains(Features::TAG));
/// assert!(!f.contains(Features::TAG | Features::RMA));
/// assert_eq!(format!("{f:?}"), "Features(AM | TAG)");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(u32);

impl Features {
    /// Active messages: [`Ep::am_send`](crate::Ep::am_send) /
    /// [`am_send_owned`](crate::Ep::am_send_owned) and
    /// [`Worker::am_recv_data`](crate::Worker::am_recv_data). Handlers
    /// ([`Worker::set_am_handler`](crate::Worker::set_am_handler)) can be installed either way;
    /// they run for messages peers send.
    pub const AM: Features = Features(1);
    /// Tag matching: [`Ep::tag_send`](crate::Ep::tag_send) and its variants,
    /// [`Worker::tag_recv`](crate::Worker::tag_recv) and
    /// [`tag_msg_recv`](crate::Worker::tag_msg_recv).
    pub const TAG: Features = Features(2);
    /// Remote memory access: [`Ep::put`](crate::Ep::put) / [`Ep::get`](crate::Ep::get);
    /// lanes for put/get are selected. [`Worker::mem_map`](crate::Worker::mem_map) and
    /// [`Ep::rkey_unpack`](crate::Ep::rkey_unpack) need this or one of the atomic features.
    pub const RMA: Features = Features(4);
    /// 32-bit atomic operations ([`crate::rma`]); an atomic lane is selected.
    pub const AMO32: Features = Features(8);
    /// 64-bit atomic operations ([`crate::rma`]); an atomic lane is selected.
    pub const AMO64: Features = Features(16);
    /// Sleeping until the worker has work: `Worker::{event_fd, arm, wait, waker}`. Interfaces
    /// without an event fd are then not opened (a warning names them), except those without
    /// active messages whose RMA needs no software at the peer (cma): they still move
    /// rendezvous data and RMA, whose announcements and completions travel on lanes with an
    /// event fd. Self needs none.
    pub const WAKEUP: Features = Features(32);
    /// Byte streams: [`Ep::stream_send`](crate::Ep::stream_send) and
    /// [`Ep::stream_recv`](crate::Ep::stream_recv).
    pub const STREAM: Features = Features(64);
    /// No feature: the check of operations every context has (flush).
    pub(crate) const NONE: Features = Features(0);

    /// Every feature with its name, in bit order.
    const NAMED: [(&'static str, Features); 7] = [
        ("AM", Features::AM),
        ("TAG", Features::TAG),
        ("RMA", Features::RMA),
        ("AMO32", Features::AMO32),
        ("AMO64", Features::AMO64),
        ("WAKEUP", Features::WAKEUP),
        ("STREAM", Features::STREAM),
    ];

    /// True when every feature of `other` is in `self`.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// `Ok` when `self` has `want`, else the `Unsupported` error of operation `what`: the check
    /// an operation of feature `want` makes first (a bit test; the message is built only on
    /// failure).
    #[inline]
    pub(crate) fn require(self, want: Features, what: &str) -> Result<()> {
        if self.contains(want) {
            Ok(())
        } else {
            Err(self.missing(want, what))
        }
    }

    /// The names of the features, `AM | TAG` (`none` for the empty set).
    fn names(self) -> String {
        let mut names: Vec<String> = Features::NAMED
            .iter()
            .filter(|(_, x)| self.contains(*x))
            .map(|(n, _)| n.to_string())
            .collect();
        let rest = self.0 & !Features::NAMED.iter().fold(0, |a, (_, x)| a | x.0);
        if rest != 0 {
            names.push(format!("{rest:#x}"));
        }
        if names.is_empty() {
            return "none".into();
        }
        names.join(" | ")
    }

    #[cold]
    fn missing(self, want: Features, what: &str) -> Error {
        Error::new(
            Status::Unsupported,
            format!(
                "ucp: {what} needs Features::{}, and the context was built with {} \
                 (ContextBuilder::features)",
                want.names(),
                self.names()
            ),
        )
    }
}

impl std::fmt::Debug for Features {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Features({})", self.names())
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, o: Features) -> Features {
        Features(self.0 | o.0)
    }
}

/// One usable transport resource: where to open it, and whether it may carry only wireup.
#[derive(Clone, Debug)]
pub(crate) struct Resource {
    pub component: uct::Component,
    pub md_name: String,
    pub tl_name: String,
    pub dev_name: String,
    pub dev_type: DeviceType,
    /// Allowed by `RUCX_TLS` only as an auxiliary transport (wireup), e.g. ud_verbs under `rc`.
    pub aux_only: bool,
}

pub(crate) struct ContextInner {
    /// The modules the resources come from (kept loaded with the context).
    pub _uct: uct::Context,
    pub features: Features,
    pub cfg: UcpConfig,
    /// Configuration set in code, for the memory domains and interfaces the workers open.
    pub settings: Overrides,
    pub resources: Vec<Resource>,
}

/// A UCP context: the features the application uses and the transport resources its workers
/// open. Cheap to clone; `Send + Sync` (one context serves the workers of every thread).
///
/// Built over a uct context, which holds the transport modules: `rucx::context()` (the umbrella
/// crate) has every built-in transport and the plugins found on disk. `RUCX_TLS`,
/// `RUCX_NET_DEVICES` and `RUCX_SHM_DEVICES` (or [`ContextBuilder::config`]) choose among
/// their resources; [`ContextBuilder::build`] fails with `NoDevice` when none is left, and
/// with `InvalidParam` for a configuration value that does not parse.
///
/// ```
/// use ucp::{Context, Features, Status};
///
/// // The self (loopback) and tcp transports, linked in; `rucx::context()` in an application.
/// let uct = uct::Context::builder()
///     .builtin(uct_self::module())
///     .builtin(uct_tcp::module())
///     .plugins(false)
///     .build();
/// let ctx = Context::builder(uct.clone())
///     .features(Features::AM | Features::TAG)
///     .config("TLS", "self,tcp") // RUCX_TLS, for this context only
///     .config("NET_DEVICES", "lo")
///     .build()?;
/// assert!(ctx.features().contains(Features::TAG));
/// assert!(ctx.resource_names().iter().any(|r| r == "tcp/lo"));
///
/// // Nothing left to use: NoDevice, and the message lists what there was.
/// let Err(e) = Context::builder(uct).config("TLS", "posix").build() else {
///     panic!("posix is not among the modules")
/// };
/// assert_eq!(e, Status::NoDevice);
/// # Ok::<(), ucp::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

/// Builds a [`Context`] over a uct context (e.g. `rucx::context()`).
pub struct ContextBuilder {
    uct: uct::Context,
    features: Features,
    settings: Overrides,
}

impl ContextBuilder {
    /// The features the application uses (default: AM).
    pub fn features(mut self, f: Features) -> Self {
        self.features = f;
        self
    }

    /// Sets configuration variable `name` (e.g. `TLS`, `RNDV_THRESH`, `TCP_SNDBUF`; with or
    /// without `RUCX_`) for this context: it wins over the environment for the context, its
    /// workers and their interfaces (UCX's `ucp_config_modify`).
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.settings.set(name, value);
        self
    }

    /// Reads the configuration and finds the usable resources. `NoDevice` (naming `RUCX_TLS`
    /// and the resources seen) when none is left.
    pub fn build(self) -> Result<Context> {
        config::register();
        ucs::config::check_known(&self.settings)?;
        let cfg = UcpConfig::read(&self.settings)?;
        if cfg.rndv_scheme == crate::config::RndvScheme::PutZcopy {
            return Err(Error::new(
                Status::Unsupported,
                "ucp: RUCX_RNDV_SCHEME=put_zcopy is not implemented; use auto, get_zcopy or am",
            ));
        }
        let tls = TlsFilter::parse(&cfg.tls)?;
        let net = ucs::config::NET_TABLE
            .with(&self.settings)
            .get_allow_list("NET_DEVICES")?;
        let mut resources = Vec::new();
        // Per resource: the `transport/device` it duplicates, if it says so.
        let mut dups: Vec<Option<String>> = Vec::new();
        let mut seen = Vec::new();
        for c in self.uct.components() {
            // A component none of whose transports RUCX_TLS can select is not asked for its
            // memory domains: querying them initializes what it wraps (libfabric's providers,
            // for ofi), which then costs the transports in use.
            let tls_names = c.transport_names();
            if !tls_names.is_empty() && tls_names.iter().all(|t| tls.allows(t) == Allowed::No) {
                ucs::debug!(
                    "ucp: component {}: RUCX_TLS={} selects none of its transports",
                    c.name(),
                    cfg.tls_spec
                );
                continue;
            }
            let names = match c.md_resources() {
                Ok(n) => n,
                Err(e) => {
                    ucs::debug!("ucp: component {}: {e}", c.name());
                    continue;
                }
            };
            for md_name in names {
                let md = match c.md_open_with(&md_name, &self.settings) {
                    Ok(md) => md,
                    Err(e) => {
                        ucs::debug!("ucp: memory domain {md_name}: {e}");
                        continue;
                    }
                };
                for r in md.tl_resources().unwrap_or_default() {
                    let (tl, dev) = (r.tl_name.as_str(), r.dev_name.as_str());
                    seen.push(format!("{tl}/{dev}"));
                    let aux_only = match tls.allows(tl) {
                        Allowed::Yes => false,
                        Allowed::AuxOnly => true,
                        Allowed::No => continue,
                    };
                    let dev_type = r.device_type();
                    if dev_type == DeviceType::Net && !config::device_allowed(&net, dev)
                        || dev_type == DeviceType::Shm && !config::device_allowed(&cfg.shm_devices, dev)
                    {
                        continue;
                    }
                    resources.push(Resource {
                        component: *c,
                        md_name: md_name.clone(),
                        tl_name: tl.to_owned(),
                        dev_name: dev.to_owned(),
                        dev_type,
                        aux_only,
                    });
                    dups.push(r.duplicate_of().map(|(t, d)| format!("{t}/{d}")));
                }
            }
        }
        drop_duplicates(&mut resources, dups, &tls);
        if resources.iter().all(|r| r.aux_only) {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "no usable transport: RUCX_TLS={}, RUCX_NET_DEVICES and RUCX_SHM_DEVICES allow none of [{}] \
                     (rucx-info -d lists them)",
                    cfg.tls_spec,
                    seen.join(", ")
                ),
            ));
        }
        Ok(Context {
            inner: Arc::new(ContextInner {
                _uct: self.uct,
                features: self.features,
                cfg,
                settings: self.settings,
                resources,
            }),
        })
    }
}

/// Leaves out the resources that duplicate another usable one (a provider of a wrapped library
/// over the same device, e.g. libfabric's `tcp;ofi_rxm/lo` next to `tcp/lo`), unless `RUCX_TLS`
/// is an allow list (so it names their transport): with `all` or a deny list they would only
/// cost `progress` calls and memory.
fn drop_duplicates(resources: &mut Vec<Resource>, dups: Vec<Option<String>>, tls: &TlsFilter) {
    if !tls.allows_all() && !tls.is_deny_list() {
        return;
    }
    let native: Vec<String> = resources
        .iter()
        .zip(&dups)
        .filter(|(r, d)| d.is_none() && !r.aux_only)
        .map(|(r, _)| format!("{}/{}", r.tl_name, r.dev_name))
        .collect();
    let mut dups = dups.into_iter();
    resources.retain(|r| match dups.next().flatten() {
        Some(d) if native.contains(&d) => {
            ucs::debug!(
                "ucp: {}/{} left out: it duplicates {d} (RUCX_TLS={tls}; name {} there to use it)",
                r.tl_name,
                r.dev_name,
                r.tl_name
            );
            false
        }
        _ => true,
    });
}

impl Context {
    /// A builder over `uct` (its modules: built-ins and plugins).
    pub fn builder(uct: uct::Context) -> ContextBuilder {
        ContextBuilder {
            uct,
            features: Features::AM,
            settings: Overrides::new(),
        }
    }

    /// The features asked for.
    pub fn features(&self) -> Features {
        self.inner.features
    }

    /// The usable resources as `transport/device` names, in the order workers open them.
    pub fn resource_names(&self) -> Vec<String> {
        self.inner
            .resources
            .iter()
            .map(|r| format!("{}/{}", r.tl_name, r.dev_name))
            .collect()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ucp::Context({:?})", self.resource_names())
    }
}
