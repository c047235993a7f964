//! Periodic timer queue: a min-heap of deadlines plus the live timers by id.
//!
//! Removing a timer deletes it from the map only; its heap entry becomes stale and is skipped when
//! it reaches the top, so removal is O(1) and drops the handler (and its closure) at once.

use super::handler::Handler;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    timers: HashMap<u64, (Arc<Handler>, Duration)>,
}

impl TimerQueue {
    /// Adds a timer first due at `now + interval` (the caller checked that it does not overflow).
    /// Returns whether it is now the earliest deadline (a sleeping poller must be woken).
    pub fn add(&mut self, h: Arc<Handler>, interval: Duration, now: Instant) -> bool {
        let deadline = now.checked_add(interval).unwrap_or(now);
        let earliest = self.next_deadline().is_none_or(|d| deadline < d);
        self.heap.push(Reverse((deadline, h.id)));
        self.timers.insert(h.id, (h, interval));
        earliest
    }

    /// Removes a timer; the caller drops the returned handler outside any lock.
    pub fn remove(&mut self, id: u64) -> Option<Arc<Handler>> {
        self.timers.remove(&id).map(|(h, _)| h)
    }

    /// The earliest live deadline (discards stale entries on top).
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, id))) = self.heap.peek() {
            if self.timers.contains_key(&id) {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }

    /// Calls `fire` for every timer due at `now` and schedules its next tick. Ticks missed while
    /// late collapse into one (the handler's pending flag coalesces them anyway), so a stalled
    /// process does not get a burst of ticks.
    pub fn expire(&mut self, now: Instant, mut fire: impl FnMut(&Arc<Handler>)) {
        while let Some(&Reverse((deadline, id))) = self.heap.peek() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            let Some((h, interval)) = self.timers.get(&id) else {
                continue; // removed
            };
            fire(h);
            let next = deadline
                .checked_add(*interval)
                .filter(|next| *next > now)
                .or_else(|| now.checked_add(*interval));
            match next {
                Some(next) => self.heap.push(Reverse((next, id))),
                None => crate::warn!(id, "async: timer deadline overflows; timer stopped"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::handler::{EventSink, Handler, Kind};
    use super::*;

    fn timer(id: u64, sink: &Arc<EventSink>) -> Arc<Handler> {
        Arc::new(Handler::new(id, Kind::Timer, sink.clone(), Box::new(|_| {})))
    }

    #[test]
    fn order_reschedule_and_remove() {
        let sink = Arc::new(EventSink::new().unwrap());
        let mut q = TimerQueue::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert!(q.add(timer(1, &sink), ms(30), t0));
        assert!(q.add(timer(2, &sink), ms(10), t0));
        assert!(!q.add(timer(3, &sink), ms(20), t0));
        assert_eq!(q.next_deadline(), Some(t0 + ms(10)));

        let mut fired = Vec::new();
        q.expire(t0 + ms(20), |h| fired.push(h.id));
        // Timer 2's next tick (20) is not in the future, so it moves to now + 10 and fires once.
        assert_eq!(fired, vec![2, 3]);
        fired.clear();
        // A late poll at 75 fires each timer once, however many ticks were missed.
        q.expire(t0 + ms(75), |h| fired.push(h.id));
        fired.sort_unstable();
        assert_eq!(fired, vec![1, 2, 3]);
        assert_eq!(
            q.next_deadline(),
            Some(t0 + ms(85)),
            "late ticks collapse to now + interval"
        );

        assert!(q.remove(2).is_some());
        assert!(q.remove(2).is_none());
        fired.clear();
        q.expire(t0 + ms(1000), |h| fired.push(h.id));
        fired.sort_unstable();
        assert_eq!(fired, vec![1, 3]);
        q.remove(1);
        q.remove(3);
        assert_eq!(q.next_deadline(), None);
    }
}
