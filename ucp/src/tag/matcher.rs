//! The tag-matching engine, free of I/O: posted receives (expected) and arrived messages
//! nobody asked for yet (unexpected), with MPI's rules.
//!
//! - A message matches a receive when `(msg_tag ^ recv_tag) & mask == 0`.
//! - An arriving message takes the oldest posted receive that matches, whether it was posted
//!   with a full mask (kept in a table by tag) or a partial one (kept in one FIFO).
//! - A posted receive takes the oldest unexpected message that matches (full mask: that tag's
//!   FIFO; otherwise a scan of all unexpected messages, oldest first).
//!
//! Messages are matched in the order they arrive; the transports deliver one endpoint's
//! messages in the order they were sent, so a receive never overtakes.

use std::collections::{BTreeMap, VecDeque};

use ucs::hash::FastMap;

/// Per-tag queues kept while empty, at most (beyond, and when most are empty, they go).
const MAX_IDLE_BUCKETS: usize = 1024;

/// A mask that compares every bit.
pub const FULL_MASK: u64 = u64::MAX;

/// Whether `tag` matches a receive for `want` under `mask`.
#[inline]
pub fn matches(tag: u64, want: u64, mask: u64) -> bool {
    (tag ^ want) & mask == 0
}

/// Full-mask receives by tag, oldest first: (sn, receive). The tag used last has its queue
/// outside the table (`hot`): a run of receives on one tag (a ping-pong, one peer's stream of
/// messages) is posted and matched without a lookup. A tag's receives are in one place only:
/// in `hot` while it is the hot tag, else in the table.
struct Exact<R> {
    hot_tag: u64,
    hot: VecDeque<(u64, R)>,
    /// Emptied queues stay (a tag used again reuses its buffer), up to a bound.
    by_tag: FastMap<u64, VecDeque<(u64, R)>>,
    /// Receives in `by_tag`.
    in_table: usize,
}

impl<R> Default for Exact<R> {
    fn default() -> Self {
        Exact {
            hot_tag: 0,
            hot: VecDeque::new(),
            by_tag: FastMap::default(),
            in_table: 0,
        }
    }
}

impl<R> Exact<R> {
    fn len(&self) -> usize {
        self.hot.len() + self.in_table
    }

    #[inline(always)]
    fn post(&mut self, tag: u64, sn: u64, r: R) {
        if tag != self.hot_tag
            && self.hot.is_empty()
            && (self.in_table == 0 || self.by_tag.get(&tag).is_none_or(VecDeque::is_empty))
        {
            // No receive waits for the hot tag nor (anywhere) for this one: it becomes hot.
            self.hot_tag = tag;
        }
        if tag == self.hot_tag {
            return self.hot.push_back((sn, r));
        }
        self.by_tag.entry(tag).or_default().push_back((sn, r));
        self.in_table += 1;
    }

    /// The oldest receive for `tag`: its queue.
    #[inline(always)]
    fn queue(&mut self, tag: u64) -> Option<&mut VecDeque<(u64, R)>> {
        if tag == self.hot_tag {
            return Some(&mut self.hot);
        }
        if self.in_table == 0 {
            return None;
        }
        self.by_tag.get_mut(&tag)
    }

    /// The age of the oldest receive for `tag`.
    fn front_sn(&mut self, tag: u64) -> Option<u64> {
        self.queue(tag)?.front().map(|(sn, _)| *sn)
    }

    #[inline(always)]
    fn pop(&mut self, tag: u64) -> Option<R> {
        let (_, r) = self.queue(tag)?.pop_front()?;
        self.taken(tag);
        Some(r)
    }

    fn cancel(&mut self, tag: u64, sn: u64) -> Option<R> {
        let q = self.queue(tag)?;
        let i = q.iter().position(|(s, _)| *s == sn)?;
        let (_, r) = q.remove(i)?;
        self.taken(tag);
        Some(r)
    }

    /// A receive for `tag` left its queue (the table's count, if it was there).
    #[inline(always)]
    fn taken(&mut self, tag: u64) {
        if tag != self.hot_tag {
            self.in_table -= 1;
            self.prune();
        }
    }

    /// Emptied per-tag queues stay up to a bound (as the unexpected side's).
    #[inline]
    fn prune(&mut self) {
        if self.by_tag.len() > MAX_IDLE_BUCKETS && self.by_tag.len() > 2 * self.in_table {
            self.by_tag.retain(|_, q| !q.is_empty());
        }
    }

