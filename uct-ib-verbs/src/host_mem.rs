//! Registering memory the transports do not own: memory lent by the uct host (`Md::mem_reg`)
//! and the chunks of `ucs::mpool` pools (send/receive descriptors).

use crate::mr::{AccessFlags, MemoryRegion};
use crate::pd::ProtectionDomain;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use ucs::mpool::{ChunkAllocator, RawChunk};
use ucs::Result;

/// Registers `[addr, addr + len)` that the uct host lent through `Md::mem_reg`.
///
/// The uct contract (`uct_transport::traits::Md::mem_reg`) keeps the memory valid until
/// `mem_dereg`, where the caller drops the region; the transport only touches it through
/// the HCA and through the raw-pointer copies of `uct_transport::iov::Iov`. Like `Md::mem_reg` itself,
/// this is a safe function taking a raw pointer under that contract; it never dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn register_host_memory(
    pd: &Arc<ProtectionDomain>,
    addr: *mut u8,
    len: usize,
    access: AccessFlags,
) -> Result<MemoryRegion> {
    // SAFETY: the host keeps the range allocated until mem_dereg drops the region (see above),
    // and Rust code of this crate holds no references into it.
    unsafe { MemoryRegion::register(pd, addr, len, access) }
}

/// A `ucs::mpool` chunk allocator whose chunks are registered memory regions: the chunk key
/// ([`RawChunk::key`]) is the lkey, so every element of the pool can be used in SGEs. With
/// `thp`, chunks are whole transparent huge pages ([`RawChunk::huge`]), else heap memory.
///
/// Elements are only read through `PoolBuf` after the HCA finished writing them (after the
/// receive or READ/atomic completion), so no Rust reference overlaps an HCA write.
pub struct MrChunkAllocator {
    pd: Arc<ProtectionDomain>,
    access: AccessFlags,
    thp: bool,
    regions: RefCell<HashMap<usize, MemoryRegion>>,
}

impl MrChunkAllocator {
    /// Chunks registered on `pd` with `access` (receive buffers need `LOCAL_WRITE`), in
    /// transparent huge pages when `thp` is set.
    pub fn new(pd: &Arc<ProtectionDomain>, access: AccessFlags, thp: bool) -> MrChunkAllocator {
        MrChunkAllocator {
            pd: pd.clone(),
            access,
            thp,
            regions: RefCell::new(HashMap::new()),
        }
    }
}

impl ChunkAllocator for MrChunkAllocator {
    fn alloc(&self, size: usize) -> Result<RawChunk> {
        let mut chunk = if self.thp {
            RawChunk::huge(size)?
        } else {
            RawChunk::heap(size)?
        };
        // SAFETY: the chunk's memory is freed only in `release`, after its region is
        // dropped; the pool accesses elements only while the HCA does not write them.
        let mr = unsafe { MemoryRegion::register(&self.pd, chunk.as_ptr(), chunk.len(), self.access)? };
        chunk.set_key(mr.lkey() as u64);
        self.regions.borrow_mut().insert(chunk.as_ptr() as usize, mr);
        Ok(chunk)
    }

    fn release(&self, chunk: RawChunk) {
        // deregister before the memory goes back to the heap
        let mr = self.regions.borrow_mut().remove(&(chunk.as_ptr() as usize));
        drop(mr);
        drop(chunk);
    }
}
