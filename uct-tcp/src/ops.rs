//! Initiator-side bookkeeping of remote operations waiting for a reply (put_zcopy acks, gets,
//! fetching atomics, flush barriers) and flush markers.
//!
//! Every put/get/atomic request of a connection takes the next sequence number. The target
//! executes requests in order and answers in order, so the reply to the oldest waiting
//! operation is always the next one to arrive; a reply that does not match the front is either
//! the error report of a posted (unacknowledged) put/atomic, or a protocol violation.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;

use ucs::Status;
use uct_transport::callbacks::{Comp, ResultPtr, UnpackCb};
use uct_transport::iov::Iov;

/// A flush of several endpoints (iface flush) that completes its completion once all are done.
pub struct FlushGroup {
    remaining: Cell<usize>,
    status: Cell<Status>,
    comp: Cell<Comp>,
}

impl FlushGroup {
    pub fn new(comp: Comp) -> Rc<FlushGroup> {
        Rc::new(FlushGroup {
            remaining: Cell::new(0),
            status: Cell::new(Status::Ok),
            comp: Cell::new(comp),
        })
    }

    pub fn add(&self) {
        self.remaining.set(self.remaining.get() + 1);
    }

    #[cfg(test)]
    pub fn remaining(&self) -> usize {
        self.remaining.get()
    }

    /// Abandons the group: its completion is no longer updated (the flush call failed).
    pub fn abandon(&self) {
        self.comp.set(Comp::NONE);
    }

    fn done(&self, st: Status) {
        if st.is_err() && self.status.get() == Status::Ok {
            self.status.set(st);
        }
        let left = self.remaining.get().saturating_sub(1);
        self.remaining.set(left);
        if left == 0 {
            let comp = self.comp.replace(Comp::NONE);
            if !comp.is_none() {
                comp.complete(self.status.get());
            }
        }
    }
}

/// What to update when an operation finishes.
pub enum Done {
    None,
    Comp(Comp),
    Group(Rc<FlushGroup>),
    /// A canceled get_bcopy: its unpack callback is canceled, then `Done` updated.
    Unpack(UnpackCb, Box<Done>),
}

impl Done {
    /// True when finishing it tells someone (a completion, an iface flush, an unpack).
    pub fn reports(&self) -> bool {
        match self {
            Done::None => false,
            Done::Comp(c) => !c.is_none(),
            Done::Group(_) | Done::Unpack(..) => true,
        }
    }

    /// Updates the completion (runs user code: call without holding transport borrows).
    pub fn complete(self, st: Status) {
        match self {
            Done::None => {}
            Done::Comp(c) => {
                if !c.is_none() {
                    c.complete(st)
                }
            }
            Done::Group(g) => g.done(st),
            Done::Unpack(u, d) => {
                u.cancel();
                d.complete(st);
            }
        }
    }
}

/// Where the data of a get goes.
pub enum GetDst {
    Zcopy {
        iov: Box<[Iov<'static>]>,
    },
    Bcopy {
        buf: Vec<u8>,
        unpack: Option<UnpackCb>,
    },
    /// Canceled: the data is read and dropped.
    Discard,
}

pub enum OpKind {
    /// put_zcopy: completes with the target's PUT_ACK.
    PutAck,
    /// Flush barrier (an empty acknowledged put).
    Barrier,
    Get {
        len: u64,
        dst: GetDst,
    },
    Atomic {
        result: Option<ResultPtr>,
    },
    /// Flush marker: completes once every operation ahead of it has.
    Marker,
}

pub struct Op {
    pub seq: u32,
    pub kind: OpKind,
    pub done: Done,
}

impl Op {
    /// Finishes the operation with `st` (an error for gets cancels their unpack callback).
    pub fn finish(self, st: Status) {
        if let OpKind::Get {
            dst: GetDst::Bcopy { unpack: Some(u), .. },
            ..
        } = self.kind
        {
            u.cancel();
        }
        self.done.complete(st);
    }

    /// Detaches the operation from the user (canceled): it stays in the queue to absorb its
    /// reply, and returns what must be completed (by the caller, once it holds no borrows: the
    /// user's callbacks run then).
    pub fn cancel(&mut self) -> Done {
        let done = std::mem::replace(&mut self.done, Done::None);
        if let OpKind::Atomic { result } = &mut self.kind {
            *result = None;
        }
        if let OpKind::Get { dst, .. } = &mut self.kind {
            if let GetDst::Bcopy { unpack: Some(u), .. } = std::mem::replace(dst, GetDst::Discard) {
                return Done::Unpack(u, Box::new(done));
            }
        }
        done
    }
}

/// The waiting operations of one connection.
#[derive(Default)]
pub struct Ops {
    next_seq: u32,
    /// Posted (unacknowledged) puts or atomics since the last barrier: a flush must send one.
    pub need_barrier: bool,
    /// The first refusal of a posted put or atomic not yet reported: the next flush that
    /// reports to someone fails with it.
    pub posted_error: Option<Status>,
    pub q: VecDeque<Op>,
}

impl Ops {
    /// The sequence number of the next request.
    pub fn take_seq(&mut self) -> u32 {
        let s = self.next_seq;
        self.next_seq = s.wrapping_add(1);
        s
    }

    /// True when nothing waits for a reply and no posted operation awaits a barrier.
    pub fn idle(&self) -> bool {
        self.q.is_empty() && !self.need_barrier
    }

    /// Pops the front operation if it answers `seq`.
    pub fn pop_reply(&mut self, seq: u32) -> Option<Op> {
        match self.q.front() {
            Some(op) if op.seq == seq && !matches!(op.kind, OpKind::Marker) => self.q.pop_front(),
            _ => None,
        }
    }

    /// Pops the markers at the front (every operation before them is done).
    pub fn pop_markers(&mut self) -> Vec<Op> {
        let mut out = Vec::new();
        while matches!(
            self.q.front(),
            Some(Op {
                kind: OpKind::Marker,
                ..
            })
        ) {
            out.extend(self.q.pop_front());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(seq: u32, kind: OpKind) -> Op {
        Op {
            seq,
            kind,
            done: Done::None,
        }
    }

    #[test]
    fn replies_match_the_front_only() {
        let mut o = Ops::default();
        let a = o.take_seq();
        let b = o.take_seq();
        o.q.push_back(op(a, OpKind::PutAck));
        o.q.push_back(op(0, OpKind::Marker));
        o.q.push_back(op(b, OpKind::Atomic { result: None }));
        assert!(o.pop_reply(b).is_none());
        assert!(o.pop_reply(a).is_some());
        assert_eq!(o.pop_markers().len(), 1);
        assert!(o.pop_reply(b).is_some());
        assert!(o.idle());
    }

    #[test]
    fn group_completes_once_when_all_done() {
        let g = FlushGroup::new(Comp::NONE);
        g.add();
        g.add();
        Done::Group(g.clone()).complete(Status::Ok);
        assert_eq!(g.remaining(), 1);
        Done::Group(g.clone()).complete(Status::IoError);
        assert_eq!(g.remaining(), 0);
        assert_eq!(g.status.get(), Status::IoError);
    }
}
