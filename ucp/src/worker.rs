//! The worker: one thread's progress engine. It opens an interface on every usable resource of
//! its context, packs its [`WorkerAddress`], installs UCP's active-message handlers on every
//! interface, and keeps the endpoints, the applications' AM handlers and the fragments of
//! messages being reassembled.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};
use uct::{AmCbFlags, AsyncMode, DeviceType, Iface, IfaceParams, Md};

use crate::address::{AddressEntry, WorkerAddress};
use crate::am::{AmHandler, AmHandlers};
use crate::context::{Context, Features};
use crate::ep::{Ep, EpInner};
use crate::proto::reasm::{Reasm, Reassembler};
use crate::tl::{TlAttr, TlInfo};
use crate::wakeup::Wakeup;
use crate::wire::am_id;

/// One opened resource.
pub(crate) struct WIface {
    pub md: Md,
    pub iface: Iface,
    pub info: TlInfo,
    /// Usable for wireup only (`RUCX_TLS`'s auxiliary transports).
    pub aux_only: bool,
    /// What `Worker::arm` arms on it (empty: not in the wakeup set).
    pub arm_events: uct::ArmEvents,
    /// Kept without an event fd under `Features::WAKEUP` (an RMA-only transport such as cma):
    /// `Worker::arm` answers `Busy` while it has operations outstanding.
    pub no_fd: bool,
}

/// The worker's endpoints: by local id (index + generation), and the maps wireup needs.
#[derive(Default)]
pub(crate) struct EpTable {
    slots: Vec<(u32, Weak<EpInner>)>,
    free: Vec<u32>,
    /// The peer's (worker id, endpoint id) → our endpoint toward it (for reply endpoints).
    pub by_remote: ucs::hash::FastMap<(u64, u64), u64>,
    /// Connections counted per peer worker, to pair simultaneous connects.
    pub conn_sn: HashMap<u64, u64>,
    /// Endpoints waiting for their peer's side, by (peer worker, connection number).
    pub unmatched: HashMap<(u64, u64), Rc<EpInner>>,
    /// Endpoints the peers created toward us that no local `connect` has adopted yet.
    pub passive: HashMap<(u64, u64), Rc<EpInner>>,
}

impl EpTable {
    /// Every endpoint still alive.
    pub fn live(&self) -> impl Iterator<Item = Rc<EpInner>> + '_ {
        self.slots.iter().filter_map(|(_, w)| w.upgrade())
    }
    /// A new local id for `ep`.
    pub fn insert(&mut self, ep: Weak<EpInner>) -> u64 {
        if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            slot.0 = slot.0.wrapping_add(1);
            slot.1 = ep;
            return u64::from(i) | (u64::from(slot.0) << 32);
        }
        self.slots.push((1, ep));
        (self.slots.len() as u64 - 1) | (1 << 32)
    }

    /// Takes the endpoint waiting for its peer under `key` (trimming the table a burst grew).
    pub fn take_unmatched(&mut self, key: &(u64, u64)) -> Option<Rc<EpInner>> {
        let ep = self.unmatched.remove(key);
        ucs::hash::trim(&mut self.unmatched);
        ep
    }

    /// Takes the passive endpoint under `key` (trimming the table a burst grew).
    pub fn take_passive(&mut self, key: &(u64, u64)) -> Option<Rc<EpInner>> {
        let ep = self.passive.remove(key);
        ucs::hash::trim(&mut self.passive);
        ep
    }

    /// The endpoint with local id `id`, if it is still there.
    pub fn get(&self, id: u64) -> Option<Rc<EpInner>> {
        let (i, g) = (id as u32 as usize, (id >> 32) as u32);
        match self.slots.get(i) {
            Some((gen, w)) if *gen == g => w.upgrade(),
            _ => None,
        }
    }

    /// Frees id `id` (the endpoint is gone); `peer`: its `by_remote` key (worker, endpoint),
    /// once wireup named the peer's endpoint (entries are only made under that key).
    pub fn remove(&mut self, id: u64, peer: Option<(u64, u64)>) {
        let (i, g) = (id as u32 as usize, (id >> 32) as u32);
        if let Some((gen, w)) = self.slots.get_mut(i) {
            if *gen == g {
                *w = Weak::new();
                self.free.push(i as u32);
            }
        }
        if let Some(k) = peer {
            self.unlink_remote(id, k);
        }
    }

    /// Names `id` our endpoint toward endpoint `new` of peer worker `worker`, dropping its
    /// entry under `old` (an earlier id that peer gave), so an endpoint has one entry.
    pub fn link_remote(&mut self, id: u64, worker: u64, old: Option<u64>, new: u64) {
        if let Some(o) = old.filter(|&o| o != new) {
            self.unlink_remote(id, (worker, o));
        }
        self.by_remote.insert((worker, new), id);
    }

    /// Removes the entry under `key` when it names `id`.
    pub fn unlink_remote(&mut self, id: u64, key: (u64, u64)) {
        if self.by_remote.get(&key) == Some(&id) {
            self.by_remote.remove(&key);
            ucs::hash::trim(&mut self.by_remote);
        }
    }
}

