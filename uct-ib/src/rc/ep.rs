//! The rc_verbs endpoint: one RC QP, connected to one peer endpoint (`connect_to_ep`), with
//! its send-queue accounting, flow-control window and pending queue.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb, PendingReq, PurgeCb, ResultPtr, UnpackCb};
use uct_transport::iov::Iov;
use uct_transport::traits::{AtomicSize, EpHandle, TransportEp};
use uct_transport::types::{AtomicOp, FlushFlags};

use super::fc::FcState;
use super::iface::IfaceShared;
use super::tx::TxOp;
use super::wire::{pack_ep_addr, unpack_ep_addr};
use crate::device::DeviceAddr;
use crate::txq::TxQueue;
use uct_ib_verbs::{qp_timeout_from_secs, rnr_timer_from_secs, QueuePair, RtrParams, RtsParams};

/// Connection state of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conn {
    /// Created, not connected yet: sends wait (`NoResource`, pending requests are kept).
    Idle,
    Connected,
    /// Failed (peer failure, error completion, canceled): every operation returns the status.
    Failed(Status),
}

/// An endpoint's pending requests. Their number is a `Cell`, so a send learns that none wait
/// without a borrow.
#[derive(Default)]
pub(crate) struct PendingQueue {
    reqs: RefCell<VecDeque<PendingReq>>,
    len: Cell<usize>,
}

impl PendingQueue {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len.get() == 0
    }

    pub fn push_back(&self, req: PendingReq) {
        self.reqs.borrow_mut().push_back(req);
        self.len.set(self.len.get() + 1);
    }

    /// Puts back a request that could not run.
    pub fn push_front(&self, req: PendingReq) {
        self.reqs.borrow_mut().push_front(req);
        self.len.set(self.len.get() + 1);
    }

    pub fn pop_front(&self) -> Option<PendingReq> {
        let req = self.reqs.borrow_mut().pop_front();
        self.len.set(self.len.get() - req.is_some() as usize);
        req
    }

    /// Every request, in order (purge).
    pub fn take_all(&self) -> VecDeque<PendingReq> {
        self.len.set(0);
        self.reqs.take()
    }
}

/// The endpoint's state, shared by the host's handle and the interface (completions by QP
/// number, dispatch schedule).
pub(crate) struct EpState {
    pub iface: Rc<IfaceShared>,
    pub qp: QueuePair,
    pub tx: TxQueue<TxOp>,
    pub fc: Cell<FcState>,
    pub conn: Cell<Conn>,
    pub handle: Cell<EpHandle>,
    pub pending: PendingQueue,
    /// A pending request of this endpoint is running: its sends may pass the queue.
    pub dispatching: Cell<bool>,
    /// On the interface's dispatch schedule.
    pub scheduled: Cell<bool>,
    /// The next send waits for earlier RDMA READs/atomics (`fence`).
    pub fence: Cell<bool>,
    /// Outstanding work was canceled by the user (flush CANCEL): no error report.
    pub canceled: Cell<bool>,
    /// Destroyed by the host; kept until its QP drained.
    pub destroyed: Cell<bool>,
}

impl EpState {
    /// True when pending requests must go first.
    #[inline]
    pub fn pending_blocks(&self) -> bool {
        // `&`, not `&&`: two flags, no branch (the send fast path)
        !self.dispatching.get() & !self.pending.is_empty()
    }

    /// Completes every waiting operation with `status` (destroy, cancel, interface close).
    pub fn cancel_all(&self, status: Status) {
        loop {
            let op = self.tx.pop_any();
            match op {
                Some(op) => op.finish(status),
                None => break,
            }
        }
    }

    fn connect(&self, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        let s = &self.iface;
        match self.conn.get() {
            Conn::Idle => {}
            Conn::Connected => {
                return Err(Error::new(
                    Status::InvalidParam,
                    "rc_verbs connect_to_ep: the endpoint is already connected",
                ));
            }
            Conn::Failed(st) => return Err(st.into()),
        }
        let remote = DeviceAddr::unpack(dev)?;
        if !s.port.can_reach(&remote) {
            ucs::error!(
                ?remote,
                "rc_verbs connect_to_ep: peer device unreachable from this port"
            );
            return Err(Status::Unreachable.into());
        }
        let dest_qp_num = unpack_ep_addr(ep_addr)?;
        let cfg = &s.cfg;
        // A peer at our own address (another QP of this port) may get a larger MTU.
        let path_mtu = if remote == s.port.device_address() {
            s.caps.local_path_mtu
        } else {
            s.caps.path_mtu
        };
        self.qp.modify_to_rtr(&RtrParams {
            path_mtu,
            dest_qp_num,
            rq_psn: 0,
            max_dest_rd_atomic: s.caps.max_dest_rd_atomic,
            min_rnr_timer: rnr_timer_from_secs(cfg.rnr_timeout.as_secs_f64()),
            ah: s.port.ah_attr(&remote, cfg),
        })?;
        self.qp.modify_to_rts(&RtsParams {
            sq_psn: 0,
            timeout: qp_timeout_from_secs(cfg.timeout.as_secs_f64()),
            retry_cnt: s.caps.retry_count,
            rnr_retry: cfg.rnr_retry_count,
            max_rd_atomic: s.caps.max_rd_atomic,
        })?;
        self.conn.set(Conn::Connected);
        ucs::debug!(qp = self.qp.qp_num(), dest_qp_num, "rc_verbs endpoint connected");
        Ok(())
    }
}

