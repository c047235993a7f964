//! Memory pool of fixed-size elements (UCX `ucs_mpool`), used for send/receive descriptors.
//!
//! Elements are carved out of chunks; `get` pops a LIFO free list and grows the pool by one chunk
//! when it is empty (next chunk size: `min(elems_per_chunk, last chunk) * grow_factor + 0.5`,
//! UCX's rule), up to `max_elems` (then `Err(NoResource)`). Neither `get` nor dropping a
//! [`PoolBuf`] allocates, except for growth. Not thread-safe: a pool and its buffers are `!Send`.
//!
//! Dropping the [`MemPool`] while buffers are out logs a leak report and keeps the storage alive
//! until the last buffer comes back, so outstanding buffers stay valid.

mod chunk;
mod pool;

use std::cell::Cell;
use std::rc::Rc;

pub use chunk::{thp_size, ChunkAllocator, ChunkInfo, HeapAllocator, RawChunk};
pub use pool::PoolBuf;

use crate::{Error, Result, Status};
use pool::{PoolInner, Slow, HDR};

/// Per-element initializer, called once for every element when its chunk is allocated.
pub type ObjInit = Box<dyn FnMut(&mut [u8], &ChunkInfo)>;

/// Creation parameters of a [`MemPool`].
pub struct MemPoolParams {
    /// Name used in logs and leak reports.
    pub name: String,
    /// Bytes per element.
    pub elem_size: usize,
    /// Alignment (a power of 2) of the byte at `align_offset` in each element.
    pub alignment: usize,
    /// Offset inside the element that is aligned (e.g. the payload after a descriptor header).
    pub align_offset: usize,
    /// Elements in the first chunk.
    pub elems_per_chunk: usize,
    /// Upper bound of one chunk's size in bytes (`usize::MAX`: none).
    pub max_chunk_size: usize,
    /// Quota of elements over the pool's life (`usize::MAX`: unlimited).
    pub max_elems: usize,
    /// Growth factor of chunk sizes (1.0 keeps them constant).
    pub grow_factor: f64,
    /// Optional per-element initializer.
    pub obj_init: Option<ObjInit>,
    /// Chunk allocator; `None` means [`HeapAllocator`].
    pub allocator: Option<Box<dyn ChunkAllocator>>,
}

impl MemPoolParams {
    /// Defaults: 8-byte alignment at offset 0, 128 elements per chunk, no limits, factor 1.
    pub fn new(name: impl Into<String>, elem_size: usize) -> MemPoolParams {
        MemPoolParams {
            name: name.into(),
            elem_size,
            alignment: 8,
            align_offset: 0,
            elems_per_chunk: 128,
            max_chunk_size: usize::MAX,
            max_elems: usize::MAX,
            grow_factor: 1.0,
            obj_init: None,
            allocator: None,
        }
    }

    /// Bytes one element takes in a chunk (its header and padding included); `None` when
    /// that overflows or `alignment` is not a power of 2.
    pub(crate) fn stride(&self) -> Option<usize> {
        let align = self.alignment;
        if !align.is_power_of_two() {
            return None;
        }
        HDR.checked_add(self.elem_size)
            .and_then(|v| v.checked_add(align - 1))
            .map(|v| v & !(align - 1))
    }

    /// Elements per chunk so that each chunk fills the whole pages of `page` bytes (a huge
    /// page, for a chunk allocator that maps them) that `elems_per_chunk` elements round down
    /// to; `None` when those elements take less than one page, or no element fits a page.
    pub fn elems_filling_pages(&self, page: usize) -> Option<usize> {
        let stride = self.stride()?;
        let slack = chunk_bytes(0, stride, self.alignment)?;
        let pages = chunk_bytes(self.elems_per_chunk, stride, self.alignment).unwrap_or(usize::MAX) / page;
        let n = pages.saturating_mul(page).saturating_sub(slack) / stride;
        (n > 0).then_some(n)
    }
}

