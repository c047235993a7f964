//! Chunks: the raw memory blocks a [`MemPool`](super::MemPool) carves into elements, and the
//! allocator hook that provides them (default: zeroed, 64-byte aligned heap memory; or
//! huge-page aligned mappings advised for transparent huge pages, for large registered pools).
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::OnceLock;

use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};

use crate::{Result, Status};

/// Alignment of heap chunks; the pool adds its own padding for larger element alignments.
const HEAP_ALIGN: usize = 64;

/// Who frees a chunk's memory when the [`RawChunk`] is dropped.
enum Owner {
    /// Allocated by [`RawChunk::heap`]; freed on drop.
    Heap(Layout),
    /// Mapped by [`RawChunk::huge`] (`len` bytes); unmapped on drop.
    Mapped,
    /// Provided through [`RawChunk::from_raw`]; the allocator frees it in `release`.
    External,
}

/// A block of initialized, writable memory plus a user key (e.g. an RDMA lkey that `obj_init`
/// stamps into each element). Heap chunks free themselves on drop; external ones do not.
pub struct RawChunk {
    ptr: NonNull<u8>,
    len: usize,
    key: u64,
    owner: Owner,
}

impl RawChunk {
    /// Allocates `size` zeroed bytes on the heap (key 0).
    pub fn heap(size: usize) -> Result<RawChunk> {
        let layout = match Layout::from_size_align(size.max(1), HEAP_ALIGN) {
            Ok(l) => l,
            Err(_) => {
                crate::error!(size, "memory pool chunk size is too large for the allocator");
                return Err(Status::NoMemory.into());
            }
        };
        // SAFETY: `layout` has a non-zero size (at least 1 byte).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(RawChunk {
                ptr,
                len: size,
                key: 0,
                owner: Owner::Heap(layout),
            }),
            None => {
                crate::error!(size, "out of memory allocating a memory pool chunk");
                Err(Status::NoMemory.into())
            }
        }
    }

    /// Allocates `size` zeroed bytes, rounded up to whole transparent huge pages, in a private
    /// anonymous mapping aligned to the huge page size and advised `MADV_HUGEPAGE` (UCX's
    /// `thp` allocation). A ring of receive buffers then spans a few TLB entries instead of
    /// one per 4 KiB page, and registering it faults in a few pages instead of thousands.
    /// Falls back to [`RawChunk::heap`] when the kernel has no THP (`never`, or no sysfs
    /// entry) or the mapping fails.
    pub fn huge(size: usize) -> Result<RawChunk> {
        let Some(hp) = thp_size() else {
            return RawChunk::heap(size);
        };
        let Some(len) = size.max(1).checked_next_multiple_of(hp) else {
            return RawChunk::heap(size);
        };
        let Some(map_len) = len.checked_add(hp).and_then(NonZeroUsize::new) else {
            return RawChunk::heap(size);
        };
        // SAFETY: a new private anonymous mapping aliases nothing; all of it is owned here.
        let base = match unsafe {
            mmap_anonymous(
                None,
                map_len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        } {
            Ok(p) => p,
            Err(e) => {
                crate::debug!(size, error = %e, "huge-page chunk mapping failed; using the heap");
                return RawChunk::heap(size);
            }
        };
        // Keep the huge-page aligned `len` bytes inside the mapping; give back the rest.
        let start = base.as_ptr() as usize;
        let aligned = start.next_multiple_of(hp);
        let head = aligned - start;
        let tail = map_len.get() - head - len;
        // SAFETY: `aligned` lies in the mapping (head < hp), so the pointer is non-null.
        let ptr = unsafe { NonNull::new_unchecked(aligned as *mut u8) };
        if head > 0 {
            // SAFETY: [start, aligned) is part of the mapping made above and not used.
            let _ = unsafe { munmap(base, head) };
        }
        if tail > 0 {
            // SAFETY: [aligned + len, end of mapping) is part of the mapping and not used.
            let _ = unsafe { munmap(ptr.byte_add(len).cast::<c_void>(), tail) };
        }
        // Advice only: without it the kernel uses huge pages when THP is `always`, small
        // pages otherwise; the memory is valid either way.
        // SAFETY: [aligned, aligned + len) is mapped and owned by this chunk.
        if let Err(e) = unsafe { madvise(ptr.cast::<c_void>(), len, MmapAdvise::MADV_HUGEPAGE) } {
            crate::debug!(len, error = %e, "madvise(MADV_HUGEPAGE) failed; small pages");
        }
        Ok(RawChunk {
            ptr,
            len,
            key: 0,
            owner: Owner::Mapped,
        })
    }

    /// Wraps memory obtained elsewhere (mmap, a registered region...).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` initialized bytes, not accessed through
    /// other pointers, and stay valid until the chunk is passed back to
    /// [`ChunkAllocator::release`] (dropping the `RawChunk` does not free it).
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, key: u64) -> RawChunk {
        RawChunk {
            ptr,
            len,
            key,
            owner: Owner::External,
        }
    }

    /// Start of the chunk.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length chunk.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The user key (0 unless set).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Sets the user key, e.g. after registering the chunk with a NIC.
    pub fn set_key(&mut self, key: u64) {
        self.key = key;
    }
}

