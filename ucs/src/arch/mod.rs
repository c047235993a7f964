//! CPU-specific code: the routine for bulk copies (UCX's built-in memcpy window in
//! `ucs_memcpy_relaxed`), and the high-resolution tick counter ([`read_hres_clock`], UCX's
//! `ucs_arch_read_hres_clock`).
//!
//! glibc copies with `rep movsb` on AMD only below the L2 cache size and with a vector loop
//! above it; on AMD Zen 5 (family 1Ah) `rep movsb` is the faster of the two above the L2 size.
//! [`copy_maybe_overlapping`] uses `rep movsb` for lengths in
//! `[RUCX_ARCH_BUILTIN_MEMCPY_MIN, RUCX_ARCH_BUILTIN_MEMCPY_MAX)` and libc's memcpy/memmove
//! otherwise.
//!
//! `auto` opens the window only on AMD family 1Ah and later with ERMS, from the L2 size up.
//! Everywhere else both limits are `inf` (libc only): on Zen 3/4 `rep movsb` is very slow for
//! some alignments (glibc bug 30994), and on Intel glibc already uses `rep movsb` up to its
//! non-temporal threshold.

mod small;
#[cfg(target_arch = "x86_64")]
mod x86_64;

use std::sync::atomic::{AtomicUsize, Ordering};

use once_cell::sync::Lazy;

use crate::config::{ConfigField, ConfigKind, ConfigTable, MemUnits};

/// `RUCX_ARCH_*` variables.
pub static ARCH_TABLE: ConfigTable = ConfigTable {
    name: "arch",
    prefix: "ARCH_",
    fields: &[
        ConfigField::new(
            "BUILTIN_MEMCPY_MIN",
            "auto",
            ConfigKind::MemUnits,
            "Smallest RMA copy done by the CPU (self's put/get, software RMA on the target) \
             with the string copy instruction (rep movsb) instead of libc's memcpy; inf turns it \
             off. auto: the L2 cache size on AMD family 1Ah (Zen 5) and later, inf elsewhere.",
        ),
        ConfigField::new(
            "BUILTIN_MEMCPY_MAX",
            "auto",
            ConfigKind::MemUnits,
            "Bulk copies of this length and longer go back to libc's memcpy. auto: inf.",
        ),
    ],
};

/// Copy lengths `[min, max)` done with the CPU's string copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyWindow {
    /// Smallest length (inclusive) copied with the string copy.
    pub min: usize,
    /// Length (exclusive) from which the ordinary copy is used again.
    pub max: usize,
}

impl CopyWindow {
    /// The window that copies nothing with the string copy.
    pub const OFF: CopyWindow = CopyWindow {
        min: usize::MAX,
        max: usize::MAX,
    };

    #[inline]
    fn contains(self, len: usize) -> bool {
        len >= self.min && len < self.max
    }
}

static WINDOW: Lazy<CopyWindow> = Lazy::new(|| read_window(&ARCH_TABLE, cpu_default()));

/// What `auto` means on this CPU.
fn cpu_default() -> CopyWindow {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::default_window()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        CopyWindow::OFF
    }
}

/// Reads the window from the environment; an invalid value is logged by the parser and leaves
/// libc's memcpy in charge (never a wrong copy).
fn read_window(table: &ConfigTable, auto: CopyWindow) -> CopyWindow {
    let get = |name: &str, auto: usize| match table.get_memunits(name) {
        Ok(m) => Some(to_len(m, auto)),
        Err(_) => None,
    };
    match (
        get("BUILTIN_MEMCPY_MIN", auto.min),
        get("BUILTIN_MEMCPY_MAX", auto.max),
    ) {
        (Some(min), Some(max)) => CopyWindow { min, max },
        _ => CopyWindow::OFF,
    }
}

fn to_len(m: MemUnits, auto: usize) -> usize {
    usize::try_from(m.bytes_or(auto as u64)).unwrap_or(usize::MAX)
}

#[inline]
fn copy_in(w: CopyWindow, dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if w.contains(src.len()) {
        return x86_64::string_copy(dst, src);
    }
    let _ = w;
    dst.copy_from_slice(src)
}

/// Copies `len` bytes from `src` to `dst`; the ranges may overlap (then libc's memmove). Up to
/// 16 bytes are copied inline; the window is checked with one relaxed load.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and nothing else may
/// access `dst` meanwhile.
#[inline]
#[allow(unsafe_code)]
pub unsafe fn copy_maybe_overlapping(src: *const u8, dst: *mut u8, len: usize) {
    if len <= small::SMALL {
        // SAFETY: the caller's contract.
        return unsafe { small::copy_small(src, dst, len) };
    }
    if len >= WINDOW_MIN.load(Ordering::Relaxed) {
        // SAFETY: the caller's contract.
        return unsafe { copy_in_window(src, dst, len) };
    }
    // SAFETY: the caller's contract; memmove allows overlap.
    unsafe { std::ptr::copy(src, dst, len) }
}

/// [`WINDOW`]'s `min`, for the fast check: 0 until the configuration is read (so the first
/// copy longer than 16 bytes reads it).
static WINDOW_MIN: AtomicUsize = AtomicUsize::new(0);

/// # Safety
/// As [`copy_maybe_overlapping`].
#[inline(never)]
#[allow(unsafe_code)]
unsafe fn copy_in_window(src: *const u8, dst: *mut u8, len: usize) {
    let w = *WINDOW;
    WINDOW_MIN.store(w.min, Ordering::Relaxed);
    let (s, d) = (src as usize, dst as usize);
    let disjoint = s.saturating_add(len) <= d || d.saturating_add(len) <= s;
    if disjoint && w.contains(len) {
        // SAFETY: the caller's contract, and the ranges are disjoint (checked), so the two
        // slices do not alias.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(src, len),
                std::slice::from_raw_parts_mut(dst, len),
            )
        };
        copy_in(w, dst, src)
    } else {
        // SAFETY: the caller's contract; memmove allows overlap.
        unsafe { std::ptr::copy(src, dst, len) }
    }
}

/// The CPU's tick counter (`rdtsc` on x86_64; 0 elsewhere): cheap, monotonic only where the
/// kernel reports the TSC constant and non-stop (callers check `/proc/cpuinfo`, as UCX does).
#[inline(always)]
pub fn read_hres_clock() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

#[cfg(test)]
mod tests;
