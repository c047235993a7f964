//! Endpoints: the lanes to one peer worker, chosen from both workers' addresses, and the queue
//! of sends that wait for the lanes (not wired yet, or out of resources), replayed in order.

mod connecting;
mod dispatch;
mod lifecycle;
mod limits;
mod route;
mod send_queue;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};

use crate::address::WorkerAddress;
use crate::lanes::{self, SelectParams};
use crate::worker::{reachable, WorkerInner};

pub(crate) use connecting::handle as connecting_handle;
pub(crate) use lifecycle::{on_transport_error, run_failures, ErrHandler, FlushOp};
pub use lifecycle::{CloseMode, EpParams, ErrMode};
pub(crate) use limits::{endpoint_thresholds, Limits};
pub(crate) use route::Route;

/// Wireup state of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wired {
    /// Lanes that connect to the peer's endpoints wait for its reply.
    WaitingForPeer,
    /// Every lane is usable.
    Ready,
    /// Failed: every operation returns the recorded error.
    Failed(Status),
    /// Closed by the application.
    Closed,
}

pub(crate) struct EpInner {
    pub worker: Weak<WorkerInner>,
    pub id: Cell<u64>,
    /// The peer's address, shared by the endpoints toward the same worker.
    pub remote: Rc<WorkerAddress>,
    pub conn_sn: u64,
    /// The peer's id of its endpoint toward us, once wireup told us.
    pub remote_ep: Cell<Option<u64>>,
    /// Lanes, limits, rendezvous lane: shared by the endpoints toward the same peer in the
    /// same error mode (a pure function of both addresses and the configuration).
    pub route: Rc<Route>,
    /// One uct endpoint per lane.
    pub uct: Vec<uct::Ep>,
    pub p2p_connected: Cell<bool>,
    /// Wireup messages waiting for the wireup lane (they go before anything else).
    pub wireup_q: RefCell<VecDeque<Vec<u8>>>,
    pub wired: Cell<Wired>,
    /// Sends waiting, in order.
    pub queue: RefCell<send_queue::SendQueue>,
    /// A uct pending request is queued on the AM lane.
    pub pending_armed: Cell<bool>,
    /// A dispatch is running (a handler it triggers may send: that send queues behind).
    pub dispatching: Cell<bool>,
    pub err_mode: ErrMode,
    /// When the peer last answered a keepalive probe (or sent one); from creation.
    pub last_rx: Cell<std::time::Instant>,
    pub err_handler: RefCell<Option<ErrHandler>>,
    /// Why it failed (with `Wired::Failed`).
    pub error: RefCell<Option<Error>>,
    /// Multi-round RMA operations in flight (for flush); made by the first one.
    pub rma_state: std::cell::OnceCell<Box<crate::rma::EpRma>>,
    /// The context's features (checked by the operations of each).
    pub features: crate::Features,
}

impl EpInner {
    /// The endpoint's multi-round RMA state (made on first use: most endpoints never need it).
    pub(crate) fn rma(&self) -> &crate::rma::EpRma {
        self.rma_state.get_or_init(Box::default)
    }

    /// True when queued sends or wireup messages could go now, with no transport event to
    /// wait for (not waiting for resources or for the peer's wireup, not inside a dispatch).
    pub(crate) fn can_progress_sends(&self) -> bool {
        if self.pending_armed.get() || self.dispatching.get() {
            return false;
        }
        let wireup = !self.wireup_q.borrow().is_empty();
        match self.wired.get() {
            Wired::Failed(_) | Wired::Closed => false,
            Wired::WaitingForPeer => wireup,
            Wired::Ready => wireup || !self.queue.borrow().is_empty(),
        }
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        if let Some(w) = self.worker.upgrade() {
            crate::stream::forget(&w, self);
            crate::activation::remove_users(&w, self.route.used_ifaces);
            if let Ok(mut t) = w.eps.try_borrow_mut() {
                let peer = self.remote_ep.get().map(|r| (self.remote.uuid, r));
                t.remove(self.id.get(), peer);
            }
        }
    }
}

