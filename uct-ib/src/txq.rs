//! Send-queue accounting of one QP with completion moderation (UCX `uct_rc_txqp_t`), for
//! rc_verbs (a queue per endpoint) and ud_verbs (one per interface).
//!
//! Every posted work request gets the next sequence number `sn` as its `wr_id`; only every
//! `moderation`-th request (or one that must report, e.g. a zcopy with a completion) is
//! signaled. A QP's send queue completes in order, so a completion for `sn` completes every
//! request up to it: the slots they used come back, and the operations waiting on them (`ops`,
//! tagged with the `sn` of their last request) are done. Sequence numbers start at a
//! per-endpoint base, so completions of a destroyed QP whose number was reused are recognised
//! as stale.
//!
//! The counters are `Cell`s and only the operation queue is a `RefCell` (borrowed inside one
//! method at a time): a send checks and commits its slot without a borrow flag to test and
//! set, as UCX's plain-C counters do: the accounting is on every send's path.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// The accounting of one send queue; `Op` is what waits for a completion.
pub struct TxQueue<Op> {
    /// Send-queue slots left.
    available: Cell<u32>,
    /// Last posted sequence number.
    pi: Cell<u64>,
    /// Last completed sequence number.
    ci: Cell<u64>,
    /// Requests posted since the last signaled one.
    unsignaled: Cell<u32>,
    moderation: u32,
    ops: RefCell<VecDeque<(u64, Op)>>,
}

impl<Op> TxQueue<Op> {
    /// A queue of `slots` work requests whose sequence numbers start after `base`, signaling
    /// every `moderation`-th request.
    pub fn new(slots: u32, moderation: u32, base: u64) -> TxQueue<Op> {
        TxQueue {
            available: Cell::new(slots),
            pi: Cell::new(base),
            ci: Cell::new(base),
            unsignaled: Cell::new(0),
            moderation: moderation.max(1),
            // Grows on demand (to at most `slots`) and keeps its capacity: an idle ep costs
            // nothing here, a busy one stops allocating once warmed up.
            ops: RefCell::new(VecDeque::new()),
        }
    }

    /// True when a request can be posted.
    #[inline]
    pub fn has_room(&self) -> bool {
        self.available.get() > 0
    }

    /// Slots left.
    #[inline]
    pub fn available(&self) -> u32 {
        self.available.get()
    }

    /// The `wr_id` of the next request and whether it must be signaled (`force`, or the
    /// moderation count is reached).
    #[inline]
    pub fn next(&self, force: bool) -> (u64, bool) {
        (
            self.pi.get() + 1,
            force | (self.unsignaled.get() + 1 >= self.moderation),
        )
    }

    /// The request from [`TxQueue::next`] was posted.
    #[inline]
    pub fn posted(&self, signaled: bool) {
        self.pi.set(self.pi.get() + 1);
        self.available.set(self.available.get() - 1);
        self.unsignaled
            .set(if signaled { 0 } else { self.unsignaled.get() + 1 });
    }

    /// Queues `op` to finish when the last posted request completes.
    #[inline]
    pub fn push_op(&self, op: Op) {
        self.ops.borrow_mut().push_back((self.pi.get(), op));
    }

    /// A completion for `sn` arrived: returns how many requests it completed (0 for a stale or
    /// repeated one).
    #[inline]
    pub fn complete(&self, sn: u64) -> u32 {
        let ci = self.ci.get();
        if sn <= ci || sn > self.pi.get() {
            return 0;
        }
        let n = (sn - ci) as u32;
        self.ci.set(sn);
        self.available.set(self.available.get() + n);
        n
    }

    /// The next operation whose requests are all complete.
    #[inline]
    pub fn pop_done(&self) -> Option<Op> {
        let mut ops = self.ops.borrow_mut();
        match ops.front() {
            Some(&(sn, _)) if sn <= self.ci.get() => ops.pop_front().map(|(_, op)| op),
            _ => None,
        }
    }

    /// The next operation whose requests all completed before the last completed one (after an
    /// error completion: those succeeded).
    pub fn pop_done_before_last(&self) -> Option<Op> {
        let mut ops = self.ops.borrow_mut();
        match ops.front() {
            Some(&(sn, _)) if sn < self.ci.get() => ops.pop_front().map(|(_, op)| op),
            _ => None,
        }
    }

    /// The next waiting operation, complete or not (to fail or cancel it).
    pub fn pop_any(&self) -> Option<Op> {
        self.ops.borrow_mut().pop_front().map(|(_, op)| op)
    }

