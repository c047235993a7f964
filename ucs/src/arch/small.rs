//! Copies of at most 16 bytes without a call into libc: RMA's short puts and gets are a few
//! bytes, and a `memmove` call costs them more than the copy (two loads and two stores here).
#![allow(unsafe_code)]

use std::ptr::{read_unaligned as rd, write_unaligned as wr};

/// Largest length [`copy_small`] takes.
pub const SMALL: usize = 16;

/// Copies `len <= SMALL` bytes; the ranges may overlap (every load happens before any store).
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and nothing else may
/// access `dst` meanwhile.
#[inline(always)]
pub unsafe fn copy_small(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len <= SMALL);
    // SAFETY (every block): the first and the last `k` bytes of a `len`-byte range with
    // `k <= len` lie inside it; unaligned accesses are allowed by `read/write_unaligned`.
    unsafe {
        if len >= 8 {
            let (a, b) = (rd(src as *const u64), rd(src.add(len - 8) as *const u64));
            wr(dst as *mut u64, a);
            wr(dst.add(len - 8) as *mut u64, b);
        } else if len >= 4 {
            let (a, b) = (rd(src as *const u32), rd(src.add(len - 4) as *const u32));
            wr(dst as *mut u32, a);
            wr(dst.add(len - 4) as *mut u32, b);
        } else if len >= 2 {
            let (a, b) = (rd(src as *const u16), rd(src.add(len - 2) as *const u16));
            wr(dst as *mut u16, a);
            wr(dst.add(len - 2) as *mut u16, b);
        } else if len == 1 {
            *dst = *src;
        }
    }
}
