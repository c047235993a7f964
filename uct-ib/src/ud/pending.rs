//! Pending requests (dispatched in order when the window and send buffers have room; nothing
//! overtakes them), flushes (complete when every packet sent before them is acknowledged),
//! and the deferred completions and error reports (fired with no borrow held, since they run
//! user code that may call back into the transport).

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PendingResult};

use super::ep::{ctl, EpCell, EpState};
use super::iface::UdShared;
use super::reliability::psn_le;

impl UdShared {
    /// Queues `ep` for pending dispatch (its state not borrowed by the caller).
    pub(crate) fn schedule_pending(&self, ep: &Rc<EpCell>) {
        let mut st = ep.st.borrow_mut();
        self.schedule_pending_locked(ep, &mut st);
    }

    pub(crate) fn schedule_pending_locked(&self, ep: &Rc<EpCell>, st: &mut EpState) {
        if !st.in_pending_list {
            st.in_pending_list = true;
            self.pending_list.borrow_mut().push(ep.clone());
        }
    }

    /// Runs `f` on every endpoint of `list` (the control, pending or ACK list), emptied first,
    /// so `f` may queue endpoints on it again; the vectors are reused through `spare`, so
    /// steady state does not allocate.
    pub(crate) fn drain_list(&self, list: &RefCell<Vec<Rc<EpCell>>>, mut f: impl FnMut(Rc<EpCell>)) {
        let mut taken = std::mem::take(&mut *self.spare.borrow_mut());
        std::mem::swap(&mut taken, &mut *list.borrow_mut());
        for ep in taken.drain(..) {
            f(ep);
        }
        self.give_back_spare(taken);
    }

    /// Keeps the larger of `list` (emptied) and the current spare vector for the next use.
    pub(crate) fn give_back_spare(&self, list: Vec<Rc<EpCell>>) {
        let mut spare = self.spare.borrow_mut();
        if spare.capacity() < list.capacity() {
            *spare = list;
        }
    }

    /// Whether `ep` could send a new AM now.
    fn ready(&self, st: &EpState) -> bool {
        st.check_send(false).is_ok() && self.tx.borrow().has_room()
    }

    /// Dispatches pending requests of every queued endpoint while resources last. (The
    /// emptiness checks of this and of [`UdShared::fire`] are inline: every progress call
    /// makes them.)
    #[inline]
    pub(crate) fn dispatch_pending(&self) -> u32 {
        if self.pending_list.borrow().is_empty() {
            return 0;
        }
        self.dispatch_queued()
    }

    fn dispatch_queued(&self) -> u32 {
        let mut work = 0;
        self.drain_list(&self.pending_list, |ep| {
            loop {
                if !self.ready(&ep.st.borrow()) {
                    break;
                }
                let r = ep.pending.borrow_mut().pop_front();
                let Some(r) = r else { break };
                ep.st.borrow_mut().dispatching = true;
                let res = r.dispatch();
                ep.st.borrow_mut().dispatching = false;
                work += 1;
                if res != PendingResult::Done {
                    ep.pending.borrow_mut().push_front(r);
                    break;
                }
            }
            let mut st = ep.st.borrow_mut();
            st.in_pending_list = false;
            if st.failed.is_none() && ep.has_pending() {
                self.schedule_pending_locked(&ep, &mut st);
            }
        });
        work
    }

    /// `Ep::flush`: `Ok(Done)` when nothing is unacknowledged, else `Ok(InProgress)` and `comp`
    /// completes once everything sent so far is acknowledged (an ACK is requested at once).
    pub(crate) fn flush_ep(&self, ep: &Rc<EpCell>, comp: Comp) -> Result<Outcome> {
        let mut g = ep.st.borrow_mut();
        let st = &mut *g;
        if let Some(s) = st.failed {
            return Err(s.into());
        }
        if ep.has_pending() {
            return Err(Status::NoResource.into());
        }
        // (an ACK kept for the next progress round leaves its packets outstanding until then:
        // their operations have not completed yet, so the flush has not either)
        if st.rel.outstanding() == 0 {
            return self.flush_done(comp);
        }
        if !comp.is_none() {
            st.flushes.push_back((st.rel.last_sent(), comp));
        }
        self.ask_ack_for_flush(ep, st);
        Ok(Outcome::InProgress)
    }

    /// `Iface::flush`: every endpoint's flush.
    pub(crate) fn flush_iface(&self, comp: Comp) -> Result<Outcome> {
        let eps: Vec<Rc<EpCell>> = self.eps.borrow().values().cloned().collect();
        if eps.iter().any(|ep| ep.has_pending()) {
            return Err(Status::NoResource.into());
        }
        if self.tx.borrow().in_windows() == 0 {
            return self.flush_done(comp);
        }
        if !comp.is_none() {
            self.iface_flushes.borrow_mut().push(comp);
        }
        for ep in &eps {
            let mut st = ep.st.borrow_mut();
            if st.failed.is_none() && st.rel.outstanding() > 0 {
                self.ask_ack_for_flush(ep, &mut st);
            }
        }
        Ok(Outcome::InProgress)
    }

