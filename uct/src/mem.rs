//! Registered memory: a buffer owned by rucx and registered with a memory domain, so transports
//! can read and write it directly (zcopy, RMA targets, atomics).
//!
//! Because peers and transports may write this memory at any time, it is never lent out as a
//! Rust reference: data moves in and out by copy (`read`, `write`, `to_vec`), which keeps the
//! aliasing rules intact. This module holds the raw memory and is one of the unsafe modules.
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::c_void;
use std::rc::Rc;

use ucs::{Result, Status};

use crate::component::Md;
use uct_transport::types::MemAccess;

/// Alignment of registered buffers (a cache line; RDMA wants at least 8 for atomics).
pub const MEM_ALIGN: usize = 64;

/// Who owns the bytes: rucx's own allocation, or a vector the application handed over.
enum Storage {
    Alloc(Layout),
    /// Never touched while registered (its heap buffer is what `ptr` points to); taken back by
    /// [`Mem::into_vec`] after deregistration.
    Vec(Option<Vec<u8>>),
    /// Another registration's bytes, registered again on a further memory domain: kept alive
    /// (and unchanged) while this one exists. Held, never read.
    Alias(#[allow(dead_code)] Rc<MemInner>),
    /// Bytes the application lends, read-only ([`LentBytes`]) or `writable`
    /// ([`LentBytesMut`]): given back by [`Mem::into_lent`].
    Lent {
        value: Option<Box<dyn std::any::Any>>,
        writable: bool,
    },
}

/// Bytes an application lends to a transport for the time of an operation (zero-copy sends,
/// rendezvous): readable at the same address, unchanged, for as long as the value lives.
/// Several operations may read one buffer at once (an `Arc<[u8]>` sent many times).
///
/// # Safety
/// `lent_bytes` must return the same slice (address, length, contents) on every call for the
/// value's lifetime: nothing may move, free or write those bytes while the value exists
/// (a value moved by its owner must keep them where they are, as a heap buffer does).
pub unsafe trait LentBytes: 'static {
    /// The bytes.
    fn lent_bytes(&self) -> &[u8];
}

// SAFETY: a vector owned by the lender is never written or reallocated (only `&self` is
// handed out); its heap buffer stays put when the `Vec` moves.
unsafe impl LentBytes for Vec<u8> {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: as for `Vec<u8>`: a boxed slice's heap buffer does not move with the box.
unsafe impl LentBytes for Box<[u8]> {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: an `Arc<[u8]>` is immutable and its allocation lives while any clone does.
unsafe impl LentBytes for std::sync::Arc<[u8]> {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: as for `Arc<[u8]>`.
unsafe impl LentBytes for Rc<[u8]> {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: static bytes never move or change.
unsafe impl LentBytes for &'static [u8] {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: the box's contents (a `LentBytes`, stable by its own contract) do not move with it.
unsafe impl<T: LentBytes + ?Sized> LentBytes for Box<T> {
    fn lent_bytes(&self) -> &[u8] {
        (**self).lent_bytes()
    }
}

/// Memory an application lends for an operation to write (a receive's destination, an RMA
/// target): writable at the same address, by rucx and its peers only, for as long as the value
/// lives. Its previous contents are not cleared first: only what the operation writes changes.
///
/// # Safety
/// `lent_bytes_mut` must return the same slice (address and length) on every call for the
/// value's lifetime, and nothing else may read, write, move or free those bytes while the value
/// exists (a value moved by its owner must keep them where they are, as a heap buffer does).
pub unsafe trait LentBytesMut: 'static {
    /// The bytes.
    fn lent_bytes_mut(&mut self) -> &mut [u8];
}

// SAFETY: only the lender's `&mut self` reaches the vector's heap buffer, which is never
// reallocated here (its length is kept) and does not move with the `Vec`.
unsafe impl LentBytesMut for Vec<u8> {
    fn lent_bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: as for `Vec<u8>`: a boxed slice's heap buffer does not move with the box.
unsafe impl LentBytesMut for Box<[u8]> {
    fn lent_bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: the box's contents (a `LentBytesMut`, stable by its own contract) do not move with it.
unsafe impl<T: LentBytesMut + ?Sized> LentBytesMut for Box<T> {
    fn lent_bytes_mut(&mut self) -> &mut [u8] {
        (**self).lent_bytes_mut()
    }
}

pub(crate) struct MemInner {
    ptr: *mut u8,
    storage: Storage,
    len: usize,
    memh: *mut c_void,
    md: Md,
}

impl MemInner {
    /// Deregisters (after this no transport may access the memory); idempotent. `false` when
    /// the memory domain could not deregister: a peer may still reach the memory (cma, with a
    /// transfer that never ended), so it must never be freed or reused.
    fn deregister(&mut self) -> bool {
        if self.memh.is_null() {
            return true;
        }
        let ok = match self.md.mem_dereg_raw(self.memh) {
            Ok(()) => true,
            Err(e) => {
                ucs::warn!(
                    "memory deregistration failed: {e}; its {} bytes stay allocated (never freed)",
                    self.len
                );
                false
            }
        };
        self.memh = std::ptr::null_mut();
        ok
    }

