//! Endpoints: the lanes to one peer worker, chosen from both workers' addresses, and the queue
//! of sends that wait for the lanes (not wired yet, or out of resources), replayed in order.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};
use uct::{IfaceFlags, PendingRequest, PendingResult};

use crate::address::WorkerAddress;
use crate::am::SendOp;
use crate::lanes::{self, LaneSet, SelectParams};
use crate::worker::{reachable, WorkerInner};

/// Size limits of the AM lane toward this peer (both sides' limits count).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Largest message (all of it) sent with `am_short`.
    pub max_short: usize,
    /// Largest message sent with one `am_bcopy`.
    pub max_bcopy: usize,
    /// Largest message sent with one `am_zcopy` (0: no zcopy), and its largest header part.
    pub max_zcopy: usize,
    pub max_zcopy_hdr: usize,
    /// Payloads from this size up go zero-copy when the buffer is the application's to lend.
    pub zcopy_thresh: usize,
}

impl Limits {
    fn new(l: &crate::tl::TlAttr, r: &crate::tl::TlAttr, zcopy_thresh: crate::config::Threshold) -> Limits {
        let max_bcopy = l.am_max_bcopy.min(r.am_max_bcopy);
        let zcopy = l.flags.contains(IfaceFlags::AM_ZCOPY) && l.am_max_iov >= 1;
        let max_zcopy = if zcopy {
            l.am_max_zcopy.min(r.am_max_zcopy)
        } else {
            0
        };
        Limits {
            max_short: l.am_max_short.min(max_bcopy),
            max_bcopy,
            max_zcopy,
            max_zcopy_hdr: if zcopy { l.am_max_hdr } else { 0 },
            zcopy_thresh: zcopy_thresh.or_auto(max_bcopy.min(16 * 1024)),
        }
    }
}

/// Wireup state of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wired {
    /// Lanes that connect to the peer's endpoints wait for its reply.
    WaitingForPeer,
    /// Every lane is usable.
    Ready,
    /// Failed: every operation returns this.
    Failed(Status),
}

pub(crate) struct EpInner {
    pub worker: Weak<WorkerInner>,
    pub id: Cell<u64>,
    pub remote: WorkerAddress,
    pub conn_sn: u64,
    /// The peer's id of its endpoint toward us, once wireup told us.
    pub remote_ep: Cell<Option<u64>>,
    pub lanes: LaneSet,
    /// One uct endpoint per lane.
    pub uct: Vec<uct::Ep>,
    /// Per lane: it connects endpoint to endpoint (wired by the wireup exchange).
    pub p2p: Vec<bool>,
    pub p2p_connected: Cell<bool>,
    /// Wireup messages waiting for the wireup lane (they go before anything else).
    pub wireup_q: RefCell<VecDeque<Vec<u8>>>,
    pub limits: Limits,
    pub wired: Cell<Wired>,
    /// Sends waiting, in order.
    pub queue: RefCell<VecDeque<SendOp>>,
    /// A uct pending request is queued on the AM lane.
    pub pending_armed: Cell<bool>,
    /// A dispatch is running (a handler it triggers may send: that send queues behind).
    pub dispatching: Cell<bool>,
}

impl EpInner {
    /// The uct endpoint of the AM lane.
    pub fn am_ep(&self) -> &uct::Ep {
        &self.uct[self.lanes.am]
    }

    /// True when the AM lane may be used (wired and nothing waiting ahead).
    pub fn can_send_now(&self) -> bool {
        self.wired.get() == Wired::Ready && !self.dispatching.get() && self.queue.borrow().is_empty()
    }

    /// Queues wireup message `bytes` and sends what it can.
    pub fn send_wireup(self: &Rc<Self>, bytes: Vec<u8>) {
        self.wireup_q.borrow_mut().push_back(bytes);
        self.dispatch();
    }

    /// Sends queued wireup messages on the wireup lane; false when it ran out of resources (a
    /// pending request is armed) or failed.
    fn dispatch_wireup(self: &Rc<Self>) -> bool {
        let lane = self.lanes.wireup;
        loop {
            // No borrow is held across the send: it may deliver at once (self) and the
            // handlers may queue more.
            let Some(m) = self.wireup_q.borrow_mut().pop_front() else {
                return true;
            };
            let r = self.uct[lane].am_bcopy(crate::wireup::AM_ID, |b| {
                b[..m.len()].copy_from_slice(&m);
                m.len()
            });
            match r {
                Ok(_) => {}
                Err(e) if e == Status::NoResource => {
                    self.wireup_q.borrow_mut().push_front(m);
                    if !self.arm_pending(lane) {
                        return false;
                    }
                }
                Err(e) => {
                    tracing::warn!("ucp: wireup message to {:#x} not sent: {e}", self.remote.uuid);
                    self.fail(e.status());
                    return false;
                }
            }
        }
    }

