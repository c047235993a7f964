//! Scatter/gather entries of registered memory, as transports see them.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;

use crate::abi::RawIov;

/// One entry of an I/O vector. `repr(transparent)` over [`RawIov`], so the host's array is used
/// in place. The memory stays valid, by the host's contract, until the operation it came with
/// completes (its completion is updated, or the call returned anything but `InProgress`).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct Iov<'a> {
    raw: RawIov,
    _life: PhantomData<&'a [u8]>,
}

impl<'a> Iov<'a> {
    /// Wraps an array passed by the host.
    ///
    /// # Safety
    /// `ptr` must point to `n` valid `RawIov` entries whose buffers are valid for the contract
    /// above, or `n` must be 0.
    pub(crate) unsafe fn slice_from_raw<'b>(ptr: *const RawIov, n: usize) -> &'b [Iov<'b>] {
        if n == 0 {
            return &[];
        }
        // SAFETY: Iov is repr(transparent) over RawIov; the caller guarantees validity.
        unsafe { std::slice::from_raw_parts(ptr as *const Iov<'b>, n) }
    }

    /// Builds an entry (host side).
    pub fn from_raw(raw: RawIov) -> Iov<'a> {
        Iov {
            raw,
            _life: PhantomData,
        }
    }

    /// The raw entry.
    pub fn raw(&self) -> RawIov {
        self.raw
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw.length
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.raw.length == 0
    }

    /// The memory handle from the memory domain (may be null).
    pub fn memh(&self) -> *mut c_void {
        self.raw.memh
    }

    /// Start address (for transports that hand it to hardware).
    pub fn addr(&self) -> *mut u8 {
        self.raw.buffer
    }

    /// The bytes, for sending.
    pub fn bytes(&self) -> &'a [u8] {
        if self.raw.length == 0 {
            return &[];
        }
        // SAFETY: by the boundary contract the buffer is valid and not written by the host while
        // the operation is outstanding.
        unsafe { std::slice::from_raw_parts(self.raw.buffer, self.raw.length) }
    }

    /// Copies `src` into the entry at `offset` (for receiving: get_zcopy targets). Returns the
    /// number of bytes copied (bounded by the entry's length).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> usize {
        if offset >= self.raw.length {
            return 0;
        }
        let n = src.len().min(self.raw.length - offset);
        // SAFETY: `offset + n <= length`; the host lent this buffer for writing until completion
        // and does not access it meanwhile. `src` (registered memory of a get) may be the same
        // bytes: the copy allows overlap.
        unsafe { ucs::arch::copy_maybe_overlapping(src.as_ptr(), self.raw.buffer.add(offset), n) };
        n
    }

    /// Lends `f` the entry's bytes from `offset` (at most `max` of them) for writing, e.g. to
    /// `recv()` a get reply straight into a get_zcopy target; returns what `f` returns. An
    /// `offset` at or past the end lends an empty slice.
    ///
    /// For entries the host lent for writing (get_zcopy targets), until the operation
    /// completes: as with [`Iov::write_at`], the host does not touch the memory meanwhile.
    pub fn write_with<R>(&self, offset: usize, max: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let off = offset.min(self.raw.length);
        let n = max.min(self.raw.length - off);
        if n == 0 {
            return f(&mut []);
        }
        // SAFETY: `off + n <= length`; the host lent this buffer for writing until the
        // operation completes and does not access it meanwhile; the slice lives only for the
        // call of `f`, so no other slice of this entry made here is alive at the same time.
        f(unsafe { std::slice::from_raw_parts_mut(self.raw.buffer.add(off), n) })
    }

    /// Extends the lifetime, for transports that keep the entry until completion.
    pub fn detach(&self) -> Iov<'static> {
        Iov {
            raw: self.raw,
            _life: PhantomData,
        }
    }
}

/// Total length of a vector.
pub fn total_len(iov: &[Iov]) -> usize {
    iov.iter().map(|e| e.len()).sum()
}

/// Copies the entries one after the other to the start of `dst` (at least
/// [`total_len`] long) and returns the bytes copied.
pub fn gather(dst: &mut [u8], iov: &[Iov]) -> usize {
    let mut off = 0;
    for e in iov {
        let b = e.bytes();
        dst[off..off + b.len()].copy_from_slice(b);
        off += b.len();
    }
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(b: &[u8]) -> Iov<'_> {
        Iov::from_raw(RawIov {
            buffer: b.as_ptr() as *mut u8,
            length: b.len(),
            memh: std::ptr::null_mut(),
        })
    }

    #[test]
    fn gather_concatenates_entries() {
        let (a, b, c) = (*b"abc", [0u8; 0], *b"de");
        let iov = [entry(&a), entry(&b), entry(&c)];
        let mut dst = [0xffu8; 8];
        assert_eq!(gather(&mut dst, &iov), total_len(&iov));
        assert_eq!(&dst[..6], b"abcde\xff");
    }
}