/// What peers' messages hold in a worker now: [`Worker::reassembly`] (messages arriving in
/// fragments), [`Worker::tag_unexpected`] (tag messages no receive matched yet),
/// [`Worker::stream_unread`] (stream bytes not read yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldUse {
    /// Messages held.
    pub messages: usize,
    /// Bytes charged for them to the budget that bounds them: the buffers they fill here
    /// (not the application's posted buffers) plus 256 per message.
    pub bytes: usize,
}

/// The reassembly stall timer ticked: each protocol drops its stalled messages; the timer
/// stops once nothing is under reassembly.
fn reasm_tick(w: &Rc<WorkerInner>) {
    w.reasm.timer.take_due();
    crate::am::reasm_tick(w);
    crate::tag::reasm_tick(w);
    if w.am_reasm.borrow().is_empty() && crate::tag::reasm_idle(w) {
        w.reasm.timer.disarm(&w.uct);
    }
}

/// Fails every endpoint toward worker `peer` with `e` (it made this worker hold more than
/// its budget allows); progress then ends their operations and calls their error handlers.
pub(crate) fn fail_peer(w: &WorkerInner, peer: u64, e: Error) {
    {
        // Peers no endpoint is toward any more need no entry (known_peer refuses them anyway):
        // the set stays as small as the peers this worker has.
        let peers = w.peers.borrow();
        let mut shunned = w.reasm.shunned.borrow_mut();
        shunned.retain(|uuid, _| peers.get(uuid).is_some_and(|a| a.strong_count() > 0));
        shunned.insert(peer, ());
    }
    let eps: Vec<Rc<EpInner>> = w
        .eps
        .borrow()
        .live()
        .filter(|ep| ep.remote.uuid == peer)
        .collect();
    for ep in eps {
        ep.fail(e.clone());
    }
}

impl WorkerInner {
    /// `Ok` when some endpoint of this worker is toward worker `uuid` (messages that create
    /// receive state are accepted only from such peers).
    pub(crate) fn known_peer(&self, uuid: u64) -> Result<()> {
        let known = self
            .peers
            .borrow()
            .get(&uuid)
            .is_some_and(|a| a.strong_count() > 0);
        if known && !self.reasm.shunned.borrow().contains_key(&uuid) {
            return Ok(());
        }
        if known {
            return Err(Error::new(
                Status::ExceedsLimit,
                format!(
                    "from worker {uuid:#x}, whose endpoints failed for exceeding the \
                     reassembly budget"
                ),
            ));
        }
        Err(Error::new(
            Status::InvalidParam,
            format!("from worker {uuid:#x}, which no endpoint of this worker is connected to"),
        ))
    }

