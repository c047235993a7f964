//! The receive side: parsing received packets, acknowledgement processing, in-order AM
//! delivery (the receive buffer is lent to the handler), connection requests and replies,
//! and the fault-injection test hook.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use ucs::mpool::{MemPool, MemPoolParams};
use ucs::{Result, Status};

use super::config::UdConfig;
use super::ep::{ctl, EpCell, EpState, Peer};
use super::iface::UdShared;
use super::inject::{Fate, FaultStats, Injector};
use super::reliability::{psn_lt, AckOutcome, Psn, RxVerdict};
use super::wire::{Crep, Creq, Header, Kind, WireError, HDR_LEN};
use crate::device::DEV_ADDR_LEN;
use crate::iface_common::{deliver_am, BUF_DATA_OFFSET};
use crate::rx_ring::Received;
use uct_ib_verbs::GRH_LEN;

/// Where the packet starts in a receive buffer (after the lending header and the GRH).
const PKT_OFF: usize = BUF_DATA_OFFSET + GRH_LEN;
/// Packets held back for reordering at most.
const MAX_HELD: usize = 64;

struct Held {
    msg: Received,
    len: usize,
    src_qp: u32,
}

/// The fault-injection test hook (`RUCX_UD_TEST_*`): decides each received packet's fate,
/// holds packets back to reorder them, copies packets to duplicate them.
pub struct Faults {
    inj: RefCell<Injector>,
    held: RefCell<VecDeque<Held>>,
    batch: RefCell<VecDeque<Held>>,
    dup: MemPool,
}

impl Faults {
    /// `buf_len`: bytes of a receive buffer after [`BUF_DATA_OFFSET`].
    pub fn new(cfg: &UdConfig, buf_len: usize) -> Result<Faults> {
        let mut p = MemPoolParams::new("ud_verbs test duplicates", BUF_DATA_OFFSET + buf_len);
        p.alignment = 64;
        Ok(Faults {
            inj: RefCell::new(Injector::new(cfg.faults)),
            held: RefCell::new(VecDeque::with_capacity(MAX_HELD)),
            batch: RefCell::new(VecDeque::with_capacity(MAX_HELD)),
            dup: MemPool::new(p)?,
        })
    }

    /// Moves the packets held so far to the batch released after this round's receives.
    pub fn take_held(&self) -> usize {
        let mut held = self.held.borrow_mut();
        let n = held.len();
        self.batch.borrow_mut().extend(held.drain(..));
        n
    }

    pub fn stats(&self) -> FaultStats {
        self.inj.borrow().stats
    }

    fn copy(&self, msg: &Received) -> Option<Received> {
        match msg {
            Received::Head(h) => Some(Received::Head(h.clone())),
            Received::Buf(buf) => {
                let mut c = self.dup.get().ok()?;
                let n = c.len().min(buf.len());
                c[..n].copy_from_slice(&buf[..n]);
                Some(Received::Buf(c))
            }
        }
    }
}

impl UdShared {
    /// A received packet of `len` bytes (after the GRH) from QP `src_qp`: in its receive
    /// buffer, or copied out of its head slot.
    #[inline]
    pub(crate) fn receive(&self, msg: Received, len: usize, src_qp: u32) {
        match &self.faults {
            None => self.handle_packet(msg, len, src_qp),
            Some(f) => self.receive_with_faults(f, msg, len, src_qp),
        }
    }

    /// [`receive`](Self::receive) through the test hook.
    #[inline(never)]
    fn receive_with_faults(&self, f: &Faults, msg: Received, len: usize, src_qp: u32) {
        let fate = f.inj.borrow_mut().decide();
        match fate {
            Fate::Deliver => {}
            Fate::Drop => return,
            Fate::Duplicate => {
                if let Some(c) = f.copy(&msg) {
                    self.handle_packet(c, len, src_qp);
                }
            }
            Fate::Hold if f.held.borrow().len() < MAX_HELD => {
                f.held.borrow_mut().push_back(Held { msg, len, src_qp });
                return;
            }
            Fate::Hold => {}
        }
        self.handle_packet(msg, len, src_qp);
    }

    /// Processes the packets the test hook held back in an earlier round.
    pub(crate) fn release_held(&self) {
        let Some(f) = &self.faults else { return };
        loop {
            let h = f.batch.borrow_mut().pop_front();
            let Some(h) = h else { break };
            self.handle_packet(h.msg, h.len, h.src_qp);
        }
    }

    pub(crate) fn held_packets(&self) -> bool {
        self.faults
            .as_ref()
            .is_some_and(|f| !f.held.borrow().is_empty() || !f.batch.borrow().is_empty())
    }

    /// A packet that fit its head slot (`slot`: the slot's bytes, GRH first), read in place
    /// by the receive loop or from a copy (the test hook's held packets).
    #[inline]
    pub(crate) fn handle_head(&self, slot: &[u8], src_qp: u32) {
        let Some(pkt) = slot.get(GRH_LEN..) else {
            return;
        };
        if let Some(id) = self.on_packet(pkt, src_qp) {
            // the slot is not reposted before this returns; a handler that keeps the data
            // gets a copy (no descriptor)
            let _ = self.am.invoke(id, &pkt[HDR_LEN..], None);
        }
    }

