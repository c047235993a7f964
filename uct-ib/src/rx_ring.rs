//! The receive ring of a verbs interface: buffers from a memory pool posted to a receive
//! queue (an SRQ, or a UD QP) in batches through a reusable WR chain, found again by `wr_id`,
//! and kept in post order so the next one to complete can be warmed while waiting. With
//! [`RxHeads`] every receive has two SGEs, its head slot and the rest of its buffer; a message
//! that fits the slot leaves the buffer untouched, and the buffer is posted again as it is.

use std::cell::{Cell, RefCell};

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Result, Status};

use crate::iface_common::buf_sge;
use crate::verbs::{touch_posted, HeadCopy, RecvChain, RecvPostError, RxHeads, MAX_RECV_BATCH, RX_DESC_HDR};

/// The buffers of an [`RxRing`] by wr_id (the slot index; a slot whose message fit its head
/// keeps its buffer for the next post), the unused wr_ids, and the posted ones in the order
/// they were posted (a receive queue completes in that order).
struct RxSlots {
    bufs: Vec<Option<PoolBuf>>,
    free: Vec<u32>,
    order: PostOrder,
}

/// A completed receive taken off the ring.
pub enum Received {
    /// The message fit its head slot: a copy of it (the buffer stayed in the ring).
    Head(HeadCopy),
    /// The message in its buffer, from the SGE offset on (with heads: the slot's bytes copied
    /// in front of the rest, so it is contiguous).
    Buf(PoolBuf),
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

