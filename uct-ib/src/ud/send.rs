//! The send side: registered send buffers ("skbs") that stay in a reliability window until
//! acknowledged, send-queue accounting, and posting of AMs (new and resent) and control
//! packets. Packets that fit the QP's inline limit are posted inline; larger ones point the
//! HCA at the skb, which then is not rewritten or reused until its send completion.

use std::cell::RefCell;

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Result, Status};
use uct::callbacks::Comp;

use super::reliability::Psn;
use super::wire::{restamp, HDR_LEN};
use crate::iface_common::{buf_sge, BUF_DATA_OFFSET};
use crate::verbs::{QueuePair, SendFlags, SendOp, SendRequest, Sge, UdDest};

/// Where a packet starts in a send buffer.
pub const PKT_OFF: usize = BUF_DATA_OFFSET;
/// `wr_id` of inline sends (no buffer to track).
const WR_INLINE: u64 = u64::MAX;
/// Most user iov entries of an am_zcopy (the first SGE is the packet header).
pub const MAX_ZCOPY_IOV: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    /// Taken for filling, or held by a window.
    Busy,
    /// Acknowledged, waiting for the HCA to finish reading it.
    Released,
    /// A control packet too large to inline, freed at its send completion.
    Ctl,
}

/// The user memory an am_zcopy packet gathers after its header, and its completion. The
/// memory stays the user's until the packet is acknowledged and the HCA is done with it.
#[derive(Clone, Copy)]
struct Zcopy {
    n: u8,
    sges: [Sge; MAX_ZCOPY_IOV],
    comp: Comp,
    /// How it ends (set when the window lets go of the packet).
    status: Status,
}

const NO_ZCOPY: Zcopy =
    Zcopy { n: 0, sges: [Sge::new(0, 0, 0); MAX_ZCOPY_IOV], comp: Comp::NONE, status: Status::Ok };

struct Skb {
    buf: Option<PoolBuf>,
    /// Bytes of the packet in the buffer (the header part for zcopy).
    len: u16,
    /// Posted by reference and not yet completed.
    posted: u16,
    state: State,
    zc: Zcopy,
}

impl Skb {
    /// The zcopy completion and its status, once the skb is free (it is cleared).
    fn take_comp(&mut self) -> Option<(Comp, Status)> {
        if self.zc.n == 0 {
            return None;
        }
        let c = (self.zc.comp, self.zc.status);
        self.zc = NO_ZCOPY;
        Some(c)
    }
}

/// Send buffers and send-queue credits of an interface.
pub struct TxPool {
    pool: MemPool,
    skbs: Vec<Skb>,
    free: Vec<u32>,
    max: usize,
    sq_free: u32,
    max_inline: usize,
    /// Skbs held by windows (everything unacknowledged, for iface flush).
    in_windows: usize,
    post_errors: u64,
}

impl TxPool {
    /// At most `max` buffers from `pool` (taken on demand), `sq_len` send WRs in flight,
    /// packets of up to `max_inline` bytes inline.
    pub fn new(pool: MemPool, max: usize, sq_len: u32, max_inline: usize) -> TxPool {
        TxPool {
            pool,
            skbs: Vec::with_capacity(max.min(1024)),
            free: Vec::with_capacity(max.min(1024)),
            max,
            sq_free: sq_len,
            max_inline,
            in_windows: 0,
            post_errors: 0,
        }
    }

    /// A send WR can be posted now.
    #[inline]
    pub fn can_post(&self) -> bool {
        self.sq_free > 0
    }

    /// A new AM could be sent now (send WR and buffer available).
    #[inline]
    pub fn has_room(&self) -> bool {
        self.sq_free > 0 && (!self.free.is_empty() || self.skbs.len() < self.max)
    }

    /// Unacknowledged packets of all endpoints.
    pub fn in_windows(&self) -> usize {
        self.in_windows
    }

