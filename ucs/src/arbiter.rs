//! Fair round-robin dispatch over groups of queued work (UCX `ucs_arbiter`), used for pending
//! queues: one group per endpoint, one arbiter per interface.
//!
//! Each group is a FIFO of elements. Scheduled groups form a ring; [`Arbiter::dispatch`] visits
//! them in turn, offering up to `per_group` elements of each group to a callback whose
//! [`DispatchResult`] decides what happens next. A group that runs empty leaves the ring; pushing
//! does not schedule (call [`Arbiter::schedule`]), as in UCX. Groups live in a slot vector and the
//! ring is linked by indices, so push (amortized), schedule, deschedule and dispatch do not
//! allocate.
//!
//! Difference from UCX: dispatch also ends once every scheduled group was visited without any
//! element being removed (UCX loops forever if callbacks keep answering `NextGroup`).

use std::collections::VecDeque;

/// What the dispatch callback wants done with the element it was offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchResult {
    /// The element is done: drop it and continue with the group's next element.
    Remove,
    /// Keep the element at the head of its group and move on to the next group; the group stays
    /// scheduled.
    NextGroup,
    /// Keep the element and take the group off the ring until [`Arbiter::schedule`] is called.
    Deschedule,
    /// Keep the element, skip the group for the rest of this dispatch, and put it back on the
    /// ring (at the tail) when the dispatch ends.
    Reschedule,
    /// Keep the element and stop dispatching; the next dispatch starts with this group.
    Stop,
}

/// Handle of a group. Stale handles (of destroyed groups) are detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId {
    index: u32,
    generation: u32,
}

const NONE: u32 = u32::MAX;

struct Group<T> {
    queue: VecDeque<T>,
    generation: u32,
    live: bool,
    scheduled: bool,
    /// Ring links, valid while scheduled.
    prev: u32,
    next: u32,
    /// Link in the list of groups to reschedule after the current dispatch.
    resched_next: u32,
    in_resched: bool,
}

/// The arbiter. See the [module docs](self).
pub struct Arbiter<T> {
    groups: Vec<Group<T>>,
    free: Vec<u32>,
    /// Next group to dispatch; `NONE` when no group is scheduled.
    current: u32,
    scheduled: usize,
    resched_head: u32,
    resched_tail: u32,
    dispatching: bool,
}

impl<T> Default for Arbiter<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Arbiter<T> {
    /// An arbiter with no groups.
    pub fn new() -> Self {
        Arbiter {
            groups: Vec::new(),
            free: Vec::new(),
            current: NONE,
            scheduled: 0,
            resched_head: NONE,
            resched_tail: NONE,
            dispatching: false,
        }
    }

    /// Creates an empty, unscheduled group.
    pub fn group_new(&mut self) -> GroupId {
        if let Some(index) = self.free.pop() {
            let g = &mut self.groups[index as usize];
            g.live = true;
            return GroupId {
                index,
                generation: g.generation,
            };
        }
        let index = u32::try_from(self.groups.len()).expect("more than 4G arbiter groups");
        self.groups.push(Group {
            queue: VecDeque::new(),
            generation: 0,
            live: true,
            scheduled: false,
            prev: NONE,
            next: NONE,
            resched_next: NONE,
            in_resched: false,
        });
        GroupId { index, generation: 0 }
    }

    /// Destroys a group and returns the elements it still held (in order).
    ///
    /// # Panics
    /// If `group` was already destroyed.
    pub fn group_destroy(&mut self, group: GroupId) -> VecDeque<T> {
        let i = self.check(group);
        self.unlink(i);
        if self.groups[i as usize].in_resched {
            self.resched_remove(i);
        }
        let g = &mut self.groups[i as usize];
        g.live = false;
        g.generation = g.generation.wrapping_add(1);
        self.free.push(i);
        std::mem::take(&mut g.queue)
    }

    /// True if `group` is a live handle of this arbiter.
    pub fn contains(&self, group: GroupId) -> bool {
        self.groups
            .get(group.index as usize)
            .is_some_and(|g| g.live && g.generation == group.generation)
    }

    /// Appends an element to the group (FIFO). Does not schedule the group.
    pub fn push(&mut self, group: GroupId, elem: T) {
        let i = self.check(group);
        self.groups[i as usize].queue.push_back(elem);
    }

