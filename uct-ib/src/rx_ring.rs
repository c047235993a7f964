//! The receive ring of a verbs interface: buffers from a memory pool posted to a receive
//! queue (an SRQ, or a UD QP) in batches through a reusable WR chain, found again by `wr_id`,
//! and kept in post order so the next one to complete can be warmed while waiting.

use std::cell::{Cell, RefCell};

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Result, Status};

use crate::iface_common::buf_sge;
use crate::verbs::{touch_posted, RecvChain, RecvPostError, MAX_RECV_BATCH, RX_DESC_HDR};

/// The posted buffers of an [`RxRing`] by wr_id (the slot index), the unused wr_ids, and the
/// posted ones in the order they were posted (a receive queue completes in that order).
struct RxSlots {
    bufs: Vec<Option<PoolBuf>>,
    free: Vec<u32>,
    order: PostOrder,
}

/// The wr_ids posted and not yet completed, oldest first: a ring as long as the receive ring.
/// A completion normally takes the oldest; one out of order is taken out where it is.
struct PostOrder {
    ids: Vec<u32>,
    head: usize,
    len: usize,
}

impl PostOrder {
    fn new(capacity: usize) -> PostOrder {
        PostOrder {
            ids: vec![0; capacity.max(1)],
            head: 0,
            len: 0,
        }
    }

    #[inline]
    fn at(&self, i: usize) -> usize {
        let p = self.head + i;
        if p >= self.ids.len() {
            p - self.ids.len()
        } else {
            p
        }
    }

    /// The oldest posted id.
    #[inline]
    fn oldest(&self) -> Option<u32> {
        (self.len > 0).then(|| self.ids[self.head])
    }

    /// `id` was posted (the ring never holds more ids than it has slots).
    #[inline]
    fn push(&mut self, id: u32) {
        if self.len < self.ids.len() {
            let p = self.at(self.len);
            self.ids[p] = id;
            self.len += 1;
        }
    }

    /// `id` completed.
    #[inline]
    fn remove(&mut self, id: u32) {
        if self.len == 0 {
            return;
        }
        if self.ids[self.head] != id {
            let Some(i) = (1..self.len).find(|&i| self.ids[self.at(i)] == id) else {
                return;
            };
            // out of order (rare): the older ones move up one place, keeping their order
            for j in (1..=i).rev() {
                let (to, from) = (self.at(j), self.at(j - 1));
                self.ids[to] = self.ids[from];
            }
        }
        self.head = self.at(1);
        self.len -= 1;
    }
}

/// Receive buffers posted to a receive queue (an SRQ, or a UD QP), found again by `wr_id`.
pub struct RxRing {
    /// Posted buffers by wr_id and the free wr_ids, behind one borrow (a receive takes a
    /// buffer and frees its id together). Declared before `pool` so the buffers are returned
    /// to it before it is dropped (no leak report at close).
    slots: RefCell<RxSlots>,
    /// The receive WRs a refill fills and posts, `batch` of them, linked once.
    chain: RefCell<RecvChain>,
    pool: MemPool,
    posted: Cell<u32>,
    /// The next buffer to complete has been touched since the last completion.
    warm: Cell<bool>,
    capacity: u32,
    batch: usize,
    /// Where the receive SGE starts in a buffer, and its length.
    sge_off: usize,
    sge_len: usize,
}

impl RxRing {
    /// A ring of `capacity` receives from `pool`, each covering `sge_len` bytes at `sge_off`
    /// of a buffer, reposted `batch` at a time.
    pub fn new(pool: MemPool, capacity: u32, batch: usize, sge_off: usize, sge_len: usize) -> Result<RxRing> {
        if sge_off < RX_DESC_HDR || sge_off + sge_len > pool.elem_size() {
            tracing::error!(
                sge_off,
                sge_len,
                elem = pool.elem_size(),
                "ib: receive SGE outside the buffer"
            );
            return Err(Status::InvalidParam);
        }
        let batch = batch.clamp(1, MAX_RECV_BATCH);
        Ok(RxRing {
            chain: RefCell::new(RecvChain::new(batch)),
            pool,
            slots: RefCell::new(RxSlots {
                bufs: (0..capacity).map(|_| None).collect(),
                free: (0..capacity).rev().collect(),
                order: PostOrder::new(capacity as usize),
            }),
            posted: Cell::new(0),
            warm: Cell::new(false),
            capacity,
            batch,
            sge_off,
            sge_len,
        })
    }