    /// Takes a free buffer out of its slot, so that user code can fill it with no borrow
    /// held. `Err(NoResource)` when none is free or the send queue is full.
    #[inline]
    pub fn take(&mut self) -> Result<(u32, PoolBuf)> {
        if self.sq_free == 0 {
            return Err(Status::NoResource);
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => self.grow()?,
        };
        let skb = &mut self.skbs[slot as usize];
        skb.state = State::Busy;
        let buf = skb.buf.take().expect("a free skb has its buffer");
        Ok((slot, buf))
    }

    #[cold]
    fn grow(&mut self) -> Result<u32> {
        if self.skbs.len() >= self.max {
            return Err(Status::NoResource);
        }
        let buf = self.pool.get().map_err(|_| Status::NoResource)?;
        self.skbs.push(Skb { buf: Some(buf), len: 0, posted: 0, state: State::Free, zc: NO_ZCOPY });
        Ok(self.skbs.len() as u32 - 1)
    }

    /// Gives back a taken buffer that will not be sent.
    pub fn abandon(&mut self, slot: u32, buf: PoolBuf) {
        let skb = &mut self.skbs[slot as usize];
        skb.buf = Some(buf);
        skb.state = State::Free;
        self.free.push(slot);
    }

    /// Puts a filled buffer (`len` packet bytes at [`PKT_OFF`]) back; a window holds it now.
    #[inline]
    pub fn commit(&mut self, slot: u32, buf: PoolBuf, len: usize) {
        let skb = &mut self.skbs[slot as usize];
        skb.buf = Some(buf);
        skb.len = len as u16;
        self.in_windows += 1;
    }

    /// Like [`TxPool::commit`] for an am_zcopy packet: `len` header bytes in the buffer, then
    /// the user memory of `sges`; `comp` completes when the skb is released and idle.
    pub fn commit_zcopy(&mut self, slot: u32, buf: PoolBuf, len: usize, sges: &[Sge], comp: Comp) {
        self.commit(slot, buf, len);
        let zc = &mut self.skbs[slot as usize].zc;
        zc.n = sges.len() as u8;
        zc.sges[..sges.len()].copy_from_slice(sges);
        zc.comp = comp;
    }

    /// A window let go of `slot`: acknowledged (`Ok`) or dropped (the endpoint's failure).
    /// Returns an am_zcopy completion to fire now (the HCA no longer reads the user's
    /// memory); a packet still posted returns it from [`TxPool::completed`] instead.
    #[inline]
    pub fn release(&mut self, slot: u32, status: Status) -> Option<(Comp, Status)> {
        self.in_windows -= 1;
        let skb = &mut self.skbs[slot as usize];
        skb.zc.status = status;
        if skb.posted == 0 {
            skb.state = State::Free;
            self.free.push(slot);
            skb.take_comp()
        } else {
            skb.state = State::Released;
            None
        }
    }

    /// Posts the packet in `slot` to `dest`.
    #[inline]
    pub fn post(&mut self, qp: &QueuePair, slot: u32, dest: UdDest<'_>) -> Result<()> {
        if self.sq_free == 0 {
            return Err(Status::NoResource);
        }
        let skb = &mut self.skbs[slot as usize];
        let Some(buf) = skb.buf.as_ref() else {
            return Err(Status::NoResource);
        };
        let len = skb.len as usize;
        let r = if skb.zc.n > 0 {
            let mut sges = [Sge::new(0, 0, 0); MAX_ZCOPY_IOV + 1];
            let n = skb.zc.n as usize;
            sges[0] = buf_sge(buf, PKT_OFF, len);
            sges[1..=n].copy_from_slice(&skb.zc.sges[..n]);
            let r = qp.post_send(&SendRequest {
                wr_id: slot as u64,
                sges: &sges[..=n],
                op: SendOp::Send,
                flags: SendFlags::SIGNALED,
                ud: Some(dest),
            });
            if r.is_ok() {
                skb.posted += 1;
            }
            r
        } else if len <= self.max_inline {
            qp.post_send_inline(
                WR_INLINE,
                &[&buf[PKT_OFF..PKT_OFF + len]],
                SendOp::Send,
                SendFlags::SIGNALED,
                Some(dest),
            )
        } else {
            let sge = buf_sge(buf, PKT_OFF, len);
            let r = qp.post_send(&SendRequest {
                wr_id: slot as u64,
                sges: std::slice::from_ref(&sge),
                op: SendOp::Send,
                flags: SendFlags::SIGNALED,
                ud: Some(dest),
            });
            if r.is_ok() {
                skb.posted += 1;
            }
            r
        };
        self.posted(r)
    }