    fn drain(&mut self) -> impl Iterator<Item = (u64, R)> + '_ {
        self.in_table = 0;
        self.hot.drain(..).chain(self.by_tag.drain().flat_map(|(_, q)| q))
    }
}

/// Expected receives of type `R` and unexpected messages of type `U`.
pub struct Matcher<R, U> {
    /// Stamps receives (age, across both queues) and unexpected messages (age).
    next_sn: u64,
    /// Full-mask receives.
    exact: Exact<R>,
    /// Receives with a partial mask, oldest first: (sn, tag, mask, receive).
    exp_wild: VecDeque<(u64, u64, u64, R)>,
    /// Unexpected messages, oldest first (by sn): (tag, message).
    unexp: BTreeMap<u64, (u64, U)>,
    /// Unexpected sns by tag, oldest first (entries may be stale: taken by a wildcard).
    unexp_by_tag: FastMap<u64, VecDeque<u64>>,
}

impl<R, U> Default for Matcher<R, U> {
    fn default() -> Self {
        Matcher {
            next_sn: 0,
            exact: Exact::default(),
            exp_wild: VecDeque::new(),
            unexp: BTreeMap::new(),
            unexp_by_tag: FastMap::default(),
        }
    }
}

/// Identifies a posted receive, for [`Matcher::cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvId {
    sn: u64,
    tag: u64,
    mask: u64,
}

impl<R, U> Matcher<R, U> {
    fn sn(&mut self) -> u64 {
        self.next_sn += 1;
        self.next_sn
    }

    /// Takes the oldest unexpected message matching `(tag, mask)`, if any.
    pub fn take_unexpected(&mut self, tag: u64, mask: u64) -> Option<(u64, U)> {
        let sn = self.find_unexpected(tag, mask)?;
        let (t, u) = self.unexp.remove(&sn).expect("found above");
        self.unlink_by_tag(t, sn);
        Some((t, u))
    }

    /// The oldest unexpected message matching `(tag, mask)`, without taking it.
    pub fn peek_unexpected(&mut self, tag: u64, mask: u64) -> Option<(u64, &U)> {
        let sn = self.find_unexpected(tag, mask)?;
        self.unexp.get(&sn).map(|(t, u)| (*t, u))
    }

    fn find_unexpected(&mut self, tag: u64, mask: u64) -> Option<u64> {
        if mask == FULL_MASK {
            let q = self.unexp_by_tag.get_mut(&tag)?;
            // Drop stale sns (taken through a wildcard receive) from the front.
            while let Some(&sn) = q.front() {
                if self.unexp.contains_key(&sn) {
                    return Some(sn);
                }
                q.pop_front();
            }
            return None;
        }
        self.unexp
            .iter()
            .find(|(_, (t, _))| matches(*t, tag, mask))
            .map(|(sn, _)| *sn)
    }

    fn unlink_by_tag(&mut self, tag: u64, sn: u64) {
        if let Some(q) = self.unexp_by_tag.get_mut(&tag) {
            if let Some(i) = q.iter().position(|&s| s == sn) {
                q.remove(i);
            }
        }
        self.prune_buckets();
    }

    /// Empty per-tag queues are kept (a tag used again reuses its buffer) up to a bound.
    fn prune_buckets(&mut self) {
        if self.unexp_by_tag.len() > MAX_IDLE_BUCKETS && self.unexp_by_tag.len() > 2 * self.unexp.len() {
            self.unexp_by_tag.retain(|_, q| !q.is_empty());
        }
    }

    /// Posts receive `r` for `(tag, mask)` (after [`Matcher::take_unexpected`] found nothing).
    #[inline(always)]
    pub fn post(&mut self, tag: u64, mask: u64, r: R) -> RecvId {
        let sn = self.sn();
        if mask == FULL_MASK {
            self.exact.post(tag, sn, r);
        } else {
            self.exp_wild.push_back((sn, tag, mask, r));
        }
        RecvId { sn, tag, mask }
    }

    /// Removes a posted receive that has not matched; `None` when it is gone (matched).
    pub fn cancel(&mut self, id: RecvId) -> Option<R> {
        if id.mask == FULL_MASK {
            self.exact.cancel(id.tag, id.sn)
        } else {
            let i = self.exp_wild.iter().position(|(sn, ..)| *sn == id.sn)?;
            self.exp_wild.remove(i).map(|(.., r)| r)
        }
    }