    /// Puts an element at the head of the group, so it is dispatched first.
    pub fn push_head(&mut self, group: GroupId, elem: T) {
        let i = self.check(group);
        self.groups[i as usize].queue.push_front(elem);
    }

    /// Puts a non-empty group on the ring, at the tail (dispatched after all scheduled groups).
    /// No effect if it is empty or already scheduled.
    pub fn schedule(&mut self, group: GroupId) {
        let i = self.check(group);
        self.link(i);
    }

    /// Takes the group off the ring; its elements stay queued. No effect if not scheduled.
    pub fn desched(&mut self, group: GroupId) {
        let i = self.check(group);
        self.unlink(i);
    }

    /// True if the group holds no elements.
    pub fn group_is_empty(&self, group: GroupId) -> bool {
        self.group_len(group) == 0
    }

    /// Number of queued elements of the group.
    pub fn group_len(&self, group: GroupId) -> usize {
        let i = self.check(group);
        self.groups[i as usize].queue.len()
    }

    /// True if the group is on the ring.
    pub fn group_is_scheduled(&self, group: GroupId) -> bool {
        let i = self.check(group);
        self.groups[i as usize].scheduled
    }

    /// True if no group is scheduled.
    pub fn is_empty(&self) -> bool {
        self.current == NONE
    }

    /// Iterates over the group's elements, head first.
    pub fn group_iter(&self, group: GroupId) -> impl Iterator<Item = &T> {
        let i = self.check(group);
        self.groups[i as usize].queue.iter()
    }

    /// Hands every element of the group to `f` (in order) and empties it; the group is taken
    /// off the ring.
    pub fn purge_group(&mut self, group: GroupId, mut f: impl FnMut(T)) {
        self.purge_group_cond(group, |e| {
            f(e);
            None
        });
    }

    /// Offers each element of the group to `f`, in order: returning `None` removes it (`f` took
    /// it), `Some(elem)` keeps it in place. The group leaves the ring if it ends up empty.
    pub fn purge_group_cond(&mut self, group: GroupId, mut f: impl FnMut(T) -> Option<T>) {
        let i = self.check(group) as usize;
        let n = self.groups[i].queue.len();
        for _ in 0..n {
            let Some(elem) = self.groups[i].queue.pop_front() else {
                break;
            };
            if let Some(kept) = f(elem) {
                self.groups[i].queue.push_back(kept);
            }
        }
        if self.groups[i].queue.is_empty() {
            self.unlink(i as u32);
        }
    }

    /// Dispatches with a callback that only sees the element. See [`Arbiter::dispatch_with`].
    pub fn dispatch(
        &mut self,
        per_group: usize,
        mut cb: impl FnMut(GroupId, &mut T) -> DispatchResult,
    ) -> usize {
        self.dispatch_with(per_group, |_, g, e| cb(g, e))
    }

