//! Bounds-checked access to registered memory, for transports that execute RMA and atomics in
//! software on the target (self, tcp). Every request names an rkey and an address range; a
//! range outside what the target registered, an unknown or stale key, or a missing access right
//! is refused with an error, never written. (UCX's tcp writes wherever the peer says.)
//!
//! Single-threaded by design: a memory domain, its registrations and the interfaces that serve
//! remote requests live on one thread, so deregistration can never race with an access.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use slab::Slab;
use ucs::{Error, Result, Status};

use crate::traits::AtomicSize;
use crate::types::{AtomicOp, MemAccess};

#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;

/// Size of a packed rkey produced by [`RegionTable::pack`]: key, base address, length (LE u64s).
pub const PACKED_RKEY_LEN: usize = 24;

#[derive(Clone, Copy, Debug)]
struct Region {
    base: u64,
    len: u64,
    access: MemAccess,
    key: u64,
}

/// The registrations of one memory domain.
pub struct RegionTable {
    regions: RefCell<Slab<Region>>,
    /// Mixed into keys so stale or guessed keys do not match a reused slot.
    salt: Cell<u32>,
}

impl Default for RegionTable {
    fn default() -> Self {
        Self::new()
    }
}

fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish() as u32
}

impl RegionTable {
    /// An empty table.
    pub fn new() -> RegionTable {
        RegionTable {
            regions: RefCell::new(Slab::new()),
            salt: Cell::new(random_u32()),
        }
    }

    /// Registers `[addr, addr+len)`; returns the memory handle (never 0).
    pub fn register(&self, addr: *mut u8, len: usize, access: MemAccess) -> usize {
        let salt = self.salt.get().wrapping_mul(0x9E37_79B9).wrapping_add(1);
        self.salt.set(salt);
        let mut regions = self.regions.borrow_mut();
        let entry = regions.vacant_entry();
        let idx = entry.key();
        let key = ((idx as u64) << 32) | salt as u64;
        entry.insert(Region {
            base: addr as u64,
            len: len as u64,
            access,
            key,
        });
        idx + 1
    }

    /// Removes a registration.
    pub fn deregister(&self, memh: usize) -> Result<()> {
        let idx = memh.checked_sub(1).ok_or(Status::InvalidParam)?;
        match self.regions.borrow_mut().try_remove(idx) {
            Some(_) => Ok(()),
            None => {
                ucs::error!(memh, "deregistering unknown memory handle");
                Err(Status::InvalidParam.into())
            }
        }
    }