    /// A message with `tag` arrived: the oldest posted receive it matches, taken.
    #[inline(always)]
    pub fn take_expected(&mut self, tag: u64) -> Option<R> {
        if self.exp_wild.is_empty() {
            // The usual case: full-mask receives only.
            return self.exact.pop(tag);
        }
        let wild = self.exp_wild.iter().position(|(_, t, m, _)| matches(tag, *t, *m));
        match (self.exact.front_sn(tag), wild) {
            (None, None) => None,
            (Some(e), Some(w)) if self.exp_wild[w].0 < e => self.exp_wild.remove(w).map(|(.., r)| r),
            (Some(_), _) => self.exact.pop(tag),
            (None, Some(w)) => self.exp_wild.remove(w).map(|(.., r)| r),
        }
    }

    /// Files a message nobody was waiting for.
    pub fn push_unexpected(&mut self, tag: u64, u: U) {
        let sn = self.sn();
        self.unexp.insert(sn, (tag, u));
        self.unexp_by_tag.entry(tag).or_default().push_back(sn);
    }

    /// Keeps only the unexpected messages `keep` says yes to (their per-tag entries go
    /// lazily, as those of messages a wildcard receive took).
    pub fn retain_unexpected(&mut self, mut keep: impl FnMut(&U) -> bool) {
        self.unexp.retain(|_, (_, u)| keep(u));
    }

    /// Unexpected messages waiting.
    pub fn unexpected_len(&self) -> usize {
        self.unexp.len()
    }

    /// Posted receives waiting.
    pub fn expected_len(&self) -> usize {
        self.exact.len() + self.exp_wild.len()
    }

    /// Takes every unexpected message (worker teardown), oldest first.
    pub fn drain_unexpected(&mut self) -> Vec<(u64, U)> {
        self.unexp_by_tag.clear();
        std::mem::take(&mut self.unexp).into_values().collect()
    }