    /// `addr` as the endpoints toward that worker already hold it, or a new shared copy.
    pub(crate) fn shared_address(&self, addr: WorkerAddress) -> Rc<WorkerAddress> {
        // A new endpoint toward a peer: its fragments are welcome again.
        if !self.reasm.shunned.borrow().is_empty() {
            self.reasm.shunned.borrow_mut().remove(&addr.uuid);
        }
        let mut peers = self.peers.borrow_mut();
        if let Some(known) = peers.get(&addr.uuid).and_then(std::rc::Weak::upgrade) {
            if *known == addr {
                return known;
            }
        }
        // Entries of peers no endpoint holds any more go when the table would grow.
        if peers.len() >= 64 && peers.len().is_power_of_two() {
            peers.retain(|_, w| w.strong_count() > 0);
        }
        let shared = Rc::new(addr);
        peers.insert(shared.uuid, Rc::downgrade(&shared));
        shared
    }
}

/// A route and the (shared) address it was made for.
type SharedRoute = (std::rc::Weak<WorkerAddress>, std::rc::Weak<crate::ep::Route>);

impl WorkerInner {
    /// The lanes an endpoint toward `remote` in `mode` already has, when its address is the
    /// one they were selected for.
    pub(crate) fn shared_route(
        &self,
        mode: crate::ep::ErrMode,
        remote: &Rc<WorkerAddress>,
    ) -> Option<Rc<crate::ep::Route>> {
        let t = self.routes.borrow();
        let (addr, route) = t.get(&(remote.uuid, mode == crate::ep::ErrMode::Peer))?;
        // The same shared address: selected from these very bytes.
        (addr.as_ptr() == Rc::as_ptr(remote))
            .then(|| route.upgrade())
            .flatten()
    }

    pub(crate) fn keep_route(
        &self,
        mode: crate::ep::ErrMode,
        remote: &Rc<WorkerAddress>,
        route: &Rc<crate::ep::Route>,
    ) {
        let mut t = self.routes.borrow_mut();
        if t.len() >= 64 && t.len().is_power_of_two() {
            t.retain(|_, (_, l)| l.strong_count() > 0);
        }
        t.insert(
            (remote.uuid, mode == crate::ep::ErrMode::Peer),
            (Rc::downgrade(remote), Rc::downgrade(route)),
        );
    }
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        crate::keepalive::stop(self);
        crate::activation::stop(self);
        self.reasm.timer.disarm(&self.uct);
        self.rndv.timer.disarm(&self.uct);
    }
}

pub(crate) struct WorkerInner {
    pub ctx: Context,
    pub uct: uct::Worker,
    pub ifaces: Vec<WIface>,
    pub uuid: u64,
    pub address: Vec<u8>,
    pub next_msg_id: Cell<u64>,
    pub am: RefCell<AmHandlers>,
    pub eps: RefCell<EpTable>,
    /// Reassembly's budget and stall timer (shared by AM and tag), and AM's messages arriving
    /// in fragments.
    pub reasm: Reasm,
    pub am_reasm: RefCell<Reassembler<crate::am::Partial>>,
    pub rndv: crate::rndv::Rndv,
    /// Peers' addresses, shared by the endpoints toward each (by worker id).
    pub peers: RefCell<HashMap<u64, std::rc::Weak<WorkerAddress>>>,
    /// Routes by peer and error mode, with the address they were made for.
    pub routes: RefCell<HashMap<(u64, bool), SharedRoute>>,
    pub keepalive: crate::keepalive::Keepalive,
    /// Which interfaces `progress` polls.
    pub activation: crate::activation::Activation,
    pub tag: RefCell<crate::tag::TagState>,
    pub stream: RefCell<crate::stream::StreamState>,
    /// Endpoints that failed since the last progress (acted on there), and whether any did.
    pub failed: RefCell<Vec<u64>>,
    pub has_failed: Cell<bool>,
    /// The wakeup fd and signal, with `Features::WAKEUP`.
    pub wakeup: Option<Wakeup>,
    /// The connection manager (`listen`, `connect_sockaddr`), made on first use: it hooks a
    /// progress callback then, so a worker that never uses it pays nothing.
    pub cm: RefCell<Option<Rc<crate::cm::Cm>>>,
    /// Finished requests kept for reuse.
    pub requests: crate::request::RequestPool,
}

