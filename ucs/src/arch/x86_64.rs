//! x86-64: CPU identification and the string copy (`rep movsb`).
#![allow(unsafe_code)]

use std::arch::x86_64::{__cpuid, __cpuid_count, CpuidResult};

use super::CopyWindow;

#[allow(unused_unsafe)]
fn cpuid(leaf: u32, sub: u32) -> CpuidResult {
    // SAFETY: `cpuid` exists on every x86-64 CPU; leaves above the maximum return zeros or the
    // highest leaf's values, which the callers check against the maximum first.
    unsafe {
        if sub == 0 {
            __cpuid(leaf)
        } else {
            __cpuid_count(leaf, sub)
        }
    }
}

/// What `auto` opens: AMD family 1Ah+ with ERMS, from the L2 size (glibc's switch point) up.
pub(super) fn default_window() -> CopyWindow {
    let id = cpuid(0, 0);
    let amd = (id.ebx, id.edx, id.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163); // "AuthenticAMD"
    if !amd || id.eax < 7 {
        return CopyWindow::OFF;
    }
    let sig = cpuid(1, 0).eax;
    let base = (sig >> 8) & 0xf;
    let family = if base == 0xf {
        base + ((sig >> 20) & 0xff)
    } else {
        base
    };
    let erms = cpuid(7, 0).ebx & (1 << 9) != 0;
    if family < 0x1a || !erms || cpuid(0x8000_0000, 0).eax < 0x8000_0006 {
        return CopyWindow::OFF;
    }
    let l2_kib = (cpuid(0x8000_0006, 0).ecx >> 16) as usize;
    if l2_kib == 0 {
        return CopyWindow::OFF;
    }
    CopyWindow {
        min: l2_kib * 1024,
        max: usize::MAX,
    }
}

/// Copies with `rep movsb`.
#[inline]
pub(super) fn string_copy(dst: &mut [u8], src: &[u8]) {
    let len = dst.len().min(src.len());
    // SAFETY: both slices are valid for `len` bytes and cannot overlap (one is `&mut`); the
    // direction flag is clear at function boundaries (SysV ABI), so the copy runs forward;
    // `rep movsb` touches only rdi/rsi/rcx and memory, not the stack or flags.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst.as_mut_ptr() => _,
            inout("rsi") src.as_ptr() => _,
            options(nostack, preserves_flags)
        );
    }
}

/// The time-stamp counter.
#[inline(always)]
pub(super) fn rdtsc() -> u64 {
    // SAFETY: RDTSC reads a counter; it touches no memory and exists on every x86_64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}
