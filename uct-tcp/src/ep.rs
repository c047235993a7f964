//! The user-facing endpoint: its connection plan, pending queue, failure state, flush and
//! destruction. The data path lives in `send.rs` (AM) and `rma.rs` (put/get/atomics).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PendingReq, PendingResult, PurgeCb};
use uct_transport::traits::EpHandle;
use uct_transport::types::FlushFlags;

use crate::conn::{Conn, State};
use crate::iface::Shared;
use crate::ops::{Done, FlushGroup, Op, OpKind};
use crate::tx::Lent;
use crate::wire::{encode_frame, Msg, PutReq};

/// How an endpoint gets its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Created by `ep_create`; `connect_to_ep` not called yet.
    Unconnected,
    /// Connect to a peer interface; `sn` pairs it with the peer's endpoint number `sn` towards
    /// us (see `connect.rs`).
    ToIface { target: SocketAddr, sn: u64 },
    /// Connect-to-ep, this side connects (it has the smaller address).
    ToEpActive { target: SocketAddr, peer_key: u64 },
    /// Connect-to-ep, the peer connects to us (its listening address and ep key).
    ToEpPassive { peer: SocketAddr, peer_key: u64 },
}

pub struct EpInner {
    pub key: u64,
    /// What the host sees in error reports.
    pub handle: Cell<usize>,
    pub plan: Cell<Plan>,
    pub conn: RefCell<Option<Rc<Conn>>>,
    /// A peer connected to this endpoint before `connect_to_ep` was called: its listening
    /// address and endpoint key, checked when the user names the peer.
    pub accepted_from: Cell<Option<(SocketAddr, u64)>>,
    /// Connection attempts of the current plan.
    pub attempts: Cell<u32>,
    /// Set once the endpoint failed: every operation returns it.
    pub failed: Cell<Option<Status>>,
    pub pending: RefCell<VecDeque<PendingReq>>,
    pub dispatching: Cell<bool>,
    pub destroyed: Cell<bool>,
}

impl EpInner {
    pub fn new(key: u64, plan: Plan) -> EpInner {
        EpInner {
            key,
            handle: Cell::new(0),
            plan: Cell::new(plan),
            conn: RefCell::new(None),
            accepted_from: Cell::new(None),
            attempts: Cell::new(0),
            failed: Cell::new(None),
            pending: RefCell::new(VecDeque::new()),
            dispatching: Cell::new(false),
            destroyed: Cell::new(false),
        }
    }

    /// Key of deferred callbacks for this endpoint (unique while it lives).
    pub fn defer_key(self: &Rc<Self>) -> u64 {
        Rc::as_ptr(self) as u64
    }

    /// Why a send cannot go ahead: the failure, or `NoResource`.
    #[cold]
    pub fn not_ready(&self) -> Status {
        self.failed.get().unwrap_or(Status::NoResource)
    }

    /// True when queued requests must go first (sends answer NoResource meanwhile).
    #[inline]
    pub fn has_pending(&self) -> bool {
        !self.dispatching.get() && !self.pending.borrow().is_empty()
    }

    /// Whether the connection could take a send now (ignoring the pending queue).
    pub fn conn_ready(&self) -> bool {
        match &*self.conn.borrow() {
            Some(c) => !c.in_pack.get() && c.can_send(&c.tx.borrow()),
            None => false,
        }
    }
}

/// The endpoint the host holds.
pub struct TcpEp {
    pub(crate) sh: Rc<Shared>,
    pub(crate) inner: Rc<EpInner>,
}

impl TcpEp {
    pub fn new(sh: Rc<Shared>, inner: Rc<EpInner>) -> TcpEp {
        TcpEp { sh, inner }
    }