impl WorkerInner {
    pub fn local_infos(&self) -> Vec<TlInfo> {
        self.ifaces.iter().map(|i| i.info.clone()).collect()
    }
}

/// A worker: one thread's progress engine (UCX's `ucp_worker`). It opens an interface on each
/// of the context's resources, has an [address](Worker::address) peers connect to, owns the
/// endpoints made from it and runs their completions and handlers from
/// [`progress`](Worker::progress), which the application calls (or sleeps on, with
/// [`Features::WAKEUP`]). Cheap to clone (a shared handle); `!Send`: it belongs to the thread
/// that made it.
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// use ucp::{AmFlags, Context, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
/// let ctx = Context::builder(uct).build()?; // Features::AM by default
/// let worker = Worker::new(&ctx)?;
///
/// // Active messages with id 7 run this handler, from `progress`.
/// let got = Rc::new(RefCell::new(Vec::new()));
/// let g = got.clone();
/// worker.set_am_handler(7, move |m| g.borrow_mut().push(m.data().to_vec()))?;
///
/// // A peer connects with the worker's address (sent out of band: a socket, a file, MPI);
/// // here the worker connects to itself, over the self transport.
/// let ep = worker.connect(worker.address())?;
/// ep.am_send(7, &[], b"ping", AmFlags::default())?.wait(&worker)?;
/// while got.borrow().is_empty() {
///     worker.progress();
/// }
/// assert_eq!(got.borrow()[0], b"ping");
/// # Ok::<(), ucp::Error>(())
/// ```
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
}

/// A worker handle that does not keep it alive: what a handler the worker owns should hold
/// to reach its worker (a [`Worker`] there would never be freed).
#[derive(Clone)]
pub struct WeakWorker(std::rc::Weak<WorkerInner>);

impl WeakWorker {
    /// The worker, while it lives.
    pub fn upgrade(&self) -> Option<Worker> {
        self.0.upgrade().map(|inner| Worker { inner })
    }
}

fn worker_uuid() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

impl Worker {
    /// A worker whose async events a background thread detects (UCX's default).
    pub fn new(ctx: &Context) -> Result<Worker> {
        Self::with_async_mode(ctx, AsyncMode::Thread)
    }