    /// Processes a packet and delivers its AM when it is the next in order.
    #[inline]
    fn handle_packet(&self, msg: Received, len: usize, src_qp: u32) {
        // (a bad AM id is refused by the table, which logs it; the packet is consumed)
        match msg {
            // a copy (the test hook's): `len` is the copy's length less the GRH
            Received::Head(h) => self.handle_head(h.bytes(), src_qp),
            Received::Buf(buf) => {
                let Some(pkt) = buf.get(PKT_OFF..PKT_OFF + len) else {
                    return;
                };
                if let Some(id) = self.on_packet(pkt, src_qp) {
                    let _ = deliver_am(&self.am, id, buf, PKT_OFF + HDR_LEN, len - HDR_LEN);
                }
            }
        }
    }

    /// Everything but the delivery: `Some(am id)` when the packet is the next AM to deliver.
    fn on_packet(&self, pkt: &[u8], src_qp: u32) -> Option<u8> {
        let hdr = match Header::decode(pkt) {
            Ok(h) => h,
            Err(e) => {
                bad_packet(e, src_qp);
                return None;
            }
        };
        let body = &pkt[HDR_LEN..];
        if hdr.kind == Kind::Creq {
            self.on_creq(body, src_qp);
            return None;
        }
        let ep = self.eps.borrow().get(hdr.dest_ep).cloned();
        let Some(ep) = ep else {
            ucs::trace!(dest = hdr.dest_ep, src_qp, kind = ?hdr.kind, "ud_verbs: packet for no endpoint, dropped");
            return None;
        };
        self.on_ep_packet(&ep, &hdr, body, src_qp).then_some(hdr.am_id)
    }

    /// The endpoint's part of [`on_packet`](Self::on_packet); true when the packet is the next
    /// AM to deliver.
    #[inline]
    fn on_ep_packet(&self, ep: &Rc<EpCell>, hdr: &Header, body: &[u8], src_qp: u32) -> bool {
        let mut g = ep.st.borrow_mut();
        let st = &mut *g;
        if st.failed.is_some() {
            return false;
        }
        if st.peer.as_ref().is_some_and(|p| p.qpn != src_qp) {
            ucs::trace!(
                ep = st.id,
                src_qp,
                "ud_verbs: packet from another QP than the peer's, dropped"
            );
            return false;
        }
        self.take_ack(ep, st, hdr.ack_psn, hdr.gap());
        let deliver = match hdr.kind {
            Kind::Am => st.rel.on_receive(hdr.psn, hdr.ack_req()) == RxVerdict::Deliver,
            Kind::Ack => {
                if hdr.ack_req() {
                    st.rel.request_ack();
                }
                false
            }
            Kind::Crep => {
                self.on_crep(ep, st, body);
                false
            }
            Kind::Disc => {
                if st.passive.is_some() {
                    self.retire(st);
                }
                false
            }
            Kind::Creq => false,
        };
        if st.rel.needs_ack_now() && st.failed.is_none() {
            self.schedule_ctl(ep, st);
        }
        deliver
    }

    /// A received cumulative ACK. One that only moves the window on is kept for the next
    /// progress call ([`apply_acks`](Self::apply_acks)): releasing the acknowledged packets
    /// and what follows from it (completions, flushes, pending requests) then happens while
    /// the caller waits, not between a received packet and the caller's answer to it (in a
    /// ping-pong every packet acknowledges the previous one). An ACK that reports a gap is
    /// applied at once, after the kept one: it may start a resend.
    #[inline]
    fn take_ack(&self, ep: &Rc<EpCell>, st: &mut EpState, ack_psn: Psn, gap: bool) {
        if !gap {
            if ack_psn == st.rel.acked_psn() {
                return; // nothing new (a stream repeats its last ACK in every packet)
            }
            match st.ack_in {
                None => {
                    st.ack_in = Some(ack_psn);
                    self.ack_list.borrow_mut().push(ep.clone());
                }
                // an older ACK overtaken by a newer one (reordering) is not kept
                Some(kept) if psn_lt(kept, ack_psn) => st.ack_in = Some(ack_psn),
                Some(_) => {}
            }
            return;
        }
        self.apply_ack_in(ep, st);
        self.process_ack(ep, st, ack_psn, gap);
    }

    /// Applies the ACKs kept by [`take_ack`](Self::take_ack). Inline for its emptiness test
    /// (every progress call makes it).
    #[inline]
    pub(crate) fn apply_acks(&self) {
        if !self.ack_list.borrow().is_empty() {
            self.apply_ack_list();
        }
    }

    fn apply_ack_list(&self) {
        self.drain_list(&self.ack_list, |ep| {
            let mut g = ep.st.borrow_mut();
            self.apply_ack_in(&ep, &mut g);
        });
    }