    /// Takes every posted receive (worker teardown).
    pub fn drain_expected(&mut self) -> Vec<R> {
        let mut v: Vec<(u64, R)> = self.exact.drain().collect();
        v.extend(self.exp_wild.drain(..).map(|(sn, _, _, r)| (sn, r)));
        v.sort_by_key(|(sn, _)| *sn);
        v.into_iter().map(|(_, r)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type M = Matcher<&'static str, u32>;

    /// Emptied per-tag receive queues are kept for reuse, but not without bound.
    #[test]
    fn idle_receive_buckets_stay_bounded() {
        let mut m = M::default();
        for tag in 0..10 * MAX_IDLE_BUCKETS as u64 {
            m.post(tag, FULL_MASK, "r");
            assert_eq!(m.take_expected(tag), Some("r"));
        }
        assert!(
            m.exact.by_tag.len() <= MAX_IDLE_BUCKETS + 1,
            "{} buckets",
            m.exact.by_tag.len()
        );
        assert_eq!(m.expected_len(), 0);
        // a reused tag still matches, and cancel of a matched receive finds nothing
        let id = m.post(3, FULL_MASK, "again");
        assert_eq!(m.expected_len(), 1);
        assert_eq!(m.take_expected(3), Some("again"));
        assert_eq!(m.cancel(id), None);
        assert_eq!(m.take_expected(3), None);
    }

    #[test]
    fn oldest_receive_wins_across_exact_and_wildcard() {
        let mut m = M::default();
        m.post(5, FULL_MASK, "exact-1");
        m.post(0, 0, "any");
        m.post(5, FULL_MASK, "exact-2");
        assert_eq!(m.take_expected(5), Some("exact-1"));
        assert_eq!(m.take_expected(5), Some("any"));
        assert_eq!(m.take_expected(5), Some("exact-2"));
        assert_eq!(m.take_expected(5), None);
        // a wildcard posted first wins over a later exact one
        m.post(0x100, 0xf00, "wild");
        m.post(0x123, FULL_MASK, "exact");
        assert_eq!(m.take_expected(0x123), Some("wild"));
        assert_eq!(m.take_expected(0x123), Some("exact"));
        assert_eq!(m.expected_len(), 0);
    }

    #[test]
    fn masks_select_bits() {
        let mut m = M::default();
        m.post(0xab00, 0xff00, "high byte ab");
        assert_eq!(m.take_expected(0xac00), None);
        assert_eq!(m.take_expected(0xab7f), Some("high byte ab"));
    }

    #[test]
    fn unexpected_oldest_first_exact_and_wildcard() {
        let mut m = M::default();
        m.push_unexpected(1, 10);
        m.push_unexpected(2, 20);
        m.push_unexpected(1, 11);
        // wildcard takes the oldest of all
        assert_eq!(m.take_unexpected(0, 0), Some((1, 10)));
        // exact skips the one the wildcard took
        assert_eq!(m.take_unexpected(1, FULL_MASK), Some((1, 11)));
        assert_eq!(m.peek_unexpected(0, 0), Some((2, &20)));
        assert_eq!(m.take_unexpected(2, FULL_MASK), Some((2, 20)));
        assert_eq!(m.take_unexpected(0, 0), None);
        assert!(m.unexp_by_tag.values().all(VecDeque::is_empty));
    }

    #[test]
    fn idle_tag_queues_are_bounded() {
        let mut m = M::default();
        for t in 0..5000u64 {
            m.push_unexpected(t, 1);
            assert_eq!(m.take_unexpected(t, FULL_MASK), Some((t, 1)));
        }
        assert!(
            m.unexp_by_tag.len() <= MAX_IDLE_BUCKETS + 1,
            "{}",
            m.unexp_by_tag.len()
        );
    }

    #[test]
    fn cancel_only_unmatched() {
        let mut m = M::default();
        let a = m.post(7, FULL_MASK, "a");
        let b = m.post(7, 0xf, "b");
        assert_eq!(m.cancel(a), Some("a"));
        assert_eq!(m.cancel(a), None);
        assert_eq!(m.take_expected(7), Some("b"));
        assert_eq!(m.cancel(b), None);
    }

    #[test]
    fn hundred_thousand_unexpected() {
        let mut m: Matcher<(), u32> = Matcher::default();
        for i in 0..100_000u32 {
            m.push_unexpected(u64::from(i % 1000), i);
        }
        assert_eq!(m.unexpected_len(), 100_000);
        // by tag: each tag's messages in arrival order
        for i in 0..100u32 {
            assert_eq!(m.take_unexpected(7, FULL_MASK), Some((7, 7 + 1000 * i)));
        }
        // wildcard on the low bit: the oldest odd tag
        assert_eq!(m.take_unexpected(1, 1), Some((1, 1)));
        let mut n = 0;
        while let Some((t, v)) = m.take_unexpected(0, 0) {
            assert_eq!(t, u64::from(v % 1000));
            n += 1;
        }
        assert_eq!(n, 100_000 - 101);
    }

    /// Against a plain list of receives, oldest first: the same receive matches, over a long
    /// pseudo-random mix of posts (a few tags, some wildcard), arrivals and cancels, so that
    /// the hot tag changes with receives of other tags waiting in the table.
    #[test]
    fn same_matches_as_a_plain_list() {
        let mut m: Matcher<u32, ()> = Matcher::default();
        let mut model: Vec<(u64, u64, u32)> = Vec::new(); // (tag, mask, id), oldest first
        let mut ids: Vec<(RecvId, u32)> = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for id in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let tag = x % 4;
            match (x >> 8) % 8 {
                0..=2 => {
                    let mask = if (x >> 16) & 7 == 0 { 0b10 } else { FULL_MASK };
                    ids.push((m.post(tag, mask, id), id));
                    model.push((tag, mask, id));
                }
                3..=5 => {
                    let want = model
                        .iter()
                        .position(|&(t, k, _)| matches(tag, t, k))
                        .map(|i| model.remove(i).2);
                    assert_eq!(m.take_expected(tag), want, "arrival of tag {tag}");
                }
                _ if !ids.is_empty() => {
                    let (rid, rv) = ids.swap_remove((x >> 24) as usize % ids.len());
                    let want = model
                        .iter()
                        .position(|&(.., v)| v == rv)
                        .map(|i| model.remove(i).2);
                    assert_eq!(m.cancel(rid), want);
                }
                _ => {}
            }
            assert_eq!(m.expected_len(), model.len());
        }
    }

    #[test]
    fn drain_in_order() {
        let mut m = M::default();
        m.post(1, FULL_MASK, "x");
        m.post(1, 0, "y");
        m.post(2, FULL_MASK, "z");
        assert_eq!(m.drain_expected(), vec!["x", "y", "z"]);
        m.push_unexpected(3, 1);
        m.push_unexpected(4, 2);
        assert_eq!(m.drain_unexpected(), vec![(3, 1), (4, 2)]);
    }
}