    /// Round-robin over the scheduled groups, offering up to `per_group` (at least 1) elements
    /// of each group per visit, until the ring is empty, the callback answers `Stop`, or a full
    /// round removes nothing. Returns the number of removed elements.
    ///
    /// The callback gets the arbiter itself, so it may push to, schedule or deschedule any group;
    /// the element being offered is outside its group during the call. A nested `dispatch` from
    /// the callback does nothing. If the callback destroys the element's own group, a kept
    /// element is dropped.
    pub fn dispatch_with(
        &mut self,
        per_group: usize,
        mut cb: impl FnMut(&mut Arbiter<T>, GroupId, &mut T) -> DispatchResult,
    ) -> usize {
        if self.dispatching || self.current == NONE {
            return 0;
        }
        self.dispatching = true;
        let per_group = per_group.max(1);
        let mut removed = 0;
        // Consecutive group visits that removed nothing; a full round of them ends the dispatch.
        let mut idle_visits = 0;
        'groups: while self.current != NONE && idle_visits < self.scheduled {
            let gi = self.current;
            let id = GroupId {
                index: gi,
                generation: self.groups[gi as usize].generation,
            };
            // Like UCX, elements pushed during this visit wait for the next one.
            let budget = per_group.min(self.groups[gi as usize].queue.len());
            let mut count = 0;
            let mut removed_here = false;
            loop {
                let Some(mut elem) = self.groups[gi as usize].queue.pop_front() else {
                    self.unlink(gi);
                    break;
                };
                let result = cb(self, id, &mut elem);
                count += 1;
                if !self.contains(id) {
                    if result == DispatchResult::Remove {
                        removed += 1;
                        removed_here = true;
                    }
                    drop(elem);
                    if result == DispatchResult::Stop {
                        break 'groups;
                    }
                    break;
                }
                match result {
                    DispatchResult::Remove => {
                        drop(elem);
                        removed += 1;
                        removed_here = true;
                        if self.groups[gi as usize].queue.is_empty() {
                            self.unlink(gi);
                            break;
                        }
                        if !self.groups[gi as usize].scheduled {
                            break; // the callback descheduled its own group
                        }
                        if count >= budget {
                            self.advance_past(gi);
                            break;
                        }
                    }
                    DispatchResult::NextGroup => {
                        self.groups[gi as usize].queue.push_front(elem);
                        self.advance_past(gi);
                        break;
                    }
                    DispatchResult::Deschedule => {
                        self.groups[gi as usize].queue.push_front(elem);
                        self.unlink(gi);
                        break;
                    }
                    DispatchResult::Reschedule => {
                        self.groups[gi as usize].queue.push_front(elem);
                        self.unlink(gi);
                        self.resched_push(gi);
                        break;
                    }
                    DispatchResult::Stop => {
                        self.groups[gi as usize].queue.push_front(elem);
                        if self.groups[gi as usize].scheduled {
                            self.current = gi;
                        }
                        break 'groups;
                    }
                }
            }
            idle_visits = if removed_here { 0 } else { idle_visits + 1 };
        }
        while self.resched_head != NONE {
            let gi = self.resched_head;
            self.resched_remove(gi);
            self.link(gi);
        }
        self.dispatching = false;
        removed
    }

    /// Index of a live group; panics on a stale handle (a use-after-destroy bug).
    fn check(&self, group: GroupId) -> u32 {
        assert!(self.contains(group), "stale or foreign arbiter GroupId {group:?}");
        group.index
    }

    /// Moves `current` to the group after `gi`, if `gi` is still current.
    fn advance_past(&mut self, gi: u32) {
        let g = &self.groups[gi as usize];
        if g.scheduled && self.current == gi {
            self.current = g.next;
        }
    }

    fn link(&mut self, gi: u32) {
        let g = &self.groups[gi as usize];
        if g.scheduled || g.queue.is_empty() || g.in_resched {
            return;
        }
        if self.current == NONE {
            let g = &mut self.groups[gi as usize];
            g.prev = gi;
            g.next = gi;
            self.current = gi;
        } else {
            // Insert before `current`, i.e. at the tail of the round.
            let next = self.current;
            let prev = self.groups[next as usize].prev;
            self.groups[prev as usize].next = gi;
            self.groups[next as usize].prev = gi;
            let g = &mut self.groups[gi as usize];
            g.prev = prev;
            g.next = next;
        }
        self.groups[gi as usize].scheduled = true;
        self.scheduled += 1;
    }

    fn unlink(&mut self, gi: u32) {
        let g = &mut self.groups[gi as usize];
        if !g.scheduled {
            return;
        }
        g.scheduled = false;
        let (prev, next) = (g.prev, g.next);
        self.scheduled -= 1;
        if next == gi {
            self.current = NONE;
        } else {
            self.groups[prev as usize].next = next;
            self.groups[next as usize].prev = prev;
            if self.current == gi {
                self.current = next;
            }
        }
    }

    fn resched_push(&mut self, gi: u32) {
        let g = &mut self.groups[gi as usize];
        if g.in_resched {
            return;
        }
        g.in_resched = true;
        g.resched_next = NONE;
        if self.resched_tail == NONE {
            self.resched_head = gi;
        } else {
            self.groups[self.resched_tail as usize].resched_next = gi;
        }
        self.resched_tail = gi;
    }

    fn resched_remove(&mut self, gi: u32) {
        let mut prev = NONE;
        let mut cur = self.resched_head;
        while cur != NONE && cur != gi {
            prev = cur;
            cur = self.groups[cur as usize].resched_next;
        }
        if cur == NONE {
            return;
        }
        let next = self.groups[gi as usize].resched_next;
        if prev == NONE {
            self.resched_head = next;
        } else {
            self.groups[prev as usize].resched_next = next;
        }
        if self.resched_tail == gi {
            self.resched_tail = prev;
        }
        let g = &mut self.groups[gi as usize];
        g.in_resched = false;
        g.resched_next = NONE;
    }
}