    /// Receives currently posted.
    pub fn posted(&self) -> u32 {
        self.posted.get()
    }

    /// True when at least a batch of receives can be posted.
    #[inline]
    pub fn needs_refill(&self) -> bool {
        (self.capacity - self.posted.get()) as usize >= self.batch
    }

    /// Posts receives in batches through `post` (an SRQ's or QP's `post_*chain`) until the
    /// ring is full (or the pool is empty); returns how many were posted. When a batch fails
    /// part way, the requests the provider took count as posted and keep their buffers; the
    /// others go back to the pool.
    pub fn refill(
        &self,
        post: impl Fn(&mut RecvChain) -> std::result::Result<(), RecvPostError>,
    ) -> Result<u32> {
        let mut total = 0;
        let mut chain = self.chain.borrow_mut();
        loop {
            let room = (self.capacity - self.posted.get()) as usize;
            let n = room.min(self.batch);
            if n == 0 {
                return Ok(total);
            }
            chain.clear();
            {
                let mut slots = self.slots.borrow_mut();
                while chain.len() < n {
                    let Ok(buf) = self.pool.get() else { break };
                    let Some(id) = slots.free.pop() else { break };
                    chain.push(id as u64, buf_sge(&buf, self.sge_off, self.sge_len));
                    slots.bufs[id as usize] = Some(buf);
                    slots.order.push(id);
                }
            }
            let got = chain.len();
            if got == 0 {
                return Ok(total);
            }
            if let Err(e) = post(&mut chain) {
                let posted = e.posted.min(got);
                self.posted.set(self.posted.get() + posted as u32);
                let mut slots = self.slots.borrow_mut();
                for i in posted..got {
                    let id = chain.wr_id(i) as u32;
                    slots.bufs[id as usize] = None;
                    slots.free.push(id);
                    slots.order.remove(id);
                }
                return Err(e.status);
            }
            self.posted.set(self.posted.get() + got as u32);
            total += got as u32;
            if got < n {
                return Ok(total);
            }
        }
    }

    /// Takes the buffer of a completed receive (`None` for an unknown `wr_id`).
    #[inline]
    pub fn take(&self, wr_id: u64) -> Option<PoolBuf> {
        let mut slots = self.slots.borrow_mut();
        let buf = slots.bufs.get_mut(wr_id as usize)?.take()?;
        // never grows: at most `capacity` ids, and the vector was created with all of them
        slots.free.push(wr_id as u32);
        slots.order.remove(wr_id as u32);
        drop(slots);
        self.posted.set(self.posted.get() - 1);
        self.warm.set(false);
        Some(buf)
    }