    /// Runs `f` on the connection's send state if a send may go ahead now; otherwise the
    /// endpoint's failure status or `NoResource`. A socket error inside `f` fails the
    /// connection (reported later, from progress). `append`: bytes a copied send needs at
    /// `tx.tail` to be appended behind unsent ones (`coalesce.rs`); 0 for sends that must wait.
    #[inline]
    pub(crate) fn with_tx<R>(
        &self,
        append: usize,
        f: impl FnOnce(&Conn, &mut crate::conn::Tx) -> Result<R>,
    ) -> Result<R> {
        let guard = self.inner.conn.borrow();
        let Some(conn) = guard.as_deref() else {
            return Err(self.inner.not_ready().into());
        };
        if conn.in_pack.get() || self.inner.has_pending() || self.inner.failed.get().is_some() {
            return Err(self.inner.not_ready().into());
        }
        let mut tx = conn.tx.borrow_mut();
        let mut idle = !tx.busy();
        if !conn.can_send_idle(idle) {
            let go = if idle {
                Ok(false)
            } else {
                self.sh.make_room(conn, &mut tx, append)
            };
            match go {
                Ok(true) => idle = !tx.busy(),
                Ok(false) => return Err(self.inner.not_ready().into()),
                Err(st) => {
                    drop(tx);
                    self.sh.conn_failed(conn, &st);
                    return Err(st);
                }
            }
        }
        if tx.buf.is_empty() {
            tx.buf = self.sh.tx_bufs.take();
        }
        if append > 0 && idle {
            if let Some(rc) = guard.as_ref() {
                self.sh.stage_if_burst(rc, &mut tx, append);
            }
        }
        let bytes = conn.tx_bytes.get();
        let r = f(conn, &mut tx);
        if !tx.busy() {
            self.sh.release_tx_buf(&mut tx);
        }
        if r.is_ok() {
            let units = 1 + ((conn.tx_bytes.get() - bytes) / crate::progress::DIRECT_UNIT).min(255);
            let before = conn.sent_since_rx.get();
            if before == 0 {
                // A wait for a reply begins; it can be timed while this is the only connection.
                let conns = &self.sh.conns;
                self.sh
                    .tuner
                    .wait_started(|| conns.try_borrow().is_ok_and(|c| c.len() == 1));
            }
            conn.sent_since_rx.set(before.saturating_add(units as u8));
        }
        if let Err(st) = &r {
            if is_socket_failure(st) && conn.is_open() {
                drop(tx);
                self.sh.conn_failed(conn, st);
            }
        }
        r
    }
}

/// Statuses that mean the socket itself failed (as opposed to a refused argument).
pub fn is_socket_failure(st: impl Into<Status>) -> bool {
    let st: Status = st.into();
    matches!(
        st,
        Status::ConnectionReset
            | Status::EndpointTimeout
            | Status::Unreachable
            | Status::IoError
            | Status::Rejected
    )
}

impl Drop for TcpEp {
    fn drop(&mut self) {
        self.sh.ep_destroy(&self.inner);
    }
}

impl Shared {
    pub fn ep_on_created(&self, ep: &EpInner, handle: EpHandle) {
        ep.handle.set(handle.0);
    }

    pub fn pending_add(&self, ep: &Rc<EpInner>, req: PendingReq) -> Result<()> {
        if let Some(st) = ep.failed.get() {
            return Err(st.into());
        }
        let ready = ep.conn_ready();
        if ready && ep.pending.borrow().is_empty() {
            return Err(Status::Busy.into());
        }
        ep.pending.borrow_mut().push_back(req);
        if ready && !ep.dispatching.get() {
            self.schedule_dispatch(ep);
        }
        Ok(())
    }

    pub fn pending_purge(&self, ep: &EpInner, purge: PurgeCb) {
        loop {
            let req = ep.pending.borrow_mut().pop_front();
            match req {
                Some(r) => purge.purge(r),
                None => break,
            }
        }
    }

