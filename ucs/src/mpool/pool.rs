//! The pool's storage and free list, and [`PoolBuf`], the handle of an element in use.
//!
//! Element layout inside a chunk (stride = `HDR + elem_size` rounded up to `alignment`):
//! `[link: *const u8][key: u64][data: elem_size bytes][pad]`, placed so that
//! `data + align_offset` is a multiple of `alignment`. `link` is the next free element while the
//! element is free, and the owning pool (an `Rc` raw pointer) while it is lent out through
//! [`PoolBuf::into_raw`]. The header may be unaligned, so it is accessed with unaligned reads.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::ptr::{self, NonNull};
use std::rc::Rc;

use super::chunk::{ChunkAllocator, ChunkInfo, RawChunk};
use crate::{Result, Status};

/// Bytes of header before each element's data.
pub(super) const HDR: usize = 16;
const KEY_OFFSET: usize = 8;

/// Validated geometry and growth state (slow path only).
pub(super) struct Slow {
    pub alignment: usize,
    pub align_offset: usize,
    pub stride: usize,
    pub elems_per_chunk: usize,
    pub max_chunk_size: usize,
    pub max_elems: usize,
    pub grow_factor: f64,
    pub allocated: usize,
    pub chunks: Vec<RawChunk>,
    pub allocator: Box<dyn ChunkAllocator>,
    pub obj_init: Option<super::ObjInit>,
}

pub(super) struct PoolInner {
    /// Header of the first free element, or null.
    free: Cell<*mut u8>,
    in_use: Cell<usize>,
    elem_size: usize,
    pub name: String,
    pub slow: RefCell<Slow>,
}

impl PoolInner {
    pub fn new(name: String, elem_size: usize, slow: Slow) -> PoolInner {
        PoolInner {
            free: Cell::new(ptr::null_mut()),
            in_use: Cell::new(0),
            elem_size,
            name,
            slow: RefCell::new(slow),
        }
    }

    pub fn in_use(&self) -> usize {
        self.in_use.get()
    }

    pub fn elem_size(&self) -> usize {
        self.elem_size
    }

    /// Pops the free-list head (LIFO), growing by one chunk when empty.
    #[inline]
    pub fn get(self: &Rc<Self>) -> Result<PoolBuf> {
        let mut hdr = self.free.get();
        if hdr.is_null() {
            self.grow()?;
            hdr = self.free.get();
        }
        // SAFETY: a non-null free-list entry is the header of a free element inside a chunk
        // owned by this pool (chunks live as long as `self`); its link slot holds the next entry.
        let next = unsafe { ptr::read_unaligned(hdr as *const *mut u8) };
        self.free.set(next);
        self.in_use.set(self.in_use.get() + 1);
        // SAFETY: `hdr` is non-null and the data follows the header inside the same chunk.
        let data = unsafe { NonNull::new_unchecked(hdr.add(HDR)) };
        Ok(PoolBuf {
            data,
            pool: Rc::clone(self),
        })
    }

    /// Pushes an element back on the free list.
    #[inline]
    fn put(&self, data: NonNull<u8>) {
        // SAFETY: `data` came from `get`, so the header precedes it in the same chunk, and the
        // element is no longer referenced by any `PoolBuf`.
        unsafe {
            let hdr = data.as_ptr().sub(HDR);
            ptr::write_unaligned(hdr as *mut *mut u8, self.free.get());
            self.free.set(hdr);
        }
        self.in_use.set(self.in_use.get() - 1);
    }

    /// Allocates one chunk (bounded by the quota and `max_chunk_size`) and frees all of its
    /// elements. Returns how many elements were added.
    #[cold]
    #[inline(never)]
    pub fn grow(&self) -> Result<usize> {
        let mut guard = self.slow.borrow_mut();
        let s = &mut *guard;
        let quota = s.max_elems - s.allocated;
        if quota == 0 {
            return Err(Status::NoResource.into());
        }
        let slack = s.alignment - 1;
        let by_size = (s.max_chunk_size - slack) / s.stride; // >= 1, checked by MemPool::new
        let want = s.elems_per_chunk.min(quota).min(by_size);
        let size = super::chunk_bytes(want, s.stride, s.alignment).ok_or(Status::NoMemory)?;
        let chunk = match s.allocator.alloc(size) {
            Ok(c) => c,
            Err(e) => {
                return Err(e.context_with(format_args!(
                    "memory pool {}: allocating a chunk of {size} bytes",
                    self.name
                )));
            }
        };
        let base = chunk.as_ptr();
        let first_data = align_up(base as usize + HDR + s.align_offset, s.alignment) - s.align_offset;
        let first = first_data - HDR - base as usize;
        let n = (chunk.len().saturating_sub(first) / s.stride).min(quota);
        if n == 0 {
            crate::error!(pool = %self.name, size, got = chunk.len(),
                "memory pool chunk allocator returned a chunk too small for one element");
            s.allocator.release(chunk);
            return Err(Status::NoMemory.into());
        }
        let info = ChunkInfo {
            base,
            len: chunk.len(),
            key: chunk.key(),
            index: s.chunks.len(),
        };
        // Keep the chunk before touching elements so a panicking obj_init cannot free it early.
        s.chunks.push(chunk);
        for i in 0..n {
            // SAFETY: element `i` lies within the chunk: `first + n * stride <= len`.
            let hdr = unsafe { base.add(first + i * s.stride) };
            // SAFETY: the header's 16 bytes are in bounds (see above); unaligned write is allowed.
            unsafe { ptr::write_unaligned(hdr.add(KEY_OFFSET) as *mut u64, info.key) };
            if let Some(init) = s.obj_init.as_mut() {
                // SAFETY: the data range is in bounds, initialized (chunk contract) and not yet
                // reachable through the free list or any `PoolBuf`.
                let data = unsafe { std::slice::from_raw_parts_mut(hdr.add(HDR), self.elem_size) };
                init(data, &info);
            }
        }
        // Link in reverse so consecutive gets return ascending addresses.
        for i in (0..n).rev() {
            // SAFETY: as above; the element becomes free now.
            unsafe {
                let hdr = base.add(first + i * s.stride);
                ptr::write_unaligned(hdr as *mut *mut u8, self.free.get());
                self.free.set(hdr);
            }
        }
        s.allocated += n;
        let next = (s.elems_per_chunk.min(n) as f64 * s.grow_factor + 0.5) as usize;
        s.elems_per_chunk = next.max(1);
        crate::trace!(pool = %self.name, elems = n, total = s.allocated, "memory pool grew");
        Ok(n)
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let s = self.slow.get_mut();
        for chunk in s.chunks.drain(..) {
            s.allocator.release(chunk);
        }
    }
}