    /// A flush waits for the peer's ACK of everything sent: asks for it with a control
    /// packet, once per last sent PSN ([`EpState::flush_asked`]), unless the ACK kept for the
    /// next progress round already covers it.
    fn ask_ack_for_flush(&self, ep: &Rc<EpCell>, st: &mut EpState) {
        let last = st.rel.last_sent();
        if kept_ack_covers_all(st) || st.flush_asked == Some(last) {
            return;
        }
        st.flush_asked = Some(last);
        st.ctl |= ctl::ACK_REQ;
        self.schedule_ctl(ep, st);
    }

    /// A flush with nothing unacknowledged: `Ok(Done)` once the operations it covers have completed.
    /// An acknowledged am_zcopy completes with its send completion, and completions fire at
    /// the end of a progress round: until then the flush is `InProgress` (its `comp` queued
    /// after those completions), or `NoResource` while a send completion has not arrived.
    fn flush_done(&self, comp: Comp) -> Result<Outcome> {
        if !self.poll_awaited_sends() {
            return Err(Status::NoResource.into());
        }
        if self.completions.borrow().is_empty() {
            return Ok(Outcome::Done);
        }
        if !comp.is_none() {
            self.completions.borrow_mut().push_back((comp, Status::Ok));
        }
        Ok(Outcome::InProgress)
    }

    /// Completes the interface flushes once nothing is unacknowledged. (The test for waiting
    /// flushes is inline: every acknowledgement that empties a window makes it.)
    #[inline(always)]
    pub(crate) fn check_iface_flush(&self) {
        if !self.iface_flushes.borrow().is_empty() {
            self.complete_iface_flushes();
        }
    }

    fn complete_iface_flushes(&self) {
        if self.tx.borrow().in_windows() != 0 {
            return;
        }
        // acknowledged am_zcopys complete first (their send completions have arrived)
        self.poll_awaited_sends();
        let f = std::mem::take(&mut *self.iface_flushes.borrow_mut());
        self.completions
            .borrow_mut()
            .extend(f.into_iter().map(|c| (c, Status::Ok)));
    }

    /// Something is waiting for progress (`event_arm` must not let the caller sleep).
    pub(crate) fn has_work(&self) -> bool {
        !self.ctl_list.borrow().is_empty()
            || !self.completions.borrow().is_empty()
            || !self.reports.borrow().is_empty()
            || self.held_packets()
            || self
                .pending_list
                .borrow()
                .iter()
                .any(|ep| ep.has_pending() && self.ready(&ep.st.borrow()))
    }

    /// Before the caller sleeps: sends the ACKs owed to peers (instead of waiting for the
    /// delayed-ACK timer) and tells whether sleeping is safe (nothing unacknowledged, no
    /// connection request waiting, every control packet out).
    pub(crate) fn settle_for_sleep(&self) -> bool {
        let mut quiet = true;
        let eps: Vec<Rc<EpCell>> = self.eps.borrow().values().cloned().collect();
        for ep in &eps {
            let mut st = ep.st.borrow_mut();
            if st.failed.is_some() {
                continue;
            }
            if st.rel.outstanding() > 0 || st.rel.is_connecting() {
                quiet = false;
            }
            if st.rel.rx_unacked() && st.connected() {
                st.rel.request_ack();
                self.schedule_ctl(ep, &mut st);
            }
        }
        self.send_ctl();
        quiet && self.ctl_list.borrow().is_empty()
    }

    /// Fires the deferred completions and error reports.
    #[inline]
    pub(crate) fn fire(&self) {
        if self.completions.borrow().is_empty() && self.reports.borrow().is_empty() {
            return;
        }
        self.fire_queued();
    }

    fn fire_queued(&self) {
        loop {
            let c = self.completions.borrow_mut().pop_front();
            let Some((comp, status)) = c else { break };
            if !comp.is_none() {
                comp.complete(status);
            }
        }
        loop {
            let r = self.reports.borrow_mut().pop_front();
            let Some((h, status)) = r else { break };
            if !self.err.report(h, status) {
                ucs::error!(
                    %status,
                    "ud_verbs: an endpoint failed (peer unreachable for RUCX_UD_TIMEOUT) and no error handler took it"
                );
            }
        }
    }
}

/// The ACK kept for the next progress round (`EpState::ack_in`) acknowledges everything
/// sent: no ACK needs to be asked for.
fn kept_ack_covers_all(st: &EpState) -> bool {
    st.ack_in.is_some_and(|a| psn_le(st.rel.last_sent(), a))
}
