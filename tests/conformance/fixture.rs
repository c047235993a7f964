//! The test harness (UCX gtest's `uct_test` / `entity`): opens a context for a target, entities
//! (memory domain + worker + interface with progress enabled), and connected sender/receiver
//! pairs in either connection model; progresses both sides until a condition holds, failing with
//! a clear message after a generous deadline.

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Once;
use std::time::{Duration, Instant};

use uct::{
    AmCbFlags, AsyncMode, Completion, Context, Ep, EpKey, FlushFlags, Iface, IfaceAttr, IfaceFlags,
    IfaceParams, Md, Mem, MemAccess, ModuleStatus, ProgressFlags, Rkey, Status, ThreadMode, Worker,
};

use crate::targets::{self, Connect, Dev, Modules, Target, Workers};

/// How long any wait may take before the test fails (remote transports only ever wait).
pub const DEADLINE: Duration = Duration::from_secs(10);

static ENV: Once = Once::new();

/// Where the test build put `libuct_self.so`: cargo builds the root package's `cdylib`
/// dependencies into `target/<profile>/deps` (next to this executable) and does not copy them
/// up to `target/<profile>` (a plain `cargo build -p uct-self` does). The target dir varies
/// (`CARGO_TARGET_DIR`), so it is derived from the executable's path.
pub fn plugin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    let profile = deps.parent().expect("target/<profile>").to_path_buf();
    for dir in [&deps, &profile] {
        if dir.join("libuct_self.so").is_file() {
            return dir.clone();
        }
    }
    panic!(
        "libuct_self.so is neither in {} nor in {}: the root package must depend on uct-self \
         (crate-type cdylib) so that the test build produces it",
        deps.display(),
        profile.display()
    );
}

/// Points `RUCX_MODULE_DIR` at the freshly built plugins (ahead of any folders the user set).
/// Runs before any test of this binary reads the environment.
fn init_env() {
    ENV.call_once(|| {
        let mut v = OsString::from(plugin_dir());
        if let Some(old) = std::env::var_os("RUCX_MODULE_DIR").filter(|o| !o.is_empty()) {
            v.push(":");
            v.push(old);
        }
        std::env::set_var("RUCX_MODULE_DIR", v);
        // ud_verbs declares a silent peer dead after RUCX_UD_TIMEOUT (30 s by default): keep it
        // well inside DEADLINE so the peer-failure tests can see it
        if std::env::var_os("RUCX_UD_TIMEOUT").is_none() {
            std::env::set_var("RUCX_UD_TIMEOUT", "2s");
        }
    });
}

/// Prints why (part of) a test does not run on a target.
pub fn skip(t: &Target, what: &str) {
    println!("SKIP [{}] {what}", t.name);
}

/// Runs `test` on the target called `name` (skipping with a note when it is absent).
pub fn run(name: &str, test: fn(&Setup)) {
    init_env();
    let t = targets::find(name).unwrap_or_else(|| panic!("target {name} is instantiated but not in TARGETS"));
    if let Some(s) = Setup::open(t) {
        test(&s);
    }
}

/// The order in which completions fired: each [`FireLog::completion`] appends its entry when
/// it fires (whatever its status).
#[derive(Clone, Default)]
pub struct FireLog(Rc<RefCell<Vec<usize>>>);

impl FireLog {
    /// A completion that logs `entry` when it fires.
    pub fn completion(&self, entry: usize) -> Completion {
        let log = self.0.clone();
        Completion::new(move |_| log.borrow_mut().push(entry))
    }

    /// The entries in the order they fired.
    pub fn order(&self) -> Vec<usize> {
        self.0.borrow().clone()
    }
}

/// A target's context and the memory domain that has its resource.
pub struct Setup {
    pub target: &'static Target,
    md: Md,
    dev: String,
}