    /// Keeps the bytes for the life of the process (after a failed deregistration).
    fn leak(&mut self) {
        match std::mem::replace(&mut self.storage, Storage::Vec(None)) {
            Storage::Alloc(_) => {}
            Storage::Vec(v) => std::mem::forget(v),
            Storage::Alias(owner) => std::mem::forget(owner),
            Storage::Lent { value, .. } => std::mem::forget(value),
        }
    }
}

impl Drop for MemInner {
    fn drop(&mut self) {
        if !self.deregister() {
            self.leak();
            return;
        }
        if let Storage::Alloc(layout) = self.storage {
            // SAFETY: `ptr` was allocated with `layout` in `Mem::alloc` and is freed once.
            unsafe { dealloc(self.ptr, layout) };
        }
    }
}

/// A registered buffer. Clones share it; it is deregistered and freed when the last clone and
/// the last operation using it are gone. Deregistration returns once no peer can reach the
/// memory through a key it still holds; when the memory domain cannot deregister (a cma peer's
/// copy that never ended), the memory is kept for the life of the process, never freed.
#[derive(Clone)]
pub struct Mem {
    pub(crate) inner: Rc<MemInner>,
}

impl Mem {
    /// Allocates `len` zeroed bytes (aligned to [`MEM_ALIGN`]) and registers them with `md`.
    pub fn alloc(md: &Md, len: usize, access: MemAccess) -> Result<Mem> {
        let layout = Layout::from_size_align(len.max(1), MEM_ALIGN).map_err(|_| Status::InvalidParam)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            ucs::error!(len, "cannot allocate {len} bytes for registered memory");
            return Err(Status::NoMemory.into());
        }
        let memh = match md.mem_reg_raw(ptr, len, access) {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: freeing what we just allocated, unregistered.
                unsafe { dealloc(ptr, layout) };
                return Err(e);
            }
        };
        Ok(Mem {
            inner: Rc::new(MemInner {
                ptr,
                storage: Storage::Alloc(layout),
                len,
                memh,
                md: md.clone(),
            }),
        })
    }

    /// Registers the application's buffer `data` with `md` (for zero-copy sends from it). The
    /// buffer is owned by the `Mem` until [`Mem::into_vec`] gives it back; an empty one is
    /// `InvalidParam`.
    ///
    /// ```
    /// let ctx = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let (md, _) = ctx.find_resource("self", "memory0")?;
    /// let m = uct::Mem::register(&md, b"hello".to_vec(), uct::MemAccess::ALL)?;
    /// let again = m.clone();
    /// let m = m.into_vec().unwrap_err(); // a clone is still alive
    /// drop(again);
    /// assert_eq!(m.into_vec().unwrap(), b"hello");
    /// # Ok::<(), uct::Error>(())
    /// ```
    pub fn register(md: &Md, data: Vec<u8>, access: MemAccess) -> Result<Mem> {
        Mem::try_register(md, data, access).map_err(|(e, _)| e)
    }

