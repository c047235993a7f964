//! Send buffers ("skbs"): registered buffers that stay in a reliability window until
//! acknowledged, send-queue accounting, and the posting of one packet (new, resent, control).
//! Packets that fit the QP's inline limit are posted inline; larger ones (and am_zcopy) point
//! the HCA at the skb, which then is not rewritten or reused until its send completion.
//!
//! Send completions are moderated as UCX does (`UCT_UD_TX_MODERATION`): one send in
//! `moderation` is signaled, and its completion completes every send before it (a send queue
//! completes in order). What must hear of its own completion is always signaled: am_zcopy (the
//! user's memory), control packets posted from a buffer, resends. An skb sent unsignaled and
//! acknowledged waits for the next signaled completion to be freed; at most `moderation - 1`
//! sends are unsignaled past the last signaled one, so buffers and queue slots cannot all be
//! held that way (`moderation` is at most a quarter of either). The one case that could wait
//! forever, a resend held back by an unsignaled copy of itself when nothing else is sent, asks
//! for the next send to be signaled ([`TxPool::resend`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Error, Result, Status};
use uct_transport::callbacks::Comp;

use super::ep::QKEY;
use super::reliability::Psn;
use super::wire::{restamp, HDR_LEN};
use crate::iface_common::{buf_sge, BUF_DATA_OFFSET};
use crate::txq::TxQueue;
use uct_ib_verbs::{
    AddressHandle, QueuePair, SendBatch, SendFlags, SendOp, SendRequest, Sge, UdDest, UdInlineWr,
};

/// Where a packet starts in a send buffer.
pub const PKT_OFF: usize = BUF_DATA_OFFSET;
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

const NO_ZCOPY: Zcopy = Zcopy {
    n: 0,
    sges: [Sge::new(0, 0, 0); MAX_ZCOPY_IOV],
    comp: Comp::NONE,
    status: Status::Ok,
};

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
    /// Before `pool`: fields drop in order, and buffers still held here (packets unacknowledged
    /// or not completed when the interface closes, after its QP is gone) must be back before
    /// the pool goes, or it reports them as leaked.
    skbs: Vec<Skb>,
    pool: MemPool,
    free: Vec<u32>,
    max: usize,
    /// Send-queue slots and completions; the ops are skbs posted by reference.
    sq: TxQueue<u32>,
    sq_len: u32,
    /// Signal the next send: a resend waits for an unsignaled send's completion.
    signal_next: bool,
    max_inline: usize,
    /// Skbs held by windows (everything unacknowledged, for iface flush).
    in_windows: usize,
    /// am_zcopy skbs acknowledged (or dropped) whose completion waits for their send
    /// completion (see [`TxPool::awaiting_send`]).
    awaiting_send: usize,
    post_errors: u64,
    /// AM packets of a burst waiting for one doorbell (`RUCX_IB_TX_DB_BATCH`, as rc_verbs:
    /// the first AM from a buffer after a progress call is posted at once, later ones to the
    /// same destination go out in chains; every other post, and progress, posts them first).
    batch: SendBatch,
    batch_max: usize,
    burst: bool,
    /// The request of every inline post, kept filled between posts.
    inline_wr: UdInlineWr,
}

impl TxPool {
    /// At most `max` buffers from `pool` (taken on demand), `sq_len` send WRs in flight,
    /// packets of up to `max_inline` bytes inline, a signaled send every `moderation` (capped
    /// at a quarter of `max` and of `sq_len`, see the module's doc).
    pub fn new(pool: MemPool, max: usize, sq_len: u32, max_inline: usize, moderation: u32) -> TxPool {
        let moderation = moderation.min(sq_len / 4).min((max / 4) as u32).max(1);
        TxPool {
            pool,
            skbs: Vec::with_capacity(max.min(1024)),
            free: Vec::with_capacity(max.min(1024)),
            max,
            sq: TxQueue::new(sq_len, moderation, 0),
            sq_len,
            signal_next: false,
            max_inline,
            in_windows: 0,
            awaiting_send: 0,
            post_errors: 0,
            batch: SendBatch::default(),
            batch_max: 1,
            burst: false,
            inline_wr: UdInlineWr::default(),
        }
    }