    /// Applies the endpoint's kept ACK, if any (it stays in the ACK list until the next
    /// [`apply_acks`](Self::apply_acks), which then finds nothing).
    pub(crate) fn apply_ack_in(&self, ep: &Rc<EpCell>, st: &mut EpState) {
        if let Some(ack) = st.ack_in.take() {
            if st.failed.is_none() {
                self.process_ack(ep, st, ack, false);
            }
        }
    }

    /// A cumulative acknowledgement: frees acknowledged packets, completes flushes, goes on
    /// with a resend, ends a lingering endpoint.
    #[inline]
    fn process_ack(&self, ep: &Rc<EpCell>, st: &mut EpState, ack_psn: u16, gap: bool) {
        if ack_psn == st.rel.acked_psn() && !gap {
            return; // nothing new (a stream repeats its last ACK in every packet)
        }
        let out = {
            let mut tx = self.tx.borrow_mut();
            st.rel.on_ack(ack_psn, gap, |_, slot| {
                if let Some(c) = tx.release(slot, Status::Ok) {
                    self.completions.borrow_mut().push_back(c);
                }
            })
        };
        match out {
            AckOutcome::Advanced(_) => {
                if !st.flushes.is_empty() {
                    // the send completions of acknowledged am_zcopys have arrived (the peer
                    // got the packets): their completions before the flushes after them
                    self.poll_awaited_sends();
                }
                if st.flush_asked.is_some_and(|p| st.rel.is_acked(p)) {
                    st.flush_asked = None;
                }
                while let Some(&(psn, comp)) = st.flushes.front() {
                    if !st.rel.is_acked(psn) {
                        break;
                    }
                    st.flushes.pop_front();
                    self.completions.borrow_mut().push_back((comp, Status::Ok));
                }
                if st.rel.resending() {
                    self.pump_resends(st);
                }
                if st.rel.outstanding() == 0 {
                    self.check_iface_flush();
                    if st.user_gone {
                        self.retire(st);
                    }
                }
                if ep.has_pending() {
                    self.schedule_pending_locked(ep, st);
                }
            }
            AckOutcome::FastResend => self.pump_resends(st),
            AckOutcome::Nothing | AckOutcome::Bogus => {}
        }
    }

    /// A connection request: make (or find) the endpoint for the requester and reply.
    fn on_creq(&self, body: &[u8], src_qp: u32) {
        let creq = match Creq::decode(body) {
            Ok(c) if c.dev_addr.len() == DEV_ADDR_LEN => c,
            _ => return bad_packet(WireError::Body, src_qp),
        };
        let mut dev = [0u8; DEV_ADDR_LEN];
        dev.copy_from_slice(creq.dev_addr);
        let key = (dev, creq.src_qpn, creq.src_ep);
        let known = self
            .passive
            .borrow()
            .get(&key)
            .and_then(|&id| self.eps.borrow().get(id).cloned());
        let ep = match known {
            Some(ep) => ep, // our reply was lost: send it again
            None => {
                let ah = match self.get_ah(&dev) {
                    Ok(ah) => ah,
                    Err(e) => {
                        ucs::warn!(
                            src_qp,
                            "ud_verbs: connection request from an unreachable peer: {e}"
                        );
                        return;
                    }
                };
                let peer = Peer {
                    ah,
                    qpn: creq.src_qpn,
                    ep_id: creq.src_ep,
                };
                let Ok(ep) = self.new_ep(Some(peer), false) else {
                    return;
                };
                let id = {
                    let mut st = ep.st.borrow_mut();
                    st.passive = Some(key);
                    st.id
                };
                self.passive.borrow_mut().insert(key, id);
                ucs::debug!(
                    ep = id,
                    peer_qpn = creq.src_qpn,
                    peer_ep = creq.src_ep,
                    "ud_verbs: accepted a connection"
                );
                ep
            }
        };
        let mut st = ep.st.borrow_mut();
        st.ctl |= ctl::CREP;
        self.schedule_ctl(&ep, &mut st);
    }

    /// The reply to our connection request: the endpoint is connected.
    fn on_crep(&self, ep: &Rc<EpCell>, st: &mut EpState, body: &[u8]) {
        let Ok(crep) = Crep::decode(body) else {
            return bad_packet(WireError::Body, 0);
        };
        if !st.rel.is_connecting() {
            return; // a duplicate reply
        }
        let Some(peer) = st.peer.as_mut() else { return };
        peer.ep_id = crep.src_ep;
        st.rel.set_connecting(false);
        st.ctl &= !ctl::CREQ;
        ucs::debug!(ep = st.id, peer_ep = crep.src_ep, "ud_verbs: connected");
        if ep.has_pending() {
            self.schedule_pending_locked(ep, st);
        }
    }
}

#[cold]
fn bad_packet(e: WireError, src_qp: u32) {
    ucs::debug!(src_qp, "ud_verbs: malformed packet dropped: {e:?}");
}