    /// [`Mem::register`], giving the buffer back with the error when registration fails.
    pub fn try_register(
        md: &Md,
        mut data: Vec<u8>,
        access: MemAccess,
    ) -> std::result::Result<Mem, (ucs::Error, Vec<u8>)> {
        let (ptr, len) = (data.as_mut_ptr(), data.len());
        match Mem::register_raw(md, ptr, len, access) {
            Ok(memh) => Ok(Mem::registered(md, ptr, len, memh, Storage::Vec(Some(data)))),
            Err(e) => Err((e, data)),
        }
    }

    /// Registers `len` bytes at `ptr` (`InvalidParam` when empty).
    fn register_raw(md: &Md, ptr: *mut u8, len: usize, access: MemAccess) -> Result<*mut c_void> {
        if len == 0 {
            return Err(ucs::Error::new(
                Status::InvalidParam,
                "cannot register an empty buffer",
            ));
        }
        md.mem_reg_raw(ptr, len, access)
    }

    fn registered(md: &Md, ptr: *mut u8, len: usize, memh: *mut c_void, storage: Storage) -> Mem {
        Mem {
            inner: Rc::new(MemInner {
                ptr,
                storage,
                len,
                memh,
                md: md.clone(),
            }),
        }
    }

    /// Registers bytes the application lends (read-only: `access` must not include writes)
    /// with `md`; [`Mem::into_lent`] gives them back. The buffer comes back with the error
    /// when registration fails (an empty one is `InvalidParam`).
    pub fn try_register_lent<B: LentBytes>(
        md: &Md,
        data: B,
        access: MemAccess,
    ) -> std::result::Result<Mem, (ucs::Error, B)> {
        let writes = MemAccess::LOCAL_WRITE | MemAccess::REMOTE_PUT | MemAccess::REMOTE_ATOMIC;
        if access.intersects(writes) {
            return Err((
                ucs::Error::new(
                    Status::InvalidParam,
                    "lent bytes are read-only: register them without write access",
                ),
                data,
            ));
        }
        let (ptr, len) = {
            let b = data.lent_bytes();
            (b.as_ptr() as *mut u8, b.len())
        };
        Mem::register_lent(md, ptr, len, access, data, false)
    }

    /// Registers writable bytes the application lends with `md` (e.g. a receive buffer that a
    /// `get_zcopy` fills, or an RMA target); [`Mem::into_lent`] gives them back. Their contents
    /// are kept (not zeroed). The buffer comes back with the error when registration fails (an
    /// empty one is `InvalidParam`).
    ///
    /// ```
    /// use uct::{Mem, MemAccess};
    ///
    /// let ctx = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let (md, _) = ctx.find_resource("self", "memory0")?;
    /// let buf: Box<[u8]> = vec![7u8; 16].into_boxed_slice();
    /// let mem = Mem::try_register_lent_mut(&md, buf, MemAccess::LOCAL_WRITE)
    ///     .map_err(|(e, _)| e)?;
    /// assert_eq!(mem.to_vec(), [7u8; 16]); // not zeroed
    /// mem.write(0, b"hi")?;
    /// let back: Box<[u8]> = mem.into_lent().ok().expect("last reference");
    /// assert_eq!(&back[..3], b"hi\x07");
    ///
    /// // Read-only lent bytes (`try_register_lent`) refuse writes.
    /// let ro = Mem::try_register_lent(&md, back, MemAccess::LOCAL_READ).map_err(|(e, _)| e)?;
    /// assert!(ro.write(0, b"x").is_err());
    /// # Ok::<(), uct::Error>(())
    /// ```
    pub fn try_register_lent_mut<B: LentBytesMut>(
        md: &Md,
        mut data: B,
        access: MemAccess,
    ) -> std::result::Result<Mem, (ucs::Error, B)> {
        let (ptr, len) = {
            let b = data.lent_bytes_mut();
            (b.as_mut_ptr(), b.len())
        };
        Mem::register_lent(md, ptr, len, access, data, true)
    }