    /// Posts AM packets of a burst in chains of up to `max` (1: every packet at once).
    pub fn with_doorbell_batch(mut self, max: usize) -> TxPool {
        self.batch_max = max.clamp(1, uct_ib_verbs::SEND_BATCH_MAX);
        self
    }

    /// True when the AM packet of `len` bytes about to be posted should wait in the batch
    /// ([`TxPool::collect`]) rather than go at once: it is posted from its buffer (not inline)
    /// and not the first of the burst.
    #[inline]
    pub fn collects(&mut self, len: usize) -> bool {
        if self.batch_max <= 1 || len <= self.max_inline {
            return false;
        }
        let burst = self.burst;
        self.burst = true;
        burst
    }

    /// Collects the AM packet in `slot` for `ah`/`remote_qpn` (see [`TxPool::collects`]),
    /// accounted as posted; a full batch, or one to another destination, is posted first.
    pub fn collect(
        &mut self,
        qp: &QueuePair,
        slot: u32,
        ah: &Arc<AddressHandle>,
        remote_qpn: u32,
    ) -> Result<()> {
        if !self.batch.is_empty()
            && (self.batch.len() >= self.batch_max || !self.batch.fits_ud(ah, remote_qpn, QKEY))
        {
            self.ring(qp);
        }
        if !self.sq.has_room() {
            return Err(Status::NoResource.into());
        }
        let (wr_id, signaled, flags) = self.next_wr(false);
        let skb = &mut self.skbs[slot as usize];
        let Some(buf) = skb.buf.as_ref() else {
            return Err(Status::NoResource.into());
        };
        let sge = buf_sge(buf, PKT_OFF, skb.len as usize);
        if !self.batch.push_ud(wr_id, sge, flags, ah, remote_qpn, QKEY) {
            // cannot happen after the ring above; post it alone
            return self.post_slot(
                qp,
                slot,
                UdDest {
                    ah,
                    remote_qpn,
                    remote_qkey: QKEY,
                },
                false,
            );
        }
        skb.posted += 1;
        self.posted(Ok(()), signaled, Some(slot))?;
        if self.batch.len() >= self.batch_max {
            self.ring(qp);
        }
        Ok(())
    }

    /// Posts the collected packets, if any, as one chain. Packets the provider refuses stay
    /// in their windows (the resend timer sends them again, as after a lost packet); their
    /// accounting is given back.
    pub fn ring(&mut self, qp: &QueuePair) {
        if self.batch.is_empty() {
            return;
        }
        if let Err(refused) = self.batch.post(qp) {
            self.post_errors += 1;
            if self.post_errors.is_power_of_two() {
                ucs::warn!(
                    errors = self.post_errors,
                    unposted = refused.unposted,
                    "ud_verbs: posting a chain of sends failed: {}",
                    refused.status.name()
                );
            }
            let skbs = &mut self.skbs;
            self.sq.unpost(refused.unposted as u32, |slot| {
                let skb = &mut skbs[slot as usize];
                skb.posted = skb.posted.saturating_sub(1);
            });
        }
    }

    /// The end of a progress call: the burst is over, collected packets go out.
    #[inline]
    pub fn end_burst(&mut self, qp: &QueuePair) {
        self.burst = false;
        if !self.batch.is_empty() {
            self.ring(qp);
        }
    }

    /// A send WR can be posted now.
    #[inline]
    pub fn can_post(&self) -> bool {
        self.sq.has_room()
    }

    /// Send completions are wanted: the send queue is half used, or a buffer is short.
    #[inline]
    pub fn wants_completions(&self) -> bool {
        self.sq.available() < self.sq_len / 2 || !self.has_room()
    }

    /// A new AM could be sent now (send WR and buffer available).
    #[inline]
    pub fn has_room(&self) -> bool {
        self.sq.has_room() && (!self.free.is_empty() || self.skbs.len() < self.max)
    }

    /// Unacknowledged packets of all endpoints.
    pub fn in_windows(&self) -> usize {
        self.in_windows
    }

