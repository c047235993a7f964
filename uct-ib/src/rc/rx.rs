//! Receive progress: SRQ completions, flow-control flags, AM delivery (small messages from
//! their head slot, others lent zero-copy), SRQ refill.

use super::iface::IfaceShared;
use super::wire::{parse_am_hdr, AM_HDR_LEN, FC_PURE_GRANT};
use crate::iface_common::{deliver_am, BUF_DATA_OFFSET as OFF};
use crate::rx_ring::Received;
use uct_ib_verbs::WcBatch;

/// Completions polled per call at most (stack array).
const MAX_POLL: usize = 32;

impl IfaceShared {
    /// One round of progress: receives, then send completions (see
    /// [`SendCqPacing`](crate::iface_common::SendCqPacing)), then
    /// pending requests. Inlined into the worker's progress callback.
    #[inline]
    pub fn progress(&self) -> u32 {
        let rx = self.progress_rx();
        // the schedule is read once per call unless send completions ran user callbacks
        let mut scheduled = !self.sched.borrow().is_empty();
        let mut n = rx;
        if self.tx_pacing.poll_now(rx, self.tx_wanted(scheduled)) {
            n += self.progress_tx();
            scheduled = !self.sched.borrow().is_empty();
        }
        if scheduled {
            self.dispatch_pending();
        }
        self.progress_doorbell();
        n
    }

    /// Sends wait for send completions: one was refused since the last poll (`tx_wanted`),
    /// requests are pending (`scheduled`), or the send CQ is half used.
    #[inline]
    fn tx_wanted(&self, scheduled: bool) -> bool {
        // `|`, not `||`: three flags, no branches
        self.tx_wanted.get() | scheduled | (self.cq_available.get() < self.cfg.tx_cq_len / 2)
    }

    // always: the receive loop is the fast path of `progress`, which is itself inlined
    #[inline(always)]
    fn progress_rx(&self) -> u32 {
        let mut batch = WcBatch::<MAX_POLL>::new();
        let Ok(wcs) = self.cqs.rx.poll_into(self.cfg.rx_max_poll, &mut batch) else {
            return 0;
        };
        let n = wcs.len();
        for wc in wcs {
            let ok = wc.is_success();
            let len = wc.byte_len() as usize;
            if ok && len >= AM_HDR_LEN {
                // a message that fits its head slot is handled where it landed
                let qp_num = wc.qp_num();
                if self
                    .rx
                    .with_head(wc.wr_id(), len, |b| self.rx_head(b, qp_num))
                    .is_some()
                {
                    continue;
                }
            }
            let Some(msg) = self.rx.take(wc.wr_id(), ok.then_some(len)) else {
                continue;
            };
            if !ok || len < AM_HDR_LEN {
                if !ok {
                    ucs::debug!(qp = wc.qp_num(), status = %wc.status_str(), "rc_verbs: receive failed");
                }
                continue;
            }
            match msg {
                Received::Head(h) => self.rx_head(h.bytes(), wc.qp_num()),
                Received::Buf(buf) => {
                    if let Some(id) = self.am_id_after_fc(buf[OFF], wc.qp_num()) {
                        // ids are 5 bits, so the table always accepts them; a handler's
                        // verdict needs no action
                        let _ = deliver_am(&self.am, id, buf, OFF + AM_HDR_LEN, len - AM_HDR_LEN);
                    }
                }
            }
        }
        if n == 0 {
            // waiting: warm the buffer the next message lands in
            self.rx.touch_next();
        }
        if self.rx.needs_refill(n > 0) {
            let _ = self.refill_rx();
        }
        n as u32
    }

    /// A message of at least [`AM_HDR_LEN`] bytes read in its head slot (`msg`): as the
    /// receive loop's head case, without the copy.
    #[inline]
    fn rx_head(&self, msg: &[u8], qp_num: u32) {
        let Some(id) = self.am_id_after_fc(msg[0], qp_num) else {
            return;
        };
        // the slot is not reposted before this returns; a handler that keeps the data gets a
        // copy (no descriptor)
        let _ = self.am.invoke(id, &msg[AM_HDR_LEN..], None);
    }

    /// The AM id of a message whose header byte is `first`, after applying its flow-control
    /// flags; `None` for a pure grant (no message to deliver).
    #[inline]
    fn am_id_after_fc(&self, first: u8, qp_num: u32) -> Option<u8> {
        let (id, flags) = parse_am_hdr(first);
        if flags != 0 {
            self.rx_fc(qp_num, flags);
            if flags == FC_PURE_GRANT {
                return None;
            }
        }
        Some(id)
    }

    /// Applies the flow-control flags of a message that arrived on `qp_num`: a grant lets
    /// pending sends go, a hard request is answered with a pure grant.
    fn rx_fc(&self, qp_num: u32, flags: u8) {
        let ep = self.eps.borrow().get(&qp_num).cloned();
        let Some(ep) = ep else { return };
        let mut fc = ep.fc.get();
        let a = fc.on_rx(&self.fc, flags);
        ep.fc.set(fc);
        if a.send_pure_grant && ep.send_pure_grant().is_err() {
            self.schedule(&ep);
        }
        if a.granted && !ep.pending.is_empty() {
            self.schedule(&ep);
        }
    }
}
