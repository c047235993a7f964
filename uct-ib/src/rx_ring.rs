//! The receive ring of a verbs interface: buffers from a memory pool posted to a receive
//! queue (an SRQ, or a UD QP) in batches through a reusable WR chain, found again by `wr_id`,
//! and kept in post order so the next one to complete can be warmed while waiting. With
//! [`RxHeads`] every receive has two SGEs, its head slot and the rest of its buffer; a message
//! that fits the slot leaves the buffer untouched, and the buffer is posted again as it is.

use std::cell::{Cell, RefCell};

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Error, Result, Status};

use crate::iface_common::buf_sge;
use uct_ib_verbs::{touch_posted, HeadCopy, RecvChain, RecvPostError, RxHeads, MAX_RECV_BATCH, RX_DESC_HDR};

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

    /// `id` completed; `false` when it is not posted. Inline for the common case, the oldest.
    #[inline]
    fn remove(&mut self, id: u32) -> bool {
        if self.len == 0 || self.ids[self.head] != id {
            return self.remove_out_of_order(id);
        }
        self.head = self.at(1);
        self.len -= 1;
        true
    }

    /// [`PostOrder::remove`] of an id that is not the oldest (rare): the older ones move up
    /// one place, keeping their order.
    #[cold]
    #[inline(never)]
    fn remove_out_of_order(&mut self, id: u32) -> bool {
        let Some(i) = (1..self.len).find(|&i| self.ids[self.at(i)] == id) else {
            return false;
        };
        for j in (1..=i).rev() {
            let (to, from) = (self.at(j), self.at(j - 1));
            self.ids[to] = self.ids[from];
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

/// Batches of receives that may be missing before a poll that delivered messages reposts
/// ([`RxRing::needs_refill`]).
const DEFER_BATCHES: usize = 4;

impl RxRing {
    /// A ring of `capacity` receives from `pool`, each covering `sge_len` bytes at `sge_off`
    /// of a buffer, reposted `batch` at a time.
    pub fn new(pool: MemPool, capacity: u32, batch: usize, sge_off: usize, sge_len: usize) -> Result<RxRing> {
        if sge_off < RX_DESC_HDR || sge_off + sge_len > pool.elem_size() {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ib: receive SGE ({sge_len} bytes at {sge_off}) outside the {}-byte buffer \
                     (or over its {RX_DESC_HDR}-byte header)",
                    pool.elem_size()
                ),
            ));
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
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ib: receive heads do not fit the ring ({} slots of {} bytes for {} receives of {} \
                     bytes, {} posted)",
                    heads.count(),
                    heads.size(),
                    self.capacity,
                    self.sge_len,
                    self.posted.get()
                ),
            ));
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

    /// True when receives should be reposted now. A poll that found nothing (`received`
    /// false: the caller waits) reposts from one batch missing; a poll that delivered messages
    /// only from four (`DEFER_BATCHES`) batches (at most half the ring) missing, so that the
    /// repost, a system call per batch on Soft-RoCE, stays off the path from a message to the
    /// caller's answer.
    #[inline]
    pub fn needs_refill(&self, received: bool) -> bool {
        let missing = (self.capacity - self.posted.get()) as usize;
        let min = if received {
            (self.batch * DEFER_BATCHES)
                .min(self.capacity as usize / 2)
                .max(self.batch)
        } else {
            self.batch
        };
        missing >= min
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
                return Err(e.error);
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

    /// A completed receive whose message (`len` bytes) fits its head slot, handled in place:
    /// `f` gets the message in the slot (no copy), then the slot is freed. `None`, with nothing
    /// taken and `f` not called, when the ring has no heads, the message is longer than a slot
    /// or `wr_id` is not posted: [`RxRing::take`] is the way for those.
    #[inline]
    pub fn with_head<R>(&self, wr_id: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let h = self.heads.as_ref()?;
        if len > h.size() {
            return None;
        }
        let id = u32::try_from(wr_id).ok()?;
        if !self.slots.borrow_mut().order.remove(id) {
            return None;
        }
        self.posted.set(self.posted.get() - 1);
        self.warm.set(false);
        // the id goes back to the free list (from which a refill posts it again) only after
        // `f`, also when `f` progresses the ring: the device does not write the slot meanwhile
        let r = h.bytes(id, len).map(f);
        self.slots.borrow_mut().free.push(id);
        r
    }

    /// Takes the buffer of a completed receive (`None` for an unknown `wr_id`); for rings
    /// without heads (the tests' shorthand; the transports take [`Received`]).
    #[cfg(test)]
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
mod tests;
