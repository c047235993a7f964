//! Zero-copy receive: lending a pool buffer to an AM handler. The first [`RX_DESC_HDR`] bytes
//! of the element hold the `RawRxDesc` whose `release` the host calls to give the buffer back
//! (it then returns to its pool, from where the receive ring takes it again).

use std::ptr::NonNull;
use ucs::mpool::PoolBuf;
use uct_transport::abi::RawRxDesc;
use uct_transport::am::LentDesc;

/// Bytes reserved at the start of a lendable element for the descriptor header. The payload
/// must start at or after this offset.
pub const RX_DESC_HDR: usize = std::mem::size_of::<RawRxDesc>();

/// A pool element prepared for lending: owned through a raw pointer until it is either
/// [`reclaimed`](RxLoan::reclaim) (the handler did not keep it) or
/// [`handed over`](RxLoan::hand_over) (the handler kept it and will release it).
///
/// Buffers must be released on the thread that owns the pool (the worker's thread).
pub struct RxLoan {
    data: NonNull<u8>,
    len: usize,
}

impl RxLoan {
    /// Prepares `buf` for lending. Gives it back unchanged when it is shorter than
    /// [`RX_DESC_HDR`] or its start is not pointer-aligned (create the pool with an alignment
    /// of at least 8 at offset 0).
    pub fn new(buf: PoolBuf) -> Result<RxLoan, PoolBuf> {
        let align = std::mem::align_of::<RawRxDesc>();
        if buf.len() < RX_DESC_HDR || !(buf.as_ptr() as usize).is_multiple_of(align) {
            return Err(buf);
        }
        let len = buf.len();
        let data = buf.into_raw();
        // SAFETY: `data` is the start of an element of at least RX_DESC_HDR bytes that we own
        // (into_raw), aligned for RawRxDesc (checked above).
        unsafe {
            data.as_ptr()
                .cast::<RawRxDesc>()
                .write(RawRxDesc { release: release_rx })
        };
        Ok(RxLoan { data, len })
    }

    /// `len` bytes at `offset` of the element (`None` when out of bounds or inside the header).
    pub fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if offset < RX_DESC_HDR || end > self.len {
            return None;
        }
        // SAFETY: in bounds of the element we own; the HCA finished writing it (the caller
        // lends only completed receives) and no mutable access exists while `self` is borrowed.
        Some(unsafe { std::slice::from_raw_parts(self.data.as_ptr().add(offset), len) })
    }

    /// The descriptor to pass to `AmTable::invoke`.
    pub fn desc(&self) -> LentDesc {
        // SAFETY: the element starts with an initialized RawRxDesc whose `release` stays valid
        // until called once; the element (and its data) lives until then (see hand_over).
        unsafe { LentDesc::new(self.data.cast::<RawRxDesc>()) }
    }

    /// The handler did not keep the descriptor: take the buffer back.
    pub fn reclaim(self) -> PoolBuf {
        let data = self.data;
        std::mem::forget(self);
        // SAFETY: `data` came from PoolBuf::into_raw in `new` and is converted back exactly
        // once: here (self is forgotten, so Drop does not), in Drop, or in `release_rx` after
        // `hand_over`.
        unsafe { PoolBuf::from_raw(data) }
    }

    /// The handler kept the descriptor: the host now owns the buffer and gives it back by
    /// calling `release`.
    pub fn hand_over(self) {
        std::mem::forget(self);
    }
}

impl Drop for RxLoan {
    /// An unresolved loan returns the buffer to its pool (never leaks).
    fn drop(&mut self) {
        // SAFETY: as in `reclaim`: `self` is dropped, so this is the only conversion.
        drop(unsafe { PoolBuf::from_raw(self.data) });
    }
}

/// Reads one byte at `off` of a receive buffer the device owns (posted) and discards it: the
/// CPU's translation of the buffer's page is then warm when its completion is handled. Each
/// message lands in a buffer posted thousands of receives earlier, so the first read of a
/// received header would miss the TLB on the ping-pong's critical path (costly under an
/// emulator, which walks the guest's page tables in software). Nothing happens when `off` is
/// outside the buffer.
#[inline]
pub fn touch_posted(buf: &PoolBuf, off: usize) {
    if off < buf.capacity() {
        // SAFETY: in bounds of the element, which stays allocated while `buf` lives. The device
        // may write the buffer meanwhile: a volatile read of DMA memory, whose value is
        // discarded, forms no reference to it.
        unsafe { std::ptr::read_volatile(buf.as_ptr().add(off)) };
    }
}

/// `RawRxDesc::release`: the host is done with a kept buffer.
///
/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct_transport::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn release_rx(desc: *mut RawRxDesc) {
    let Some(data) = NonNull::new(desc.cast::<u8>()) else {
        return;
    };
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the host calls release exactly once for a descriptor we handed over; it is the
        // element start returned by PoolBuf::into_raw.
        drop(unsafe { PoolBuf::from_raw(data) });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;
    use ucs::mpool::{MemPool, MemPoolParams};
    use ucs::Status;
    use uct_transport::am::{AmDisposition, AmTable};
    use uct_transport::types::AmCbFlags;

    fn pool() -> MemPool {
        let mut p = MemPoolParams::new("lend-test", 64);
        p.alignment = 64;
        MemPool::new(p).unwrap()
    }

    /// An AM handler that keeps the descriptor (stores it through `arg`).
    ///
    /// # Safety
    /// Called only across the plugin boundary, with the handles and pointers that
    /// `uct_transport::abi`'s contract guarantees valid (see the module documentation).
    unsafe extern "C" fn keep(
        arg: *mut c_void,
        _d: *const u8,
        _l: usize,
        desc: *mut RawRxDesc,
        _f: u32,
    ) -> i8 {
        // SAFETY: `arg` points to the test's slot.
        unsafe { *(arg as *mut *mut RawRxDesc) = desc };
        Status::InProgress.as_raw()
    }

    #[test]
    fn reclaim_and_release_return_the_buffer() {
        let mp = pool();
        let mut b = mp.get().unwrap();
        b[RX_DESC_HDR..RX_DESC_HDR + 3].copy_from_slice(b"abc");
        let loan = RxLoan::new(b).unwrap();
        assert_eq!(loan.bytes(RX_DESC_HDR, 3).unwrap(), b"abc");
        assert!(loan.bytes(0, 1).is_none() && loan.bytes(60, 8).is_none());
        drop(loan.reclaim());
        assert_eq!(mp.stats().in_use, 0);

        let mut slot: *mut RawRxDesc = std::ptr::null_mut();
        let t = AmTable::new(true);
        t.set(3, Some(keep), &mut slot as *mut _ as *mut c_void, AmCbFlags::SYNC)
            .unwrap();
        let loan = RxLoan::new(mp.get().unwrap()).unwrap();
        let r = t.invoke(3, loan.bytes(RX_DESC_HDR, 4).unwrap(), Some(loan.desc()));
        assert_eq!(r, Ok(AmDisposition::Kept));
        loan.hand_over();
        assert_eq!(mp.stats().in_use, 1);
        assert!(!slot.is_null());
        // SAFETY: what the host does with a kept descriptor: release it once.
        unsafe { ((*slot).release)(slot) };
        assert_eq!(mp.stats().in_use, 0);

        drop(RxLoan::new(mp.get().unwrap()).unwrap());
        assert_eq!(
            mp.stats().in_use,
            0,
            "dropping an unresolved loan returns the buffer"
        );
    }
}
