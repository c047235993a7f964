//! Timers, checked by progress every `RUCX_UD_TIMER_TICK`: resends, delayed ACKs,
//! connection-request retries, and peer timeouts (the endpoint fails with
//! `EndpointTimeout`, its outstanding operations complete with that error, the error
//! handler is called).

use ucs::Status;

use super::ep::{ctl, EpState};
use super::iface::UdShared;

/// Progress reads the clock (for the timers) every this many calls.
const CLOCK_EVERY: u8 = 16;

impl UdShared {
    /// Runs the timers when a tick has passed. Reads the clock only while endpoints exist, and
    /// then every [`CLOCK_EVERY`]th call: where the clock is a system call (VMs without a
    /// vDSO clock) it is most of an idle progress call, so a message arriving while a
    /// ping-pong side spins waits for it, and after a delivery it delays the return to the
    /// caller waiting for that message. UCX's progress reads no clock (its timers run on the
    /// async thread). Progress runs far more often than a tick (`RUCX_UD_TIMER_TICK`, 10 ms),
    /// and while packets are unacknowledged `event_arm` keeps callers progressing.
    #[inline]
    pub(crate) fn maybe_tick(&self) -> u32 {
        if self.eps.borrow().is_empty() {
            return 0;
        }
        let n = self.clock_skipped.get() + 1;
        if n < CLOCK_EVERY {
            self.clock_skipped.set(n);
            return 0;
        }
        self.clock_skipped.set(0);
        let now = self.now();
        if now < self.next_tick.get() {
            return 0;
        }
        self.next_tick.set(now + self.tick);
        self.run_timers(now)
    }

    fn run_timers(&self, now: u64) -> u32 {
        // the ACKs this round's receives kept: no resend or timeout for what they acknowledge
        self.apply_acks();
        let mut list = std::mem::take(&mut *self.spare.borrow_mut());
        list.extend(self.eps.borrow().values().cloned());
        let mut work = 0;
        for ep in list.drain(..) {
            let mut g = ep.st.borrow_mut();
            let st = &mut *g;
            if st.failed.is_some() {
                continue;
            }
            let o = st.rel.on_timer(now);
            if o.timeout {
                self.fail(st, Status::EndpointTimeout);
                work += 1;
                continue;
            }
            if o.resend {
                work += 1;
                if st.rel.is_connecting() {
                    st.ctl |= ctl::CREQ;
                }
                self.pump_resends(st);
            }
            if o.send_ack && st.connected() {
                st.rel.request_ack();
            }
            if st.ctl != 0 || st.rel.needs_ack_now() {
                self.schedule_ctl(&ep, st);
            }
        }
        self.give_back_spare(list);
        work
    }

    /// The endpoint failed with `status`: its unacknowledged packets are dropped, its flushes
    /// complete with `status`, later operations return it, and the error handler hears of it
    /// (at the end of this progress round). Endpoints the host no longer owns just go.
    pub(crate) fn fail(&self, st: &mut EpState, status: Status) {
        ucs::debug!(ep = st.id, %status, outstanding = st.rel.outstanding(), "ud_verbs: endpoint failed");
        st.failed = Some(status);
        self.drain_window(st, status);
        st.ctl = 0;
        if !st.flushes.is_empty() {
            // dropped am_zcopys still posted: their send completions arrived long ago (the
            // timeout is RUCX_UD_TIMEOUT after the send) but may not have been polled in a
            // round that received; their completions before the flushes that cover them
            self.poll_awaited_sends();
        }
        for (_, c) in st.flushes.drain(..) {
            self.completions.borrow_mut().push_back((c, status));
        }
        self.check_iface_flush();
        match st.handle {
            Some(h) => self.reports.borrow_mut().push_back((h, status)),
            None => self.retire(st),
        }
    }
}