impl Setup {
    fn absent(t: &'static Target, why: String, ctx: &Context) -> Option<Setup> {
        if t.required {
            panic!(
                "[{}] required target unavailable: {why}; modules: {:?}",
                t.name,
                ctx.modules()
            );
        }
        skip(t, &format!("target unavailable: {why}"));
        None
    }

    fn open(t: &'static Target) -> Option<Setup> {
        let ctx = match t.modules {
            Modules::Builtin(m) => Context::builder().builtin(m()).plugins(false).build(),
            Modules::Plugin(_) => Context::builder().plugins(true).build(),
        };
        let (module, want) = match t.modules {
            // A context built from one linked-in module lists exactly that module.
            Modules::Builtin(_) => match ctx.modules() {
                [m] => (m.name.clone(), ModuleStatus::Builtin),
                other => {
                    return Self::absent(t, format!("expected one built-in module, got {other:?}"), &ctx)
                }
            },
            Modules::Plugin(name) => (name.to_string(), ModuleStatus::Loaded),
        };
        match ctx.modules().iter().find(|m| m.name == module) {
            Some(m) if m.status == want => {}
            Some(m) => {
                return Self::absent(
                    t,
                    format!("module {module} is {:?} ({:?})", m.status, m.path),
                    &ctx,
                )
            }
            None => return Self::absent(t, format!("module {module} not found"), &ctx),
        }
        // Only the components offering this transport are asked (another plugin that fails to
        // open its memory domains, e.g. ib on a host without devices, must not matter).
        let mut found = None;
        for c in ctx
            .components()
            .iter()
            .filter(|c| c.transport_names().contains(&t.tl))
        {
            for name in c.md_resources().unwrap_or_default() {
                let Ok(md) = c.md_open(&name) else { continue };
                let res = md.tl_resources().unwrap_or_default();
                let hit = res.into_iter().find(|r| {
                    r.tl_name.as_str() == t.tl
                        && match t.dev {
                            Dev::Named(d) => r.dev_name.as_str() == d,
                            Dev::First => true,
                        }
                });
                if let Some(r) = hit {
                    found = Some((md, r));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        match found {
            Some((md, r)) => Some(Setup {
                target: t,
                md,
                dev: r.dev_name.as_str().to_owned(),
            }),
            None => Self::absent(t, format!("no resource {} on {:?}", t.tl, t.dev), &ctx),
        }
    }

    /// An entity on `worker` (its own memory domain, an interface with progress enabled).
    pub fn entity(&self, worker: &Worker) -> Entity {
        let name = self.target.name;
        let md = self
            .md
            .component()
            .md_open(self.md.name())
            .unwrap_or_else(|e| panic!("[{name}] md_open: {e}"));
        let errors: Rc<RefCell<Vec<(EpKey, Status)>>> = Rc::default();
        let log = errors.clone();
        let params = IfaceParams::new(self.target.tl, &self.dev)
            .err_handler(move |k, s| log.borrow_mut().push((k, s)));
        let iface = Iface::open(&md, worker, params).unwrap_or_else(|e| panic!("[{name}] Iface::open: {e}"));
        iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
        Entity {
            md,
            worker: worker.clone(),
            iface,
            errors,
        }
    }

    /// A new worker.
    pub fn worker(&self) -> Worker {
        Worker::new(AsyncMode::Poll, ThreadMode::Single).expect("Worker::new")
    }

    /// A connected sender → receiver pair, in the target's connection model and worker layout.
    pub fn pair(&self) -> Pair {
        let w1 = self.worker();
        let w2 = match self.target.workers {
            Workers::Shared => w1.clone(),
            Workers::Separate => self.worker(),
        };
        let tx = self.entity(&w1);
        let rx = self.entity(&w2);
        let mut p = Pair {
            target: self.target,
            tx,
            rx,
            ep: None,
            back: None,
        };
        let (ep, back) = p.connect();
        p.ep = Some(ep);
        p.back = back;
        p
    }
}

/// Memory domain, worker and interface of one side.
pub struct Entity {
    pub md: Md,
    pub worker: Worker,
    pub iface: Iface,
    /// What the interface's error handler received.
    pub errors: Rc<RefCell<Vec<(EpKey, Status)>>>,
}

impl Entity {
    pub fn attr(&self) -> &IfaceAttr {
        self.iface.attr()
    }
}

/// Registered memory on the receiver and the rkey the sender uses for it.
pub struct Remote {
    pub mem: Mem,
    pub rkey: Rkey,
}

impl Remote {
    /// Remote address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.mem.addr() + off as u64
    }
}

/// Received messages, in arrival order.
pub type Recorder = Rc<RefCell<Vec<Vec<u8>>>>;

/// A sender entity with an endpoint to a receiver entity (and the receiver's endpoint back, in
/// the connect-to-ep model).
pub struct Pair {
    pub target: &'static Target,
    pub tx: Entity,
    pub rx: Entity,
    ep: Option<Rc<Ep>>,
    back: Option<Rc<Ep>>,
}

impl Pair {
    /// The sender's endpoint.
    pub fn ep(&self) -> &Rc<Ep> {
        self.ep.as_ref().expect("connected")
    }

    /// The sender's interface attributes.
    pub fn attr(&self) -> &IfaceAttr {
        self.tx.attr()
    }

    pub fn name(&self) -> &'static str {
        self.target.name
    }

    /// True when the sender advertises `flag`; prints a skip note otherwise.
    pub fn supports(&self, flag: IfaceFlags, what: &str) -> bool {
        let yes = self.attr().flags.contains(flag);
        if !yes {
            skip(
                self.target,
                &format!("{what}: no {flag:?}; checking it returns Unsupported"),
            );
        }
        yes
    }

    /// Handler flags the receiver accepts: sync when it has `CB_SYNC`.
    pub fn am_flags(&self) -> AmCbFlags {
        if self.rx.attr().flags.contains(IfaceFlags::CB_SYNC) {
            AmCbFlags::SYNC
        } else {
            AmCbFlags::ASYNC
        }
    }

    /// Connects a new endpoint from the sender to the receiver (and back, for connect-to-ep).
    pub fn connect(&self) -> (Rc<Ep>, Option<Rc<Ep>>) {
        let n = self.name();
        let (tx, rx) = (&self.tx.iface, &self.rx.iface);
        let rx_dev = rx
            .device_address()
            .unwrap_or_else(|e| panic!("[{n}] device_address: {e}"));
        let rx_iface = rx
            .address()
            .unwrap_or_else(|e| panic!("[{n}] iface address: {e}"));
        assert!(
            tx.is_reachable(&rx_dev, &rx_iface),
            "[{n}] receiver not reachable from sender"
        );
        match self.target.connect {
            Connect::ToIface => {
                assert!(
                    self.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE),
                    "[{n}] target connects to ifaces but the transport lacks CONNECT_TO_IFACE"
                );
                let ep = tx
                    .ep_create_connected(&rx_dev, &rx_iface)
                    .unwrap_or_else(|e| panic!("[{n}] ep_create_connected: {e}"));
                (Rc::new(ep), None)
            }
            Connect::ToEp => {
                assert!(
                    self.attr().flags.contains(IfaceFlags::CONNECT_TO_EP),
                    "[{n}] target connects to eps but the transport lacks CONNECT_TO_EP"
                );
                let tx_dev = tx
                    .device_address()
                    .unwrap_or_else(|e| panic!("[{n}] device_address: {e}"));
                let a = tx
                    .ep_create()
                    .unwrap_or_else(|e| panic!("[{n}] ep_create (sender): {e}"));
                let b = rx
                    .ep_create()
                    .unwrap_or_else(|e| panic!("[{n}] ep_create (receiver): {e}"));
                let a_addr = a.address().unwrap_or_else(|e| panic!("[{n}] ep address: {e}"));
                let b_addr = b.address().unwrap_or_else(|e| panic!("[{n}] ep address: {e}"));
                a.connect_to_ep(&rx_dev, &b_addr)
                    .unwrap_or_else(|e| panic!("[{n}] connect_to_ep (sender): {e}"));
                b.connect_to_ep(&tx_dev, &a_addr)
                    .unwrap_or_else(|e| panic!("[{n}] connect_to_ep (receiver): {e}"));
                (Rc::new(a), Some(Rc::new(b)))
            }
        }
    }