impl<T> std::fmt::Debug for Arbiter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arbiter")
            .field("groups", &(self.groups.len() - self.free.len()))
            .field("scheduled", &self.scheduled)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DispatchResult::*;

    fn three_groups(arb: &mut Arbiter<(usize, usize)>, n: usize) -> Vec<GroupId> {
        let gs: Vec<_> = (0..3).map(|_| arb.group_new()).collect();
        for (gi, &g) in gs.iter().enumerate() {
            for k in 0..n {
                arb.push(g, (gi, k));
            }
            arb.schedule(g);
        }
        gs
    }

    #[test]
    fn round_robin_fairness() {
        let mut arb = Arbiter::new();
        three_groups(&mut arb, 4);
        let mut order = Vec::new();
        let n = arb.dispatch(1, |_, e| {
            order.push(*e);
            Remove
        });
        assert_eq!(n, 12);
        let expect: Vec<_> = (0..4).flat_map(|k| (0..3).map(move |g| (g, k))).collect();
        assert_eq!(order, expect);
        assert!(arb.is_empty());

        // per_group = 2 takes pairs from each group in turn
        let mut arb = Arbiter::new();
        three_groups(&mut arb, 3);
        let mut order = Vec::new();
        arb.dispatch(2, |_, e| {
            order.push(*e);
            Remove
        });
        assert_eq!(
            order,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (2, 0),
                (2, 1),
                (0, 2),
                (1, 2),
                (2, 2)
            ]
        );
    }

    #[test]
    fn push_does_not_schedule_and_schedule_appends_to_tail() {
        let mut arb = Arbiter::new();
        let a = arb.group_new();
        let b = arb.group_new();
        arb.push(a, 1);
        assert!(arb.is_empty() && !arb.group_is_scheduled(a));
        arb.schedule(b); // empty: no effect
        assert!(!arb.group_is_scheduled(b));
        arb.push(b, 2);
        arb.schedule(b);
        arb.schedule(a);
        arb.schedule(a); // idempotent
        let mut seen = Vec::new();
        arb.dispatch(1, |_, e| {
            seen.push(*e);
            Remove
        });
        assert_eq!(seen, vec![2, 1]);
        assert!(arb.group_is_empty(a) && !arb.group_is_scheduled(a));
    }

    #[test]
    fn next_group_keeps_element_and_round_ends() {
        let mut arb = Arbiter::new();
        let gs = three_groups(&mut arb, 2);
        let mut calls = 0;
        let n = arb.dispatch(4, |_, _| {
            calls += 1;
            NextGroup
        });
        assert_eq!(
            (n, calls),
            (0, 3),
            "one full round without progress ends the dispatch"
        );
        assert!(gs
            .iter()
            .all(|&g| arb.group_len(g) == 2 && arb.group_is_scheduled(g)));
        // group 1 refuses, others drain: group 1 must be retried each round, in order
        let mut order = Vec::new();
        arb.dispatch(1, |g, e| {
            order.push(*e);
            if g == gs[1] {
                NextGroup
            } else {
                Remove
            }
        });
        assert_eq!(
            order,
            vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 0), (2, 1), (1, 0)]
        );
        assert_eq!(arb.group_len(gs[1]), 2);
    }

    #[test]
    fn deschedule_until_scheduled_again() {
        let mut arb = Arbiter::new();
        let gs = three_groups(&mut arb, 2);
        let mut order = Vec::new();
        arb.dispatch(1, |g, e| {
            order.push(*e);
            if g == gs[0] {
                Deschedule
            } else {
                Remove
            }
        });
        assert_eq!(order, vec![(0, 0), (1, 0), (2, 0), (1, 1), (2, 1)]);
        assert!(arb.is_empty());
        assert_eq!(arb.group_len(gs[0]), 2);
        arb.schedule(gs[0]);
        let mut rest = Vec::new();
        arb.dispatch(8, |_, e| {
            rest.push(*e);
            Remove
        });
        assert_eq!(rest, vec![(0, 0), (0, 1)], "kept element stays at the head");
    }

    #[test]
    fn reschedule_skips_rest_of_dispatch_then_returns() {
        let mut arb = Arbiter::new();
        let gs = three_groups(&mut arb, 2);
        let mut order = Vec::new();
        arb.dispatch(1, |g, e| {
            order.push(*e);
            if g == gs[1] {
                Reschedule
            } else {
                Remove
            }
        });
        assert_eq!(order, vec![(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]);
        assert!(arb.group_is_scheduled(gs[1]), "rescheduled after the dispatch");
        let mut next = Vec::new();
        arb.dispatch(1, |_, e| {
            next.push(*e);
            Remove
        });
        assert_eq!(next, vec![(1, 0), (1, 1)]);
    }

    #[test]
    fn stop_resumes_at_same_group() {
        let mut arb = Arbiter::new();
        let gs = three_groups(&mut arb, 2);
        let mut budget = 2;
        let mut order = Vec::new();
        let take = |budget: &mut i32, order: &mut Vec<_>, e: &mut (usize, usize)| {
            if *budget == 0 {
                return Stop;
            }
            *budget -= 1;
            order.push(*e);
            Remove
        };
        assert_eq!(arb.dispatch(1, |_, e| take(&mut budget, &mut order, e)), 2);
        assert_eq!(order, vec![(0, 0), (1, 0)]);
        assert_eq!(arb.group_len(gs[2]), 2, "stopped group keeps its element");
        budget = 10;
        arb.dispatch(1, |_, e| take(&mut budget, &mut order, e));
        assert_eq!(
            order[2..],
            [(2, 0), (0, 1), (1, 1), (2, 1)],
            "resumes at the stopped group"
        );
    }

    #[test]
    fn push_head_goes_first_even_when_scheduled() {
        let mut arb = Arbiter::new();
        let g = arb.group_new();
        arb.push(g, 2);
        arb.push(g, 3);
        arb.schedule(g);
        arb.push_head(g, 1);
        let mut seen = Vec::new();
        arb.dispatch(10, |_, e| {
            seen.push(*e);
            Remove
        });
        assert_eq!(seen, vec![1, 2, 3]);
    }

    #[test]
    fn purge_hands_back_everything_and_cond_keeps() {
        let mut arb = Arbiter::new();
        let gs = three_groups(&mut arb, 4);
        let mut got = Vec::new();
        arb.purge_group(gs[1], |e| got.push(e));
        assert_eq!(got, (0..4).map(|k| (1, k)).collect::<Vec<_>>());
        assert!(arb.group_is_empty(gs[1]) && !arb.group_is_scheduled(gs[1]));
        // keep odd elements of group 0
        let mut taken = Vec::new();
        arb.purge_group_cond(gs[0], |e| {
            if e.1 % 2 == 0 {
                taken.push(e);
                None
            } else {
                Some(e)
            }
        });
        assert_eq!(taken, vec![(0, 0), (0, 2)]);
        assert_eq!(
            arb.group_iter(gs[0]).copied().collect::<Vec<_>>(),
            vec![(0, 1), (0, 3)]
        );
        assert!(arb.group_is_scheduled(gs[0]));
        let n = arb.dispatch(1, |_, _| Remove);
        assert_eq!(n, 6);
    }

    #[test]
    fn callback_pushes_to_another_group() {
        let mut arb = Arbiter::new();
        let a = arb.group_new();
        let b = arb.group_new();
        arb.push(a, 1u32);
        arb.push(a, 2);
        arb.schedule(a);
        let mut seen = Vec::new();
        arb.dispatch_with(1, |arb, g, e| {
            seen.push(*e);
            if g == a {
                arb.push(b, *e * 10);
                arb.schedule(b);
                assert_eq!(arb.dispatch(1, |_, _| Remove), 0, "nested dispatch is a no-op");
            }
            Remove
        });
        assert_eq!(seen, vec![1, 10, 2, 20]);
        assert!(arb.is_empty());
    }

    #[test]
    fn destroy_and_stale_handles() {
        let mut arb = Arbiter::new();
        let a = arb.group_new();
        arb.push(a, 'x');
        arb.push(a, 'y');
        arb.schedule(a);
        let left = arb.group_destroy(a);
        assert_eq!(left, ['x', 'y']);
        assert!(arb.is_empty() && !arb.contains(a));
        let b = arb.group_new();
        assert_ne!(a, b, "slot reuse gets a new generation");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arb.push(a, 'z')));
        assert!(r.is_err());
        // destroying its own group from the callback drops the kept element safely
        arb.push(b, 'q');
        arb.schedule(b);
        arb.dispatch_with(1, |arb, g, _| {
            arb.group_destroy(g);
            NextGroup
        });
        assert!(arb.is_empty());
    }
}