/// Bytes of a chunk holding `elems` elements of `stride` bytes: room to align the first one
/// (`alignment - 1`) included. What [`MemPool`] asks its chunk allocator for.
pub(crate) fn chunk_bytes(elems: usize, stride: usize, alignment: usize) -> Option<usize> {
    elems.checked_mul(stride)?.checked_add(alignment - 1)
}

impl std::fmt::Debug for MemPoolParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPoolParams")
            .field("name", &self.name)
            .field("elem_size", &self.elem_size)
            .field("alignment", &self.alignment)
            .field("align_offset", &self.align_offset)
            .field("elems_per_chunk", &self.elems_per_chunk)
            .field("max_chunk_size", &self.max_chunk_size)
            .field("max_elems", &self.max_elems)
            .field("grow_factor", &self.grow_factor)
            .field("obj_init", &self.obj_init.is_some())
            .field("allocator", &self.allocator.is_some())
            .finish()
    }
}

/// Counters of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemPoolStats {
    /// Elements carved so far (free + in use).
    pub allocated: usize,
    /// Elements currently held by [`PoolBuf`]s.
    pub in_use: usize,
    /// Chunks allocated.
    pub chunks: usize,
    /// Elements the next chunk will hold (before quota and size limits).
    pub next_chunk_elems: usize,
}

/// A memory pool. See the [module docs](self).
pub struct MemPool {
    inner: Rc<PoolInner>,
    reported: Cell<bool>,
}

fn invalid(name: &str, what: &str) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("memory pool {name}: invalid parameters: {what}"),
    )
}

impl MemPool {
    /// Validates `params` and creates an empty pool (memory is allocated on the first `get`).
    pub fn new(params: MemPoolParams) -> Result<MemPool> {
        let p = params;
        let name = p.name.as_str();
        if !p.alignment.is_power_of_two() {
            return Err(invalid(name, "alignment must be a power of 2"));
        }
        if p.align_offset > p.elem_size {
            return Err(invalid(name, "align_offset must not exceed elem_size"));
        }
        if p.elems_per_chunk == 0 || p.max_elems == 0 {
            return Err(invalid(name, "elems_per_chunk and max_elems must be at least 1"));
        }
        if !(p.grow_factor.is_finite() && p.grow_factor > 0.0) {
            return Err(invalid(
                name,
                "grow_factor must be a positive number (1.0 = constant)",
            ));
        }
        let stride = p
            .stride()
            .ok_or_else(|| invalid(name, "elem_size is too large"))?;
        let fits = chunk_bytes(1, stride, p.alignment).is_some_and(|m| p.max_chunk_size >= m);
        if !fits {
            return Err(invalid(
                name,
                "max_chunk_size is too small for one element; raise it or shrink elem_size",
            ));
        }
        let slow = Slow {
            alignment: p.alignment,
            align_offset: p.align_offset,
            stride,
            elems_per_chunk: p.elems_per_chunk,
            max_chunk_size: p.max_chunk_size,
            max_elems: p.max_elems,
            grow_factor: p.grow_factor,
            allocated: 0,
            chunks: Vec::new(),
            allocator: p.allocator.unwrap_or_else(|| Box::new(HeapAllocator)),
            obj_init: p.obj_init,
        };
        Ok(MemPool {
            inner: Rc::new(PoolInner::new(p.name, p.elem_size, slow)),
            reported: Cell::new(false),
        })
    }

    /// Takes an element; `Err(NoResource)` once `max_elems` are in use.
    #[inline]
    pub fn get(&self) -> Result<PoolBuf> {
        self.inner.get()
    }