    fn posted(&mut self, r: Result<()>) -> Result<()> {
        match r {
            Ok(()) => {
                self.sq_free -= 1;
                Ok(())
            }
            Err(e) => {
                self.post_errors += 1;
                if self.post_errors.is_power_of_two() {
                    tracing::warn!(errors = self.post_errors, "ud_verbs: posting a send failed: {e}");
                }
                Err(e)
            }
        }
    }

    /// Sends the packet in `slot` again with a new acknowledgement and flags. `Ok(false)`
    /// when the HCA still reads the buffer from an earlier post (that copy is on its way).
    pub fn resend(&mut self, qp: &QueuePair, slot: u32, ack_psn: Psn, flags: u8, dest: UdDest<'_>) -> Result<bool> {
        let skb = &mut self.skbs[slot as usize];
        if skb.posted > 0 {
            return Ok(false);
        }
        let Some(buf) = skb.buf.as_mut() else {
            return Ok(false);
        };
        restamp(&mut buf[PKT_OFF..PKT_OFF + HDR_LEN], ack_psn, flags);
        self.post(qp, slot, dest).map(|_| true)
    }

    /// Posts a control packet: inline when it fits, otherwise from a buffer freed at its
    /// send completion.
    pub fn post_ctl(&mut self, qp: &QueuePair, pkt: &[u8], dest: UdDest<'_>) -> Result<()> {
        if self.sq_free == 0 {
            return Err(Status::NoResource);
        }
        if pkt.len() <= self.max_inline {
            let r = qp.post_send_inline(WR_INLINE, &[pkt], SendOp::Send, SendFlags::SIGNALED, Some(dest));
            return self.posted(r);
        }
        let (slot, mut buf) = self.take()?;
        buf[PKT_OFF..PKT_OFF + pkt.len()].copy_from_slice(pkt);
        let skb = &mut self.skbs[slot as usize];
        skb.buf = Some(buf);
        skb.len = pkt.len() as u16;
        skb.state = State::Ctl;
        let r = self.post(qp, slot, dest);
        let skb = &mut self.skbs[slot as usize];
        if r.is_err() && skb.posted == 0 {
            skb.state = State::Free;
            self.free.push(slot);
        }
        r
    }

    /// A send completion (every send is signaled); returns an am_zcopy completion that was
    /// waiting for the HCA to finish.
    #[inline]
    pub fn completed(&mut self, wr_id: u64) -> Option<(Comp, Status)> {
        self.sq_free += 1;
        if wr_id == WR_INLINE {
            return None;
        }
        let skb = self.skbs.get_mut(wr_id as usize)?;
        skb.posted = skb.posted.saturating_sub(1);
        if skb.posted == 0 && matches!(skb.state, State::Released | State::Ctl) {
            skb.state = State::Free;
            self.free.push(wr_id as u32);
            return skb.take_comp();
        }
        None
    }
}

/// A buffer taken from a [`TxPool`] for filling; goes back to the pool unless committed
/// (also when the user's pack callback panics).
pub struct Taken<'a> {
    tx: &'a RefCell<TxPool>,
    slot: u32,
    buf: Option<PoolBuf>,
}