    /// Dispatches the pending queue in order while the connection can send (UCX semantics:
    /// `Ok` done, `InProgress` keep and go on, anything else keep and stop).
    pub fn dispatch_pending(&self, ep: &Rc<EpInner>) -> u32 {
        if ep.dispatching.get() || ep.destroyed.get() || ep.failed.get().is_some() {
            return 0;
        }
        let mut work = 0;
        let mut budget = ep.pending.borrow().len() + 16;
        ep.dispatching.set(true);
        loop {
            if !ep.conn_ready() || ep.destroyed.get() {
                break;
            }
            let Some(req) = ep.pending.borrow_mut().pop_front() else {
                break;
            };
            let r = req.dispatch();
            work += 1;
            match r {
                PendingResult::Done => continue,
                PendingResult::InProgress => {
                    ep.pending.borrow_mut().push_front(req);
                    budget = budget.saturating_sub(1);
                    if budget == 0 {
                        ep.dispatching.set(false);
                        self.schedule_dispatch(ep);
                        return work;
                    }
                }
                PendingResult::Stop => {
                    ep.pending.borrow_mut().push_front(req);
                    break;
                }
            }
        }
        ep.dispatching.set(false);
        {
            // Drained: an endpoint that stays idle then holds no queue memory (pending is off
            // the fast path; the next episode allocates again).
            let mut q = ep.pending.borrow_mut();
            if q.is_empty() {
                *q = VecDeque::new();
            }
        }
        // Stopped with the socket idle (the request ran out of something else): try again at
        // the next progress rather than waiting for a socket event that will not come.
        if !ep.pending.borrow().is_empty() && ep.conn_ready() && !ep.destroyed.get() {
            self.schedule_dispatch(ep);
        }
        work
    }

    pub fn schedule_dispatch(&self, ep: &Rc<EpInner>) {
        let weak = Rc::downgrade(ep);
        self.defer(ep.defer_key() + 1, move |sh| {
            if let Some(ep) = weak.upgrade() {
                sh.dispatch_pending(&ep);
            }
        });
    }

    /// Endpoint flush (`group` set for an iface flush).
    pub fn ep_flush(&self, ep: &Rc<EpInner>, flags: FlushFlags, done: Done) -> Result<Outcome> {
        if let Some(st) = ep.failed.get() {
            return Err(st.into());
        }
        let conn = ep.conn.borrow().clone();
        if flags.contains(FlushFlags::CANCEL) {
            if let Some(c) = &conn {
                self.flush_cancel(ep, c);
            }
            return Ok(Outcome::Done);
        }
        if !ep.pending.borrow().is_empty() {
            return Err(Status::NoResource.into());
        }
        let Some(conn) = conn else {
            return Ok(Outcome::Done);
        };
        match conn.state.get() {
            State::Connected => {}
            // Nothing can have been sent before the connection is up.
            State::Connecting | State::WaitAck | State::Accepted => return Ok(Outcome::Done),
            State::Closed => return Err(ep.not_ready().into()),
        }
        if conn.in_pack.get() {
            return Err(Status::NoResource.into());
        }
        let mut tx = conn.tx.borrow_mut();
        if tx.busy() {
            return Err(Status::NoResource.into());
        }
        let mut ops = conn.ops.borrow_mut();
        if ops.idle() {
            return match ops.posted_error.take() {
                Some(st) => Err(Error::new(
                    st,
                    format!(
                        "tcp: a put or atomic posted to {} was refused by the target",
                        conn.peer.get()
                    ),
                )),
                None => Ok(Outcome::Done),
            };
        }
        let track = done.reports();
        if ops.need_barrier {
            let seq = ops.take_seq();
            let put = PutReq {
                remote_addr: 0,
                rkey: 0,
                length: 0,
                seq,
                ack_req: true,
            };
            let mut b = [0u8; 40];
            let n = encode_frame(&Msg::PutReq(put), &mut b).map_err(Status::from)?;
            match self.send_parts(&conn, &mut tx, &[&b[..n]], 1, Lent::None, Comp::NONE) {
                Ok(_) => {}
                Err(st) => {
                    drop((ops, tx));
                    self.conn_failed(&conn, &st);
                    return Err(st);
                }
            }
            ops.need_barrier = false;
            ops.q.push_back(Op {
                seq,
                kind: OpKind::Barrier,
                done,
            });
        } else if track {
            ops.q.push_back(Op {
                seq: 0,
                kind: OpKind::Marker,
                done,
            });
        }
        Ok(Outcome::InProgress)
    }

