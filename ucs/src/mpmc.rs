//! Multi-producer multi-consumer queue (UCX `ucs_mpmc_queue`).
//!
//! UCX's queue started as a bounded ring that failed with `UCS_ERR_EXCEEDS_LIMIT` when full and was
//! later made unbounded because a fixed capacity turned into fatal errors under load. This one is
//! unbounded from the start: a lock-free segmented queue (`crossbeam_queue::SegQueue`), so `push`
//! never fails and never blocks. It allocates one segment per 31 elements, not one per element.

use crossbeam_queue::SegQueue;
use std::fmt;

/// An unbounded, lock-free FIFO queue that any number of threads may push to and pull from.
pub struct MpmcQueue<T> {
    queue: SegQueue<T>,
}

impl<T> MpmcQueue<T> {
    /// Creates an empty queue.
    pub const fn new() -> Self {
        Self {
            queue: SegQueue::new(),
        }
    }

    /// Appends `value` at the tail.
    pub fn push(&self, value: T) {
        self.queue.push(value);
    }

    /// Removes the element at the head, or returns `None` if the queue is empty.
    pub fn pull(&self) -> Option<T> {
        self.queue.pop()
    }

    /// Whether the queue looks empty. With concurrent producers or consumers this is only a hint:
    /// the answer may be stale by the time the caller acts on it.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Number of queued elements (a hint under concurrency, like [`is_empty`](Self::is_empty)).
    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

impl<T> Default for MpmcQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for MpmcQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpmcQueue").field("len", &self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread;

    #[test]
    fn basic_fifo() {
        let q = MpmcQueue::new();
        assert!(q.is_empty());
        assert_eq!(q.pull(), None);
        q.push(124u64);
        q.push(125);
        q.push(126);
        assert!(!q.is_empty());
        assert_eq!(q.len(), 3);
        assert_eq!(q.pull(), Some(124));
        assert_eq!(q.pull(), Some(125));
        assert_eq!(q.pull(), Some(126));
        assert_eq!(q.pull(), None);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }

    /// 4 producers push (producer, seq) pairs; 4 consumers pull. Every producer's sequence must be
    /// seen in increasing order by each consumer, and every element exactly once overall.
    #[test]
    fn multi_threaded() {
        const PRODUCERS: usize = 4;
        const CONSUMERS: usize = 4;
        const PER_PRODUCER: u64 = 20_000;
        let q = Arc::new(MpmcQueue::<(usize, u64)>::new());
        let done = Arc::new(AtomicBool::new(false));
        let pulled = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(vec![vec![0u32; PER_PRODUCER as usize]; PRODUCERS]));

        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let (q, done, pulled, seen) = (q.clone(), done.clone(), pulled.clone(), seen.clone());
                thread::spawn(move || {
                    let mut last = [None::<u64>; PRODUCERS];
                    let mut mine = Vec::new();
                    loop {
                        match q.pull() {
                            Some((p, seq)) => {
                                if let Some(prev) = last[p] {
                                    assert!(seq > prev, "producer {p}: {seq} after {prev}");
                                }
                                last[p] = Some(seq);
                                mine.push((p, seq));
                                pulled.fetch_add(1, Ordering::Relaxed);
                            }
                            None if done.load(Ordering::Acquire) && q.is_empty() => break,
                            None => thread::yield_now(),
                        }
                    }
                    let mut seen = seen.lock().unwrap();
                    for (p, seq) in mine {
                        seen[p][seq as usize] += 1;
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || (0..PER_PRODUCER).for_each(|seq| q.push((p, seq))))
            })
            .collect();
        producers.into_iter().for_each(|t| t.join().unwrap());
        done.store(true, Ordering::Release);
        consumers.into_iter().for_each(|t| t.join().unwrap());

        assert_eq!(pulled.load(Ordering::Relaxed), PRODUCERS * PER_PRODUCER as usize);
        assert!(q.is_empty());
        let seen = seen.lock().unwrap();
        assert!(
            seen.iter().flatten().all(|&n| n == 1),
            "an element was lost or duplicated"
        );
    }
}