fn align_up(v: usize, align: usize) -> usize {
    (v + align - 1) & !(align - 1)
}

/// An element taken from a [`MemPool`](super::MemPool): `elem_size` bytes, returned to the
/// pool's free list on drop. It keeps the pool's storage alive, so it may outlive the pool.
pub struct PoolBuf {
    data: NonNull<u8>,
    pool: Rc<PoolInner>,
}

impl PoolBuf {
    /// Start of the element's data.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }

    /// Start of the element's data, writable.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_ptr()
    }

    /// Copies `data` into the element at `offset`, as much as fits; returns the bytes copied.
    /// (What a device does to a posted buffer; no slice over the element is formed.)
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> usize {
        let cap = self.capacity();
        if offset >= cap {
            return 0;
        }
        let n = data.len().min(cap - offset);
        // SAFETY: `offset + n <= capacity`, inside this element, which `&mut self` owns; no
        // reference into the element exists (this type never forms one), and `data` cannot
        // overlap it for the same reason.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.data.as_ptr().add(offset), n) };
        n
    }

    /// Bytes in the element (the pool's element size), without forming a slice over them
    /// (a device may own them, e.g. a posted receive buffer).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.pool.elem_size()
    }

    /// The key of the chunk holding this element ([`RawChunk::key`]).
    #[inline]
    pub fn chunk_key(&self) -> u64 {
        // SAFETY: the header precedes the data in the same live chunk; the key slot is written
        // once at grow time and never while the element is in use.
        unsafe { ptr::read_unaligned(self.data.as_ptr().sub(HDR - KEY_OFFSET) as *const u64) }
    }

    /// Gives up ownership without returning the element; recover it with [`PoolBuf::from_raw`].
    /// Used to pass descriptors through C-style interfaces.
    #[inline]
    pub fn into_raw(self) -> NonNull<u8> {
        let this = std::mem::ManuallyDrop::new(self);
        let data = this.data;
        // SAFETY: moving the Rc out of a ManuallyDrop that is never used again.
        let pool = unsafe { ptr::read(&this.pool) };
        // SAFETY: the link slot of an in-use element is unused; it now owns one Rc reference.
        unsafe {
            ptr::write_unaligned(
                data.as_ptr().sub(HDR) as *mut *const PoolInner,
                Rc::into_raw(pool),
            );
        }
        data
    }

    /// Takes back an element released by [`PoolBuf::into_raw`].
    ///
    /// # Safety
    /// `data` must come from `into_raw` and must not have been passed to `from_raw` before.
    // inline: transports return every received buffer through here (no cross-crate call)
    #[inline]
    pub unsafe fn from_raw(data: NonNull<u8>) -> PoolBuf {
        // SAFETY: per the contract, the link slot holds the pointer stored by `into_raw`.
        let pool = unsafe {
            Rc::from_raw(ptr::read_unaligned(
                data.as_ptr().sub(HDR) as *const *const PoolInner
            ))
        };
        PoolBuf { data, pool }
    }
}

impl std::ops::Deref for PoolBuf {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the element's `elem_size` bytes are initialized and owned exclusively by this
        // handle until it is dropped.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.pool.elem_size()) }
    }
}

impl std::ops::DerefMut for PoolBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.pool.elem_size()) }
    }
}

impl Drop for PoolBuf {
    #[inline]
    fn drop(&mut self) {
        self.pool.put(self.data);
    }
}

impl std::fmt::Debug for PoolBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuf")
            .field("pool", &self.pool.name)
            .field("ptr", &self.data)
            .field("len", &self.pool.elem_size())
            .finish()
    }
}