    /// One round of progress on both workers (once when they are shared).
    pub fn progress(&self) -> u32 {
        let mut n = self.tx.worker.progress();
        if self.target.workers == Workers::Separate {
            n += self.rx.worker.progress();
        }
        n
    }

    /// Progresses until `cond` holds; fails after [`DEADLINE`].
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if start.elapsed() > DEADLINE {
                panic!(
                    "[{}] timed out after {DEADLINE:?} waiting for {what}",
                    self.name()
                );
            }
            self.progress();
        }
    }

    /// Runs `op` until it returns anything but `Err(NoResource)`, progressing in between.
    pub fn retry<T>(&self, what: &str, mut op: impl FnMut() -> uct::Result<T>) -> uct::Result<T> {
        let start = Instant::now();
        loop {
            match op() {
                Err(Status::NoResource) => {
                    if start.elapsed() > DEADLINE {
                        panic!("[{}] {what}: still NoResource after {DEADLINE:?}", self.name());
                    }
                    self.progress();
                }
                r => return r,
            }
        }
    }

    /// Runs an operation that takes a completion (retrying `NoResource`), requires success and
    /// waits for it: `Ok(Ok)` must leave the completion untouched, `Ok(InProgress)` must fire it
    /// once with `Ok`. Returns what the operation returned.
    pub fn complete(&self, what: &str, mut op: impl FnMut(&Completion) -> uct::Result<Status>) -> Status {
        let comp = Completion::counter();
        let r = self.retry(what, || op(&comp));
        self.check_completion(what, &comp, r)
    }

    /// The completion contract for one operation's result `r` on a fresh `comp`.
    pub fn check_completion(&self, what: &str, comp: &Completion, r: uct::Result<Status>) -> Status {
        let n = self.name();
        match r {
            Ok(Status::Ok) => {
                assert_eq!(
                    comp.fired(),
                    0,
                    "[{n}] {what}: returned Ok but fired its completion"
                );
                assert_eq!(
                    comp.outstanding(),
                    0,
                    "[{n}] {what}: returned Ok but left the completion counted"
                );
                Status::Ok
            }
            Ok(Status::InProgress) => {
                self.wait_for(&format!("{what} completion"), || comp.fired() > 0);
                assert_eq!(comp.fired(), 1, "[{n}] {what}: completion fired more than once");
                assert_eq!(
                    comp.last_status(),
                    Status::Ok,
                    "[{n}] {what}: completed with an error"
                );
                assert_eq!(comp.outstanding(), 0, "[{n}] {what}");
                Status::InProgress
            }
            other => panic!("[{n}] {what}: {other:?}"),
        }
    }

    /// Flushes the sender's endpoint (local completion) and waits for it.
    pub fn flush_ep(&self) {
        let ep = self.ep().clone();
        self.complete("ep flush", |c| ep.flush(FlushFlags::LOCAL, Some(c)));
    }

    /// Waits until everything the sender's endpoint started has completed at the target
    /// (`FlushFlags::REMOTE`; a plain local flush where remote flush is Unsupported).
    pub fn quiesce(&self) {
        let ep = self.ep().clone();
        let c = Completion::counter();
        let r = self.retry("ep flush (remote)", || ep.flush(FlushFlags::REMOTE, Some(&c)));
        if r == Err(Status::Unsupported) {
            self.flush_ep();
        } else {
            self.check_completion("ep flush (remote)", &c, r);
        }
    }

    /// `len` bytes registered on the receiver (filled with `fill`), with the sender's rkey.
    pub fn remote_mem(&self, len: usize, fill: u8) -> Remote {
        let n = self.name();
        let mem =
            Mem::alloc(&self.rx.md, len, MemAccess::ALL).unwrap_or_else(|e| panic!("[{n}] Mem::alloc: {e}"));
        mem.fill(fill);
        let packed = mem.pack_rkey().unwrap_or_else(|e| panic!("[{n}] pack_rkey: {e}"));
        let rkey = self
            .tx
            .md
            .component()
            .rkey_unpack(&packed)
            .unwrap_or_else(|e| panic!("[{n}] rkey_unpack: {e}"));
        Remote { mem, rkey }
    }

    /// `len` bytes registered on the sender, filled with `fill`.
    pub fn local_mem(&self, len: usize, fill: u8) -> Mem {
        let mem = Mem::alloc(&self.tx.md, len, MemAccess::ALL)
            .unwrap_or_else(|e| panic!("[{}] Mem::alloc: {e}", self.name()));
        mem.fill(fill);
        mem
    }

    /// Installs a handler for AM `id` on the receiver that records every message.
    pub fn record_am(&self, id: u8) -> Recorder {
        let rec: Recorder = Rc::default();
        let r = rec.clone();
        self.rx
            .iface
            .set_am_handler(id, self.am_flags(), move |m| {
                r.borrow_mut().push(m.data().to_vec())
            })
            .unwrap_or_else(|e| panic!("[{}] set_am_handler({id}): {e}", self.name()));
        rec
    }

    /// Waits until `rec` holds `n` messages.
    pub fn wait_msgs(&self, rec: &Recorder, n: usize, what: &str) {
        self.wait_for(
            &format!("{n} {what} messages (have {})", rec.borrow().len()),
            || rec.borrow().len() >= n,
        );
        assert_eq!(
            rec.borrow().len(),
            n,
            "[{}] {what}: more messages than sent",
            self.name()
        );
    }

    /// Everything the error handlers of both sides received.
    pub fn errors(&self) -> Vec<(EpKey, Status)> {
        let mut v = self.tx.errors.borrow().clone();
        v.extend(self.rx.errors.borrow().iter().copied());
        v
    }

    /// Destroys the receiver side (its endpoint, interface and, if separate, worker) and returns
    /// the sender with its endpoint, to observe peer failure.
    pub fn into_sender(mut self) -> (Entity, Rc<Ep>, &'static Target) {
        let ep = self.ep.take().expect("connected");
        drop(self.back.take());
        let Pair { target, tx, rx, .. } = self;
        drop(rx);
        (tx, ep, target)
    }
}

/// The `.so` the plugin targets use is the one this test build produced.
#[test]
fn self_plugin_comes_from_the_test_build() {
    init_env();
    let ctx = Context::builder().plugins(true).build();
    let m = ctx
        .modules()
        .iter()
        .find(|m| m.name == "self")
        .expect("self plugin found");
    assert_eq!(m.status, ModuleStatus::Loaded, "{:?}", ctx.modules());
    let path = m.path.as_ref().expect("plugin path").canonicalize().unwrap();
    assert_eq!(
        path.parent().unwrap(),
        plugin_dir().canonicalize().unwrap(),
        "loaded from elsewhere"
    );
    // Built in and plugin side by side: the built-in wins, the plugin is listed as shadowed.
    let both = Context::builder()
        .builtin(uct_self::module())
        .plugins(true)
        .build();
    let st: Vec<_> = both
        .modules()
        .iter()
        .filter(|m| m.name == "self")
        .map(|m| m.status.clone())
        .collect();
    assert_eq!(st, vec![ModuleStatus::Builtin, ModuleStatus::Shadowed]);
}