    /// With nothing received: reads a byte of the buffer the next completion will most likely
    /// carry (the oldest posted), once per completion, so that its first read when it arrives
    /// does not wait for the CPU's page translation ([`touch_posted`]).
    #[inline]
    pub fn touch_next(&self) {
        if self.warm.replace(true) {
            return;
        }
        let slots = self.slots.borrow();
        if let Some(buf) = slots
            .order
            .oldest()
            .and_then(|id| slots.bufs[id as usize].as_ref())
        {
            touch_posted(buf, self.sge_off);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iface_common::BUF_DATA_OFFSET;
    use ucs::mpool::{HeapAllocator, MemPoolParams};
    use ucs::Status;

    fn heap_pool(n: usize) -> MemPool {
        let mut p = MemPoolParams::new("rx-test", BUF_DATA_OFFSET + 128);
        p.alignment = 64;
        p.max_elems = n;
        p.allocator = Some(Box::new(HeapAllocator));
        MemPool::new(p).unwrap()
    }

    #[test]
    fn ring_refills_in_batches_and_finds_buffers_by_wr_id() {
        let ring = RxRing::new(heap_pool(100), 10, 4, BUF_DATA_OFFSET, 128).unwrap();
        let batches = RefCell::new(Vec::new());
        let n = ring
            .refill(|chain| {
                batches
                    .borrow_mut()
                    .push((0..chain.len()).map(|i| chain.wr_id(i)).collect::<Vec<_>>());
                assert_eq!(chain.capacity(), 4, "one batch per post");
                assert!((0..chain.len()).all(|i| chain.sge(i).length() == 128));
                Ok(())
            })
            .unwrap();
        assert_eq!(n, 10);
        assert_eq!(
            batches.borrow().iter().map(|b| b.len()).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        assert!(!ring.needs_refill());
        let first = batches.borrow()[0][0];
        let buf = ring.take(first).unwrap();
        assert!(ring.take(first).is_none(), "a wr_id completes once");
        assert!(ring.take(999).is_none());
        drop(buf);
        for id in batches.borrow()[1].clone() {
            ring.take(id).unwrap();
        }
        assert_eq!(ring.posted(), 5);
        assert!(ring.needs_refill());
        // a post that fails at once counts nothing and returns the buffers
        let fail_at = |posted| {
            move |_: &mut RecvChain| {
                Err(RecvPostError {
                    posted,
                    status: Status::NoResource,
                })
            }
        };
        assert_eq!(ring.refill(fail_at(0)), Err(Status::NoResource));
        assert_eq!(ring.posted(), 5);
        // one that fails part way counts the requests the provider took
        let taken = RefCell::new(Vec::new());
        let r = ring.refill(|chain| {
            taken.borrow_mut().extend((0..2).map(|i| chain.wr_id(i)));
            fail_at(2)(chain)
        });
        assert_eq!(r, Err(Status::NoResource));
        assert_eq!(ring.posted(), 7);
        for id in taken.borrow().iter() {
            assert!(ring.take(*id).is_some(), "a posted request keeps its buffer");
        }
        assert_eq!(ring.posted(), 5);
        assert_eq!(ring.refill(|_| Ok(())).unwrap(), 5);
        assert_eq!(ring.posted(), 10);
    }

    /// The posted ids come back oldest first; an out-of-order completion leaves the rest in
    /// order, and the ring never holds more than its capacity.
    #[test]
    fn post_order_tracks_the_oldest_posted_id() {
        let mut o = PostOrder::new(4);
        assert_eq!(o.oldest(), None);
        o.remove(7); // nothing posted: ignored
        for id in [10, 11, 12, 13, 14] {
            o.push(id); // 14 does not fit
        }
        assert_eq!(o.oldest(), Some(10));
        o.remove(10);
        assert_eq!(o.oldest(), Some(11));
        o.remove(13); // out of order: 11 and 12 stay first, in order
        assert_eq!(o.oldest(), Some(11));
        o.remove(99); // unknown
        o.push(20); // wraps around
        let mut seen = Vec::new();
        while let Some(id) = o.oldest() {
            seen.push(id);
            o.remove(id);
        }
        assert_eq!(seen, vec![11, 12, 20]);
    }

    /// `touch_next` reads the oldest posted buffer once per completion and copes with an
    /// empty ring.
    #[test]
    fn touch_next_follows_the_post_order() {
        let ring = RxRing::new(heap_pool(8), 4, 4, BUF_DATA_OFFSET, 128).unwrap();
        ring.touch_next(); // nothing posted
        let posted = RefCell::new(Vec::new());
        ring.refill(|chain| {
            posted
                .borrow_mut()
                .extend((0..chain.len()).map(|i| chain.wr_id(i)));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            ring.slots.borrow().order.oldest(),
            Some(posted.borrow()[0] as u32)
        );
        ring.touch_next();
        assert!(ring.warm.get());
        let first = posted.borrow()[0];
        drop(ring.take(first).unwrap());
        assert!(!ring.warm.get(), "a completion makes the next buffer cold again");
        assert_eq!(
            ring.slots.borrow().order.oldest(),
            Some(posted.borrow()[1] as u32)
        );
        ring.touch_next();
        assert!(ring.warm.get());
    }

    #[test]
    fn ring_stops_when_the_pool_is_empty() {
        let ring = RxRing::new(heap_pool(3), 10, 4, BUF_DATA_OFFSET, 128).unwrap();
        assert_eq!(ring.refill(|_| Ok(())).unwrap(), 3);
        assert!(
            RxRing::new(heap_pool(3), 10, 4, 0, 128).is_err(),
            "the SGE must not cover the header"
        );
    }
}