    /// `id` completed; `false` when it is not posted.
    #[inline]
    fn remove(&mut self, id: u32) -> bool {
        if self.len == 0 {
            return false;
        }
        if self.ids[self.head] != id {
            let Some(i) = (1..self.len).find(|&i| self.ids[self.at(i)] == id) else {
                return false;
            };
            // out of order (rare): the older ones move up one place, keeping their order
            for j in (1..=i).rev() {
                let (to, from) = (self.at(j), self.at(j - 1));
                self.ids[to] = self.ids[from];
            }
        }
        self.head = self.at(1);
        self.len -= 1;
        true
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
    /// Head slots (the first SGE of every receive), if used.
    heads: Option<RxHeads>,
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
            heads: None,
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

    /// Gives every receive a head slot of `heads` as its first SGE (before the first refill):
    /// `heads` must have a slot per receive, smaller than the receive.
    pub fn with_heads(mut self, heads: RxHeads) -> Result<RxRing> {
        if heads.count() < self.capacity as usize || heads.size() >= self.sge_len || self.posted.get() > 0 {
            tracing::error!(
                slots = heads.count(),
                size = heads.size(),
                capacity = self.capacity,
                sge_len = self.sge_len,
                "ib: receive heads do not fit the ring"
            );
            return Err(Status::InvalidParam);
        }
        self.chain = RefCell::new(RecvChain::with_sges(self.batch, 2));
        self.heads = Some(heads);
        Ok(self)
    }

    /// Bytes of the head slots (0 without).
    pub fn head_size(&self) -> usize {
        self.heads.as_ref().map_or(0, RxHeads::size)
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
                    let Some(id) = slots.free.pop() else { break };
                    let buf = match slots.bufs[id as usize].take() {
                        Some(b) => b,
                        None => match self.pool.get() {
                            Ok(b) => b,
                            Err(_) => {
                                slots.free.push(id);
                                break;
                            }
                        },
                    };
                    match &self.heads {
                        None => chain.push(id as u64, buf_sge(&buf, self.sge_off, self.sge_len)),
                        Some(h) => chain.push2(
                            id as u64,
                            h.sge(id),
                            buf_sge(&buf, self.sge_off + h.size(), self.sge_len - h.size()),
                        ),
                    };
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

    /// Takes a completed receive of `len` bytes (`None` for a failed one) off the ring
    /// (`None` for an unknown `wr_id`). Without heads, or for a failed receive, always
    /// [`Received::Buf`].
    #[inline]
    pub fn take(&self, wr_id: u64, len: Option<usize>) -> Option<Received> {
        let mut slots = self.slots.borrow_mut();
        let id = u32::try_from(wr_id).ok()?;
        if !slots.order.remove(id) {
            return None;
        }
        // (a posted id always has a buffer and a head slot: the `None`s below cannot happen)
        let got = match (&self.heads, len) {
            // the buffer stays in its slot for the next post
            (Some(h), Some(len)) if len <= h.size() => h.copy(id, len).map(Received::Head),
            (Some(h), Some(_)) => slots.bufs[id as usize].take().map(|mut buf| {
                let at = self.sge_off;
                h.copy_into(id, &mut buf[at..]);
                Received::Buf(buf)
            }),
            _ => slots.bufs[id as usize].take().map(Received::Buf),
        };
        // never grows: at most `capacity` ids, and the vector was created with all of them
        slots.free.push(id);
        drop(slots);
        self.posted.set(self.posted.get() - 1);
        self.warm.set(false);
        got
    }

    /// Takes the buffer of a completed receive (`None` for an unknown `wr_id`); for rings
    /// without heads.
    #[inline]
    pub fn take_buf(&self, wr_id: u64) -> Option<PoolBuf> {
        match self.take(wr_id, None)? {
            Received::Buf(b) => Some(b),
            Received::Head(_) => None,
        }
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
        let Some(id) = slots.order.oldest() else { return };
        if let Some(h) = &self.heads {
            h.touch(id);
        } else if let Some(buf) = slots.bufs[id as usize].as_ref() {
            touch_posted(buf, self.sge_off);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iface_common::BUF_DATA_OFFSET;
    use crate::verbs::RX_HEAD;
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
        let buf = ring.take_buf(first).unwrap();
        assert!(ring.take_buf(first).is_none(), "a wr_id completes once");
        assert!(ring.take_buf(999).is_none());
        drop(buf);
        for id in batches.borrow()[1].clone() {
            ring.take_buf(id).unwrap();
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
            assert!(ring.take_buf(*id).is_some(), "a posted request keeps its buffer");
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
        assert!(!o.remove(7), "nothing posted");
        for id in [10, 11, 12, 13, 14] {
            o.push(id); // 14 does not fit
        }
        assert_eq!(o.oldest(), Some(10));
        o.remove(10);
        assert_eq!(o.oldest(), Some(11));
        o.remove(13); // out of order: 11 and 12 stay first, in order
        assert_eq!(o.oldest(), Some(11));
        assert!(!o.remove(99), "unknown");
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
        drop(ring.take_buf(first).unwrap());
        assert!(!ring.warm.get(), "a completion makes the next buffer cold again");
        assert_eq!(
            ring.slots.borrow().order.oldest(),
            Some(posted.borrow()[1] as u32)
        );
        ring.touch_next();
        assert!(ring.warm.get());
    }

    fn heads(count: usize) -> RxHeads {
        let mut p = MemPoolParams::new("rx-heads-test", count * RX_HEAD);
        p.alignment = 64;
        p.max_elems = 1;
        p.allocator = Some(Box::new(HeapAllocator));
        RxHeads::new(MemPool::new(p).unwrap(), count).unwrap()
    }

    /// Writes `msg` where a device would: the head slot, then the rest of the buffer.
    #[allow(unsafe_code)] // plays the device: writes through the posted SGEs' addresses
    fn land(ring: &RxRing, id: u64, msg: &[u8]) {
        let h = ring.heads.as_ref().unwrap();
        let n = msg.len().min(RX_HEAD);
        // SAFETY: test memory: the slot's SGE covers RX_HEAD bytes of the heads array.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), h.sge(id as u32).addr() as *mut u8, n) };
        if msg.len() > RX_HEAD {
            let slots = ring.slots.borrow();
            let buf = slots.bufs[id as usize].as_ref().unwrap();
            let at = buf.as_ptr() as usize + BUF_DATA_OFFSET + RX_HEAD;
            // SAFETY: inside the posted buffer's second SGE (128 - 64 bytes).
            unsafe {
                std::ptr::copy_nonoverlapping(msg[RX_HEAD..].as_ptr(), at as *mut u8, msg.len() - RX_HEAD)
            };
        }
    }

    /// With heads, each receive is two SGEs; a message that fits its slot comes back as a
    /// copy and leaves its buffer in the ring for the next post, a longer one comes back in
    /// its buffer, contiguous.
    #[test]
    fn heads_take_small_messages_out_of_the_slot() {
        let ring = RxRing::new(heap_pool(8), 4, 4, BUF_DATA_OFFSET, 128)
            .unwrap()
            .with_heads(heads(4))
            .unwrap();
        assert_eq!(ring.head_size(), RX_HEAD);
        let posts = RefCell::new(Vec::new());
        let record = |chain: &mut RecvChain| {
            assert_eq!(chain.sges_per_wr(), 2);
            posts.borrow_mut().extend((0..chain.len()).map(|i| {
                let (h, rest) = (chain.sge_at(i, 0), chain.sge_at(i, 1));
                assert_eq!(
                    (h.length(), rest.length()),
                    (RX_HEAD as u32, 128 - RX_HEAD as u32)
                );
                (chain.wr_id(i), h.addr(), rest.addr())
            }));
            Ok(())
        };
        assert_eq!(ring.refill(record).unwrap(), 4);
        let first = posts.borrow().clone();
        let slot0 = heads_base(&first);
        for &(id, h, _) in &first {
            assert_eq!(h, slot0 + id * RX_HEAD as u64, "slot by wr_id");
        }
        let (small_id, _, small_rest) = first[0];
        land(&ring, small_id, b"hello");
        match ring.take(small_id, Some(5)) {
            Some(Received::Head(c)) => assert_eq!(c.bytes(), b"hello"),
            _ => panic!("a 5-byte message comes from its slot"),
        }
        assert!(ring.take(small_id, Some(5)).is_none(), "completes once");
        let long: Vec<u8> = (0..100u8).collect();
        let (long_id, _, _) = first[1];
        land(&ring, long_id, &long);
        match ring.take(long_id, Some(long.len())) {
            Some(Received::Buf(buf)) => assert_eq!(&buf[BUF_DATA_OFFSET..BUF_DATA_OFFSET + 100], &long[..]),
            _ => panic!("a 100-byte message comes in its buffer"),
        }
        // a failed receive gives its buffer back as it is
        assert!(matches!(ring.take(first[2].0, None), Some(Received::Buf(_))));
        assert_eq!(ring.posted(), 1);
        posts.borrow_mut().clear();
        assert_eq!(ring.refill(record).unwrap(), 3);
        let again = posts.borrow().clone();
        let reposted = again
            .iter()
            .find(|e| e.0 == small_id)
            .expect("the slot is posted again");
        assert_eq!(reposted.2, small_rest, "with the buffer it kept");
        assert!(
            RxRing::new(heap_pool(8), 8, 4, BUF_DATA_OFFSET, 128)
                .unwrap()
                .with_heads(heads(4))
                .is_err(),
            "a slot per receive"
        );
    }

    fn heads_base(posts: &[(u64, u64, u64)]) -> u64 {
        posts
            .iter()
            .map(|&(id, h, _)| h - id * RX_HEAD as u64)
            .min()
            .unwrap()
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
