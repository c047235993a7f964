//! Process facts from the C library that measurement tools compare with UCX's.
#![allow(unsafe_code)]

/// Heap bytes in use as glibc counts them (`mallinfo2`: main-arena chunks in use plus mmap'd
/// blocks), allocations of C libraries such as libibverbs included; `None` off glibc.
pub fn heap_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 (glibc >= 2.33) only reads the allocator's statistics and returns
        // them by value.
        let m = unsafe { nix::libc::mallinfo2() };
        Some(m.uordblks + m.hblkhd)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Resident memory of this process in bytes (`/proc/self/statm`, 4 KiB pages); `None` where
/// that file is not there.
pub fn resident_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    #[test]
    fn heap_grows_with_an_allocation() {
        let Some(before) = super::heap_in_use() else {
            return;
        };
        // Large against what other test threads allocate or free meanwhile (the count is
        // process-wide): 64 MiB, of which at least half must show.
        // black_box: in release the optimizer would otherwise drop the unused vector.
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = super::heap_in_use().unwrap();
        assert!(after >= before + (32 << 20), "{before} -> {after}");
        drop(std::hint::black_box(v));
    }
}
