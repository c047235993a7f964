//! What operations in flight and the interface keep of an endpoint: its pending queue and its
//! dispatch, failure (reported once), and flush waiters.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use ucs::Status;
use uct_transport::callbacks::{Comp, PendingReq, PendingResult};
use uct_transport::traits::EpHandle;

use crate::ffi::Endpoint;
use crate::iface::Shared;

/// What operations in flight and the interface keep of an endpoint.
pub(crate) struct EpState {
    /// Where operations go: the endpoint and the destination address it takes.
    pub(crate) tx: Rc<Endpoint>,
    pub(crate) dest: u64,
    /// A connected endpoint whose connection is not up yet.
    pub(crate) connecting: Cell<bool>,
    pub(super) handle: Cell<EpHandle>,
    pub(crate) outstanding: Cell<usize>,
    pub(super) pending: RefCell<VecDeque<PendingReq>>,
    /// In the interface's arbiter.
    pub(crate) queued: Cell<bool>,
    /// The provider said `-FI_EAGAIN` since the last send that went out.
    pub(super) blocked: Cell<bool>,
    /// When the provider first said `-FI_EAGAIN` with nothing going out since.
    pub(crate) stalled_since: Cell<Option<std::time::Instant>>,
    /// In the interface's `stalled` list.
    pub(crate) watched: Cell<bool>,
    pub(super) failed: Cell<Option<Status>>,
    pub(super) destroyed: Cell<bool>,
    pub(super) flush_waiters: RefCell<Vec<Comp>>,
}

impl EpState {
    pub(crate) fn new(tx: Rc<Endpoint>, dest: u64, connecting: bool) -> EpState {
        EpState {
            tx,
            dest,
            connecting: Cell::new(connecting),
            handle: Cell::new(EpHandle(0)),
            outstanding: Cell::new(0),
            pending: RefCell::new(VecDeque::new()),
            queued: Cell::new(false),
            blocked: Cell::new(false),
            stalled_since: Cell::new(None),
            watched: Cell::new(false),
            failed: Cell::new(None),
            destroyed: Cell::new(false),
            flush_waiters: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.get().is_some() || self.destroyed.get()
    }

    /// An operation of this endpoint failed: the peer is unusable. Reported once, to the
    /// interface's error handler, unless the endpoint is already destroyed.
    pub(crate) fn fail(&self, s: &Shared, status: Status) {
        if status == Status::Canceled || self.failed.get().is_some() {
            return;
        }
        self.failed.set(Some(status));
        if !self.destroyed.get() {
            ucs::debug!("ofi {}: endpoint failed: {status:?}", s.md.name);
            s.err_handler.report(self.handle.get(), status);
        }
    }

    /// Nothing is in flight any more: completes the flush waiters.
    pub(crate) fn flushed(&self) {
        let w = std::mem::take(&mut *self.flush_waiters.borrow_mut());
        for c in w {
            c.complete(self.failed.get().unwrap_or(Status::Ok));
        }
    }

    /// Dispatches this endpoint's pending requests until one stops or a send finds the
    /// provider full. At most as many calls as requests were queued: a callback that queues
    /// itself again (its send got `-FI_EAGAIN`) waits for the next progress, because the
    /// provider only frees resources (and RxM only finishes connecting) in `fi_cq_read`.
    pub(crate) fn dispatch(self: &Rc<Self>, s: &Shared) {
        s.dispatching.set(Rc::as_ptr(self) as usize);
        self.blocked.set(false);
        let mut budget = self.pending.borrow().len();
        while budget > 0 && !self.blocked.get() && self.failed.get().is_none() {
            budget -= 1;
            let Some(req) = self.pending.borrow_mut().pop_front() else {
                break;
            };
            match req.dispatch() {
                PendingResult::Done => {}
                // keep it first and go on
                PendingResult::InProgress => self.pending.borrow_mut().push_front(req),
                PendingResult::Stop => {
                    self.pending.borrow_mut().push_front(req);
                    break;
                }
            }
        }
        s.dispatching.set(0);
    }
}