    /// Takes a free slot; its buffer stays there, to be filled through [`TxPool::buf_mut`]
    /// while the pool is borrowed. `Err(NoResource)` when none is free or the send queue is
    /// full.
    #[inline]
    pub fn take_slot(&mut self) -> Result<u32> {
        if !self.sq.has_room() {
            return Err(Status::NoResource.into());
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => self.grow()?,
        };
        self.skbs[slot as usize].state = State::Busy;
        Ok(slot)
    }

    /// Takes a free buffer out of its slot, so that user code can fill it with no borrow
    /// held ([`TxPool::restore`] puts it back). `Err(NoResource)` as [`TxPool::take_slot`].
    #[inline]
    pub fn take(&mut self) -> Result<(u32, PoolBuf)> {
        let slot = self.take_slot()?;
        let buf = self.skbs[slot as usize]
            .buf
            .take()
            .expect("a free skb has its buffer");
        Ok((slot, buf))
    }

    /// The buffer of a taken slot.
    #[inline]
    pub fn buf_mut(&mut self, slot: u32) -> &mut [u8] {
        self.skbs[slot as usize]
            .buf
            .as_mut()
            .expect("a taken slot holds its buffer")
    }

    /// Puts a buffer taken with [`TxPool::take`] back into its slot (still taken).
    #[inline]
    pub fn restore(&mut self, slot: u32, buf: PoolBuf) {
        self.skbs[slot as usize].buf = Some(buf);
    }

    #[cold]
    fn grow(&mut self) -> Result<u32> {
        if self.skbs.len() >= self.max {
            return Err(Status::NoResource.into());
        }
        let buf = self.pool.get().map_err(|_| Status::NoResource)?;
        self.skbs.push(Skb {
            buf: Some(buf),
            len: 0,
            posted: 0,
            state: State::Free,
            zc: NO_ZCOPY,
        });
        Ok(self.skbs.len() as u32 - 1)
    }

    /// Gives back a taken buffer that will not be sent.
    pub fn abandon(&mut self, slot: u32, buf: PoolBuf) {
        let skb = &mut self.skbs[slot as usize];
        skb.buf = Some(buf);
        skb.state = State::Free;
        self.free.push(slot);
    }

    /// The taken slot's buffer is filled (`len` packet bytes at [`PKT_OFF`]); a window holds
    /// it now.
    #[inline]
    pub fn commit(&mut self, slot: u32, len: usize) {
        self.skbs[slot as usize].len = len as u16;
        self.in_windows += 1;
    }