    /// A worker in `mode` ([`AsyncMode::Poll`]: no background thread).
    pub fn with_async_mode(ctx: &Context, mode: AsyncMode) -> Result<Worker> {
        let uct = uct::Worker::with_async_mode(mode)?;
        let wakeup = ctx.inner.features.contains(Features::WAKEUP);
        let uuid = worker_uuid();
        let mut mds: Vec<(String, String, Md)> = Vec::new();
        let mut ifaces = Vec::new();
        // The transports' error callbacks find the worker through this, set once it exists.
        let slot: Rc<RefCell<Weak<WorkerInner>>> = Rc::default();
        for r in &ctx.inner.resources {
            let comp = r.component.name().to_owned();
            let md = match mds.iter().find(|(c, n, _)| *c == comp && *n == r.md_name) {
                Some((_, _, md)) => md.clone(),
                None => {
                    let md = r.component.md_open_with(&r.md_name, &ctx.inner.settings)?;
                    mds.push((comp.clone(), r.md_name.clone(), md.clone()));
                    md
                }
            };
            if ifaces.len() == crate::address::MAX_ENTRIES {
                ucs::warn!(
                    "ucp: {}/{} not used: a worker address holds at most {} interfaces; \
                     narrow RUCX_TLS or RUCX_NET_DEVICES",
                    r.tl_name,
                    r.dev_name,
                    crate::address::MAX_ENTRIES
                );
                continue;
            }
            let s = slot.clone();
            let mut params = IfaceParams::new(&r.tl_name, &r.dev_name).err_handler(move |key, st| {
                if let Some(w) = s.borrow().upgrade() {
                    crate::ep::on_transport_error(&w, key, st);
                }
            });
            params.config = ctx.inner.settings.clone();
            params.wakeup = wakeup;
            let iface = match Iface::open(&md, &uct, params) {
                Ok(i) => i,
                Err(e) => {
                    ucs::warn!("ucp: {}/{} not used: {e}", r.tl_name, r.dev_name);
                    continue;
                }
            };
            // Without an event fd nothing would wake the worker for what arrives on it: under
            // wakeup only an interface that never receives anything for the worker stays.
            let no_fd = wakeup && !crate::wakeup::usable(&iface, r.dev_type);
            if no_fd && !crate::wakeup::serves_without_fd(iface.attr().flags) {
                ucs::warn!(
                    "ucp: {}/{} not used: it has no event fd, and Features::WAKEUP was asked for",
                    r.tl_name,
                    r.dev_name
                );
                continue;
            }
            let arm_events = if wakeup && !no_fd {
                crate::wakeup::arm_events(&iface)
            } else {
                uct::ArmEvents::EMPTY
            };
            let info = TlInfo {
                tl_name: r.tl_name.clone(),
                dev_name: r.dev_name.clone(),
                component: comp,
                dev_type: r.dev_type as u8,
                attr: TlAttr::from_iface(iface.attr()),
            };
            ifaces.push(WIface {
                md,
                iface,
                info,
                aux_only: r.aux_only,
                arm_events,
                no_fd,
            });
        }
        if ifaces.iter().all(|i| i.aux_only) {
            return Err(Error::new(
                Status::NoDevice,
                format!("ucp: no interface could be opened on {:?}", ctx.resource_names()),
            ));
        }
        let mut entries = Vec::new();
        for w in &ifaces {
            entries.push(AddressEntry {
                tl: w.info.clone(),
                dev_addr: w.iface.device_address()?,
                iface_addr: w.iface.address()?,
            });
        }
        let address = WorkerAddress {
            uuid,
            name: crate::address::bounded_name(&format!("{}:{}", hostname(), std::process::id())),
            entries,
        };
        address.validate()?;
        let address = address.pack();
        let wakeup = if wakeup {
            Some(Wakeup::new(&uct, &ifaces)?)
        } else {
            None
        };
        let activation = crate::activation::Activation::new(&ifaces, &uct, ctx.inner.cfg.adaptive_progress);
        let inner = Rc::new(WorkerInner {
            activation,
            ctx: ctx.clone(),
            uct,
            ifaces,
            uuid,
            address,
            next_msg_id: Cell::new(1),
            am: RefCell::new(AmHandlers::default()),
            eps: RefCell::new(EpTable::default()),
            reasm: Reasm::new(ctx.inner.cfg.reasm),
            am_reasm: RefCell::new(Reassembler::default()),
            rndv: crate::rndv::Rndv::new(ctx.inner.cfg.rndv_timeout),
            peers: RefCell::new(HashMap::new()),
            routes: RefCell::new(HashMap::new()),
            keepalive: crate::keepalive::Keepalive::default(),
            tag: RefCell::new(crate::tag::TagState::new(ctx.inner.cfg.tag_unexp)),
            stream: RefCell::new(crate::stream::StreamState::new(ctx.inner.cfg.stream_unread)),
            failed: RefCell::new(Vec::new()),
            has_failed: Cell::new(false),
            wakeup,
            cm: RefCell::new(None),
            requests: Default::default(),
        });
        *slot.borrow_mut() = Rc::downgrade(&inner);
        for (i, w) in inner.ifaces.iter().enumerate() {
            install_handlers(&inner, i, &w.iface)?;
        }
        Ok(Worker { inner })
    }

    /// Progresses every interface; returns the amount of work done.
    #[inline]
    pub fn progress(&self) -> u32 {
        let mut n = self.inner.uct.progress();
        if self.inner.activation.has_work() {
            n += crate::activation::run(&self.inner);
        }
        if self.inner.keepalive.is_due() {
            crate::keepalive::round(&self.inner);
        }
        if self.inner.reasm.timer.is_due() {
            reasm_tick(&self.inner);
        }
        if self.inner.rndv.timer.is_due() {
            crate::rndv::tick(&self.inner);
        }
        if self.inner.has_failed.get() {
            crate::ep::run_failures(&self.inner);
        }
        n
    }

