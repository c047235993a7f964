//! Chunks: the raw memory blocks a [`MemPool`](super::MemPool) carves into elements, and the
//! allocator hook that provides them (default: zeroed, 64-byte aligned heap memory).
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::{Result, Status};

/// Alignment of heap chunks; the pool adds its own padding for larger element alignments.
const HEAP_ALIGN: usize = 64;

/// Who frees a chunk's memory when the [`RawChunk`] is dropped.
enum Owner {
    /// Allocated by [`RawChunk::heap`]; freed on drop.
    Heap(Layout),
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
                tracing::error!(size, "memory pool chunk size is too large for the allocator");
                return Err(Status::NoMemory);
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
                tracing::error!(size, "out of memory allocating a memory pool chunk");
                Err(Status::NoMemory)
            }
        }
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
        if let Owner::Heap(layout) = self.owner {
            // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` in `heap()` and is freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
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