impl<'a> Taken<'a> {
    #[inline]
    pub fn new(tx: &'a RefCell<TxPool>) -> Result<Taken<'a>> {
        let (slot, buf) = tx.borrow_mut().take()?;
        Ok(Taken { tx, slot, buf: Some(buf) })
    }

    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The whole buffer.
    #[inline]
    pub fn buf(&mut self) -> &mut [u8] {
        self.buf.as_mut().expect("not committed")
    }

    /// Hands the filled buffer (`len` packet bytes) to the pool's window accounting.
    #[inline]
    pub fn commit(mut self, tx: &mut TxPool, len: usize) {
        let buf = self.buf.take().expect("not committed");
        tx.commit(self.slot, buf, len);
    }

    /// [`Taken::commit`] for an am_zcopy packet.
    pub fn commit_zcopy(mut self, tx: &mut TxPool, len: usize, sges: &[Sge], comp: Comp) {
        let buf = self.buf.take().expect("not committed");
        tx.commit_zcopy(self.slot, buf, len, sges, comp);
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            if let Ok(mut tx) = self.tx.try_borrow_mut() {
                tx.abandon(self.slot, buf);
            }
        }
    }
}

// ------------------------------------------------------------------ the interface's send paths

use std::rc::Rc;

use super::ep::{ctl, EpCell, EpState};
use super::iface::UdShared;
use super::wire::{Creq, Crep, Header, Kind, EP_ID_NONE, FLAG_ACK_REQ};