    /// Like [`TxPool::commit`] for an am_zcopy packet: `len` header bytes in the buffer, then
    /// the user memory of `sges`; `comp` completes when the skb is released and idle.
    pub fn commit_zcopy(&mut self, slot: u32, len: usize, sges: &[Sge], comp: Comp) {
        self.commit(slot, len);
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
            if skb.zc.n > 0 {
                self.awaiting_send += 1;
            }
            None
        }
    }

    /// Posts the AM packet of `len` bytes in `slot` (not an am_zcopy) to `ah`/`remote_qpn`:
    /// inline through the kept request when it fits (the fast path: no batch, zcopy or
    /// by-reference branches), else collected for a doorbell or posted from its buffer.
    #[inline]
    pub fn post_am(
        &mut self,
        qp: &QueuePair,
        slot: u32,
        len: usize,
        ah: &Arc<AddressHandle>,
        remote_qpn: u32,
    ) -> Result<()> {
        let dest = UdDest {
            ah,
            remote_qpn,
            remote_qkey: QKEY,
        };
        if len > self.max_inline {
            return if self.collects(len) {
                self.collect(qp, slot, ah, remote_qpn)
            } else {
                self.post_slot(qp, slot, dest, false)
            };
        }
        self.post_inline(qp, slot, len, dest, false)
    }

    /// Collected packets go first (order on the QP); then a send WR must be free.
    #[inline]
    fn make_room(&mut self, qp: &QueuePair) -> Result<()> {
        if !self.batch.is_empty() {
            self.ring(qp);
        }
        if !self.sq.has_room() {
            return Err(Status::NoResource.into());
        }
        Ok(())
    }

    /// Posts the `len` bytes of the packet in `slot` inline through the kept request
    /// (signaled when `force`, or by moderation); the HCA does not read the buffer after.
    #[inline]
    fn post_inline(
        &mut self,
        qp: &QueuePair,
        slot: u32,
        len: usize,
        dest: UdDest<'_>,
        force: bool,
    ) -> Result<()> {
        self.make_room(qp)?;
        let (wr_id, signaled, flags) = self.next_wr(force);
        let pkt = self
            .skbs
            .get(slot as usize)
            .and_then(|s| s.buf.as_ref())
            .and_then(|b| b.get(PKT_OFF..PKT_OFF + len));
        let Some(pkt) = pkt else {
            return Err(Status::NoResource.into());
        };
        let r = qp.post_ud_inline_prepared(&mut self.inline_wr, wr_id, pkt, flags, dest);
        self.posted(r, signaled, None)
    }

    /// Posts the packet in `slot` to `dest`.
    #[inline]
    pub fn post(&mut self, qp: &QueuePair, slot: u32, dest: UdDest<'_>) -> Result<()> {
        self.post_slot(qp, slot, dest, false)
    }

    /// The `wr_id` of the next send, whether it is signaled (`force`, a pending
    /// [`TxPool::signal_wanted`], or moderation) and its flags.
    #[inline]
    fn next_wr(&self, force: bool) -> (u64, bool, SendFlags) {
        let (wr_id, signaled) = self.sq.next(force || self.signal_next);
        let flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        (wr_id, signaled, flags)
    }

    /// Posts the packet in `slot`, signaled when `force`, for an am_zcopy, or by moderation:
    /// inline when it fits and is not an am_zcopy, else from its buffer (and the user's memory).
    #[inline]
    fn post_slot(&mut self, qp: &QueuePair, slot: u32, dest: UdDest<'_>, force: bool) -> Result<()> {
        let skb = &self.skbs[slot as usize];
        let zcopy = skb.zc.n > 0;
        let len = skb.len as usize;
        if !zcopy && len <= self.max_inline {
            return self.post_inline(qp, slot, len, dest, force);
        }
        self.make_room(qp)?;
        let (wr_id, signaled, flags) = self.next_wr(force || zcopy);
        let skb = &mut self.skbs[slot as usize];
        let Some(buf) = skb.buf.as_ref() else {
            return Err(Status::NoResource.into());
        };
        let r = if zcopy {
            let mut sges = [Sge::new(0, 0, 0); MAX_ZCOPY_IOV + 1];
            let n = skb.zc.n as usize;
            sges[0] = buf_sge(buf, PKT_OFF, len);
            sges[1..=n].copy_from_slice(&skb.zc.sges[..n]);
            qp.post_send(&SendRequest {
                wr_id,
                sges: &sges[..=n],
                op: SendOp::Send,
                flags,
                ud: Some(dest),
            })
        } else {
            let sge = buf_sge(buf, PKT_OFF, len);
            qp.post_send(&SendRequest {
                wr_id,
                sges: std::slice::from_ref(&sge),
                op: SendOp::Send,
                flags,
                ud: Some(dest),
            })
        };
        if r.is_ok() {
            skb.posted += 1;
        }
        self.posted(r, signaled, Some(slot))
    }

    /// Accounts a post (`slot`: the skb it reads, if any) or counts its failure.
    #[inline]
    fn posted(&mut self, r: Result<()>, signaled: bool, slot: Option<u32>) -> Result<()> {
        match r {
            Ok(()) => {
                self.sq.posted(signaled);
                if signaled {
                    self.signal_next = false;
                }
                if let Some(slot) = slot {
                    self.sq.push_op(slot);
                }
                Ok(())
            }
            Err(e) => Err(self.post_failed(e)),
        }
    }

    #[cold]
    fn post_failed(&mut self, e: Error) -> Error {
        self.post_errors += 1;
        if self.post_errors.is_power_of_two() {
            ucs::warn!(errors = self.post_errors, "ud_verbs: posting a send failed: {e}");
        }
        e
    }

    /// Sends the packet in `slot` again with a new acknowledgement and flags (signaled, so
    /// that its completion frees the skb for the next resend). `Ok(false)` when the HCA may
    /// still read the buffer from an earlier post: that copy is on its way, or has gone
    /// unsignaled and is waiting for a later completion; then the next send is signaled, and
    /// the caller should make sure one goes out ([`TxPool::signal_wanted`]).
    pub fn resend(
        &mut self,
        qp: &QueuePair,
        slot: u32,
        ack_psn: Psn,
        flags: u8,
        dest: UdDest<'_>,
    ) -> Result<bool> {
        if self.held_by_hca(slot) {
            return Ok(false);
        }
        let Some(buf) = self.skbs[slot as usize].buf.as_mut() else {
            return Ok(false);
        };
        restamp(&mut buf[PKT_OFF..PKT_OFF + HDR_LEN], ack_psn, flags);
        self.post_slot(qp, slot, dest, true).map(|_| true)
    }

    /// True when the HCA may still read `slot` from an earlier post. If that post may be
    /// unsignaled, the next send is signaled so that its completion lets `slot` go.
    fn held_by_hca(&mut self, slot: u32) -> bool {
        if self.skbs[slot as usize].posted == 0 {
            return false;
        }
        if self.sq.unsignaled() > 0 {
            self.signal_next = true;
        }
        true
    }

    /// A resend waits for unsignaled sends to complete: the next send will be signaled.
    pub fn signal_wanted(&self) -> bool {
        self.signal_next
    }

    /// Posts a control packet: inline when it fits, otherwise from a buffer freed at its
    /// send completion.
    pub fn post_ctl(&mut self, qp: &QueuePair, pkt: &[u8], dest: UdDest<'_>) -> Result<()> {
        self.make_room(qp)?;
        if pkt.len() <= self.max_inline {
            let (wr_id, signaled, flags) = self.next_wr(false);
            let r = qp.post_ud_inline_prepared(&mut self.inline_wr, wr_id, pkt, flags, dest);
            return self.posted(r, signaled, None);
        }
        let (slot, mut buf) = self.take()?;
        buf[PKT_OFF..PKT_OFF + pkt.len()].copy_from_slice(pkt);
        let skb = &mut self.skbs[slot as usize];
        skb.buf = Some(buf);
        skb.len = pkt.len() as u16;
        skb.state = State::Ctl;
        let r = self.post_slot(qp, slot, dest, true);
        let skb = &mut self.skbs[slot as usize];
        if r.is_err() && skb.posted == 0 {
            skb.state = State::Free;
            self.free.push(slot);
        }
        r
    }

    /// A send completion for `wr_id`: it completes every send up to it. Skbs the HCA no
    /// longer reads are freed when their window let go of them; am_zcopy completions that
    /// waited for that go to `done`.
    #[inline]
    pub fn completed(&mut self, wr_id: u64, done: &mut VecDeque<(Comp, Status)>) {
        if self.sq.complete(wr_id) == 0 {
            return; // stale or repeated (e.g. flushed unsignaled sends after their signaled one)
        }
        while let Some(slot) = self.sq.pop_done() {
            let skb = &mut self.skbs[slot as usize];
            skb.posted = skb.posted.saturating_sub(1);
            if skb.posted == 0 && matches!(skb.state, State::Released | State::Ctl) {
                skb.state = State::Free;
                self.free.push(slot);
                if let Some(c) = skb.take_comp() {
                    self.awaiting_send = self.awaiting_send.saturating_sub(1);
                    done.push_back(c);
                }
            }
        }
    }

    /// am_zcopy operations whose packets have left their windows but whose completion waits
    /// for the send completion (the send CQ not polled yet): a flush is not done before them.
    #[inline]
    pub fn awaiting_send(&self) -> usize {
        self.awaiting_send
    }
}