    /// Sends queued operations while the lanes take them (wireup messages first); arms a uct
    /// pending request when they stop for lack of resources. Not re-entered: a send made by a
    /// handler it triggers queues behind and goes from the running dispatch.
    pub fn dispatch(self: &Rc<Self>) {
        if self.dispatching.replace(true) {
            return;
        }
        self.dispatch_queues();
        self.dispatching.set(false);
    }

    fn dispatch_queues(self: &Rc<Self>) {
        if !self.wireup_q.borrow().is_empty() && !self.dispatch_wireup() {
            return;
        }
        if self.wired.get() != Wired::Ready {
            return;
        }
        loop {
            let Some(mut op) = self.queue.borrow_mut().pop_front() else {
                return;
            };
            match op.progress(self) {
                Ok(true) => op.finish(Ok(())),
                Ok(false) => {
                    self.queue.borrow_mut().push_front(op);
                    if !self.arm_pending(self.lanes.am) {
                        return;
                    }
                }
                Err(e) => op.finish(Err(e)),
            }
            if !self.wireup_q.borrow().is_empty() && !self.dispatch_wireup() {
                return;
            }
        }
    }

    /// Asks lane `lane` to call back when it has resources again; true when it has them
    /// already (`Busy`): send again now.
    fn arm_pending(self: &Rc<Self>, lane: usize) -> bool {
        if self.pending_armed.replace(true) {
            return false;
        }
        let w = Rc::downgrade(self);
        let req = PendingRequest::new(move |_| {
            if let Some(ep) = w.upgrade() {
                ep.pending_armed.set(false);
                ep.dispatch();
            }
            PendingResult::Done
        });
        match self.uct[lane].pending_add(req) {
            Ok(()) => false,
            Err((e, _)) => {
                self.pending_armed.set(false);
                if e == Status::Busy {
                    return true;
                }
                self.fail(e.status());
                false
            }
        }
    }

    /// Fails the endpoint: queued sends complete with `st`.
    pub fn fail(&self, st: Status) {
        if matches!(self.wired.get(), Wired::Failed(_)) {
            return;
        }
        self.wired.set(Wired::Failed(st));
        let ops: Vec<SendOp> = self.queue.borrow_mut().drain(..).collect();
        for op in ops {
            op.finish(Err(st.into()));
        }
    }

    /// Marks every lane usable and sends what waited.
    pub fn set_ready(self: &Rc<Self>) {
        if self.wired.get() == Wired::WaitingForPeer {
            self.wired.set(Wired::Ready);
            self.dispatch();
        }
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        if let Some(w) = self.worker.upgrade() {
            if let Ok(mut t) = w.eps.try_borrow_mut() {
                t.remove(self.id.get());
            }
        }
    }
}

/// An endpoint to a peer worker. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Ep {
    pub(crate) inner: Rc<EpInner>,
}

impl Ep {
    /// The peer worker's id.
    pub fn remote_id(&self) -> u64 {
        self.inner.remote.uuid
    }

    /// True once every lane is wired.
    pub fn is_connected(&self) -> bool {
        self.inner.wired.get() == Wired::Ready
    }

    /// The lanes, as `transport/device → transport/device` with their uses.
    pub fn describe_lanes(&self) -> String {
        match self.inner.worker.upgrade() {
            Some(w) => {
                let remote: Vec<_> = self.inner.remote.entries.iter().map(|e| e.tl.clone()).collect();
                self.inner.lanes.describe(&w.local_infos(), &remote)
            }
            None => String::new(),
        }
    }
}

impl std::fmt::Debug for Ep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ucp::Ep(to {:#x}, {:?})",
            self.inner.remote.uuid,
            self.inner.wired.get()
        )
    }
}

