//! Doorbell batching: the bcopy sends of a burst share `ibv_post_send` calls.
//!
//! The first bcopy send after a progress call is posted at once (a ping-pong never waits).
//! Later ones, until the next progress call, collect in the interface's one [`SendBatch`] and
//! go out as a chain of up to `RUCX_IB_TX_DB_BATCH` requests: when the batch is full, before
//! any other operation is posted, at the end of every progress call, and in flush, event
//! arming and endpoint destruction. A collected request is accounted (sequence number,
//! send-queue slot, CQ entry) when collected, exactly as if posted, so completions, flush and
//! failure handling see no difference.
//!
//! Why: every `ibv_post_send` rings the doorbell once. On Soft-RoCE that is a `write()` to
//! the uverbs device, in whose context the kernel runs the requester for all queued requests,
//! so a chain pays the system call once for all of them.

use std::cell::{Cell, RefCell};

use ucs::{Result, Status};

use super::ep::EpState;
use super::iface::IfaceShared;
use super::tx::TxOp;
use uct_ib_verbs::{SendBatch, SendFlags, SendOp, Sge};

/// The interface's collected send requests (of one endpoint at a time).
pub(crate) struct Doorbell {
    batch: RefCell<SendBatch>,
    /// Requests collected (a borrow-free copy of the batch's length).
    len: Cell<usize>,
    /// Local QP number of the endpoint they belong to (meaningful while `len > 0`).
    owner: Cell<u32>,
    /// A bcopy send was posted since the last progress call: later ones are a burst.
    burst: Cell<bool>,
    /// Requests per chain (1: batching off).
    max: usize,
}

impl Doorbell {
    pub fn new(max: usize) -> Doorbell {
        Doorbell {
            batch: RefCell::new(SendBatch::default()),
            len: Cell::new(0),
            owner: Cell::new(0),
            burst: Cell::new(false),
            max,
        }
    }

    /// True when requests wait to be posted.
    #[inline]
    pub fn waiting(&self) -> bool {
        self.len.get() != 0
    }

    /// True when a bcopy send of the endpoint with QP `qp_num` should be collected rather than
    /// posted now; marks the burst as started otherwise.
    #[inline]
    pub fn collects(&self, qp_num: u32) -> bool {
        if self.max <= 1 {
            return false;
        }
        if self.burst.get() && (self.len.get() == 0 || self.owner.get() == qp_num) {
            return true;
        }
        self.burst.set(true);
        false
    }
}

impl IfaceShared {
    /// Posts the collected requests, if any, as one chain on their endpoint's QP. A refused
    /// chain fails that endpoint (its error handler hears it); nothing else is affected.
    pub fn ring(&self) {
        let db = &self.db;
        if db.len.get() == 0 {
            return;
        }
        db.len.set(0);
        let qp_num = db.owner.get();
        let ep = self.eps.borrow().get(&qp_num).cloned();
        let mut batch = db.batch.borrow_mut();
        let Some(ep) = ep else {
            // endpoints ring before they leave the map; keep the batch consistent anyway
            *batch = SendBatch::default();
            return;
        };
        let r = batch.post(&ep.qp);
        drop(batch);
        if let Err(refused) = r {
            ep.post_failed(refused);
        }
    }

    /// Called at the end of every progress call: the burst is over.
    #[inline]
    pub fn progress_doorbell(&self) {
        self.db.burst.set(false);
        if self.db.waiting() {
            self.ring();
        }
    }
}

impl EpState {
    /// Collects one registered-buffer SEND of a burst (see the module doc), accounted as
    /// posted, with `op` to finish at its completion. The caller checked resources
    /// ([`EpState::check`]) and [`Doorbell::collects`], which keeps the batch to one
    /// endpoint.
    pub(crate) fn collect(&self, sge: Sge, extra: SendFlags, op: TxOp) -> Result<()> {
        let s = &self.iface;
        let db = &s.db;
        // the batch is posted when it reaches its maximum, so the push has room
        self.post_accounted(false, extra, |sn, flags| {
            if db.batch.borrow_mut().push(sn, sge, SendOp::Send, flags) {
                Ok(())
            } else {
                Err(Status::NoResource.into())
            }
        })?;
        self.tx.push_op(op);
        db.owner.set(self.qp.qp_num());
        let n = db.len.get() + 1;
        db.len.set(n);
        if n >= db.max {
            s.ring();
        }
        Ok(())
    }
}
