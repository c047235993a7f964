//! The send paths of the interface: AMs (the fast path: a buffer from the pool, header and
//! body copied in, posted inline when small), am_zcopy, go-back-N resends, and control packets
//! (CREQ, CREP, ACK, DISC).

use std::rc::Rc;

use ucs::Result;
use uct_transport::callbacks::Comp;

use super::ep::{ctl, EpCell, EpState};
use super::iface::UdShared;
use super::skb::{Taken, TxPool, PKT_OFF};
use super::wire::{Crep, Creq, Header, Kind, EP_ID_NONE, FLAG_ACK_REQ, HDR_LEN};
use uct_ib_verbs::Sge;

impl UdShared {
    /// Sends an AM whose body `fill` writes (at most [`UdShared::max_am`] bytes); returns the
    /// body length. `fill` may be user code (a pack callback): it runs with no borrow held,
    /// so it may send on this endpoint itself. The packet stays in the endpoint's window until
    /// acknowledged.
    #[inline]
    pub(crate) fn send_am(
        &self,
        ep: &EpCell,
        id: u8,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<usize> {
        ep.st.borrow().check_send(ep.has_pending())?;
        let mut t = Taken::new(&self.tx)?;
        // user code (a pack callback) runs here, with no borrow held
        let n = fill(&mut t.buf()[PKT_OFF + HDR_LEN..PKT_OFF + self.seg])?;
        let mut g = ep.st.borrow_mut();
        let st = &mut *g;
        // the callback may have sent on this endpoint or failed it
        st.check_send(ep.has_pending())?;
        let (slot, buf) = t.into_parts();
        let mut tx = self.tx.borrow_mut();
        tx.restore(slot, buf);
        self.stamp_and_post(st, &mut tx, id, slot, n, None);
        Ok(n)
    }

    /// [`UdShared::send_am`] for a body that is our own copy (am_short, am_short_iov, a
    /// header-only am_zcopy): the AM fast path.
    #[inline]
    pub(crate) fn send_am_copy(
        &self,
        ep: &EpCell,
        id: u8,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<()> {
        self.send_copied(ep, id, fill, None)
    }

    /// Sends an am_zcopy: `header` goes into the send buffer, `sges` (user memory) follow it.
    /// `comp` completes once the packet is acknowledged.
    pub(crate) fn send_zcopy(
        &self,
        ep: &EpCell,
        id: u8,
        header: &[u8],
        sges: &[Sge],
        comp: Comp,
    ) -> Result<()> {
        let fill = |b: &mut [u8]| {
            b[..header.len()].copy_from_slice(header);
            header.len()
        };
        self.send_copied(ep, id, fill, Some((sges, comp)))
    }

    /// `fill` runs no user code, so the endpoint and the send pool stay borrowed throughout
    /// and are checked once.
    #[inline]
    fn send_copied(
        &self,
        ep: &EpCell,
        id: u8,
        fill: impl FnOnce(&mut [u8]) -> usize,
        zcopy: Option<(&[Sge], Comp)>,
    ) -> Result<()> {
        let mut g = ep.st.borrow_mut();
        let st = &mut *g;
        st.check_send(ep.has_pending())?;
        let mut tx = self.tx.borrow_mut();
        let slot = tx.take_slot()?;
        let n = fill(&mut tx.buf_mut(slot)[PKT_OFF + HDR_LEN..PKT_OFF + self.seg]);
        self.stamp_and_post(st, &mut tx, id, slot, n, zcopy);
        Ok(())
    }

    /// The common end of every AM send: the packet in the buffer of the taken `slot` (`n` body
    /// bytes) gets its PSN and header, goes into the endpoint's window, and is posted (or
    /// collected for a doorbell, see [`TxPool::collects`]). A failed post leaves the packet in
    /// the window: the resend timer sends it again, as after a lost packet.
    #[inline]
    fn stamp_and_post(
        &self,
        st: &mut EpState,
        tx: &mut TxPool,
        id: u8,
        slot: u32,
        n: usize,
        zcopy: Option<(&[Sge], Comp)>,
    ) {
        let stamp = st.rel.send(slot);
        let peer = st.peer.as_ref().expect("checked: connected");
        Header {
            kind: Kind::Am,
            am_id: id,
            flags: stamp.flags,
            dest_ep: peer.ep_id,
            psn: stamp.psn,
            ack_psn: stamp.ack_psn,
        }
        .encode(&mut tx.buf_mut(slot)[PKT_OFF..]);
        let len = HDR_LEN + n;
        let _ = match zcopy {
            None => {
                tx.commit(slot, len);
                tx.post_am(&self.qp, slot, len, &peer.ah, peer.qpn)
            }
            Some((sges, comp)) => {
                tx.commit_zcopy(slot, len, sges, comp);
                tx.post(&self.qp, slot, peer.dest())
            }
        };
    }

    /// Sends again what the endpoint's go-back-N cursor allows. A packet whose earlier copy
    /// went unsignaled and may still be read by the HCA is skipped (the next timer resends
    /// it); an ACK then goes out signaled, so that its completion lets that copy go even when
    /// nothing else is sent.
    pub(crate) fn pump_resends(&self, st: &mut EpState) {
        let EpState { rel, peer, .. } = st;
        let Some(peer) = peer.as_ref().filter(|p| p.ep_id != EP_ID_NONE) else {
            return;
        };
        let mut tx = self.tx.borrow_mut();
        while tx.can_post() {
            let Some(r) = rel.next_resend() else { break };
            let _ = tx.resend(&self.qp, r.skb, r.stamp.ack_psn, r.stamp.flags, peer.dest());
        }
        if tx.signal_wanted() {
            rel.request_ack();
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
        let mut work = 0;
        self.drain_list(&self.ctl_list, |ep| {
            let mut g = ep.st.borrow_mut();
            let st = &mut *g;
            st.in_ctl_list = false;
            if st.failed.is_some() {
                return;
            }
            work += 1;
            if !self.send_ctl_of(st) {
                self.schedule_ctl(&ep, st);
            }
        });
        work
    }

    /// Sends an endpoint's control packets; false when the send queue is full.
    fn send_ctl_of(&self, st: &mut EpState) -> bool {
        let EpState {
            rel,
            peer,
            ctl: bits,
            id,
            ..
        } = st;
        let Some(peer) = peer.as_ref() else {
            return true; // not connected: nothing to say yet (the timer asks again)
        };
        let mut pkt = [0u8; 128];
        let mut tx = self.tx.borrow_mut();
        if *bits & ctl::CREQ != 0 {
            Header {
                kind: Kind::Creq,
                am_id: 0,
                flags: 0,
                dest_ep: EP_ID_NONE,
                psn: 0,
                ack_psn: 0,
            }
            .encode(&mut pkt);
            let body = Creq {
                src_ep: *id,
                src_qpn: self.qpn,
                dev_addr: &self.dev_addr,
            };
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
            let ack = rel.take_ack();
            Header {
                kind: Kind::Crep,
                am_id: 0,
                flags: ack.flags,
                dest_ep: peer.ep_id,
                psn: 0,
                ack_psn: ack.psn,
            }
            .encode(&mut pkt);
            pkt[HDR_LEN..HDR_LEN + Crep::LEN].copy_from_slice(&Crep { src_ep: *id }.to_bytes());
            if tx
                .post_ctl(&self.qp, &pkt[..HDR_LEN + Crep::LEN], peer.dest())
                .is_err()
            {
                rel.request_ack();
                return false;
            }
            *bits &= !ctl::CREP;
        }
        if *bits & ctl::ACK_REQ != 0 || rel.needs_ack_now() {
            let req = if *bits & ctl::ACK_REQ != 0 {
                FLAG_ACK_REQ
            } else {
                0
            };
            let ack = rel.take_ack();
            Header {
                kind: Kind::Ack,
                am_id: 0,
                flags: req | ack.flags,
                dest_ep: peer.ep_id,
                psn: 0,
                ack_psn: ack.psn,
            }
            .encode(&mut pkt);
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
        let Some(peer) = st.peer.as_ref().filter(|p| p.ep_id != EP_ID_NONE) else {
            return;
        };
        let ack = st.rel.take_ack();
        let h = Header {
            kind: Kind::Disc,
            am_id: 0,
            flags: ack.flags,
            dest_ep: peer.ep_id,
            psn: 0,
            ack_psn: ack.psn,
        };
        let _ = self
            .tx
            .borrow_mut()
            .post_ctl(&self.qp, &h.to_bytes(), peer.dest());
    }
}