    /// What messages arriving in fragments hold in this worker now (bounded by
    /// `RUCX_REASM_WORKER_LIMIT`, and per peer by `RUCX_REASM_PEER_LIMIT`).
    ///
    /// ```
    /// use ucp::{Context, Features, Worker};
    ///
    /// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let worker = Worker::new(&Context::builder(uct).features(Features::AM).build()?)?;
    /// assert_eq!(worker.reassembly(), ucp::HeldUse { messages: 0, bytes: 0 });
    /// # Ok::<(), ucp::Error>(())
    /// ```
    pub fn reassembly(&self) -> HeldUse {
        HeldUse {
            messages: self.inner.am_reasm.borrow().len() + crate::tag::reasm_len(&self.inner),
            bytes: self.inner.reasm.budget.held(),
        }
    }

    /// What tag messages no receive matched yet hold here (bounded by
    /// `RUCX_TAG_UNEXP_PEER_LIMIT` and `RUCX_TAG_UNEXP_WORKER_LIMIT`).
    pub fn tag_unexpected(&self) -> HeldUse {
        self.inner.tag.borrow().unexp_use()
    }

    /// What stream bytes that arrived and were not read hold here (bounded by
    /// `RUCX_STREAM_PEER_LIMIT` and `RUCX_STREAM_WORKER_LIMIT`).
    pub fn stream_unread(&self) -> HeldUse {
        self.inner.stream.borrow().unread()
    }

    /// Endpoints peers' wireup requests made here that the application has not adopted
    /// (bounded by `RUCX_PASSIVE_PEER_LIMIT` and `RUCX_PASSIVE_WORKER_LIMIT`).
    pub fn passive_endpoints(&self) -> usize {
        self.inner.eps.borrow().passive.len()
    }

    /// This worker's packed address, for a peer's [`Worker::connect`].
    pub fn address(&self) -> &[u8] {
        &self.inner.address
    }

    /// The resources `progress` polls on every call now, as `transport/device`: those an
    /// endpoint uses, and idle ones that can do neither of the adaptive progress's (sleep on an
    /// event fd, be polled every few calls; see `RUCX_ADAPTIVE_PROGRESS`).
    pub fn progressed_resources(&self) -> Vec<String> {
        self.inner
            .ifaces
            .iter()
            .enumerate()
            .filter(|(i, _)| self.inner.activation.is_active(*i))
            .map(|(_, w)| format!("{}/{}", w.info.tl_name, w.info.dev_name))
            .collect()
    }

    /// The worker's unique id (also in its address).
    pub fn id(&self) -> u64 {
        self.inner.uuid
    }

    /// A handle that does not keep the worker alive ([`WeakWorker`]).
    pub fn downgrade(&self) -> WeakWorker {
        WeakWorker(Rc::downgrade(&self.inner))
    }

    /// The transports this worker opened, as `transport/device`.
    pub fn resources(&self) -> Vec<String> {
        self.inner
            .ifaces
            .iter()
            .map(|w| format!("{}/{}", w.info.tl_name, w.info.dev_name))
            .collect()
    }

    /// An endpoint to the worker whose packed address is `remote` (from its
    /// [`Worker::address`], exchanged out of band). Usable at once: sends made before its
    /// lanes are wired wait and go in order.
    pub fn connect(&self, remote: &[u8]) -> Result<Ep> {
        crate::ep::connect(&self.inner, remote, crate::EpParams::default())
    }

    /// [`Worker::connect`] with an error-handling mode and an error handler.
    pub fn connect_with(&self, remote: &[u8], params: crate::EpParams) -> Result<Ep> {
        crate::ep::connect(&self.inner, remote, params)
    }

