//! Memory registration (`ibv_reg_mr` / `ibv_dereg_mr`) and an owned registered buffer.

use crate::error::{fail, invalid, last_errno, rc_errno, CallKind};
use crate::pd::ProtectionDomain;
use crate::wr::Sge;
use rdma_sys::*;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::BitOr;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::{Result, Status};

/// Memory region access rights (`enum ibv_access_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No remote access, HCA may only read (send source).
    pub const NONE: AccessFlags = AccessFlags(0);
    /// HCA may write: receive buffers, RDMA READ / atomic result buffers.
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// Peers may RDMA WRITE into it (requires LOCAL_WRITE).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// Peers may RDMA READ from it.
    pub const REMOTE_READ: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// Peers may run atomics on it (requires LOCAL_WRITE).
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// PCIe relaxed ordering allowed (UCX sets it where supported).
    pub const RELAXED_ORDERING: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0);
    /// What UCX registers user memory with: local write + remote write/read/atomic.
    pub const ALL_REMOTE: AccessFlags =
        AccessFlags(Self::LOCAL_WRITE.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0);

    /// The raw verbs bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// True when every bit of `other` is set in `self`.
    pub fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

/// A registered memory region; deregistered on drop (before its PD, which it holds).
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an MR handle is usable from any thread; ibv_dereg_mr is thread-safe and the
// cached keys are plain values.
unsafe impl Send for MemoryRegion {}
// SAFETY: &MemoryRegion only reads cached keys.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `[addr, addr + len)` with `access`.
    ///
    /// # Safety
    /// The memory must stay allocated (and not be remapped) until the region is dropped,
    /// and, when remote or local-write access is granted, the caller must not hold Rust
    /// references into it while the HCA may write it (RDMA WRITE, receives, READ/atomic
    /// results): read and write it through raw pointers only.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        let needs_local_write = AccessFlags(AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0);
        if access.0 & needs_local_write.0 != 0 && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(invalid(
                "MemoryRegion::register",
                format_args!("REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE; add AccessFlags::LOCAL_WRITE"),
                Status::InvalidParam,
            ));
        }
        // SAFETY: valid PD; the caller guarantees the range stays valid while registered.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access.0 as i32) };
        let Some(mr) = NonNull::new(mr) else {
            return Err(fail(
                "ibv_reg_mr",
                format_args!(
                    "{} addr={addr:p} len={len} access={:#x}",
                    pd.context().name(),
                    access.0
                ),
                last_errno(),
                CallKind::Control,
            ));
        };
        // SAFETY: a freshly returned, valid ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(MemoryRegion {
            mr,
            addr: addr as u64,
            len,
            lkey,
            rkey,
            _pd: pd.clone(),
        })
    }

    /// Local key (for SGEs).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key (for peers' RDMA/atomic work requests).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Start address of the region.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length registration.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather entry for `[offset, offset + len)` of the region (bounds-checked).
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        match offset.checked_add(len as usize) {
            Some(end) if end <= self.len => Ok(Sge::new(self.addr + offset as u64, len, self.lkey)),
            _ => Err(invalid(
                "MemoryRegion::sge",
                format_args!("range {offset}+{len} is outside the {}-byte region", self.len),
                Status::InvalidParam,
            )),
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: the MR is valid and deregistered exactly once; the PD is still alive.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_dereg_mr",
                format_args!("addr={:#x} len={}", self.addr, self.len),
                rc_errno(rc),
                CallKind::Control,
            );
        }
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemoryRegion({:#x}+{}, lkey={:#x}, rkey={:#x})",
            self.addr, self.len, self.lkey, self.rkey
        )
    }
}

/// Page-aligned zeroed heap memory; freed on drop.
struct AlignedAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for AlignedAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated with exactly this layout in RegisteredBuffer::new.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// An owned, page-aligned, zero-initialised buffer registered as one memory region.
///
/// The HCA may write it at any time, so it is only accessed by copying (`read`/`write`),
/// never through references.
pub struct RegisteredBuffer {
    // field order matters: the region is deregistered before the memory is freed
    mr: MemoryRegion,
    mem: AlignedAlloc,
}

// SAFETY: the buffer is only accessed by copies through raw pointers; the HCA is the only
// other writer and Rust never holds references into the memory.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: as above.
unsafe impl Sync for RegisteredBuffer {}

impl RegisteredBuffer {
    /// Allocates `len` bytes (page-aligned, zeroed) and registers them with `access`.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<RegisteredBuffer> {
        let layout = match Layout::from_size_align(len.max(1), 4096) {
            Ok(l) => l,
            Err(_) => {
                return Err(invalid(
                    "RegisteredBuffer::new",
                    format_args!("length {len} too large"),
                    Status::InvalidParam,
                ))
            }
        };
        // SAFETY: layout has non-zero size.
        let Some(ptr) = NonNull::new(unsafe { alloc_zeroed(layout) }) else {
            ucs::error!(
                "RegisteredBuffer::new: cannot allocate {len} bytes -> {}",
                Status::NoMemory.name()
            );
            return Err(Status::NoMemory.into());
        };
        let mem = AlignedAlloc { ptr, layout };
        // SAFETY: the memory lives in `mem`, which is dropped after `mr`; it is only
        // accessed through raw-pointer copies.
        let mr = unsafe { MemoryRegion::register(pd, mem.ptr.as_ptr(), len, access)? };
        Ok(RegisteredBuffer { mr, mem })
    }

    /// The memory region (keys, SGEs).
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// Start address (for SGEs and for peers' `remote_addr`).
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// A scatter/gather entry for `[offset, offset + len)` (bounds-checked).
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        self.mr.sge(offset, len)
    }

    fn check(&self, what: &str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(invalid(
                what,
                format_args!("range {offset}+{len} is outside the {}-byte buffer", self.len()),
                Status::InvalidParam,
            )),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check("RegisteredBuffer::read", offset, dst.len())?;
        // SAFETY: in bounds (checked); the source is our allocation, `dst` a distinct slice.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mem.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check("RegisteredBuffer::write", offset, src.len())?;
        // SAFETY: in bounds (checked); the destination is our allocation, `src` a distinct slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.mem.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Reads a native-endian u64 at `offset` (atomic operands and results).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes a native-endian u64 at `offset`.
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<()> {
        self.write(offset, &v.to_ne_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_combine() {
        let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        assert!(a.contains(AccessFlags::LOCAL_WRITE));
        assert!(!a.contains(AccessFlags::REMOTE_WRITE));
        assert_eq!(AccessFlags::ALL_REMOTE.bits(), 0xf);
        assert_eq!(AccessFlags::NONE.bits(), 0);
    }
}