    /// `FlushFlags::CANCEL`: every waiting operation completes with `Canceled`; a partly sent
    /// message that uses the user's memory cannot be withdrawn, so its connection is dropped.
    fn flush_cancel(&self, ep: &Rc<EpInner>, conn: &Rc<Conn>) {
        let mut dones = self.cancel_ops(conn);
        let lent = conn.tx.borrow().holds_user_memory();
        if lent && conn.is_open() {
            let comp = conn.tx.borrow_mut().reset();
            dones.push(Done::Comp(comp));
            ep.failed.set(Some(Status::Canceled));
            self.close_conn(conn);
        }
        for d in dones {
            d.complete(Status::Canceled);
        }
    }

    /// Interface flush: every endpoint's flush, completing `comp` once when all are done.
    pub fn iface_flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        let eps = self.all_eps();
        if !flags.contains(FlushFlags::CANCEL) {
            // Refuse before changing anything when some endpoint cannot flush now.
            for ep in &eps {
                if ep.failed.get().is_some() {
                    continue;
                }
                let busy = ep
                    .conn
                    .borrow()
                    .as_ref()
                    .is_some_and(|c| c.in_pack.get() || c.tx.borrow().busy());
                if busy || !ep.pending.borrow().is_empty() {
                    return Err(Status::NoResource.into());
                }
            }
        }
        let query_only = comp.is_none();
        let group = FlushGroup::new(comp);
        group.add(); // held until every endpoint is flushed
        let mut in_progress = false;
        for ep in &eps {
            if ep.failed.get().is_some() {
                continue;
            }
            group.add();
            let done = if query_only {
                Done::None
            } else {
                Done::Group(group.clone())
            };
            match self.ep_flush(ep, flags, done) {
                Ok(Outcome::InProgress) => in_progress = true,
                Ok(_) => {
                    // Not queued: release its count.
                    crate::ops::Done::Group(group.clone()).complete(Status::Ok);
                }
                Err(e) => {
                    group.abandon();
                    return Err(e);
                }
            }
        }
        if !in_progress {
            group.abandon();
            return Ok(Outcome::Done);
        }
        Done::Group(group).complete(Status::Ok);
        Ok(Outcome::InProgress)
    }

    /// The host destroys an endpoint: waiting operations complete with `Canceled` (or the
    /// failure); its connection sends FIN and stays with the interface while the peer still
    /// has an endpoint on it.
    pub fn ep_destroy(&self, ep: &Rc<EpInner>) {
        ep.destroyed.set(true);
        self.remove_ep(ep.key);
        if let Plan::ToIface { target, sn } = ep.plan.get() {
            let key = crate::conn::pair_key(target, sn);
            let mut m = self.iface_eps.borrow_mut();
            if m.get(&key)
                .is_some_and(|w| w.upgrade().is_none_or(|e| Rc::ptr_eq(&e, ep)))
            {
                m.remove(&key);
                ucs::hash::trim(&mut m);
            }
        }
        let Some(conn) = ep.conn.borrow_mut().take() else {
            return;
        };
        let st = ep.failed.get().unwrap_or(Status::Canceled);
        // Canceled operations stay queued (detached from the user) to absorb their replies.
        let mut dones = self.cancel_ops(&conn);
        self.retire_conn(&conn, &mut dones);
        for d in dones {
            d.complete(st);
        }
    }
}

impl uct_transport::traits::TransportEp for TcpEp {
    fn on_created(&self, handle: EpHandle) {
        self.sh.ep_on_created(&self.inner, handle);
    }

