//! Targets and the pair of workers a UCP test runs on.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucp::{AmFlags, Context, Ep, Features, Worker};
use uct::AsyncMode;

/// How long any wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A transport to run on.
pub struct Target {
    pub name: &'static str,
    /// `RUCX_TLS`.
    pub tls: &'static str,
    /// The uct transport the AM lane must be on.
    pub tl_name: &'static str,
    /// Two workers (a process pair's two sides); false: one worker talking to itself.
    pub two_workers: bool,
    /// Needs the ib plugin and an RDMA device (skipped without one).
    pub rdma: bool,
    /// `RUCX_NET_DEVICES` of a target on the host (RDMA targets take every device).
    pub net_devices: &'static str,
    /// Its transport is a plugin (skipped where the plugin or its device is missing).
    pub plugin: bool,
    /// `RUCX_SHM_DEVICES`: the ofi targets leave out libfabric's shm, which UCP would choose
    /// between two workers of one process.
    pub shm_devices: &'static str,
    /// The AM lane has am_zcopy (posix and sysv copy every message into the peer's FIFO).
    pub am_zcopy: bool,
}

pub static TARGETS: &[Target] = &[
    Target {
        name: "self_",
        tls: "self",
        tl_name: "self",
        two_workers: false,
        rdma: false,
        net_devices: "lo",
        plugin: false,
        shm_devices: "all",
        am_zcopy: true,
    },
    Target {
        name: "tcp",
        tls: "tcp",
        tl_name: "tcp",
        two_workers: true,
        rdma: false,
        net_devices: "lo",
        plugin: false,
        shm_devices: "all",
        am_zcopy: true,
    },
    Target {
        name: "posix",
        tls: "posix,cma,tcp",
        tl_name: "posix",
        two_workers: true,
        rdma: false,
        net_devices: "lo",
        plugin: false,
        shm_devices: "all",
        am_zcopy: false,
    },
    Target {
        name: "rc_verbs",
        tls: "rc",
        tl_name: "rc_verbs",
        two_workers: true,
        rdma: true,
        net_devices: "",
        plugin: true,
        shm_devices: "all",
        am_zcopy: true,
    },
    Target {
        name: "ud_verbs",
        tls: "ud",
        tl_name: "ud_verbs",
        two_workers: true,
        rdma: true,
        net_devices: "",
        plugin: true,
        shm_devices: "all",
        am_zcopy: true,
    },
    // libfabric (libuct_ofi.so): tcp;ofi_rxm and shm, UCP's selection choosing among them
    Target {
        name: "ofi",
        tls: "ofi",
        tl_name: "ofi",
        two_workers: true,
        rdma: false,
        net_devices: "tcp;ofi_rxm/lo",
        plugin: true,
        shm_devices: "all",
        am_zcopy: true,
    },
    // libfabric's verbs connected endpoints (soft-RoCE VM)
    Target {
        name: "ofi_verbs",
        tls: "ofi",
        tl_name: "ofi",
        two_workers: true,
        rdma: true,
        net_devices: "verbs/rxe*",
        plugin: true,
        shm_devices: "^*",
        am_zcopy: true,
    },
];

/// Instantiates each test once per target: `ucp_test!(am_sizes, ...)` makes a module per
/// test with one `#[test]` per target.
#[macro_export]
macro_rules! ucp_test {
    ($($t:ident),* $(,)?) => {$(
        mod $t {
            #[test] fn self_() { $crate::harness::run("self_", super::$t) }
            #[test] fn tcp() { $crate::harness::run("tcp", super::$t) }
            #[test] fn posix() { $crate::harness::run("posix", super::$t) }
            #[test] fn rc_verbs() { $crate::harness::run("rc_verbs", super::$t) }
            #[test] fn ud_verbs() { $crate::harness::run("ud_verbs", super::$t) }
            #[test] fn ofi() { $crate::harness::run("ofi", super::$t) }
            #[test] fn ofi_verbs() { $crate::harness::run("ofi_verbs", super::$t) }
        }
    )*};
}

/// The uct context a target's UCP context is built on.
pub fn uct_context(t: &Target) -> uct::Context {
    if t.plugin {
        rucx_testkit::modules::plugin_context().build()
    } else {
        rucx::context_builder().plugins(false).build()
    }
}

/// The context of `t` with `extra` configuration set in code; `None` (with a note) for an
/// RDMA target on a host without RDMA.
pub fn context(t: &Target, extra: &[(&str, &str)]) -> Option<Context> {
    context_with(t, extra, Features::AM)
}

