//! Send completions: what waits on them ([`TxOp`]), the send-CQ progress, error completions
//! turned into endpoint failures, pending dispatch, and interface flush.

use std::cell::Cell;
use std::rc::Rc;

use ucs::mpool::PoolBuf;
use ucs::{Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PendingResult, ResultPtr, UnpackCb};
use uct_transport::types::FlushFlags;

use super::ep::{Conn, EpState};
use super::iface::IfaceShared;
use crate::iface_common::BUF_DATA_OFFSET as OFF;
use uct_ib_verbs::{ChainRefused, WcBatch, WcStatus, WorkCompletion};

/// Completions polled per call at most (stack array).
const MAX_POLL: usize = 32;

/// Something that finishes when a send work request completes.
pub(crate) enum TxOp {
    /// A user completion (zcopy, flush).
    Comp(Comp),
    /// A send buffer to recycle.
    Buf(PoolBuf),
    /// am_zcopy: header buffer and completion.
    BufComp(PoolBuf, Comp),
    /// get_bcopy: the bounce buffer holds `len` bytes for `unpack`.
    GetBcopy {
        buf: PoolBuf,
        len: usize,
        unpack: UnpackCb,
        comp: Comp,
    },
    /// A fetching atomic: the old value is in the buffer.
    Fetch {
        buf: PoolBuf,
        result: ResultPtr,
        comp: Comp,
    },
    /// One endpoint's part of an interface flush.
    Group(Rc<FlushGroup>),
}

impl TxOp {
    /// Finishes the operation with `status` (runs user callbacks: hold no borrows).
    pub fn finish(self, status: Status) {
        match self {
            TxOp::Comp(c) => c.complete(status),
            TxOp::Buf(buf) => drop(buf),
            TxOp::BufComp(buf, c) => {
                drop(buf);
                c.complete(status);
            }
            TxOp::GetBcopy {
                buf,
                len,
                unpack,
                comp,
            } => {
                if !status.is_err() {
                    unpack.deliver(&buf[OFF..OFF + len]);
                } else {
                    unpack.cancel();
                }
                drop(buf);
                comp.complete(status);
            }
            TxOp::Fetch { buf, result, comp } => {
                if !status.is_err() {
                    let mut v = [0u8; 8];
                    v.copy_from_slice(&buf[OFF..OFF + 8]);
                    // the HCA wrote the old value in host order (see docs/ib.md)
                    result.set(u64::from_ne_bytes(v));
                }
                drop(buf);
                comp.complete(status);
            }
            TxOp::Group(g) => g.done(status),
        }
    }
}

/// An interface flush over several endpoints: completes `comp` when the last one is done.
pub(crate) struct FlushGroup {
    comp: Cell<Comp>,
    remaining: Cell<u32>,
    status: Cell<Status>,
}

impl FlushGroup {
    fn done(&self, status: Status) {
        if status.is_err() && !self.status.get().is_err() {
            self.status.set(status);
        }
        let n = self.remaining.get() - 1;
        self.remaining.set(n);
        if n == 0 {
            self.comp.replace(Comp::NONE).complete(self.status.get());
        }
    }
}

impl EpState {
    /// Finishes the waiting operations whose requests completed.
    fn finish_done(&self, status: Status) {
        loop {
            let op = self.tx.pop_done();
            match op {
                Some(op) => op.finish(status),
                None => break,
            }
        }
    }

    /// An error completion: everything before it succeeded (RC completes in order), the failed
    /// request and all later ones fail with its status; the endpoint is failed and, unless the
    /// user canceled, reported once to the error handler.
    fn on_error(self: &Rc<Self>, wc: &WorkCompletion, mut status: Status) {
        let first = !matches!(self.conn.get(), Conn::Failed(_));
        if first {
            if self.canceled.get() || wc.status() == WcStatus::WrFlushErr {
                status = Status::Canceled;
            }
            self.conn.set(Conn::Failed(status));
            let _ = self.qp.modify_to_error();
            self.iface.deschedule(self);
        }
        let failed = match self.conn.get() {
            Conn::Failed(s) => s,
            _ => status,
        };
        self.cancel_all(failed);
        if first && !self.canceled.get() && !self.destroyed.get() {
            ucs::debug!(
                qp = self.qp.qp_num(),
                wc = %wc.status_str(),
                vendor_err = wc.vendor_err(),
                "rc_verbs endpoint failed: {}",
                failed.name()
            );
            if !self.iface.err.report(self.handle.get(), failed) {
                ucs::error!(
                    "rc_verbs: endpoint (qp {:#x}) failed: {} ({}); no error handler took it",
                    self.qp.qp_num(),
                    failed.name(),
                    wc.status_str()
                );
            }
        }
    }
}