/// [`crate::Worker::connect`].
pub(crate) fn connect(w: &Rc<WorkerInner>, remote_bytes: &[u8]) -> Result<Ep> {
    let remote = WorkerAddress::unpack(remote_bytes).map_err(|e| e.context_with("ucp: connect"))?;
    let sn = {
        let mut t = w.eps.borrow_mut();
        let c = t.conn_sn.entry(remote.uuid).or_insert(0);
        let sn = *c;
        *c += 1;
        // The peer connected first: adopt the endpoint its request made.
        if let Some(ep) = t.passive.remove(&(remote.uuid, sn)) {
            return Ok(Ep { inner: ep });
        }
        sn
    };
    let ep = create(w, remote, sn, None)?;
    w.eps
        .borrow_mut()
        .unmatched
        .insert((ep.remote.uuid, sn), ep.clone());
    crate::wireup::send_request(&ep)?;
    Ok(Ep { inner: ep })
}

/// Creates an endpoint toward `remote`: selects the lanes, creates the uct endpoints
/// (connect-to-iface lanes connect now, connect-to-ep lanes wait for the peer's addresses).
pub(crate) fn create(
    w: &Rc<WorkerInner>,
    remote: WorkerAddress,
    conn_sn: u64,
    remote_ep: Option<u64>,
) -> Result<Rc<EpInner>> {
    let local = w.local_infos();
    let remote_infos: Vec<_> = remote.entries.iter().map(|e| e.tl.clone()).collect();
    let reach = |i: usize, j: usize| reachable(w, i, &remote.entries[j], remote.uuid);
    let mut params = SelectParams::from_context(&w.ctx, w.ifaces.iter().map(|i| i.aux_only).collect());
    params.local_uuid = w.uuid;
    params.remote_uuid = remote.uuid;
    let lanes = lanes::select(&local, &remote_infos, &reach, &params)?;
    let mut uct = Vec::with_capacity(lanes.lanes.len());
    let mut p2p_lanes = Vec::with_capacity(lanes.lanes.len());
    for l in &lanes.lanes {
        let wi = &w.ifaces[l.local];
        let e = &remote.entries[l.remote];
        let f = wi.iface.attr().flags;
        let ep = if f.contains(IfaceFlags::CONNECT_TO_IFACE) && !e.iface_addr.is_empty() {
            p2p_lanes.push(false);
            wi.iface.ep_create_connected(&e.dev_addr, &e.iface_addr)?
        } else if f.contains(IfaceFlags::CONNECT_TO_EP) {
            p2p_lanes.push(true);
            wi.iface.ep_create()?
        } else {
            return Err(Error::new(
                Status::Unreachable,
                format!(
                    "ucp: {}/{} can connect neither to an interface nor to an endpoint",
                    wi.info.tl_name, wi.info.dev_name
                ),
            ));
        };
        uct.push(ep);
    }
    let am = &lanes.lanes[lanes.am];
    let limits = Limits::new(
        &w.ifaces[am.local].info.attr,
        &remote.entries[am.remote].tl.attr,
        w.ctx.inner.cfg.zcopy_thresh,
    );
    let inner = Rc::new(EpInner {
        worker: Rc::downgrade(w),
        id: Cell::new(0),
        remote,
        conn_sn,
        remote_ep: Cell::new(remote_ep),
        lanes,
        uct,
        wired: Cell::new(if p2p_lanes.iter().any(|p| *p) {
            Wired::WaitingForPeer
        } else {
            Wired::Ready
        }),
        p2p: p2p_lanes,
        p2p_connected: Cell::new(false),
        wireup_q: RefCell::new(VecDeque::new()),
        limits,
        queue: RefCell::new(VecDeque::new()),
        pending_armed: Cell::new(false),
        dispatching: Cell::new(false),
    });
    let id = w.eps.borrow_mut().insert(Rc::downgrade(&inner));
    inner.id.set(id);
    if w.ctx.inner.cfg.proto_info {
        let remote_infos: Vec<_> = inner.remote.entries.iter().map(|e| e.tl.clone()).collect();
        println!(
            "[ucp] endpoint to {:#x}:\n{}\n  am: short <= {} B, bcopy <= {} B, zcopy <= {} B (from {} B), fragments above",
            inner.remote.uuid,
            inner.lanes.describe(&w.local_infos(), &remote_infos),
            inner.limits.max_short,
            inner.limits.max_bcopy,
            inner.limits.max_zcopy,
            inner.limits.zcopy_thresh,
        );
    }
    Ok(inner)
}
