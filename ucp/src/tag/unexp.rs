//! The unexpected queue's budget: every message no receive matched yet is charged to its
//! sender and to the worker (`RUCX_TAG_UNEXP_PEER_LIMIT`, `RUCX_TAG_UNEXP_WORKER_LIMIT`),
//! from when it is filed until a receive or a probe takes it. What is charged:
//! - a whole eager message: its data plus [`ENTRY_COST`], to [`ANONYMOUS`] (the plain eager
//!   header names no sender, so only the worker limit applies); over it the message is dropped;
//! - a message still arriving in fragments: [`ENTRY_COST`] while reassembly's budget holds its
//!   data, its data too once it is whole; over it the sender's endpoints fail;
//! - a rendezvous announcement: its rkey plus [`ENTRY_COST`]; over it the sender's endpoints fail.

use std::cell::RefCell;
use std::rc::Rc;

use ucs::Error;

use super::{Incoming, TagState, Target, Unexp};
use crate::config::ByteLimits;
use crate::proto::budget::{Budget, BudgetSpec, ANONYMOUS, ENTRY_COST};

pub(super) fn budget(limits: ByteLimits) -> Budget {
    Budget::new(BudgetSpec {
        what: "unexpected tag messages",
        peer: ("RUCX_TAG_UNEXP_PEER_LIMIT", limits.peer_bytes),
        worker: ("RUCX_TAG_UNEXP_WORKER_LIMIT", limits.worker_bytes),
    })
}

impl Unexp {
    /// The sender charged and the bytes charged for holding it.
    fn charge(&self) -> (u64, usize) {
        match self {
            Unexp::Whole(d, _) => (ANONYMOUS, d.capacity() + ENTRY_COST),
            Unexp::Eager(i) => {
                let i = i.borrow();
                (i.peer, i.unexp_charged)
            }
            Unexp::Rndv(d) => (d.peer(), d.key_len() + ENTRY_COST),
        }
    }
}

/// What an eager message costs unexpected: its data once whole (before, reassembly holds it).
fn eager_cost(i: &Incoming) -> usize {
    ENTRY_COST + if i.received == i.total { i.target.held() } else { 0 }
}

impl TagState {
    pub fn new(limits: ByteLimits) -> TagState {
        TagState {
            matcher: Default::default(),
            incoming: Default::default(),
            sync: Default::default(),
            next_req: 0,
            unexp_budget: budget(limits),
        }
    }

    /// Files `u` as unexpected, charged to its sender; refused (handed back) over budget.
    pub(super) fn push_unexp(&mut self, tag: u64, u: Unexp) -> Result<(), (Error, Unexp)> {
        if let Unexp::Eager(i) = &u {
            let mut i = i.borrow_mut();
            i.unexp_charged = eager_cost(&i);
        }
        let (peer, n) = u.charge();
        if let Err(e) = self.unexp_budget.recharge(peer, 0, n) {
            return Err((e, u));
        }
        self.matcher.push_unexpected(tag, u);
        Ok(())
    }

    /// The oldest unexpected message matching `(tag, mask)`, no longer charged.
    pub(super) fn take_unexp(&mut self, tag: u64, mask: u64) -> Option<(u64, Unexp)> {
        let (t, u) = self.matcher.take_unexpected(tag, mask)?;
        self.uncharge(&u);
        Some((t, u))
    }

    /// Keeps the unexpected messages `keep` says yes to; the others are uncharged and dropped.
    pub(super) fn retain_unexp(&mut self, mut keep: impl FnMut(&Unexp) -> bool) {
        let budget = &self.unexp_budget;
        self.matcher.retain_unexpected(|u| {
            let k = keep(u);
            if !k {
                let (peer, n) = u.charge();
                let _ = budget.recharge(peer, n, 0);
            }
            k
        });
    }

    fn uncharge(&self, u: &Unexp) {
        let (peer, n) = u.charge();
        let _ = self.unexp_budget.recharge(peer, n, 0);
    }

    /// Unexpected message `inc` became whole: its data, which reassembly's budget released,
    /// is charged here. Over budget: `Err` (the caller fails the sender).
    pub(super) fn charge_whole(&self, inc: &Rc<RefCell<Incoming>>) -> Result<(), Error> {
        let mut i = inc.borrow_mut();
        if !matches!(i.target, Target::Unexp(_)) {
            return Ok(());
        }
        let new = eager_cost(&i);
        self.unexp_budget.recharge(i.peer, i.unexp_charged, new)?;
        i.unexp_charged = new;
        Ok(())
    }

    pub fn unexp_use(&self) -> crate::HeldUse {
        crate::HeldUse {
            messages: self.matcher.unexpected_len(),
            bytes: self.unexp_budget.held(),
        }
    }
}