impl IfaceShared {
    /// Polls the send CQ; returns the number of completions.
    pub fn progress_tx(&self) -> u32 {
        self.tx_wanted.set(false);
        let mut batch = WcBatch::<MAX_POLL>::new();
        let Ok(wcs) = self.cqs.tx.poll_into(self.cfg.tx_max_poll, &mut batch) else {
            return 0;
        };
        let n = wcs.len();
        for wc in wcs {
            let ep = self.eps.borrow().get(&wc.qp_num()).cloned();
            let Some(ep) = ep else { continue };
            let freed = ep.tx.complete(wc.wr_id());
            self.cq_available.set(self.cq_available.get() + freed);
            if wc.is_success() {
                // ops on a failed endpoint were already finished
                ep.finish_done(Status::Ok);
            } else {
                let st = wc.status().to_status();
                if freed > 0 {
                    ep.finish_done_before_last(st);
                }
                ep.on_error(wc, st);
            }
            if ep.destroyed.get() && ep.tx.outstanding() == 0 {
                ep.cancel_all(Status::Canceled);
                self.eps.borrow_mut().remove(&wc.qp_num());
            }
        }
        n as u32
    }

    /// Runs pending requests (and owed pure grants) of scheduled endpoints while resources
    /// last, round robin (UCX arbiter semantics: `InProgress` moves on to the next endpoint,
    /// anything else but `Ok` keeps the request and stops the endpoint).
    pub fn dispatch_pending(&self) {
        let rounds = self.sched.borrow().len();
        for _ in 0..rounds {
            if self.cq_available.get() == 0 {
                return;
            }
            let ep = self.sched.borrow_mut().pop_front();
            let Some(ep) = ep else { return };
            ep.scheduled.set(false);
            if !matches!(ep.conn.get(), Conn::Connected) {
                continue;
            }
            if ep.fc.get().pure_grant_due && ep.send_pure_grant().is_err() {
                self.schedule(&ep);
                continue;
            }
            loop {
                // the head request may be an AM: wait for credits too (a grant reschedules)
                if !ep.has_tx_resources() || !ep.fc.get().can_send(&self.fc) {
                    break;
                }
                let req = ep.pending.pop_front();
                let Some(req) = req else { break };
                ep.dispatching.set(true);
                let r = req.dispatch();
                ep.dispatching.set(false);
                match r {
                    PendingResult::Done => continue,
                    PendingResult::InProgress | PendingResult::Stop => {
                        ep.pending.push_front(req);
                        break;
                    }
                }
            }
            let more = ep.fc.get().pure_grant_due || !ep.pending.is_empty();
            if more && matches!(ep.conn.get(), Conn::Connected) {
                self.schedule(&ep);
            }
        }
    }

    /// Flushes every endpoint; `comp` completes when all of them are done.
    pub fn flush_all(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        let eps: Vec<Rc<EpState>> = self
            .eps
            .borrow()
            .values()
            .filter(|e| !e.destroyed.get())
            .cloned()
            .collect();
        let group = Rc::new(FlushGroup {
            comp: Cell::new(comp),
            remaining: Cell::new(1),
            status: Cell::new(Status::Ok),
        });
        let mut waiting = 0;
        let mut no_resource = false;
        for ep in &eps {
            match ep.flush(flags, TxOp::Group(group.clone())) {
                Ok(Outcome::InProgress) => waiting += 1,
                Ok(Outcome::Done) => {}
                Err(e) if e == Status::NoResource => no_resource = true,
                // a canceled or failed endpoint has nothing left to flush
                Err(_) => {}
            }
        }
        if no_resource {
            // the caller retries the whole flush; the parts already queued complete nothing
            group.comp.set(Comp::NONE);
            return Err(Status::NoResource.into());
        }
        if waiting == 0 {
            return Ok(Outcome::Done);
        }
        // the count taken at creation kept the group from completing while parts were added
        group.remaining.set(group.remaining.get() + waiting);
        group.done(Status::Ok);
        Ok(Outcome::InProgress)
    }
}

impl EpState {
    /// The provider refused (part of) a chain of collected requests (see `doorbell`): the
    /// unposted ones are taken back from the accounting (they are the newest of this
    /// endpoint), and the endpoint fails as on an error completion; the posted ones complete
    /// (flushed) as usual.
    pub(crate) fn post_failed(self: &Rc<Self>, refused: ChainRefused) {
        let s = &self.iface;
        let status = refused.status;
        let n = refused.unposted as u32;
        self.tx.unpost(n, |op| op.finish(status));
        s.cq_available.set(s.cq_available.get() + n);
        let first = !matches!(self.conn.get(), Conn::Failed(_));
        if first {
            self.conn.set(Conn::Failed(status));
            let _ = self.qp.modify_to_error();
            s.deschedule(self);
        }
        self.cancel_all(status);
        if first && !self.canceled.get() && !self.destroyed.get() && !s.err.report(self.handle.get(), status)
        {
            ucs::error!(
                "rc_verbs: endpoint (qp {:#x}) failed: posting its sends failed: {}; no error \
                 handler took it",
                self.qp.qp_num(),
                status.name()
            );
        }
        if self.destroyed.get() && self.tx.outstanding() == 0 {
            s.eps.borrow_mut().remove(&self.qp.qp_num());
        }
    }

    /// After an error completion freed requests: those before the failed one succeeded.
    fn finish_done_before_last(&self, _status: Status) {
        loop {
            let op = self.tx.pop_done_before_last();
            match op {
                Some(op) => op.finish(Status::Ok),
                None => break,
            }
        }
    }
}