/// [`context`] with `features`.
pub fn context_with(t: &Target, extra: &[(&str, &str)], features: Features) -> Option<Context> {
    let mut b = Context::builder(uct_context(t))
        .features(features)
        .config("TLS", t.tls);
    if !t.net_devices.is_empty() {
        b = b.config("NET_DEVICES", t.net_devices);
    }
    b = b.config("SHM_DEVICES", t.shm_devices);
    for (k, v) in extra {
        b = b.config(k, v);
    }
    match b.build() {
        Ok(c) => Some(c),
        Err(e) if t.plugin && e == ucs::Status::NoDevice => {
            println!(
                "SKIP [{}] no device (RDMA, or the transport's plugin): {e}",
                t.name
            );
            None
        }
        Err(e) => panic!("[{}] ucp context: {e}", t.name),
    }
}

/// Runs `test` on target `name`.
pub fn run(name: &str, test: fn(&Setup)) {
    let t = TARGETS
        .iter()
        .find(|t| t.name == name)
        .expect("target in TARGETS");
    test(&Setup { t, extra: Vec::new() });
}

/// A target and configuration the test adds.
pub struct Setup {
    pub t: &'static Target,
    pub extra: Vec<(&'static str, String)>,
}

impl Setup {
    /// The same target with `name=value` set in code too.
    pub fn with(&self, name: &'static str, value: impl Into<String>) -> Setup {
        let mut extra = self.extra.clone();
        extra.push((name, value.into()));
        Setup { t: self.t, extra }
    }

    /// The context of this target with `features`, or `None` (skipped).
    pub fn context(&self, features: Features) -> Option<Context> {
        let extra: Vec<(&str, &str)> = self.extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        context_with(self.t, &extra, features)
    }

    /// A connected pair on this target, or `None` (skipped).
    pub fn pair(&self) -> Option<Pair> {
        self.pair_with(Features::AM)
    }

    /// A connected pair whose context has `features`.
    pub fn pair_with(&self, features: Features) -> Option<Pair> {
        self.pair_in(features, AsyncMode::Poll)
    }

    /// A connected pair whose workers' async contexts run in `mode` (a worker sleeps only in
    /// thread mode where its transports keep async handlers: ofi's connected devices).
    pub fn pair_in(&self, features: Features, mode: AsyncMode) -> Option<Pair> {
        let ctx = self.context(features)?;
        let a =
            Worker::with_async_mode(&ctx, mode).unwrap_or_else(|e| panic!("[{}] worker: {e}", self.t.name));
        let b = if self.t.two_workers {
            Worker::with_async_mode(&ctx, mode).unwrap()
        } else {
            a.clone()
        };
        let ep = a
            .connect(b.address())
            .unwrap_or_else(|e| panic!("[{}] connect: {e}", self.t.name));
        Some(Pair {
            name: self.t.name,
            a,
            b,
            ep,
        })
    }
}

/// A sender worker `a` with an endpoint `ep` to a receiver worker `b` (the same worker on
/// the self target).
pub struct Pair {
    pub name: &'static str,
    pub a: Worker,
    pub b: Worker,
    pub ep: Ep,
}

/// Messages a handler received: (header, data, came with a reply endpoint).
pub type Inbox = Rc<RefCell<Vec<(Vec<u8>, Vec<u8>, bool)>>>;

impl Pair {
    pub fn progress(&self) {
        self.a.progress();
        if self.a.id() != self.b.id() {
            self.b.progress();
        }
    }

    /// Progresses until `cond` holds; fails after [`DEADLINE`].
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < DEADLINE,
                "[{}] timed out waiting for {what}",
                self.name
            );
            self.progress();
        }
    }

    /// Records what AM `id` brings to `b` (the plain handler: a rendezvous message's data is
    /// fetched by the worker before the handler runs).
    pub fn inbox(&self, id: u16) -> Inbox {
        let inbox: Inbox = Rc::default();
        let i = inbox.clone();
        self.b
            .set_am_handler(id, move |m| {
                assert!(!m.is_rndv(), "a plain handler gets the data");
                let reply = m.reply_ep().is_some();
                i.borrow_mut()
                    .push((m.header().to_vec(), m.data().to_vec(), reply));
            })
            .unwrap();
        inbox
    }

    /// Sends and waits until the send finished.
    pub fn send(&self, id: u16, header: &[u8], data: &[u8], flags: AmFlags) {
        let r = self
            .ep
            .am_send(id, header, data, flags)
            .unwrap_or_else(|e| panic!("[{}] am_send of {} bytes: {e}", self.name, data.len()));
        if let ucp::Issued::Pending(mut req) = r {
            self.wait_for("the send to finish", || req.is_done());
            req.take()
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] send failed: {e}", self.name));
        }
    }
}

/// Test data: byte `i` of message `seed` is `(i * 31 + seed) as u8`.
pub fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed)) as u8)
        .collect()
}
