//! Private receive descriptors: a message is copied out of the shared FIFO into one before its
//! handler runs (a peer cannot change it under the handler), and `keep()` lends that descriptor
//! without a further copy. Released descriptors return to their interface's free list.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::{Rc, Weak};

use uct_transport::abi::RawRxDesc;
use uct_transport::am::{AmDisposition, AmTable, LentDesc};

/// Descriptors kept on the free list at most (more are freed when released).
const MAX_FREE: usize = 64;

type FreeList = RefCell<Vec<Box<RxBuf>>>;

/// A descriptor: the `RawRxDesc` the host releases through comes first.
#[repr(C)]
struct RxBuf {
    desc: RawRxDesc,
    home: Weak<FreeList>,
    data: Box<[u8]>,
}

/// The descriptors of one interface.
pub struct RxPool {
    free: Rc<FreeList>,
    size: usize,
}

impl RxPool {
    pub fn new(size: usize) -> RxPool {
        let free = Rc::new(RefCell::new(Vec::new()));
        let pool = RxPool { free, size };
        // one ready, so the first message allocates nothing
        let b = pool.alloc();
        pool.free.borrow_mut().push(b);
        pool
    }

    fn alloc(&self) -> Box<RxBuf> {
        Box::new(RxBuf {
            desc: RawRxDesc { release: release_rx },
            home: Rc::downgrade(&self.free),
            data: vec![0u8; self.size].into_boxed_slice(),
        })
    }

    /// Fills a descriptor with `len` bytes through `fill` and hands it to the handler of `id`;
    /// the descriptor returns to the free list unless the handler kept it.
    #[inline]
    pub fn deliver(&self, am: &AmTable, id: u8, len: usize, fill: impl FnOnce(&mut [u8])) {
        let popped = self.free.borrow_mut().pop();
        let mut b = popped.unwrap_or_else(|| self.alloc());
        let len = len.min(b.data.len());
        fill(&mut b.data[..len]);
        let raw = Box::into_raw(b);
        // SAFETY: `raw` is a live, uniquely owned RxBuf; the slice covers its own data, which
        // stays put (boxed) until the box is reclaimed below or in `release_rx`.
        let data = unsafe { std::slice::from_raw_parts((*raw).data.as_ptr(), len) };
        // SAFETY: the RxBuf starts with its RawRxDesc (repr(C)); `release_rx` stays callable and
        // the data valid until the host releases it, exactly once, if the handler keeps it.
        let desc = unsafe { LentDesc::new(NonNull::new_unchecked(raw.cast::<RawRxDesc>())) };
        match am.invoke(id, data, Some(desc)) {
            Ok(AmDisposition::Kept) => {}
            _ => {
                // SAFETY: not kept: still ours, converted back exactly once.
                let b = unsafe { Box::from_raw(raw) };
                give_back(b);
            }
        }
    }

    /// Descriptors on the free list (tests).
    #[cfg(test)]
    pub fn free_len(&self) -> usize {
        self.free.borrow().len()
    }
}

fn give_back(b: Box<RxBuf>) {
    if let Some(home) = b.home.upgrade() {
        let mut free = home.borrow_mut();
        if free.len() < MAX_FREE {
            free.push(b);
        }
    }
}

/// `RawRxDesc::release`: the host is done with a kept descriptor.
///
/// # Safety
/// `desc` must be a descriptor lent by [`RxPool::deliver`] and kept, released exactly once, on
/// the interface's thread.
unsafe extern "C" fn release_rx(desc: *mut RawRxDesc) {
    if desc.is_null() {
        return;
    }
    // SAFETY: per this function's contract, `desc` is the start of a leaked Box<RxBuf>.
    let b = unsafe { Box::from_raw(desc.cast::<RxBuf>()) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| give_back(b)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;
    use ucs::Status;
    use uct_transport::types::AmCbFlags;

    /// # Safety
    /// Called by the AM table with the test's slot as `arg`.
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
    fn kept_descriptors_come_back_on_release() {
        let pool = RxPool::new(32);
        let mut slot: *mut RawRxDesc = std::ptr::null_mut();
        let t = AmTable::new(true);
        t.set(1, Some(keep), &mut slot as *mut _ as *mut c_void, AmCbFlags::SYNC)
            .unwrap();
        pool.deliver(&t, 1, 4, |b| b.copy_from_slice(b"abcd"));
        assert_eq!(pool.free_len(), 0, "lent");
        pool.deliver(&t, 2, 4, |b| b.copy_from_slice(b"efgh"));
        assert_eq!(pool.free_len(), 1, "no handler: back at once");
        // SAFETY: what the host does with a kept descriptor: release it once.
        unsafe { ((*slot).release)(slot) };
        assert_eq!(pool.free_len(), 2);
    }
}