/// An endpoint to a peer worker ([`Worker::connect`](crate::Worker::connect),
/// [`Worker::connect_sockaddr`](crate::Worker::connect_sockaddr) or an accepted
/// [`ConnRequest`](crate::ConnRequest)): the lanes chosen from both workers' addresses, and
/// the operations on them. Cheap to clone (a shared handle).
///
/// Operations return [`Issued`](crate::Issued): `Done` when they finished in the call,
/// `Pending` with a [`Request`](crate::Request) completed from the worker's `progress`. They
/// fail at once with `Unsupported` when the context lacks their
/// [feature](crate::Features), and with the endpoint's error once it failed (`NotConnected`
/// after [`Ep::close`]).
///
/// # Active messages
///
/// Two workers over tcp on the loopback device; the handler answers on the endpoint it is
/// given back to the sender ([`AmFlags::REPLY`](crate::AmFlags::REPLY)):
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// use ucp::{AmFlags, Context, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_tcp::module()).plugins(false).build();
/// let ctx = Context::builder(uct).config("NET_DEVICES", "lo").build()?;
/// let (server, client) = (Worker::new(&ctx)?, Worker::new(&ctx)?);
/// server.set_am_handler(1, |m| {
///     assert_eq!((m.header(), m.data()), (&b"op"[..], &b"hello"[..]));
///     let _ = m.reply_ep().unwrap().am_send(2, &[], b"hello back", AmFlags::default());
/// })?;
/// let answer = Rc::new(RefCell::new(None));
/// let a = answer.clone();
/// client.set_am_handler(2, move |m| *a.borrow_mut() = Some(m.data().to_vec()))?;
///
/// let ep = client.connect(server.address())?;
/// let _sent = ep.am_send(1, b"op", b"hello", AmFlags::REPLY)?; // Done, or Pending
/// // Both workers live in this thread: progress both.
/// while answer.borrow().is_none() {
///     server.progress();
///     client.progress();
/// }
/// assert_eq!(answer.borrow().as_deref(), Some(&b"hello back"[..]));
/// # Ok::<(), ucp::Error>(())
/// ```
///
/// # Tag matching
///
/// A receive posted before the message came, and one found by a probe after it came:
///
/// ```
/// use ucp::{Context, Features, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
/// let ctx = Context::builder(uct).features(Features::TAG).build()?;
/// let worker = Worker::new(&ctx)?;
/// let ep = worker.connect(worker.address())?;
///
/// let recv = worker.tag_recv(0x10, u64::MAX, vec![0; 64])?; // the exact tag 0x10
/// ep.tag_send(0x10, b"expected")?.wait(&worker)?;
/// let m = recv.wait(&worker)?;
/// assert_eq!((m.tag, &m.data[..]), (0x10, &b"expected"[..]));
///
/// ep.tag_send(0x2042, b"unexpected")?.wait(&worker)?;
/// // Mask !0xff: every bit but the low byte compares, so 0x2000..=0x20ff match.
/// let probe = loop {
///     worker.progress();
///     if let Some(p) = worker.tag_probe(0x2000, !0xff, true)? {
///         break p;
///     }
/// };
/// assert_eq!((probe.info.tag, probe.info.length), (0x2042, 10));
/// let m = worker.tag_msg_recv(probe.msg.unwrap(), vec![0; probe.info.length])?.wait(&worker)?;
/// assert_eq!(m.data, b"unexpected");
/// # Ok::<(), ucp::Error>(())
/// ```
///
/// # Streams
///
/// Bytes in order, received in any pieces; both ends need an endpoint, here from a listener:
///
/// ```
/// use ucp::{Context, EpParams, Features, Issued, ListenerParams, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_tcp::module()).plugins(false).build();
/// let ctx = Context::builder(uct).features(Features::STREAM).config("NET_DEVICES", "lo").build()?;
/// let (server, client) = (Worker::new(&ctx)?, Worker::new(&ctx)?);
/// let listener = server.listen("127.0.0.1:0".parse().unwrap(), ListenerParams::new())?;
/// let ep = client.connect_sockaddr(listener.local_addr(), EpParams::new())?;
/// let server_ep = loop {
///     client.progress();
///     server.progress();
///     if let Some(req) = listener.accept() {
///         break req.accept(EpParams::new())?;
///     }
/// };
///
/// // `wait_all`: exactly the buffer's length (else what arrived, at least one byte).
/// let Issued::Pending(mut recv) = server_ep.stream_recv(vec![0; 13], true)? else {
///     unreachable!("nothing was sent yet")
/// };
/// let _sent = ep.stream_send(b"hello, ")?;
/// let _sent = ep.stream_send(b"stream")?;
/// let data = loop {
///     client.progress();
///     server.progress();
///     if let Some(r) = recv.take() {
///         break r?;
///     }
/// };
/// assert_eq!(data, b"hello, stream");
/// # Ok::<(), ucp::Error>(())
/// ```
///
/// # Remote memory: put, get and atomics
///
/// The target maps memory and hands its packed key to the initiator (in a message, or out of
/// band); here one worker is both:
///
/// ```
/// use ucp::{AtomicOp, AtomicWidth, Context, Features, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
/// let ctx = Context::builder(uct).features(Features::RMA | Features::AMO64).build()?;
/// let worker = Worker::new(&ctx)?;
/// let ep = worker.connect(worker.address())?;
///
/// let mem = worker.mem_alloc(64)?; // zeroed, aligned for atomics
/// let rkey = ep.rkey_unpack(&mem.rkey_pack()?)?;
/// ep.put(b"written remotely", mem.addr(), &rkey)?.wait(&worker)?;
/// ep.flush()?.wait(&worker)?; // done at the target
/// assert_eq!(&mem.to_vec()[..16], b"written remotely");
/// assert_eq!(ep.get(8, mem.addr(), &rkey)?.wait(&worker)?, b"written ");
///
/// let word = mem.addr() + 56;
/// ep.atomic_post(AtomicOp::Add, AtomicWidth::U64, 5, word, &rkey)?.wait(&worker)?;
/// let old = ep.atomic_fetch(AtomicOp::Add, AtomicWidth::U64, 1, word, &rkey)?.wait(&worker)?;
/// let before = ep.atomic_cswap(AtomicWidth::U64, 6, 100, word, &rkey)?.wait(&worker)?;
/// assert_eq!((old, before), (5, 6)); // the swap happened: it held 6
/// ep.flush()?.wait(&worker)?;
/// assert_eq!(mem.read_u64(56)?, 100);
///
/// // Outside the mapped region: an error, nothing written.
/// assert!(ep.put(b"x", mem.addr() + 64, &rkey).is_err());
/// # Ok::<(), ucp::Error>(())
/// ```
#[derive(Clone)]
pub struct Ep {
    pub(crate) repr: connecting::Repr,
}