    /// Registers the `len` bytes at `ptr` that `data` lends, keeping `data` until given back.
    fn register_lent<B: 'static>(
        md: &Md,
        ptr: *mut u8,
        len: usize,
        access: MemAccess,
        data: B,
        writable: bool,
    ) -> std::result::Result<Mem, (ucs::Error, B)> {
        match Mem::register_raw(md, ptr, len, access) {
            Ok(memh) => {
                let value = Some(Box::new(data) as Box<dyn std::any::Any>);
                Ok(Mem::registered(
                    md,
                    ptr,
                    len,
                    memh,
                    Storage::Lent { value, writable },
                ))
            }
            Err(e) => Err((e, data)),
        }
    }

    /// The lent bytes back, deregistered, when this is the last reference (no clone, no
    /// operation outstanding) and they were lent as a `B`; otherwise `Err(self)`.
    pub fn into_lent<B: 'static>(self) -> std::result::Result<B, Mem> {
        let lent_as_b = matches!(&self.inner.storage, Storage::Lent { value: Some(b), .. } if b.is::<B>());
        if !lent_as_b {
            return Err(self);
        }
        match Rc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                if !inner.deregister() {
                    // Still reachable by a peer: the bytes stay registered for good.
                    inner.leak();
                    return Err(Mem {
                        inner: Rc::new(inner),
                    });
                }
                match &mut inner.storage {
                    Storage::Lent { value, .. } => {
                        Ok(*value.take().expect("present").downcast::<B>().expect("checked"))
                    }
                    _ => unreachable!("checked above"),
                }
            }
            Err(inner) => Err(Mem { inner }),
        }
    }

    /// True for lent bytes, read-only ([`Mem::try_register_lent`]: [`Mem::write`] refuses
    /// them) or writable ([`Mem::try_register_lent_mut`]).
    pub fn is_lent(&self) -> bool {
        matches!(self.inner.storage, Storage::Lent { .. })
    }

    /// The same bytes registered on memory domain `md` too (for a buffer that transports of
    /// several memory domains access). The new `Mem` keeps this one's memory alive; its
    /// [`Mem::into_vec`] gives a copy.
    pub fn register_on(&self, md: &Md, access: MemAccess) -> Result<Mem> {
        let memh = md.mem_reg_raw(self.inner.ptr, self.inner.len, access)?;
        Ok(Mem {
            inner: Rc::new(MemInner {
                ptr: self.inner.ptr,
                storage: Storage::Alias(self.inner.clone()),
                len: self.inner.len,
                memh,
                md: md.clone(),
            }),
        })
    }

    /// The registered application buffer back, deregistered, when this is the last reference
    /// to it (no clone, no operation outstanding); otherwise `Err(self)`. A `Mem` from
    /// [`Mem::alloc`] gives its contents as a new vector.
    pub fn into_vec(self) -> std::result::Result<Vec<u8>, Mem> {
        match Rc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                if !inner.deregister() {
                    // Still reachable by a peer: hand out a copy, keep the original.
                    let mut v = vec![0; inner.len];
                    // SAFETY: `ptr` holds `len` live bytes (kept, never freed); bytes a peer
                    // may still write are valid for `u8`.
                    unsafe { std::ptr::copy_nonoverlapping(inner.ptr, v.as_mut_ptr(), inner.len) };
                    inner.leak();
                    return Ok(v);
                }
                match &mut inner.storage {
                    Storage::Vec(v) => Ok(v.take().expect("vector present until taken")),
                    Storage::Alloc(_) | Storage::Alias(_) | Storage::Lent { .. } => {
                        let mut v = vec![0; inner.len];
                        // SAFETY: `ptr` holds `len` bytes of our allocation, deregistered: no
                        // transport touches it any more.
                        unsafe { std::ptr::copy_nonoverlapping(inner.ptr, v.as_mut_ptr(), inner.len) };
                        Ok(v)
                    }
                }
            }
            Err(inner) => Err(Mem { inner }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The address peers use as `remote_addr` (with the packed rkey).
    pub fn addr(&self) -> u64 {
        self.inner.ptr as u64
    }

    /// The memory domain it is registered with.
    pub fn md(&self) -> &Md {
        &self.inner.md
    }

    /// Packs the rkey a peer needs to access this memory.
    pub fn pack_rkey(&self) -> Result<Vec<u8>> {
        self.inner.md.mkey_pack_raw(self.inner.memh)
    }

    fn check_writable(&self) -> Result<()> {
        if matches!(self.inner.storage, Storage::Lent { writable: false, .. }) {
            ucs::error!("a write into lent (read-only) registered bytes was refused");
            return Err(ucs::Error::new(Status::InvalidParam, "lent bytes are read-only"));
        }
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.len => Ok(()),
            _ => {
                ucs::error!(
                    offset,
                    len,
                    size = self.inner.len,
                    "access beyond registered memory"
                );
                Err(Status::OutOfRange.into())
            }
        }
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds (checked); the source may be concurrently written by a transport,
        // which only makes the copied bytes stale, never invalid for `u8`.
        unsafe { std::ptr::copy_nonoverlapping(self.inner.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The byte at `offset`, read once from memory (for polling a byte a transport or a peer
    /// writes, as perftests poll their sequence numbers); `None` past the end.
    #[inline]
    pub fn load_u8(&self, offset: usize) -> Option<u8> {
        if offset >= self.inner.len {
            return None;
        }
        // SAFETY: in bounds (checked). A volatile read: the byte may be written meanwhile by a
        // transport or a device, and must be read again on every call.
        Some(unsafe { std::ptr::read_volatile(self.inner.ptr.add(offset)) })
    }

    /// Copies `data` to `offset`; `InvalidParam` for lent (read-only) bytes.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        self.check_writable()?;
        // SAFETY: in bounds (checked); `data` cannot overlap our private allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.inner.ptr.add(offset), data.len()) };
        Ok(())
    }

    /// Copies message `m` from `at` on to `offset`, at most `cap` bytes and as much as fits
    /// (one copy, also from a message in shared memory); returns how many bytes. Nothing for
    /// read-only lent bytes.
    pub fn write_msg(&self, offset: usize, m: &crate::AmMessage<'_>, at: usize, cap: usize) -> usize {
        if offset >= self.inner.len || self.check_writable().is_err() {
            return 0;
        }
        let cap = cap.min(self.inner.len - offset);
        // SAFETY: `cap` bytes from `offset` are ours to write (in bounds, checked); a message
        // never lies in this buffer (messages are transports' memory).
        unsafe { m.copy_raw(at, self.inner.ptr.add(offset), cap) }
    }

    /// Fills the whole buffer with `byte` (lent bytes are read-only: left as they are, with an
    /// error logged).
    pub fn fill(&self, byte: u8) {
        if self.check_writable().is_err() {
            return;
        }
        // SAFETY: the whole allocation is ours.
        unsafe { std::ptr::write_bytes(self.inner.ptr, byte, self.inner.len) };
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.inner.len];
        self.read(0, &mut v).expect("whole-buffer read is in bounds");
        v
    }

    /// Reads a little-endian u64 at `offset` (8-aligned offsets are read atomically).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// An I/O-vector entry over `[offset, offset+len)`, for zcopy operations.
    pub fn iov(&self, offset: usize, len: usize) -> Result<MemIov> {
        self.check(offset, len)?;
        Ok(MemIov {
            mem: self.clone(),
            offset,
            len,
        })
    }

    /// The whole buffer as one I/O-vector entry.
    pub fn whole(&self) -> MemIov {
        MemIov {
            mem: self.clone(),
            offset: 0,
            len: self.inner.len,
        }
    }

    pub(crate) fn raw_iov(&self, offset: usize, len: usize) -> uct_transport::abi::RawIov {
        uct_transport::abi::RawIov {
            // SAFETY: `offset` was bounds-checked when the MemIov was built.
            buffer: unsafe { self.inner.ptr.add(offset) },
            length: len,
            memh: self.inner.memh,
        }
    }
}

impl std::fmt::Debug for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mem({:#x}, {} bytes)", self.addr(), self.len())
    }
}

/// A bounds-checked range of registered memory for zcopy operations.
#[derive(Clone, Debug)]
pub struct MemIov {
    pub(crate) mem: Mem,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl MemIov {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