    /// Receives a rendezvous message's data ([`crate::AmMsg::take_data_desc`], for a handler
    /// installed with [`crate::AmHandlerFlags::RNDV_DESC`]) into `buf`,
    /// which is resized to the message's length and comes back filled when the request
    /// completes (the sender's buffer is released then). The fetch uses `get_zcopy` where the
    /// lanes have it, else the sender sends the data in pieces on the AM lane.
    /// `InvalidParam` (the message discarded) when another worker received the message.
    pub fn am_recv_data(&self, desc: crate::AmDataDesc, buf: Vec<u8>) -> Result<crate::Issued<Vec<u8>>> {
        self.inner
            .ctx
            .features()
            .require(Features::AM, "Worker::am_recv_data")?;
        crate::rndv::recv_data_vec(&self.inner, desc, buf)
    }

    /// [`Worker::am_recv_data`] into memory the application lends (any
    /// [`uct::LentBytesMut`]): the data lands in its first [`crate::AmDataDesc::len`] bytes, in
    /// place (registered for `get_zcopy` as it is, never zeroed or reallocated), and the
    /// buffer comes back whole. `MessageTruncated` (the message discarded, the sender told)
    /// when the buffer is shorter than the message.
    pub fn am_recv_data_into<B: uct::LentBytesMut>(
        &self,
        desc: crate::AmDataDesc,
        buf: B,
    ) -> Result<crate::Issued<B>> {
        self.inner
            .ctx
            .features()
            .require(Features::AM, "Worker::am_recv_data_into")?;
        crate::rndv::recv_data_lent(&self.inner, desc, buf)
    }

    /// [`Worker::am_recv_data`] into a scatter-gather list the application lends (as
    /// [`Worker::tag_recv_iov`]); the list comes back whole.
    pub fn am_recv_data_iov<B: uct::LentBytesMut>(
        &self,
        desc: crate::AmDataDesc,
        segments: Vec<B>,
    ) -> Result<crate::Issued<Vec<B>>> {
        self.inner
            .ctx
            .features()
            .require(Features::AM, "Worker::am_recv_data_iov")?;
        crate::rndv::recv_data_as(&self.inner, desc, crate::recv_buf::RecvBuf::iov(segments))
    }

    /// [`Worker::am_recv_data`] through the application's [`crate::Unpack`] (as
    /// [`Worker::tag_recv_unpack`]); the unpacker comes back.
    pub fn am_recv_data_unpack<U: crate::Unpack>(
        &self,
        desc: crate::AmDataDesc,
        unpack: U,
    ) -> Result<crate::Issued<U>> {
        self.inner
            .ctx
            .features()
            .require(Features::AM, "Worker::am_recv_data_unpack")?;
        crate::rndv::recv_data_as(&self.inner, desc, crate::recv_buf::RecvBuf::unpack(unpack))
    }