impl Ep {
    /// The peer worker's id; 0 while an endpoint from
    /// [`Worker::connect_sockaddr`](crate::Worker::connect_sockaddr) is still connecting.
    pub fn remote_id(&self) -> u64 {
        self.ready().map_or(0, |e| e.remote.uuid)
    }

    /// True once every lane is wired.
    pub fn is_connected(&self) -> bool {
        self.ready().is_some_and(|e| e.wired.get() == Wired::Ready)
    }

    /// The protocol of each payload range (header and data, without [`crate::AmFlags::REPLY`]),
    /// one line each: what `RUCX_PROTO_INFO=y` prints under the lanes. Empty while the
    /// endpoint is still connecting (its lanes are not chosen yet).
    pub fn describe_protocols(&self) -> String {
        self.ready()
            .map(|e| e.route.limits.describe(&e.route.rndv_scheme()))
            .unwrap_or_default()
    }

    /// The lanes, as `transport/device → transport/device` with their uses. Empty while the
    /// endpoint is still connecting.
    pub fn describe_lanes(&self) -> String {
        match self.ready().and_then(|e| Some((e, e.worker.upgrade()?))) {
            Some((e, w)) => {
                let remote: Vec<_> = e.remote.entries.iter().map(|e| e.tl.clone()).collect();
                e.route.lanes.describe(&w.local_infos(), &remote)
            }
            None => String::new(),
        }
    }
}

impl std::fmt::Debug for Ep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.ready(), self.connecting_to()) {
            (Some(e), _) => write!(f, "ucp::Ep(to {:#x}, {:?})", e.remote.uuid, e.wired.get()),
            (None, Some(to)) => write!(f, "ucp::Ep(connecting to {to})"),
            (None, None) => write!(f, "ucp::Ep(connect failed)"),
        }
    }
}