/// A buffer taken from a [`TxPool`] for filling by user code; goes back to the pool unless
/// taken apart with [`Taken::into_parts`] (also when the user's pack callback panics).
pub struct Taken<'a> {
    tx: &'a RefCell<TxPool>,
    slot: u32,
    buf: Option<PoolBuf>,
}

impl<'a> Taken<'a> {
    #[inline]
    pub fn new(tx: &'a RefCell<TxPool>) -> Result<Taken<'a>> {
        let (slot, buf) = tx.borrow_mut().take()?;
        Ok(Taken {
            tx,
            slot,
            buf: Some(buf),
        })
    }

    /// The whole buffer.
    #[inline]
    pub fn buf(&mut self) -> &mut [u8] {
        self.buf.as_mut().expect("not committed")
    }

    /// The slot and its filled buffer, for [`TxPool::commit`] (no longer given back on drop).
    #[inline]
    pub fn into_parts(mut self) -> (u32, PoolBuf) {
        (self.slot, self.buf.take().expect("not committed"))
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

#[cfg(test)]
impl TxPool {
    /// As if `slot` had been posted by reference (tests have no QP); returns its `wr_id` and
    /// whether it was signaled.
    fn mark_posted(&mut self, slot: u32) -> (u64, bool) {
        let zcopy = self.skbs[slot as usize].zc.n > 0;
        let (wr_id, signaled, _) = self.next_wr(zcopy);
        self.skbs[slot as usize].posted += 1;
        self.posted(Ok(()), signaled, Some(slot)).unwrap();
        (wr_id, signaled)
    }

    /// As if an inline packet had been posted.
    fn mark_posted_inline(&mut self) -> (u64, bool) {
        let (wr_id, signaled, _) = self.next_wr(false);
        self.posted(Ok(()), signaled, None).unwrap();
        (wr_id, signaled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ucs::mpool::MemPoolParams;

    fn pool(max: usize, sq: u32) -> TxPool {
        TxPool::new(
            MemPool::new(MemPoolParams::new("tx-test", PKT_OFF + 256)).unwrap(),
            max,
            sq,
            64,
            64,
        )
    }

    #[test]
    fn buffers_are_bounded_reused_and_accounted() {
        let mut tx = pool(3, 16);
        let a = tx.take().unwrap();
        let b = tx.take().unwrap();
        let c = tx.take().unwrap();
        assert_eq!(
            tx.take().err(),
            Some(Status::NoResource.into()),
            "at most 3 buffers"
        );
        assert!(!tx.has_room());
        tx.abandon(c.0, c.1);
        assert!(tx.has_room());
        tx.restore(a.0, a.1);
        tx.commit(a.0, 40);
        tx.restore(b.0, b.1);
        tx.commit(b.0, 400);
        assert_eq!(tx.in_windows(), 2);
        assert_eq!(tx.release(a.0, Status::Ok), None);
        assert_eq!(tx.in_windows(), 1);
        let again = tx.take().unwrap();
        assert!(
            again.0 == a.0 || again.0 == c.0,
            "freed buffers are reused, not reallocated"
        );
        assert_eq!(tx.skbs.len(), 3);
    }

    #[test]
    fn a_buffer_the_hca_still_reads_is_freed_at_its_completion() {
        let mut tx = pool(1, 4);
        let slot = tx.take_slot().unwrap();
        let comp = Comp::NONE;
        let sge = [Sge::new(0x1000, 8, 7)];
        tx.commit_zcopy(slot, 20, &sge, comp);
        let (wr_id, signaled) = tx.mark_posted(slot);
        assert!(signaled, "an am_zcopy is always signaled");
        // acknowledged while the send is still in the queue: neither freed nor completed
        assert_eq!(tx.release(slot, Status::Ok), None);
        assert_eq!(tx.take().err(), Some(Status::NoResource.into()));
        let mut done = VecDeque::new();
        tx.completed(wr_id, &mut done);
        assert_eq!(done, [(comp, Status::Ok)], "zcopy completes with the send");
        assert!(tx.take().is_ok(), "and the buffer is free again");
        // dropped by a failing endpoint: the completion carries the failure
        let mut tx = pool(1, 4);
        let slot = tx.take_slot().unwrap();
        tx.commit_zcopy(slot, 20, &sge, comp);
        assert_eq!(
            tx.release(slot, Status::EndpointTimeout),
            Some((comp, Status::EndpointTimeout))
        );
    }

    #[test]
    fn send_queue_credits_gate_taking_buffers() {
        let mut tx = pool(8, 1);
        let slot = tx.take_slot().unwrap();
        tx.commit(slot, 500);
        let (wr_id, signaled) = tx.mark_posted(slot);
        assert!(signaled, "a one-slot queue signals every send");
        assert!(!tx.can_post() && !tx.has_room());
        assert_eq!(
            tx.take().err(),
            Some(Status::NoResource.into()),
            "send queue full"
        );
        let mut done = VecDeque::new();
        tx.completed(wr_id, &mut done);
        assert!(done.is_empty());
        assert!(tx.can_post());
    }

    #[test]
    fn moderated_sends_complete_with_the_next_signaled_one() {
        // moderation 64 asked, capped at a quarter of the 16-slot queue: every 4th is signaled
        let mut tx = pool(64, 16);
        let mut slots = Vec::new();
        for _ in 0..3 {
            let slot = tx.take_slot().unwrap();
            tx.commit(slot, 200);
            assert!(!tx.mark_posted(slot).1, "unsignaled");
            slots.push(slot);
        }
        assert_eq!(tx.sq.available(), 13);
        // all three acknowledged: their buffers stay with the HCA until a completion covers them
        for &s in &slots {
            assert_eq!(tx.release(s, Status::Ok), None);
        }
        assert_eq!((tx.in_windows(), tx.free.len()), (0, 0));
        let (wr_id, signaled) = tx.mark_posted_inline();
        assert!(signaled, "the 4th send is signaled");
        let mut done = VecDeque::new();
        tx.completed(wr_id, &mut done);
        assert_eq!(tx.sq.available(), 16, "one completion returns all four slots");
        assert_eq!(tx.free.len(), 3, "and frees the three buffers");
        tx.completed(wr_id, &mut done);
        assert_eq!(tx.sq.available(), 16, "a repeated completion changes nothing");
        assert!(done.is_empty());
    }

    #[test]
    fn moderation_is_capped_by_the_buffers() {
        // 16 buffers: at most 3 may wait unsignaled, so that the others keep flowing
        let mut tx = pool(16, 256);
        let sig: Vec<bool> = (0..8).map(|_| tx.mark_posted_inline().1).collect();
        assert_eq!(sig, [false, false, false, true, false, false, false, true]);
    }

    #[test]
    fn a_held_back_resend_asks_for_a_signaled_send() {
        let mut tx = pool(64, 256);
        let slot = tx.take_slot().unwrap();
        tx.commit(slot, 200);
        assert!(!tx.mark_posted(slot).1);
        assert!(!tx.signal_wanted());
        assert!(tx.held_by_hca(slot), "a resend must wait for the unsignaled post");
        assert!(tx.signal_wanted());
        let (wr_id, signaled) = tx.mark_posted_inline();
        assert!(
            signaled && !tx.signal_wanted(),
            "the next send (an ACK) is signaled"
        );
        let mut done = VecDeque::new();
        tx.completed(wr_id, &mut done);
        assert_eq!(
            tx.skbs[slot as usize].posted, 0,
            "and completes the held-back skb"
        );
    }

    #[test]
    fn taken_buffers_go_back_unless_committed() {
        let cell = RefCell::new(pool(1, 4));
        {
            let mut t = Taken::new(&cell).unwrap();
            t.buf()[PKT_OFF] = 1;
            assert!(Taken::new(&cell).is_err());
        } // dropped uncommitted (e.g. a panicking pack callback)
        let (slot, buf) = Taken::new(&cell).unwrap().into_parts();
        cell.borrow_mut().restore(slot, buf);
        cell.borrow_mut().commit(slot, 30);
        assert_eq!(cell.borrow().in_windows(), 1);
        assert!(Taken::new(&cell).is_err());
    }
}