impl UdShared {
    /// Sends an AM whose body `fill` writes (at most [`UdShared::max_am`] bytes); returns the
    /// body length. The packet stays in the endpoint's window until acknowledged.
    #[inline]
    pub(crate) fn send_am(
        &self,
        ep: &EpCell,
        id: u8,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<usize> {
        self.send_packet(ep, id, fill, None)
    }

    /// Sends an am_zcopy: `header` goes into the send buffer, `sges` (user memory) follow it.
    /// `comp` completes once the packet is acknowledged.
    pub(crate) fn send_zcopy(&self, ep: &EpCell, id: u8, header: &[u8], sges: &[Sge], comp: Comp) -> Result<()> {
        let fill = |b: &mut [u8]| {
            b[..header.len()].copy_from_slice(header);
            Ok(header.len())
        };
        self.send_packet(ep, id, fill, Some((sges, comp))).map(|_| ())
    }

    #[inline]
    fn send_packet(
        &self,
        ep: &EpCell,
        id: u8,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
        zcopy: Option<(&[Sge], Comp)>,
    ) -> Result<usize> {
        ep.st.borrow().check_send(ep.has_pending())?;
        let mut t = Taken::new(&self.tx)?;
        // user code (a pack callback) runs here, with no borrow held
        let n = fill(&mut t.buf()[PKT_OFF + HDR_LEN..PKT_OFF + self.seg])?;
        let mut g = ep.st.borrow_mut();
        let st = &mut *g;
        st.check_send(ep.has_pending())?;
        let slot = t.slot();
        let stamp = st.rel.send(slot);
        let peer = st.peer.as_ref().expect("checked: connected");
        Header { kind: Kind::Am, am_id: id, flags: stamp.flags, dest_ep: peer.ep_id, psn: stamp.psn, ack_psn: stamp.ack_psn }
            .encode(&mut t.buf()[PKT_OFF..]);
        let mut tx = self.tx.borrow_mut();
        match zcopy {
            None => t.commit(&mut tx, HDR_LEN + n),
            Some((sges, comp)) => t.commit_zcopy(&mut tx, HDR_LEN + n, sges, comp),
        }
        // a failed post leaves the packet in the window: the resend timer sends it again
        let _ = tx.post(&self.qp, slot, peer.dest());
        Ok(n)
    }

    /// Sends again what the endpoint's go-back-N cursor allows.
    pub(crate) fn pump_resends(&self, st: &mut EpState) {
        let EpState { rel, peer, .. } = st;
        let Some(peer) = peer.as_ref().filter(|p| p.ep_id != EP_ID_NONE) else { return };
        let mut tx = self.tx.borrow_mut();
        while tx.can_post() {
            let Some(r) = rel.next_resend() else { break };
            let _ = tx.resend(&self.qp, r.skb, r.stamp.ack_psn, r.stamp.flags, peer.dest());
        }
    }

    /// Queues `ep` for its control packets (sent by the next progress, or at once by
    /// [`UdShared::send_ctl`]).
    pub(crate) fn schedule_ctl(&self, ep: &Rc<EpCell>, st: &mut EpState) {
        if !st.in_ctl_list {
            st.in_ctl_list = true;
            self.ctl_list.borrow_mut().push(ep.clone());
        }
    }

    /// Sends the control packets of every queued endpoint; endpoints whose packets do not fit
    /// in the send queue stay queued.
    pub(crate) fn send_ctl(&self) -> u32 {
        if self.ctl_list.borrow().is_empty() {
            return 0;
        }
        let mut list = std::mem::take(&mut *self.spare.borrow_mut());
        std::mem::swap(&mut list, &mut *self.ctl_list.borrow_mut());
        let mut work = 0;
        for ep in list.drain(..) {
            let mut g = ep.st.borrow_mut();
            let st = &mut *g;
            st.in_ctl_list = false;
            if st.failed.is_some() {
                continue;
            }
            work += 1;
            if !self.send_ctl_of(st) {
                self.schedule_ctl(&ep, st);
            }
        }
        let mut spare = self.spare.borrow_mut();
        if spare.capacity() < list.capacity() {
            *spare = list;
        }
        work
    }

    /// Sends an endpoint's control packets; false when the send queue is full.
    fn send_ctl_of(&self, st: &mut EpState) -> bool {
        let EpState { rel, peer, ctl: bits, id, .. } = st;
        let Some(peer) = peer.as_ref() else {
            return true; // not connected: nothing to say yet (the timer asks again)
        };
        let mut pkt = [0u8; 128];
        let mut tx = self.tx.borrow_mut();
        if *bits & ctl::CREQ != 0 {
            Header { kind: Kind::Creq, am_id: 0, flags: 0, dest_ep: EP_ID_NONE, psn: 0, ack_psn: 0 }.encode(&mut pkt);
            let body = Creq { src_ep: *id, src_qpn: self.qpn, dev_addr: &self.dev_addr };
            let n = HDR_LEN + body.encode(&mut pkt[HDR_LEN..]);
            if tx.post_ctl(&self.qp, &pkt[..n], peer.dest()).is_err() {
                return false;
            }
            *bits &= !ctl::CREQ;
        }
        if peer.ep_id == EP_ID_NONE {
            return true; // the rest needs the peer's endpoint (after its reply)
        }
        if *bits & ctl::CREP != 0 {
            let ack_psn = rel.take_ack();
            Header { kind: Kind::Crep, am_id: 0, flags: 0, dest_ep: peer.ep_id, psn: 0, ack_psn }.encode(&mut pkt);
            pkt[HDR_LEN..HDR_LEN + Crep::LEN].copy_from_slice(&Crep { src_ep: *id }.to_bytes());
            if tx.post_ctl(&self.qp, &pkt[..HDR_LEN + Crep::LEN], peer.dest()).is_err() {
                rel.request_ack();
                return false;
            }
            *bits &= !ctl::CREP;
        }
        if *bits & ctl::ACK_REQ != 0 || rel.needs_ack_now() {
            let flags = if *bits & ctl::ACK_REQ != 0 { FLAG_ACK_REQ } else { 0 };
            let ack_psn = rel.take_ack();
            Header { kind: Kind::Ack, am_id: 0, flags, dest_ep: peer.ep_id, psn: 0, ack_psn }.encode(&mut pkt);
            if tx.post_ctl(&self.qp, &pkt[..HDR_LEN], peer.dest()).is_err() {
                rel.request_ack();
                return false;
            }
            *bits &= !ctl::ACK_REQ;
        }
        true
    }

    /// Tells the peer that this endpoint is gone (best effort, no retry).
    pub(crate) fn send_disc(&self, st: &mut EpState) {
        let Some(peer) = st.peer.as_ref().filter(|p| p.ep_id != EP_ID_NONE) else { return };
        let ack_psn = st.rel.take_ack();
        let h = Header { kind: Kind::Disc, am_id: 0, flags: 0, dest_ep: peer.ep_id, psn: 0, ack_psn };
        let _ = self.tx.borrow_mut().post_ctl(&self.qp, &h.to_bytes(), peer.dest());
    }
}