/// [`crate::Worker::connect`].
pub(crate) fn connect(w: &Rc<WorkerInner>, remote_bytes: &[u8], params: EpParams) -> Result<Ep> {
    let remote = WorkerAddress::unpack(remote_bytes).map_err(|e| e.context_with("ucp: connect"))?;
    let sn = {
        let mut t = w.eps.borrow_mut();
        let c = t.conn_sn.entry(remote.uuid).or_insert(0);
        let sn = *c;
        *c += 1;
        // The peer connected first: adopt the endpoint its request made.
        if let Some(ep) = t.take_passive(&(remote.uuid, sn)) {
            if let Some(h) = params.on_error {
                *ep.err_handler.borrow_mut() = Some(h);
            }
            return Ok(Ep::from_inner(ep));
        }
        sn
    };
    let ep = create(w, remote, sn, None, params.err_mode)?;
    *ep.err_handler.borrow_mut() = params.on_error;
    w.eps
        .borrow_mut()
        .unmatched
        .insert((ep.remote.uuid, sn), ep.clone());
    crate::wireup::send_request(&ep)?;
    Ok(Ep::from_inner(ep))
}

/// Creates an endpoint toward `remote`: selects the lanes, creates the uct endpoints
/// (connect-to-iface lanes connect now, connect-to-ep lanes wait for the peer's addresses).
pub(crate) fn create(
    w: &Rc<WorkerInner>,
    remote: WorkerAddress,
    conn_sn: u64,
    remote_ep: Option<u64>,
    err_mode: ErrMode,
) -> Result<Rc<EpInner>> {
    let remote = w.shared_address(remote);
    let local = w.local_infos();
    let remote_infos: Vec<_> = remote.entries.iter().map(|e| e.tl.clone()).collect();
    let reach = |i: usize, j: usize| reachable(w, i, &remote.entries[j], remote.uuid);
    let mut params = SelectParams::from_context(&w.ctx, w.ifaces.iter().map(|i| i.aux_only).collect());
    params.local_uuid = w.uuid;
    params.remote_uuid = remote.uuid;
    params.peer_failure = err_mode == ErrMode::Peer;
    let route = match w.shared_route(err_mode, &remote) {
        Some(r) => r,
        None => {
            let lanes = lanes::select(&local, &remote_infos, &reach, &params)?;
            let r = Rc::new(Route::new(w, &remote, lanes)?);
            w.keep_route(err_mode, &remote, &r);
            r
        }
    };
    let mut uct = Vec::with_capacity(route.lanes.lanes.len());
    for (i, l) in route.lanes.lanes.iter().enumerate() {
        let wi = &w.ifaces[l.local];
        let e = &remote.entries[l.remote];
        uct.push(if route.is_p2p(i) {
            wi.iface.ep_create()?
        } else {
            wi.iface.ep_create_connected(&e.dev_addr, &e.iface_addr)?
        });
    }
    crate::activation::add_users(w, route.used_ifaces);
    let inner = Rc::new(EpInner {
        features: w.ctx.features(),
        worker: Rc::downgrade(w),
        id: Cell::new(0),
        remote,
        conn_sn,
        remote_ep: Cell::new(remote_ep),
        uct,
        wired: Cell::new(if route.p2p != 0 {
            Wired::WaitingForPeer
        } else {
            Wired::Ready
        }),
        route,
        p2p_connected: Cell::new(false),
        wireup_q: RefCell::new(VecDeque::new()),
        queue: RefCell::default(),
        pending_armed: Cell::new(false),
        dispatching: Cell::new(false),
        err_mode,
        last_rx: Cell::new(std::time::Instant::now()),
        err_handler: RefCell::new(None),
        error: RefCell::new(None),
        rma_state: std::cell::OnceCell::new(),
    });
    let id = {
        let mut t = w.eps.borrow_mut();
        t.insert(Rc::downgrade(&inner))
    };
    inner.id.set(id);
    if err_mode == ErrMode::Peer {
        crate::keepalive::start(w);
    }
    if w.ctx.inner.cfg.proto_info {
        let remote_infos: Vec<_> = inner.remote.entries.iter().map(|e| e.tl.clone()).collect();
        println!(
            "[ucp] endpoint to {:#x}:\n{}{}",
            inner.remote.uuid,
            inner.route.lanes.describe(&w.local_infos(), &remote_infos),
            inner.route.limits.describe(&inner.route.rndv_scheme()),
        );
    }
    Ok(inner)
}