    fn query(&self) -> uct_transport::types::EpAttr {
        let conn = self.inner.conn.borrow();
        match conn.as_deref() {
            Some(c) if c.state.get() == crate::conn::State::Connected => uct_transport::types::EpAttr {
                peer_am_max: c.peer_max.get() as usize,
                connected: true,
            },
            _ => uct_transport::types::EpAttr::default(),
        }
    }

    fn get_address(&self, buf: &mut [u8]) -> Result<()> {
        crate::addr::encode_ep_addr(self.sh.listen_addr.port(), self.inner.key, buf)
    }

    fn connect_to_ep(&self, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        self.sh.connect_to_ep(&self.inner, dev, ep_addr)
    }

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        self.send_am_short(id, header, payload)
    }

    fn am_short_iov(&self, id: u8, iov: &[uct_transport::iov::Iov]) -> Result<()> {
        self.send_am_short_iov(id, iov)
    }

    fn am_bcopy(&self, id: u8, pack: uct_transport::callbacks::PackCb, _flags: u32) -> Result<usize> {
        self.send_am_bcopy(id, pack)
    }

    fn am_zcopy(
        &self,
        id: u8,
        header: &[u8],
        iov: &[uct_transport::iov::Iov],
        _flags: u32,
        comp: Comp,
    ) -> Result<Outcome> {
        self.send_am_zcopy(id, header, iov, comp)
    }

    fn put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        self.send_put_short(data, raddr, rkey)
    }

    fn put_bcopy(&self, pack: uct_transport::callbacks::PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        self.send_put_bcopy(pack, raddr, rkey)
    }

    fn put_zcopy(
        &self,
        iov: &[uct_transport::iov::Iov],
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        self.send_put_zcopy(iov, raddr, rkey, comp)
    }

    fn get_bcopy(
        &self,
        unpack: uct_transport::callbacks::UnpackCb,
        len: usize,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        self.send_get_bcopy(unpack, len, raddr, rkey, comp)
    }

    fn get_zcopy(
        &self,
        iov: &[uct_transport::iov::Iov],
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        self.send_get_zcopy(iov, raddr, rkey, comp)
    }

    fn atomic_post(
        &self,
        size: uct_transport::traits::AtomicSize,
        op: uct_transport::types::AtomicOp,
        value: u64,
        raddr: u64,
        rkey: u64,
    ) -> Result<()> {
        self.send_atomic(size, op, value, 0, None, raddr, rkey, Comp::NONE)
            .map(|_| ())
    }

    fn atomic_fetch(
        &self,
        size: uct_transport::traits::AtomicSize,
        op: uct_transport::types::AtomicOp,
        value: u64,
        result: uct_transport::callbacks::ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        if op == uct_transport::types::AtomicOp::Cswap {
            ucs::error!("tcp: atomic_fetch with Cswap: use atomic_cswap");
            return Err(Status::InvalidParam.into());
        }
        self.send_atomic(size, op, value, 0, Some(result), raddr, rkey, comp)
    }

    fn atomic_cswap(
        &self,
        size: uct_transport::traits::AtomicSize,
        compare: u64,
        swap: u64,
        result: uct_transport::callbacks::ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        self.send_atomic(
            size,
            uct_transport::types::AtomicOp::Cswap,
            swap,
            compare,
            Some(result),
            raddr,
            rkey,
            comp,
        )
    }

    fn pending_add(&self, req: PendingReq, _flags: u32) -> Result<()> {
        self.sh.pending_add(&self.inner, req)
    }

    fn pending_purge(&self, purge: PurgeCb) {
        self.sh.pending_purge(&self.inner, purge)
    }

    fn flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        self.sh.ep_flush(&self.inner, flags, Done::Comp(comp))
    }

    fn fence(&self, _flags: u32) -> Result<()> {
        // One ordered stream, executed in order by the target: nothing to do.
        Ok(())
    }
}
