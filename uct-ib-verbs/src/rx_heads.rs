//! Dense receive heads: one registered array with a slot of `size` bytes per receive, the
//! first SGE of every receive of a ring (the second covers the rest of the receive buffer).
//! A message no longer than `size` lands in the array only, so consecutive small messages
//! share pages instead of each touching a buffer of its own (UCX's mlx5 transports get the
//! same effect from the device scattering small messages into the CQE).

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Error, Result, Status};

use crate::Sge;

/// Bytes of a head slot: a cache line. Fixed, so that taking a message out of its slot is a
/// copy of known size (two or four vector moves, no call into libc).
pub const RX_HEAD: usize = 64;

/// The bytes of one small message, copied out of its head slot.
#[derive(Clone)]
pub struct HeadCopy {
    bytes: [u8; RX_HEAD],
    len: usize,
}

impl HeadCopy {
    /// The message.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `count` head slots of [`RX_HEAD`] bytes in one registered element of a pool.
pub struct RxHeads {
    /// Declared before `_pool` so it goes back to the pool before the pool is dropped.
    array: PoolBuf,
    _pool: MemPool,
    count: usize,
    lkey: u32,
}

impl RxHeads {
    /// Takes the array from `pool` (one element of at least `count * RX_HEAD` bytes,
    /// registered for local write; chunk key = lkey).
    pub fn new(pool: MemPool, count: usize) -> Result<RxHeads> {
        let array = pool.get()?;
        if count.checked_mul(RX_HEAD).is_none_or(|n| n > array.capacity()) {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ib: receive head array too small: {count} heads of {RX_HEAD} bytes in a {}-byte pool element",
                    array.capacity()
                ),
            ));
        }
        let lkey = array.chunk_key() as u32;
        Ok(RxHeads {
            array,
            _pool: pool,
            count,
            lkey,
        })
    }

    /// Bytes per slot.
    #[inline]
    pub fn size(&self) -> usize {
        RX_HEAD
    }

    /// Slots.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The SGE of slot `id` (`id < count`, else an empty SGE).
    #[inline]
    pub fn sge(&self, id: u32) -> Sge {
        let id = id as usize;
        if id >= self.count {
            return Sge::new(0, 0, self.lkey);
        }
        Sge::new(
            self.array.as_ptr() as u64 + (id * RX_HEAD) as u64,
            RX_HEAD as u32,
            self.lkey,
        )
    }

    /// Test support: writes `data` (at most a slot) into slot `id` as the device does when
    /// a receive lands there. The slot must not be lent out in place meanwhile.
    #[cfg(feature = "testing")]
    pub fn land(&self, id: u32, data: &[u8]) {
        let id = id as usize;
        assert!(id < self.count, "slot {id} past the array");
        let n = data.len().min(RX_HEAD);
        // SAFETY: `(id + 1) * RX_HEAD <= capacity`: in bounds of the element, which lives as
        // long as `self`; like the device, this writes through a raw pointer, and the caller
        // keeps no in-place view of the slot meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.array.as_ptr() as *mut u8).add(id * RX_HEAD),
                n,
            )
        };
    }

    /// The whole slot `id` (`None` past the array), which must belong to a completed receive.
    #[inline]
    fn slot(&self, id: u32) -> Option<[u8; RX_HEAD]> {
        let id = id as usize;
        if id >= self.count {
            return None;
        }
        // SAFETY: `(id + 1) * RX_HEAD <= count * RX_HEAD <= capacity`: in bounds of the element,
        // which lives as long as `self`; `[u8; N]` has alignment 1. Only the device writes the
        // array, and not this slot once its receive completed (the caller's contract); the
        // read is a copy through a raw pointer, no reference to memory the device writes.
        Some(unsafe { std::ptr::read(self.array.as_ptr().add(id * RX_HEAD) as *const [u8; RX_HEAD]) })
    }

    /// The first `len` bytes (at most a slot) of slot `id` in place (`None` past the array).
    /// As for [`RxHeads::copy`], slot `id` must belong to a completed receive, and here it must
    /// also not be posted again while the slice lives (the device writes a slot only while its
    /// receive is posted): `uct-ib`'s `RxRing::with_head` frees the
    /// slot only after its use of the slice.
    #[inline]
    pub fn bytes(&self, id: u32, len: usize) -> Option<&[u8]> {
        let id = id as usize;
        if id >= self.count {
            return None;
        }
        // SAFETY: `id * RX_HEAD + len.min(RX_HEAD) <= count * RX_HEAD <= capacity`: in bounds of
        // the element, which lives as long as `self`; nothing writes the slot while the slice
        // lives (the caller's contract above), so a shared slice of it is sound.
        Some(unsafe { std::slice::from_raw_parts(self.array.as_ptr().add(id * RX_HEAD), len.min(RX_HEAD)) })
    }

    /// Copies the message of `len` bytes (at most a slot) out of slot `id`.
    #[inline]
    pub fn copy(&self, id: u32, len: usize) -> Option<HeadCopy> {
        Some(HeadCopy {
            bytes: self.slot(id)?,
            len: len.min(RX_HEAD),
        })
    }

    /// Copies slot `id` whole into the first [`RX_HEAD`] bytes of `dst` (the start of the
    /// receive buffer its second SGE continues), for a message longer than a slot. `false`
    /// when out of range.
    #[inline]
    pub fn copy_into(&self, id: u32, dst: &mut [u8]) -> bool {
        match (self.slot(id), dst.get_mut(..RX_HEAD)) {
            (Some(src), Some(dst)) => {
                dst.copy_from_slice(&src);
                true
            }
            _ => false,
        }
    }

    /// Reads one byte of slot `id` (a posted one: the next to complete) so that its page is
    /// translated before the message arrives; see [`touch_posted`](super::touch_posted).
    #[inline]
    pub fn touch(&self, id: u32) {
        super::touch_posted(&self.array, id as usize * RX_HEAD);
    }
}
