//! The receive FIFO in a shared segment, and the only code that touches it.
//!
//! Layout (little-endian, offsets in bytes):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `RUCXSMF1` |
//! | 8 | nonce (also in the interface address: a peer checks it maps the right segment) |
//! | 16 | element count (u32, a power of 2), 20: element size (u32) |
//! | 24 | owner pid (u32), 28: closed flag (atomic u32, set when the owner closes the interface) |
//! | 64 | head (atomic u64, own cache line): next element a sender claims; bit 63 = receiver armed |
//! | 128 | tail (atomic u64, own cache line): first element the receiver has not released |
//! | 192 | the elements |
//!
//! An element: flags (atomic u32: bit 0 owner, bit 1 skip), AM id (u8), length (u32 at 8), the
//! payload at 16. Senders claim an element by a compare-and-swap of the head (many producers),
//! fill it, and publish it by storing the flags with the owner bit of the round
//! (`(index >> log2(count)) & 1`, so elements need no reset between rounds). The one consumer
//! reads elements in order and releases them by advancing the tail.
//!
//! Trust: the owner of the segment never reads its shape back from shared memory (it keeps its
//! own copy), and a peer reads the header once, checks it against the mapping's size, and keeps
//! locals. Element indexes are masked, lengths and ids are read once into locals and checked
//! before the payload is copied out: a peer writing anything anywhere in the segment can lose
//! or garble messages, never make us touch memory outside the mapping.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ucs::{Error, Result, Status};

use crate::sys::{page_align, Mapping};

const MAGIC: u64 = u64::from_le_bytes(*b"RUCXSMF1");
const OFF_NONCE: usize = 8;
const OFF_COUNT: usize = 16;
const OFF_ELEM_SIZE: usize = 20;
const OFF_PID: usize = 24;
const OFF_CLOSED: usize = 28;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
/// Where the elements start.
pub const HDR_LEN: usize = 192;
/// Bytes before an element's payload.
pub const ELEM_HDR: usize = 16;
/// Head bit: the receiver sleeps and wants a wakeup on its socket.
pub const ARMED: u64 = 1 << 63;

const FLAG_OWNER: u32 = 1;
const FLAG_SKIP: u32 = 2;
/// A sender retries a contended head this often before answering NoResource (a peer could
/// change the head forever).
const CLAIM_TRIES: u32 = 256;

/// The element size that holds `seg_size` payload bytes.
pub fn elem_size_for(seg_size: usize) -> usize {
    (ELEM_HDR + seg_size).next_multiple_of(64)
}

/// The segment size for `count` elements of `elem_size` bytes.
pub fn seg_len(count: u64, elem_size: usize) -> usize {
    page_align(HDR_LEN + count as usize * elem_size)
}

/// A FIFO mapped in this process: our own (receiver) or a peer's (sender).
pub struct Fifo {
    map: Mapping,
    count: u64,
    shift: u32,
    elem_size: usize,
}

/// An element claimed by a sender: it must be published (with a message or as skipped).
#[must_use]
pub struct Claim {
    idx: u64,
    /// The receiver was armed: signal it after publishing.
    pub armed: bool,
}

/// What the consumer found at its read index.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    Empty,
    Msg {
        id: u8,
        len: usize,
    },
    /// Published without a message (the sender's pack failed): release and go on.
    Skip,
    /// Bytes no sender of ours writes: release and report.
    Corrupt(String),
}