    /// Adds one chunk now (e.g. to pre-post receive buffers); returns the number of new elements.
    pub fn grow(&self) -> Result<usize> {
        self.inner.grow()
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Bytes per element.
    pub fn elem_size(&self) -> usize {
        self.inner.elem_size()
    }

    /// Current counters.
    pub fn stats(&self) -> MemPoolStats {
        let s = self.inner.slow.borrow();
        MemPoolStats {
            allocated: s.allocated,
            in_use: self.inner.in_use(),
            chunks: s.chunks.len(),
            next_chunk_elems: s.elems_per_chunk,
        }
    }

    /// Destroys the pool and returns the number of buffers still outstanding (0 when clean);
    /// a non-zero count is also logged as a warning. Their memory stays valid until returned.
    pub fn destroy(self) -> usize {
        self.leak_report()
    }

    fn leak_report(&self) -> usize {
        if self.reported.replace(true) {
            return 0;
        }
        let leaked = self.inner.in_use();
        if leaked > 0 {
            crate::warn!(
                pool = %self.inner.name,
                leaked,
                "leak report: memory pool '{}' destroyed with {} buffer(s) still in use; its memory \
                 is kept until they are dropped",
                self.inner.name,
                leaked
            );
        }
        leaked
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        self.leak_report();
    }
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("name", &self.inner.name)
            .field("elem_size", &self.inner.elem_size())
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn chunks_sized_to_whole_pages() {
        const MIB2: usize = 2 << 20;
        let with = |elem_size: usize, per_chunk: usize| {
            let mut p = MemPoolParams::new("pages", elem_size);
            p.alignment = 64;
            p.elems_per_chunk = per_chunk;
            p
        };
        // rc_verbs rx: 256 buffers of 8 KiB + 64 (stride 8320) round down to one 2 MiB page
        let p = with(8192 + 64, 256);
        assert_eq!(p.stride(), Some(8320));
        let n = p.elems_filling_pages(MIB2).unwrap();
        assert_eq!(n, 252);
        let bytes = |n| chunk_bytes(n, 8320, 64).unwrap();
        assert!(bytes(n) <= MIB2 && bytes(n + 1) > MIB2, "fills the page, no more");
        // more pages when asked for
        assert_eq!(with(8192 + 64, 600).elems_filling_pages(MIB2), Some(504));
        // less than a page's worth (rc tx: 128 buffers, 1 MiB) is left alone
        assert_eq!(with(8192 + 64, 128).elems_filling_pages(MIB2), None);
        // an element larger than the page: whole pages for as many as fit
        assert_eq!(with(3 << 20, 1).elems_filling_pages(MIB2), None);
        assert_eq!(with(3 << 20, 2).elems_filling_pages(MIB2), Some(1));
    }

    fn params(elem_size: usize, per_chunk: usize, max: usize) -> MemPoolParams {
        let mut p = MemPoolParams::new("test", elem_size);
        p.elems_per_chunk = per_chunk;
        p.max_elems = max;
        p
    }

    #[test]
    fn basic_exhaust_release_reuse_alignment() {
        let mut p = params(100, 6, 18);
        p.alignment = 64;
        p.align_offset = 8;
        let mp = MemPool::new(p).unwrap();
        let mut bufs: Vec<PoolBuf> = (0..18).map(|_| mp.get().unwrap()).collect();
        assert_eq!(mp.get().unwrap_err(), Status::NoResource);
        let addrs: HashSet<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        assert_eq!(addrs.len(), 18);
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!((b.as_ptr() as usize + 8) % 64, 0, "offset 8 must be 64-aligned");
            assert_eq!(b.len(), 100);
            b.fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8), "elements must not overlap");
        }
        assert_eq!(
            mp.stats(),
            MemPoolStats {
                allocated: 18,
                in_use: 18,
                chunks: 3,
                next_chunk_elems: 6
            }
        );
        bufs.clear();
        assert_eq!(mp.stats().in_use, 0);
        let again: Vec<PoolBuf> = (0..18).map(|_| mp.get().unwrap()).collect();
        let addrs2: HashSet<usize> = again.iter().map(|b| b.as_ptr() as usize).collect();
        assert_eq!(
            addrs, addrs2,
            "released elements are reused, nothing new allocated"
        );
        assert_eq!(mp.stats().chunks, 3);
        assert_eq!(mp.get().unwrap_err(), Status::NoResource);
    }

    #[test]
    fn lifo_reuse() {
        let mp = MemPool::new(params(32, 4, usize::MAX)).unwrap();
        let a = mp.get().unwrap();
        let _b = mp.get().unwrap();
        let pa = a.as_ptr();
        drop(a);
        assert_eq!(mp.get().unwrap().as_ptr(), pa);
    }

    #[test]
    fn grow_with_factor() {
        let mut p = params(24, 4, usize::MAX);
        p.grow_factor = 2.0;
        let mp = MemPool::new(p).unwrap();
        let mut held = Vec::new();
        let mut chunk_sizes = Vec::new();
        let mut last_alloc = 0;
        for _ in 0..(4 + 8 + 16 + 32) {
            held.push(mp.get().unwrap());
            let st = mp.stats();
            if st.allocated != last_alloc {
                chunk_sizes.push(st.allocated - last_alloc);
                last_alloc = st.allocated;
            }
        }
        assert_eq!(chunk_sizes, vec![4, 8, 16, 32]);
        assert_eq!(mp.stats().next_chunk_elems, 64);
    }

    #[test]
    fn grow_factor_one_and_quota_tail() {
        let mp = MemPool::new(params(8, 6, 10)).unwrap();
        let held: Vec<_> = (0..10).map(|_| mp.get().unwrap()).collect();
        let st = mp.stats();
        assert_eq!((st.allocated, st.chunks), (10, 2), "chunks of 6 then 4 (quota)");
        // UCX rule: next = min(6, 4) * 1.0 + 0.5 -> 4
        assert_eq!(st.next_chunk_elems, 4);
        assert_eq!(mp.get().unwrap_err(), Status::NoResource);
        drop(held);
    }

    #[test]
    fn max_chunk_size_bounds_elements() {
        let mut p = params(48, 100, usize::MAX);
        p.max_chunk_size = 64 * 3 + 7; // stride 64 (16 hdr + 48 data), 7 bytes of alignment slack
        let mp = MemPool::new(p).unwrap();
        let _b = mp.get().unwrap();
        assert_eq!(mp.stats().allocated, 3);

        let mut p = params(48, 100, usize::MAX);
        p.max_chunk_size = 32;
        assert_eq!(MemPool::new(p).unwrap_err(), Status::InvalidParam);
    }

    #[test]
    fn invalid_params() {
        let bad: Vec<fn(&mut MemPoolParams)> = vec![
            |p| p.alignment = 3,
            |p| p.alignment = 0,
            |p| p.align_offset = 1000,
            |p| p.elems_per_chunk = 0,
            |p| p.max_elems = 0,
            |p| p.grow_factor = f64::NAN,
            |p| p.grow_factor = 0.0,
            |p| p.elem_size = usize::MAX,
        ];
        for f in bad {
            let mut p = params(64, 4, 100);
            f(&mut p);
            let shown = format!("{p:?}");
            assert_eq!(MemPool::new(p).unwrap_err(), Status::InvalidParam, "{shown}");
        }
    }

    #[test]
    fn infinite_get_put() {
        let mp = MemPool::new(params(64, 32, usize::MAX)).unwrap();
        let mut held = Vec::with_capacity(100);
        for i in 0..200_000usize {
            if held.len() < 100 && i % 3 != 0 {
                held.push(mp.get().unwrap());
            } else if let Some(b) = held.pop() {
                drop(b);
            }
        }
        let st = mp.stats();
        assert!(
            st.allocated <= 128,
            "pool must not grow past the high-water mark: {st:?}"
        );
        assert_eq!(st.in_use, held.len());
    }

    #[test]
    fn leak_report_keeps_memory_alive() {
        use std::cell::RefCell;
        struct Counting(Rc<RefCell<(usize, usize)>>);
        impl ChunkAllocator for Counting {
            fn alloc(&self, size: usize) -> Result<RawChunk> {
                self.0.borrow_mut().0 += 1;
                RawChunk::heap(size)
            }
            fn release(&self, chunk: RawChunk) {
                self.0.borrow_mut().1 += 1;
                drop(chunk);
            }
        }
        let counts = Rc::new(RefCell::new((0, 0)));
        let mut p = params(16, 4, usize::MAX);
        p.allocator = Some(Box::new(Counting(counts.clone())));
        let mp = MemPool::new(p).unwrap();
        let mut kept: Vec<_> = (0..3).map(|_| mp.get().unwrap()).collect();
        drop(mp.get().unwrap());
        assert_eq!(mp.destroy(), 3);
        assert_eq!(
            *counts.borrow(),
            (1, 0),
            "storage must outlive the pool while buffers are out"
        );
        kept[0].fill(0xaa); // still valid memory
        kept.pop();
        assert_eq!(counts.borrow().1, 0);
        kept.clear();
        assert_eq!(*counts.borrow(), (1, 1), "last buffer returned -> chunk released");

        let clean = MemPool::new(params(16, 4, usize::MAX)).unwrap();
        drop(clean.get().unwrap());
        assert_eq!(clean.destroy(), 0);
    }

    #[test]
    fn custom_allocator_key_and_obj_init_once_per_element() {
        use std::cell::RefCell;
        struct Keyed(Cell<u64>);
        impl ChunkAllocator for Keyed {
            fn alloc(&self, size: usize) -> Result<RawChunk> {
                let mut c = RawChunk::heap(size)?;
                self.0.set(self.0.get() + 1);
                c.set_key(0x1000 + self.0.get());
                Ok(c)
            }
        }
        let inits = Rc::new(RefCell::new(Vec::<(usize, u64)>::new()));
        let inits2 = inits.clone();
        let mut p = params(32, 5, 12);
        p.allocator = Some(Box::new(Keyed(Cell::new(0))));
        p.obj_init = Some(Box::new(move |data: &mut [u8], info: &ChunkInfo| {
            data[..8].copy_from_slice(&info.key.to_le_bytes());
            inits2.borrow_mut().push((data.as_ptr() as usize, info.key));
            assert!(info.len >= 32 && !info.base.is_null());
        }));
        let mp = MemPool::new(p).unwrap();
        let bufs: Vec<_> = (0..12).map(|_| mp.get().unwrap()).collect();
        for b in &bufs {
            let stamped = u64::from_le_bytes(b[..8].try_into().unwrap());
            assert_eq!(stamped, b.chunk_key());
            assert!((0x1001..=0x1003).contains(&stamped));
        }
        drop(bufs);
        let again: Vec<_> = (0..12).map(|_| mp.get().unwrap()).collect();
        let recorded = inits.borrow();
        assert_eq!(recorded.len(), 12, "obj_init runs once per element, not per get");
        let uniq: HashSet<usize> = recorded.iter().map(|r| r.0).collect();
        assert_eq!(uniq.len(), 12);
        drop(again);
    }

    #[test]
    fn into_raw_from_raw_round_trip() {
        let mp = MemPool::new(params(16, 2, 2)).unwrap();
        let mut b = mp.get().unwrap();
        b[0] = 42;
        let key = b.chunk_key();
        let raw = b.into_raw();
        assert_eq!(mp.stats().in_use, 1);
        drop(mp); // pool gone, element still owned through `raw`
                  // SAFETY: `raw` comes from `into_raw` and is used once.
        #[allow(unsafe_code)]
        let b = unsafe { PoolBuf::from_raw(raw) };
        assert_eq!(b[0], 42);
        assert_eq!(b.chunk_key(), key);
    }
}