/// The endpoint as the host holds it.
pub struct RcEp {
    pub(crate) st: Rc<EpState>,
}

impl RcEp {
    pub(crate) fn create(iface: &Rc<IfaceShared>) -> Result<RcEp> {
        let qp = iface.create_qp()?;
        let st = Rc::new(EpState {
            tx: TxQueue::new(iface.caps.tx_qlen, iface.caps.moderation, iface.next_sn_base()),
            fc: Cell::new(FcState::new(&iface.fc)),
            conn: Cell::new(Conn::Idle),
            handle: Cell::new(EpHandle(0)),
            pending: PendingQueue::default(),
            dispatching: Cell::new(false),
            scheduled: Cell::new(false),
            fence: Cell::new(false),
            canceled: Cell::new(false),
            destroyed: Cell::new(false),
            iface: iface.clone(),
            qp,
        });
        iface.eps.borrow_mut().insert(st.qp.qp_num(), st.clone());
        Ok(RcEp { st })
    }
}

impl Drop for RcEp {
    fn drop(&mut self) {
        let st = &self.st;
        let s = &st.iface;
        // collected sends are accounted as posted: post them, so that they complete (or are
        // flushed with the QP) and the accounting below stays exact
        s.ring();
        st.destroyed.set(true);
        s.deschedule(st);
        if st.tx.outstanding() == 0 {
            st.cancel_all(Status::Canceled);
            s.eps.borrow_mut().remove(&st.qp.qp_num());
        } else {
            // flush the QP: its requests complete (Canceled) from progress, and only then are
            // their buffers reused and the endpoint dropped, so the HCA never writes into
            // recycled memory and the send-queue/CQ accounting stays exact
            st.canceled.set(true);
            let _ = st.qp.modify_to_error();
        }
    }
}

impl TransportEp for RcEp {
    fn on_created(&self, handle: EpHandle) {
        self.st.handle.set(handle);
    }

    /// Connected once `connect_to_ep` wired the QP. The peer's limits are not in its address:
    /// both sides are expected to run with the same configuration (as in UCX).
    fn query(&self) -> uct_transport::types::EpAttr {
        uct_transport::types::EpAttr {
            peer_am_max: 0,
            connected: matches!(self.st.conn.get(), Conn::Connected),
        }
    }

    fn get_address(&self, buf: &mut [u8]) -> Result<()> {
        pack_ep_addr(self.st.qp.qp_num(), buf)
    }

    fn connect_to_ep(&self, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        self.st.connect(dev, ep_addr)?;
        // sends that waited for the connection may go now
        if !self.st.pending.is_empty() {
            self.st.iface.schedule(&self.st);
        }
        Ok(())
    }

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        self.st.am_short(id, header, payload)
    }

    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        self.st.am_short_iov(id, iov)
    }

    fn am_bcopy(&self, id: u8, pack: PackCb, _flags: u32) -> Result<usize> {
        self.st.am_bcopy(id, pack)
    }

    fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], _flags: u32, comp: Comp) -> Result<Outcome> {
        self.st.am_zcopy(id, header, iov, comp)
    }

    #[inline]
    fn put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        self.st.put_short(data, raddr, rkey)
    }

    fn put_bcopy(&self, pack: PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        self.st.put_bcopy(pack, raddr, rkey)
    }

    fn put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        self.st.rdma_zcopy(iov, raddr, rkey, comp, false)
    }

    fn get_bcopy(&self, unpack: UnpackCb, len: usize, raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        self.st.get_bcopy(unpack, len, raddr, rkey, comp)
    }

    fn get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        self.st.rdma_zcopy(iov, raddr, rkey, comp, true)
    }

    fn atomic_post(&self, size: AtomicSize, op: AtomicOp, value: u64, raddr: u64, rkey: u64) -> Result<()> {
        self.st
            .atomic(size, op, value, 0, None, raddr, rkey, Comp::NONE)
            .map(|_| ())
    }

    fn atomic_fetch(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        if op == AtomicOp::Cswap {
            return Err(Error::new(
                Status::InvalidParam,
                "rc_verbs atomic_fetch: use atomic_cswap for compare-and-swap",
            ));
        }
        self.st
            .atomic(size, op, value, 0, Some(result), raddr, rkey, comp)
    }

    fn atomic_cswap(
        &self,
        size: AtomicSize,
        compare: u64,
        swap: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        self.st.atomic(
            size,
            AtomicOp::Cswap,
            swap,
            compare,
            Some(result),
            raddr,
            rkey,
            comp,
        )
    }

    fn pending_add(&self, req: PendingReq, _flags: u32) -> Result<()> {
        let st = &self.st;
        if let Conn::Failed(s) = st.conn.get() {
            return Err(s.into());
        }
        if st.pending.is_empty() && st.has_tx_resources() && st.fc.get().can_send(&st.iface.fc) {
            return Err(Status::Busy.into());
        }
        st.pending.push_back(req);
        if st.conn.get() == Conn::Connected {
            st.iface.schedule(st);
        }
        Ok(())
    }

    fn pending_purge(&self, purge: PurgeCb) {
        let reqs = self.st.pending.take_all();
        self.st.iface.deschedule(&self.st);
        for r in reqs {
            purge.purge(r);
        }
    }

    fn flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        self.st.flush(flags, TxOp::Comp(comp))
    }

    fn fence(&self, _flags: u32) -> Result<()> {
        self.st.fence.set(true);
        Ok(())
    }
}