impl Drop for RawChunk {
    fn drop(&mut self) {
        match self.owner {
            // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` in `heap()` and is freed once.
            Owner::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            Owner::Mapped => {
                // SAFETY: `huge()` mapped exactly [ptr, ptr + len); it is unmapped once.
                if let Err(e) = unsafe { munmap(self.ptr.cast::<c_void>(), self.len) } {
                    crate::warn!(len = self.len, error = %e, "munmap of a pool chunk failed");
                }
            }
            Owner::External => {}
        }
    }
}

/// The size of a transparent huge page when THP can be used (`enabled` is `always` or
/// `madvise`), read once from sysfs.
pub fn thp_size() -> Option<usize> {
    static SIZE: OnceLock<Option<usize>> = OnceLock::new();
    *SIZE.get_or_init(|| {
        let dir = "/sys/kernel/mm/transparent_hugepage";
        let enabled = std::fs::read_to_string(format!("{dir}/enabled")).ok()?;
        if enabled.contains("[never]") {
            return None;
        }
        let size: usize = std::fs::read_to_string(format!("{dir}/hpage_pmd_size"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        // A PMD page is 2 MiB on x86_64, up to 512 MiB on 64 KiB-page arm64: too coarse
        // for pool chunks beyond 32 MiB.
        (size.is_power_of_two() && (64 << 10..=32 << 20).contains(&size)).then_some(size)
    })
}

impl std::fmt::Debug for RawChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawChunk")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("key", &self.key)
            .finish()
    }
}

/// Provides the memory of a pool's chunks (UCX `chunk_alloc` / `chunk_release`). An RDMA
/// transport allocates with [`RawChunk::heap`], registers the memory and stores the key with
/// [`RawChunk::set_key`]; `release` deregisters and drops the chunk.
pub trait ChunkAllocator {
    /// Returns a chunk of at least `size` bytes (a longer one is used fully).
    fn alloc(&self, size: usize) -> Result<RawChunk>;

    /// Takes back a chunk returned by `alloc`; called when the pool's storage is freed.
    fn release(&self, chunk: RawChunk) {
        drop(chunk);
    }
}

/// The default allocator: zeroed heap memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeapAllocator;

impl ChunkAllocator for HeapAllocator {
    fn alloc(&self, size: usize) -> Result<RawChunk> {
        RawChunk::heap(size)
    }
}

/// What `obj_init` learns about the chunk an element lives in.
#[derive(Clone, Copy, Debug)]
pub struct ChunkInfo {
    /// Start address of the chunk.
    pub base: *const u8,
    /// Chunk length in bytes.
    pub len: usize,
    /// The chunk's user key ([`RawChunk::key`]).
    pub key: u64,
    /// 0 for the pool's first chunk, then 1, 2...
    pub index: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_chunks_are_whole_aligned_zeroed_pages() {
        let size = 3 << 20;
        let mut c = RawChunk::huge(size).unwrap();
        match thp_size() {
            Some(hp) => {
                assert_eq!(
                    c.len(),
                    size.next_multiple_of(hp),
                    "rounded up to whole huge pages"
                );
                assert_eq!(c.as_ptr() as usize % hp, 0, "huge-page aligned");
            }
            None => assert_eq!(c.len(), size, "heap fallback without THP"),
        }
        // SAFETY: the chunk owns `len` initialized bytes and nothing else refers to them.
        let mem = unsafe { std::slice::from_raw_parts_mut(c.as_ptr(), c.len()) };
        assert!(mem.iter().all(|&b| b == 0));
        mem[0] = 1;
        *mem.last_mut().unwrap() = 2;
        c.set_key(7);
        assert_eq!(c.key(), 7);
        drop(c);
        // map, write both ends, unmap, many times: a chunk that overlapped an unmapped range
        // (a wrong head/tail trim or unmap) would fault here
        for i in 0..64u8 {
            let c = RawChunk::huge(1).unwrap();
            // SAFETY: as above.
            let mem = unsafe { std::slice::from_raw_parts_mut(c.as_ptr(), c.len()) };
            assert_eq!((mem[0], mem[mem.len() - 1]), (0, 0), "fresh chunks are zeroed");
            mem[0] = i;
            mem[mem.len() - 1] = i;
        }
    }
}