    /// Packs the rkey of `memh` into `buf` ([`PACKED_RKEY_LEN`] bytes).
    pub fn pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        let regions = self.regions.borrow();
        let r = memh
            .checked_sub(1)
            .and_then(|i| regions.get(i))
            .ok_or(Status::InvalidParam)?;
        let out = buf.get_mut(..PACKED_RKEY_LEN).ok_or(Status::BufferTooSmall)?;
        out[..8].copy_from_slice(&r.key.to_le_bytes());
        out[8..16].copy_from_slice(&r.base.to_le_bytes());
        out[16..24].copy_from_slice(&r.len.to_le_bytes());
        Ok(())
    }

    /// The rkey value (the key) of a packed rkey ([`PACKED_RKEY_LEN`] bytes; a shorter one is
    /// truncated or not ours).
    pub fn unpack(packed: &[u8]) -> Result<u64> {
        let b = packed.get(..PACKED_RKEY_LEN).ok_or_else(|| {
            ucs::error!(
                len = packed.len(),
                "packed rkey too short (need {PACKED_RKEY_LEN} bytes)"
            );
            Status::InvalidParam
        })?;
        Ok(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
    }

    /// Checks that `[addr, addr+len)` lies inside the region of `key` and `need` is granted;
    /// returns the start pointer. The accepted path is a handful of compares; the refusal and
    /// its log line are out of line.
    #[inline]
    fn check(&self, key: u64, addr: u64, len: usize, need: MemAccess) -> Result<*mut u8> {
        let ok = match self.regions.borrow().get((key >> 32) as usize) {
            Some(r) => {
                r.key == key
                    && addr >= r.base
                    && addr
                        .checked_add(len as u64)
                        .is_some_and(|end| end <= r.base + r.len)
                    && r.access.contains(need)
            }
            None => false,
        };
        if ok {
            Ok(addr as *mut u8)
        } else {
            Err(self.refuse(key, addr, len, need))
        }
    }

    /// Why [`check`](Self::check) refused an access: logged for the operator of this (target)
    /// process, and the context of the error the transport reports back.
    #[cold]
    #[inline(never)]
    fn refuse(&self, key: u64, addr: u64, len: usize, need: MemAccess) -> Error {
        let regions = self.regions.borrow();
        let msg = match regions.get((key >> 32) as usize) {
            Some(r) if r.key == key => {
                let end = addr.checked_add(len as u64);
                if addr < r.base || end.is_none_or(|e| e > r.base + r.len) {
                    format!(
                        "remote access [{addr:#x}, +{len}) outside registered [{:#x}, +{}): refused",
                        r.base, r.len
                    )
                } else {
                    format!(
                        "remote access {need:?} not granted by the registration ({:?}): refused",
                        r.access
                    )
                }
            }
            _ => format!("remote access with unknown or stale rkey {key:#x}: refused"),
        };
        ucs::error!("{msg}");
        Error::new(Status::InvalidAddr, msg)
    }

    /// Writes `data` at `addr` (a remote put).
    #[inline]
    pub fn write(&self, key: u64, addr: u64, data: &[u8]) -> Result<()> {
        let p = self.check(key, addr, data.len(), MemAccess::REMOTE_PUT)?;
        // SAFETY: `p..p+len` lies in memory the host registered and keeps valid until
        // deregistration, which cannot happen concurrently (single thread). `data` may be
        // registered memory too, even the same range: the copy allows overlap.
        unsafe { ucs::arch::copy_maybe_overlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Reads `out.len()` bytes at `addr` (a remote get).
    #[inline]
    pub fn read(&self, key: u64, addr: u64, out: &mut [u8]) -> Result<()> {
        let p = self.check(key, addr, out.len(), MemAccess::REMOTE_GET)?;
        // SAFETY: as in `write`.
        unsafe { ucs::arch::copy_maybe_overlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Runs `f` over the registered bytes `[addr, addr+len)` for reading (a remote get that
    /// copies straight into its destination).
    pub fn with_source<R>(&self, key: u64, addr: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let p = self.check(key, addr, len, MemAccess::REMOTE_GET)?;
        // SAFETY: as in `write`; the slice does not escape `f`.
        let s = unsafe { std::slice::from_raw_parts(p, len) };
        Ok(f(s))
    }

    /// Runs `f` over the registered bytes `[addr, addr+len)` (for receiving straight into them).
    pub fn with_target<R>(
        &self,
        key: u64,
        addr: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let p = self.check(key, addr, len, MemAccess::REMOTE_PUT)?;
        // SAFETY: as in `write`; the slice does not escape `f` and nothing else on this thread
        // accesses the range meanwhile.
        let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
        Ok(f(s))
    }

    /// Executes an atomic op at `addr`; returns the old value. `compare` is used by `Cswap`.
    pub fn atomic(
        &self,
        key: u64,
        addr: u64,
        size: AtomicSize,
        op: AtomicOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        let width = match size {
            AtomicSize::U32 => 4,
            AtomicSize::U64 => 8,
        };
        if !addr.is_multiple_of(width as u64) {
            ucs::error!("atomic at unaligned address {addr:#x} (needs {width}-byte alignment): refused");
            return Err(Status::InvalidAddr.into());
        }
        let p = self.check(key, addr, width, MemAccess::REMOTE_ATOMIC)?;
        // SAFETY: aligned, in registered memory (checked); atomics make concurrent CPU access
        // by the host well-defined.
        Ok(unsafe {
            match size {
                AtomicSize::U64 => apply64(AtomicU64::from_ptr(p as *mut u64), op, operand, compare),
                AtomicSize::U32 => apply32(
                    AtomicU32::from_ptr(p as *mut u32),
                    op,
                    operand as u32,
                    compare as u32,
                ) as u64,
            }
        })
    }

    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.regions.borrow().len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn apply64(a: &AtomicU64, op: AtomicOp, v: u64, cmp: u64) -> u64 {
    let o = Ordering::SeqCst;
    match op {
        AtomicOp::Add => a.fetch_add(v, o),
        AtomicOp::And => a.fetch_and(v, o),
        AtomicOp::Or => a.fetch_or(v, o),
        AtomicOp::Xor => a.fetch_xor(v, o),
        AtomicOp::Swap => a.swap(v, o),
        AtomicOp::Cswap => a.compare_exchange(cmp, v, o, o).unwrap_or_else(|x| x),
    }
}

fn apply32(a: &AtomicU32, op: AtomicOp, v: u32, cmp: u32) -> u32 {
    let o = Ordering::SeqCst;
    match op {
        AtomicOp::Add => a.fetch_add(v, o),
        AtomicOp::And => a.fetch_and(v, o),
        AtomicOp::Or => a.fetch_or(v, o),
        AtomicOp::Xor => a.fetch_xor(v, o),
        AtomicOp::Swap => a.swap(v, o),
        AtomicOp::Cswap => a.compare_exchange(cmp, v, o, o).unwrap_or_else(|x| x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_keys_and_access_are_enforced() {
        let mut buf = vec![0u64; 8];
        let t = RegionTable::new();
        let base = buf.as_mut_ptr() as *mut u8;
        let h = t.register(base, 64, MemAccess::ALL);
        let mut packed = [0u8; PACKED_RKEY_LEN];
        t.pack(h, &mut packed).unwrap();
        let key = RegionTable::unpack(&packed).unwrap();
        assert_eq!(
            RegionTable::unpack(&packed[..8]),
            Err(Status::InvalidParam.into()),
            "truncated rkey"
        );
        let a = base as u64;
        t.write(key, a + 8, &7u64.to_le_bytes()).unwrap();
        assert_eq!(buf[1], 7);
        assert_eq!(t.write(key, a + 60, &[0; 8]), Err(Status::InvalidAddr.into()));
        assert_eq!(t.write(key, a - 1, &[0; 1]), Err(Status::InvalidAddr.into()));
        assert_eq!(
            t.write(key, u64::MAX - 2, &[0; 8]),
            Err(Status::InvalidAddr.into())
        );
        assert_eq!(t.write(key ^ 1, a, &[0; 1]), Err(Status::InvalidAddr.into()));
        assert_eq!(t.atomic(key, a + 8, AtomicSize::U64, AtomicOp::Add, 5, 0), Ok(7));
        assert_eq!(buf[1], 12);
        assert_eq!(
            t.atomic(key, a + 8, AtomicSize::U64, AtomicOp::Cswap, 1, 12),
            Ok(12)
        );
        assert_eq!(buf[1], 1);
        assert_eq!(
            t.atomic(key, a + 3, AtomicSize::U32, AtomicOp::Add, 1, 0),
            Err(Status::InvalidAddr.into())
        );
        let h2 = t.register(base, 64, MemAccess::REMOTE_GET);
        let mut p2 = [0u8; PACKED_RKEY_LEN];
        t.pack(h2, &mut p2).unwrap();
        let k2 = RegionTable::unpack(&p2).unwrap();
        assert_eq!(t.write(k2, a, &[1]), Err(Status::InvalidAddr.into()));
        let mut out = [0u8; 8];
        t.read(k2, a + 8, &mut out).unwrap();
        assert_eq!(u64::from_le_bytes(out), 1);
        t.deregister(h).unwrap();
        assert_eq!(t.write(key, a, &[1]), Err(Status::InvalidAddr.into()));
        // A reused slot gets a different key: the stale key still fails.
        let h3 = t.register(base, 64, MemAccess::ALL);
        assert_eq!(h3, h);
        assert_eq!(t.write(key, a, &[1]), Err(Status::InvalidAddr.into()));
    }
}
