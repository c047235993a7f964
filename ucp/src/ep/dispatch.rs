//! Sending in order: the endpoint's wireup messages and queued operations go out while the
//! lanes take them; a uct pending request resumes them when a lane has resources again.

use std::rc::Rc;

use ucs::Status;
use uct::{PendingRequest, PendingResult};

use super::{EpInner, Wired};

impl EpInner {
    /// The uct endpoint of the AM lane.
    pub fn am_ep(&self) -> &uct::Ep {
        &self.uct[self.route.lanes.am]
    }

    /// True when the AM lane may be used (wired and nothing waiting ahead).
    pub(crate) fn can_send_now(&self) -> bool {
        self.wired.get() == Wired::Ready && !self.dispatching.get() && self.queue.borrow().is_empty()
    }

    /// Queues wireup message `bytes` and sends what it can.
    pub fn send_wireup(self: &Rc<Self>, bytes: Vec<u8>) {
        self.wireup_q.borrow_mut().push_back(bytes);
        self.dispatch();
    }

    /// Sends queued wireup messages on the wireup lane; false when it ran out of resources (a
    /// pending request is armed) or failed.
    fn dispatch_wireup(self: &Rc<Self>) -> bool {
        let lane = self.route.lanes.wireup;
        if let Some(w) = self.worker.upgrade() {
            crate::activation::touch(&w, self.route.lanes.lanes[lane].local);
        }
        loop {
            // No borrow is held across the send: it may deliver at once (self) and the
            // handlers may queue more.
            let Some(m) = self.wireup_q.borrow_mut().pop_front() else {
                // Wireup messages are few per endpoint: keep no buffer for them.
                self.wireup_q.borrow_mut().shrink_to_fit();
                return true;
            };
            let r = self.uct[lane].am_bcopy(crate::wireup::AM_ID, |b| {
                b[..m.len()].copy_from_slice(&m);
                m.len()
            });
            match r {
                Ok(_) => {}
                Err(e) if e == Status::NoResource => {
                    self.wireup_q.borrow_mut().push_front(m);
                    if !self.arm_pending(lane) {
                        return false;
                    }
                }
                Err(e) => {
                    self.fail(e.context_with(format_args!("ucp: sending to worker {:#x}", self.remote.uuid)));
                    return false;
                }
            }
        }
    }

    /// Sends queued operations while the lanes take them (wireup messages first); arms a uct
    /// pending request when they stop for lack of resources. Not re-entered: a send made by a
    /// handler it triggers queues behind and goes from the running dispatch.
    pub fn dispatch(self: &Rc<Self>) {
        if self.dispatching.replace(true) {
            return;
        }
        self.dispatch_queues();
        self.dispatching.set(false);
    }

    fn dispatch_queues(self: &Rc<Self>) {
        if !self.wireup_q.borrow().is_empty() && !self.dispatch_wireup() {
            return;
        }
        if self.wired.get() != Wired::Ready {
            return;
        }
        loop {
            let Some(mut op) = self.queue.borrow_mut().pop_front() else {
                return;
            };
            match op.progress(self) {
                Ok(true) => op.finish(Ok(())),
                Ok(false) => {
                    let lane = op.lane(self);
                    self.queue.borrow_mut().push_front(op);
                    if !self.arm_pending(lane) {
                        return;
                    }
                }
                Err(e) => op.finish(Err(e)),
            }
            if !self.wireup_q.borrow().is_empty() && !self.dispatch_wireup() {
                return;
            }
        }
    }

    /// Asks lane `lane` to call back when it has resources again; true when it has them
    /// already (`Busy`): send again now.
    fn arm_pending(self: &Rc<Self>, lane: usize) -> bool {
        if self.pending_armed.replace(true) {
            return false;
        }
        let w = Rc::downgrade(self);
        let req = PendingRequest::new(move |_| {
            if let Some(ep) = w.upgrade() {
                ep.pending_armed.set(false);
                ep.dispatch();
                // The queue grew while the lane was full; an endpoint that queues rarely
                // (thousands of mostly idle ones) keeps no buffer for it.
                if let Ok(mut q) = ep.queue.try_borrow_mut() {
                    if q.is_empty() {
                        q.shrink_to_fit();
                    }
                }
            }
            PendingResult::Done
        });
        match self.uct[lane].pending_add(req) {
            Ok(()) => false,
            Err((e, _)) => {
                self.pending_armed.set(false);
                if e == Status::Busy {
                    return true;
                }
                self.fail(e.context_with(format_args!("ucp: sending to worker {:#x}", self.remote.uuid)));
                false
            }
        }
    }
}