    /// Requests posted and not completed yet.
    #[inline]
    pub fn outstanding(&self) -> u64 {
        self.pi.get() - self.ci.get()
    }

    /// Requests posted since the last signaled one (a flush must signal to see them complete).
    pub fn unsignaled(&self) -> u32 {
        self.unsignaled.get()
    }

    /// The last `n` requests accounted as posted were not posted after all (a refused
    /// chain): their sequence numbers and slots are given back, and the operations waiting on
    /// them go to `gone` (newest first), since those sequence numbers will be used again.
    pub fn unpost(&self, n: u32, mut gone: impl FnMut(Op)) {
        let n = n.min((self.pi.get() - self.ci.get()) as u32);
        let pi = self.pi.get() - n as u64;
        self.pi.set(pi);
        self.available.set(self.available.get() + n);
        loop {
            let op = {
                let mut ops = self.ops.borrow_mut();
                match ops.back() {
                    Some(&(sn, _)) if sn > pi => ops.pop_back().map(|(_, op)| op),
                    _ => None,
                }
            };
            match op {
                Some(op) => gone(op),
                None => break,
            }
        }
    }

    /// Last posted sequence number.
    #[cfg(test)]
    pub fn last_sn(&self) -> u64 {
        self.pi.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post<Op>(q: &TxQueue<Op>, force: bool) -> (u64, bool) {
        let (sn, sig) = q.next(force);
        q.posted(sig);
        (sn, sig)
    }

    #[test]
    fn moderation_signals_every_nth_and_forced() {
        let q: TxQueue<()> = TxQueue::new(16, 4, 1000);
        let sig: Vec<bool> = (0..8).map(|_| post(&q, false).1).collect();
        assert_eq!(sig, vec![false, false, false, true, false, false, false, true]);
        assert!(post(&q, true).1, "forced");
        assert_eq!(q.unsignaled(), 0);
        assert!(!post(&q, false).1, "the count restarts after a forced signal");
        assert_eq!((q.available(), q.outstanding(), q.last_sn()), (6, 10, 1010));
    }

    #[test]
    fn one_completion_completes_everything_up_to_it() {
        let q: TxQueue<&str> = TxQueue::new(8, 64, 0);
        post(&q, false);
        q.push_op("a");
        post(&q, false);
        post(&q, true);
        q.push_op("c");
        post(&q, false);
        q.push_op("d");
        assert_eq!(q.available(), 4);
        assert_eq!(q.pop_done(), None, "nothing completed yet");
        assert_eq!(q.complete(3), 3);
        assert_eq!(
            (q.pop_done(), q.pop_done(), q.pop_done()),
            (Some("a"), Some("c"), None)
        );
        assert_eq!(q.available(), 7);
        assert_eq!(q.complete(3), 0, "a repeated completion frees nothing");
        assert_eq!(q.complete(99), 0, "a completion beyond the last post is stale");
        assert_eq!(q.outstanding(), 1);
        assert_eq!(q.pop_any(), Some("d"));
        assert_eq!(q.complete(4), 1);
        assert_eq!((q.available(), q.outstanding()), (8, 0));
    }

    #[test]
    fn unpost_gives_back_the_newest() {
        let q: TxQueue<u32> = TxQueue::new(8, 64, 100);
        for i in 0..5 {
            post(&q, false);
            q.push_op(i);
        }
        assert_eq!(q.complete(102), 2);
        let mut gone = Vec::new();
        q.unpost(2, |op| gone.push(op));
        assert_eq!(
            gone,
            vec![4, 3],
            "the unposted requests' operations, newest first"
        );
        assert_eq!((q.available(), q.outstanding(), q.last_sn()), (7, 1, 103));
        assert_eq!(q.complete(104), 0, "an unposted request cannot complete");
        assert_eq!(q.complete(103), 1);
        q.unpost(5, |op| gone.push(op));
        assert_eq!(
            (q.available(), q.outstanding()),
            (8, 0),
            "never below the completed"
        );
        assert_eq!(gone, vec![4, 3], "completed operations are not given back");
        assert_eq!(q.next(false).0, 104, "the given-back numbers are used again");
    }

    #[test]
    fn exhaustion() {
        let q: TxQueue<()> = TxQueue::new(3, 2, 0);
        for _ in 0..3 {
            assert!(q.has_room());
            post(&q, false);
        }
        assert!(!q.has_room());
        // the last signaled one was #2: its completion frees two slots
        assert_eq!(q.complete(2), 2);
        assert!(q.has_room());
    }
}