    /// [`Worker::am_recv_data`] into `len` bytes at `offset` of memory this worker mapped (as
    /// [`Worker::tag_recv_mapped`]); the request gives a clone of the handle back.
    /// `MessageTruncated` when `len` is shorter than the message.
    pub fn am_recv_data_mapped(
        &self,
        desc: crate::AmDataDesc,
        mem: &crate::MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<crate::Issued<crate::MemHandle>> {
        self.inner
            .ctx
            .features()
            .require(Features::AM, "Worker::am_recv_data_mapped")?;
        mem.check_recv(&self.inner, offset, len)?;
        let buf = crate::recv_buf::RecvBuf::Mapped {
            mem: mem.clone(),
            offset,
            len,
        };
        crate::rndv::recv_data_as(&self.inner, desc, buf)
    }

    /// Installs the handler of active messages with id `id` (any `u16`): it runs from
    /// `progress` with the message (see [`crate::AmMsg`]), whose [`crate::AmMsg::data`] is
    /// all the data whatever its size and the transport: the worker fetches a rendezvous
    /// message's data before calling the handler. Replaces an earlier one.
    ///
    /// `Unsupported` when the context was built without [`Features::AM`].
    pub fn set_am_handler(&self, id: u16, f: impl FnMut(&mut crate::AmMsg<'_>) + 'static) -> Result<()> {
        self.set_am_handler_with(id, crate::AmHandlerFlags::default(), f)
    }

    /// [`Worker::set_am_handler`] with `flags`: [`crate::AmHandlerFlags::RNDV_DESC`] hands
    /// rendezvous messages to the handler when announced, their data still at the sender,
    /// for [`Worker::am_recv_data`] into the application's own buffer.
    pub fn set_am_handler_with(
        &self,
        id: u16,
        flags: crate::AmHandlerFlags,
        f: impl FnMut(&mut crate::AmMsg<'_>) + 'static,
    ) -> Result<()> {
        self.inner
            .ctx
            .features()
            .require(Features::AM, "Worker::set_am_handler")?;
        self.inner.am.borrow_mut().set(id, AmHandler::new(flags, f));
        Ok(())
    }

    /// Removes the handler of `id`.
    pub fn clear_am_handler(&self, id: u16) {
        self.inner.am.borrow_mut().clear(id);
    }

    /// The uct worker underneath (its async context, its event fd).
    pub fn uct(&self) -> &uct::Worker {
        &self.inner.uct
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ucp::Worker({:#x}, {:?})", self.inner.uuid, self.resources())
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// UCP's handlers on interface `idx`: each holds the worker weakly (the worker owns the iface).
fn install_handlers(inner: &Rc<WorkerInner>, idx: usize, iface: &Iface) -> Result<()> {
    let flags = if iface.attr().flags.contains(uct::IfaceFlags::CB_SYNC) {
        AmCbFlags::SYNC
    } else {
        AmCbFlags::ASYNC
    };
    // Shared: the handler copies the data once, straight from a shared-memory transport's
    // FIFO to where it goes (`AmCbFlags::SHARED_DATA`). A single active message is not: its
    // handler reads a slice, and may keep the transport's private copy without another.
    let shared = flags | AmCbFlags::SHARED_DATA;
    // Each handler is its own closure type (a fn item, not a fn pointer): it is inlined into
    // the interface's trampoline, one call from the transport to the protocol.
    macro_rules! install {
        ($($id:expr, $h:path, $flags:expr;)*) => {$({
            let w = Rc::downgrade(inner);
            iface.set_am_handler($id, $flags, move |m| {
                if let Some(inner) = w.upgrade() {
                    $h(&inner, idx, m);
                }
            })?;
        })*};
    }
    install! {
        am_id::WIREUP, crate::wireup::on_message, flags;
        am_id::SINGLE, crate::am::on_single, flags;
        am_id::FIRST, crate::am::on_first, shared;
        am_id::MIDDLE, crate::am::on_middle, shared;
        am_id::RTS, crate::rndv::on_rts, flags;
        am_id::ATS, crate::rndv::on_ats, flags;
        am_id::RTR, crate::rndv::on_rtr, flags;
        am_id::DATA, crate::rndv::on_data, flags;
        am_id::TAG_EAGER, crate::tag::on_eager, shared;
        am_id::TAG_SYNC, crate::tag::on_sync, shared;
        am_id::TAG_FIRST, crate::tag::on_first, shared;
        am_id::TAG_MIDDLE, crate::tag::on_middle, shared;
        am_id::TAG_SYNC_ACK, crate::tag::on_sync_ack, flags;
        am_id::TAG_RTS, crate::tag::on_rts, flags;
        am_id::STREAM, crate::stream::on_stream, shared;
    }
    Ok(())
}

/// Whether local interface `i` reaches the peer's address entry `e` (same transport, the
/// transport says so, and `self` only toward this same worker).
pub(crate) fn reachable(inner: &WorkerInner, i: usize, e: &AddressEntry, remote_uuid: u64) -> bool {
    let w = &inner.ifaces[i];
    if w.info.tl_name != e.tl.tl_name {
        return false;
    }
    if w.info.dev_type == DeviceType::SelfDev as u8 && remote_uuid != inner.uuid {
        return false;
    }
    w.iface.is_reachable(&e.dev_addr, &e.iface_addr)
}