impl Fifo {
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HDR_LEN && off.is_multiple_of(4));
        // SAFETY: `off` is a fixed, aligned header offset inside the mapping (HDR_LEN bytes at
        // least, checked at creation/open); the mapping outlives `&self`. Shared memory another
        // process writes is accessed only through atomics.
        unsafe { AtomicU32::from_ptr(self.map.as_ptr().add(off).cast()) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HDR_LEN && off.is_multiple_of(8));
        // SAFETY: as in `u32_at`; offsets are 8-aligned and the mapping is page-aligned.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(off).cast()) }
    }

    /// Start of the element of `idx` (any index: it is masked, so always in the mapping).
    fn elem(&self, idx: u64) -> *mut u8 {
        let slot = (idx & (self.count - 1)) as usize;
        // SAFETY: slot < count and HDR_LEN + count * elem_size <= map.len() (checked when the
        // FIFO was created or opened).
        unsafe { self.map.as_ptr().add(HDR_LEN + slot * self.elem_size) }
    }

    fn flags(&self, idx: u64) -> &AtomicU32 {
        // SAFETY: the element start is 64-aligned (HDR_LEN and elem_size are multiples of 64)
        // and inside the mapping; see `u32_at`.
        unsafe { AtomicU32::from_ptr(self.elem(idx).cast()) }
    }

    fn owner(&self, idx: u64) -> u32 {
        ((idx >> self.shift) & 1) as u32
    }

    /// Sets up a new, zeroed segment as an empty FIFO (its owner's view).
    pub fn init(map: Mapping, count: u64, elem_size: usize, nonce: u64) -> Result<Fifo> {
        if !count.is_power_of_two() || !elem_size.is_multiple_of(64) || elem_size < ELEM_HDR + 8 {
            return Err(Status::InvalidParam.into());
        }
        if HDR_LEN + count as usize * elem_size > map.len() {
            return Err(Status::InvalidParam.into());
        }
        let f = Fifo {
            map,
            count,
            shift: count.trailing_zeros(),
            elem_size,
        };
        f.u64_at(OFF_NONCE).store(nonce, Ordering::Relaxed);
        f.u32_at(OFF_COUNT).store(count as u32, Ordering::Relaxed);
        f.u32_at(OFF_ELEM_SIZE).store(elem_size as u32, Ordering::Relaxed);
        f.u32_at(OFF_PID).store(std::process::id(), Ordering::Relaxed);
        for i in 0..count {
            // Round 0 publishes owner bit 0: mark every element "not yet".
            f.flags(i).store(FLAG_OWNER, Ordering::Relaxed);
        }
        f.u64_at(0).store(MAGIC, Ordering::Release);
        Ok(f)
    }

    /// A peer's FIFO, mapped: checks its header once against the address and the mapping.
    pub fn open(map: Mapping, nonce: u64) -> Result<Fifo> {
        let bad = |what: String| {
            Err(Error::new(
                Status::ShmemSegment,
                format!("the peer's FIFO segment is not usable: {what}"),
            ))
        };
        if map.len() < HDR_LEN {
            return bad(format!("{} bytes", map.len()));
        }
        let probe = Fifo {
            map,
            count: 1,
            shift: 0,
            elem_size: 64,
        };
        let magic = probe.u64_at(0).load(Ordering::Acquire);
        let seen_nonce = probe.u64_at(OFF_NONCE).load(Ordering::Relaxed);
        let count = probe.u32_at(OFF_COUNT).load(Ordering::Relaxed) as u64;
        let elem_size = probe.u32_at(OFF_ELEM_SIZE).load(Ordering::Relaxed) as usize;
        if magic != MAGIC || seen_nonce != nonce {
            return bad("wrong magic or nonce (another segment, or the interface closed)".into());
        }
        if !count.is_power_of_two()
            || count > 65536
            || !elem_size.is_multiple_of(64)
            || elem_size < ELEM_HDR + 8
            || (HDR_LEN as u64).saturating_add(count.saturating_mul(elem_size as u64))
                > probe.map.len() as u64
        {
            return bad(format!(
                "{count} elements of {elem_size} bytes do not fit its {} bytes",
                probe.map.len()
            ));
        }
        Ok(Fifo {
            map: probe.map,
            count,
            shift: count.trailing_zeros(),
            elem_size,
        })
    }

    /// Largest message an element holds.
    pub fn payload_cap(&self) -> usize {
        self.elem_size - ELEM_HDR
    }

    /// The owner marked the FIFO closed.
    pub fn is_closed(&self) -> bool {
        self.u32_at(OFF_CLOSED).load(Ordering::Acquire) != 0
    }

    /// Marks the FIFO closed (the owner, when its interface closes).
    pub fn close(&self) {
        self.u32_at(OFF_CLOSED).store(1, Ordering::Release);
    }

    // ---- sender side ----

    /// True when a claim would find room (refreshing the cached tail when it looks full).
    pub fn has_room(&self, cached_tail: &Cell<u64>) -> bool {
        let h = self.u64_at(OFF_HEAD).load(Ordering::Relaxed) & !ARMED;
        if h.wrapping_sub(cached_tail.get()) < self.count {
            return true;
        }
        let t = self.u64_at(OFF_TAIL).load(Ordering::Acquire);
        cached_tail.set(t);
        h.wrapping_sub(t) < self.count
    }

    /// Claims the next element, or `None` when the FIFO is full (the receiver has not released
    /// enough). Clears the armed bit; the claim says whether it was set.
    #[inline]
    pub fn claim(&self, cached_tail: &Cell<u64>) -> Option<Claim> {
        let head = self.u64_at(OFF_HEAD);
        let mut h = head.load(Ordering::Relaxed);
        for _ in 0..CLAIM_TRIES {
            let idx = h & !ARMED;
            if idx.wrapping_sub(cached_tail.get()) >= self.count {
                let t = self.u64_at(OFF_TAIL).load(Ordering::Acquire);
                cached_tail.set(t);
                if idx.wrapping_sub(t) >= self.count {
                    return None;
                }
            }
            match head.compare_exchange_weak(h, (idx + 1) & !ARMED, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    return Some(Claim {
                        idx,
                        armed: h & ARMED != 0,
                    })
                }
                Err(now) => h = now,
            }
        }
        None
    }

    /// The payload of a claimed element, for the sender to fill.
    #[inline]
    pub fn payload<'a>(&'a self, c: &'a mut Claim) -> &'a mut [u8] {
        // SAFETY: the element is inside the mapping (see `elem`) and has payload_cap bytes after
        // its header. We claimed it, so no sender of ours writes it and the receiver does not
        // read it until we publish. A hostile process could write it concurrently: that can only
        // change the bytes delivered, which the receiver treats as untrusted anyway.
        unsafe { std::slice::from_raw_parts_mut(self.elem(c.idx).add(ELEM_HDR), self.payload_cap()) }
    }

    /// Publishes a claimed element: a message of `len` bytes for `id`, or (`None`) nothing.
    #[inline]
    pub fn publish(&self, c: Claim, msg: Option<(u8, usize)>) {
        let e = self.elem(c.idx);
        let (id, len, skip) = match msg {
            Some((id, len)) => (id, len as u32, 0),
            None => (0, 0, FLAG_SKIP),
        };
        // SAFETY: bytes 4 and 8..12 of an element inside the mapping; plain stores ordered
        // before the flags by the release store below.
        unsafe {
            e.add(4).write_volatile(id);
            e.add(8).cast::<u32>().write_volatile(len);
        }
        self.flags(c.idx)
            .store(self.owner(c.idx) | skip, Ordering::Release);
    }

    // ---- receiver side ----

    /// Looks at element `idx` (the consumer's read index).
    #[inline]
    pub fn peek(&self, idx: u64) -> Peek {
        let f = self.flags(idx).load(Ordering::Acquire);
        if f & FLAG_OWNER != self.owner(idx) {
            return Peek::Empty;
        }
        if f & !(FLAG_OWNER | FLAG_SKIP) != 0 {
            return Peek::Corrupt(format!("element flags {f:#x}"));
        }
        if f & FLAG_SKIP != 0 {
            return Peek::Skip;
        }
        let e = self.elem(idx);
        // SAFETY: bytes of an element inside the mapping, read once into locals (a peer may
        // change them at any time; only these copies are used).
        let (id, len) = unsafe {
            (
                e.add(4).read_volatile(),
                e.add(8).cast::<u32>().read_volatile() as usize,
            )
        };
        if len > self.payload_cap() {
            return Peek::Corrupt(format!("length {len} > {}", self.payload_cap()));
        }
        if id >= uct_transport::types::AM_ID_MAX {
            return Peek::Corrupt(format!("AM id {id}"));
        }
        Peek::Msg { id, len }
    }

    /// Copies the payload of element `idx` into `dst` (whose length was checked by `peek`
    /// against the element; shorter destinations get a prefix).
    #[inline]
    pub fn copy_out(&self, idx: u64, dst: &mut [u8]) {
        let n = dst.len().min(self.payload_cap());
        // SAFETY: `n` bytes from the element's payload, inside the mapping, into memory we own
        // and nothing else accesses meanwhile; a concurrent writer can only change which bytes
        // we copy. The CPU-tuned copy of `ucs::arch` (bulk copies of large bcopy messages).
        unsafe { ucs::arch::copy_maybe_overlapping(self.elem(idx).add(ELEM_HDR), dst.as_mut_ptr(), n) };
    }

    /// Hands element `idx`'s `len` payload bytes, where they lie, to the AM handler of `id`
    /// (one that takes shared data: it copies what it reads).
    #[inline]
    pub fn invoke_in_place(&self, idx: u64, len: usize, am: &uct_transport::am::AmTable, id: u8) {
        let len = len.min(self.payload_cap());
        // SAFETY: the payload starts after the element's header, inside the mapping, which
        // stays mapped while `self` lives; `len` bytes fit in the payload.
        let _ = unsafe { am.invoke_shared(id, self.elem(idx).add(ELEM_HDR), len) };
    }

    /// Releases every element before `idx` to the senders.
    #[inline]
    pub fn release(&self, idx: u64) {
        self.u64_at(OFF_TAIL).store(idx, Ordering::Release);
    }

    /// Arms the FIFO (the next claim signals us) unless elements beyond `idx` are claimed:
    /// returns false then (do not sleep).
    pub fn arm(&self, idx: u64) -> bool {
        let head = self.u64_at(OFF_HEAD);
        let mut h = head.load(Ordering::Acquire);
        for _ in 0..CLAIM_TRIES {
            if h & !ARMED != idx {
                return false;
            }
            if h & ARMED != 0 {
                return true;
            }
            match head.compare_exchange_weak(h, h | ARMED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => h = now,
            }
        }
        false
    }

    /// Raw access to the whole segment, for the tests that play a hostile peer.
    #[cfg(test)]
    pub fn raw(&self) -> (*mut u8, usize) {
        (self.map.as_ptr(), self.map.len())
    }

    /// Writes `bytes` at `off` of the segment (clipped to it), as a hostile peer would.
    #[cfg(any(test, feature = "fuzz"))]
    pub fn scribble(&self, off: usize, bytes: &[u8]) {
        let n = bytes.len().min(self.map.len().saturating_sub(off));
        for (i, b) in bytes[..n].iter().enumerate() {
            // SAFETY: `off + i` is inside the mapping (clipped above); a volatile byte store,
            // as another process's write would land.
            unsafe { self.map.as_ptr().add(off + i).write_volatile(*b) };
        }
    }

    /// Elements in the FIFO.
    #[cfg(any(test, feature = "fuzz"))]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mapping back (a fuzz body reopens what it scribbled as a peer's segment).
    #[cfg(any(test, feature = "fuzz"))]
    pub fn into_mapping(self) -> Mapping {
        self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::sysv_create;

    fn fifo(count: u64, seg: usize) -> Fifo {
        let es = elem_size_for(seg);
        let s = sysv_create(seg_len(count, es), false).unwrap();
        Fifo::init(s.map, count, es, 5).unwrap()
    }

    #[test]
    fn messages_wrap_around_in_order_and_full_is_refused() {
        let f = fifo(4, 64);
        let tail = Cell::new(0);
        let mut rd = 0u64;
        for round in 0..5u64 {
            for i in 0..4u64 {
                let mut c = f.claim(&tail).expect("room");
                f.payload(&mut c)[..8].copy_from_slice(&(round * 4 + i).to_le_bytes());
                f.publish(c, Some((3, 8)));
            }
            assert!(f.claim(&tail).is_none(), "full after 4");
            for _ in 0..4 {
                assert_eq!(f.peek(rd), Peek::Msg { id: 3, len: 8 });
                let mut b = [0u8; 8];
                f.copy_out(rd, &mut b);
                assert_eq!(u64::from_le_bytes(b), rd);
                rd += 1;
                f.release(rd);
            }
            assert_eq!(f.peek(rd), Peek::Empty);
        }
    }

    #[test]
    fn arming_and_skips() {
        let f = fifo(2, 64);
        let tail = Cell::new(0);
        assert!(f.arm(0));
        let c = f.claim(&tail).unwrap();
        assert!(c.armed, "claim after arm sees the bit");
        f.publish(c, None);
        assert!(!f.arm(0), "claimed but unread: no sleep");
        assert_eq!(f.peek(0), Peek::Skip);
        f.release(1);
        assert!(f.arm(1));
        let c = f.claim(&tail).unwrap();
        assert!(c.armed);
        f.publish(c, Some((1, 0)));
        let c = f.claim(&tail).unwrap();
        assert!(!c.armed, "one signal per arm");
        f.publish(c, Some((1, 0)));
    }

    #[test]
    fn bad_headers_are_refused_by_peers() {
        let es = elem_size_for(64);
        let s = sysv_create(seg_len(4, es), false).unwrap();
        let id = s.id;
        let f = Fifo::init(s.map, 4, es, 9).unwrap();
        let len = f.raw().1;
        let peer = crate::sys::sysv_attach(id, len).unwrap();
        assert!(Fifo::open(peer, 8).is_err(), "wrong nonce");
        // a header claiming more elements than the segment holds
        f.u32_at(OFF_COUNT).store(1 << 16, Ordering::Relaxed);
        let peer = crate::sys::sysv_attach(id, len).unwrap();
        assert!(Fifo::open(peer, 9).is_err());
        f.u32_at(OFF_COUNT).store(4, Ordering::Relaxed);
        let peer = crate::sys::sysv_attach(id, len).unwrap();
        assert!(Fifo::open(peer, 9).is_ok());
    }
}
