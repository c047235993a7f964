//! The `ib` component and its memory domains: one per verbs device (`ibv_get_device_list`).
//!
//! Memory handles: `mem_reg` returns `(slot + 1) << 32 | lkey`, so the data path reads the lkey
//! of an iov straight from its memh ([`lkey_of_memh`]) without a lookup; the slot finds the
//! region again in `mem_dereg`/`mkey_pack`.
//!
//! Packed rkey, 8 bytes, little-endian (see docs/ib.md): `[u8 version = 1][u8 access bits:
//! 1 remote write, 2 remote read, 4 remote atomic][u16 reserved = 0][u32 rkey]`. `rkey_unpack`
//! returns the 32-bit rkey (zero-extended), which RDMA and atomic work requests use directly.

use std::cell::RefCell;
use std::ffi::CStr;
use std::sync::Arc;

use slab::Slab;
use ucs::config::Overrides;
use ucs::{Error, Result, Status};
use uct_transport::traits::{TransportComponent, TransportMd};
use uct_transport::types::{LinearFunc, MdAttr, MdFlags, MemAccess};

use crate::device::IbDevice;
use uct_ib_verbs::{register_host_memory, AccessFlags, DeviceList, MemoryRegion};

/// Length of a packed rkey.
pub const RKEY_PACKED_LEN: usize = 8;
const RKEY_VERSION: u8 = 1;

pub struct IbComponent;

impl TransportComponent for IbComponent {
    type Md = IbMd;
    const NAME: &'static CStr = c"ib";

    fn md_resources() -> Result<Vec<String>> {
        // no kernel support or no devices: an empty list, not an error
        let list = match DeviceList::new() {
            Ok(l) => l,
            Err(_) => return Ok(Vec::new()),
        };
        Ok(list.iter().map(|d| d.name()).collect())
    }

    fn md_open(name: &str, _config: &Overrides) -> Result<IbMd> {
        Ok(IbMd {
            dev: IbDevice::open(name)?,
            regs: RefCell::new(Slab::new()),
        })
    }

    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)> {
        unpack_rkey(packed).map(|rkey| (rkey as u64, 0))
    }
}

/// Parses a packed rkey (the format above).
pub fn unpack_rkey(packed: &[u8]) -> Result<u32> {
    if packed.len() < RKEY_PACKED_LEN || packed[0] != RKEY_VERSION {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "not an ib packed rkey ({} bytes; expected {RKEY_PACKED_LEN} bytes, version \
                 {RKEY_VERSION}): was it packed by another component?",
                packed.len()
            ),
        ));
    }
    Ok(u32::from_le_bytes([packed[4], packed[5], packed[6], packed[7]]))
}

/// Writes a packed rkey.
pub fn pack_rkey(rkey: u32, access: AccessFlags, buf: &mut [u8]) -> Result<()> {
    let out = buf.get_mut(..RKEY_PACKED_LEN).ok_or(Status::BufferTooSmall)?;
    let mut bits = 0u8;
    if access.contains(AccessFlags::REMOTE_WRITE) {
        bits |= 1;
    }
    if access.contains(AccessFlags::REMOTE_READ) {
        bits |= 2;
    }
    if access.contains(AccessFlags::REMOTE_ATOMIC) {
        bits |= 4;
    }
    out[0] = RKEY_VERSION;
    out[1] = bits;
    out[2..4].copy_from_slice(&[0, 0]);
    out[4..8].copy_from_slice(&rkey.to_le_bytes());
    Ok(())
}

/// The lkey encoded in a memory handle returned by [`IbMd::mem_reg`] (`None` for a null memh).
#[inline]
pub fn lkey_of_memh(memh: usize) -> Option<u32> {
    (memh >> 32 != 0).then_some(memh as u32)
}

/// Verbs access rights for uct access flags. Local write is granted whenever the HCA may write
/// (remote put/atomic need it, and zcopy get/receive targets are written locally); no flags at
/// all means everything, as in UCX.
pub fn access_flags(access: MemAccess) -> AccessFlags {
    let access = if access.is_empty() { MemAccess::ALL } else { access };
    let mut f = AccessFlags::NONE;
    if access.intersects(MemAccess::LOCAL_WRITE | MemAccess::REMOTE_PUT | MemAccess::REMOTE_ATOMIC) {
        f = f | AccessFlags::LOCAL_WRITE;
    }
    if access.contains(MemAccess::REMOTE_PUT) {
        f = f | AccessFlags::REMOTE_WRITE;
    }
    if access.contains(MemAccess::REMOTE_GET) {
        f = f | AccessFlags::REMOTE_READ;
    }
    if access.contains(MemAccess::REMOTE_ATOMIC) {
        f = f | AccessFlags::REMOTE_ATOMIC;
    }
    f
}

struct Reg {
    mr: MemoryRegion,
    access: AccessFlags,
}

/// A memory domain: an open device, its protection domain and the user's registrations.
pub struct IbMd {
    pub(crate) dev: Arc<IbDevice>,
    regs: RefCell<Slab<Reg>>,
}

impl IbMd {
    /// The device (shared with the interfaces opened on this domain).
    pub fn device(&self) -> &Arc<IbDevice> {
        &self.dev
    }

    fn slot(memh: usize) -> Option<usize> {
        (memh >> 32).checked_sub(1)
    }
}

impl TransportMd for IbMd {
    fn query(&self) -> MdAttr {
        MdAttr {
            flags: MdFlags::REG | MdFlags::NEED_MEMH | MdFlags::NEED_RKEY,
            max_reg: usize::try_from(self.dev.attr.max_mr_size).unwrap_or(usize::MAX),
            rkey_packed_size: RKEY_PACKED_LEN,
            // UCX's model for verbs registration: fixed syscall cost plus pinning per byte
            reg_cost: LinearFunc { c: 16e-6, m: 0.06e-9 },
        }
    }

    fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<usize> {
        if len == 0 {
            return Err(Error::new(
                Status::InvalidParam,
                "ib mem_reg: zero-length region; register at least one byte",
            ));
        }
        let flags = access_flags(access);
        let mr = register_host_memory(&self.dev.pd, addr, len, flags)?;
        let lkey = mr.lkey();
        let mut regs = self.regs.borrow_mut();
        let slot = regs.insert(Reg { mr, access: flags });
        if slot >= u32::MAX as usize {
            regs.remove(slot);
            return Err(Error::new(Status::NoMemory, "ib mem_reg: too many registrations"));
        }
        Ok(((slot as u64 + 1) << 32 | lkey as u64) as usize)
    }

    fn mem_dereg(&self, memh: usize) -> Result<()> {
        let mut regs = self.regs.borrow_mut();
        match Self::slot(memh).filter(|&s| regs.get(s).is_some_and(|r| r.mr.lkey() == memh as u32)) {
            Some(s) => {
                drop(regs.remove(s));
                Ok(())
            }
            None => Err(Error::new(
                Status::InvalidParam,
                format!("ib mem_dereg: unknown memory handle {memh:#x} (already deregistered?)"),
            )),
        }
    }

    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        let regs = self.regs.borrow();
        match Self::slot(memh)
            .and_then(|s| regs.get(s))
            .filter(|r| r.mr.lkey() == memh as u32)
        {
            Some(r) => pack_rkey(r.mr.rkey(), r.access, buf),
            None => Err(Error::new(
                Status::InvalidParam,
                format!("ib mkey_pack: unknown memory handle {memh:#x}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rkey_pack_round_trip() {
        let mut b = [0u8; RKEY_PACKED_LEN];
        pack_rkey(0xdead_beef, AccessFlags::ALL_REMOTE, &mut b).unwrap();
        assert_eq!(b, [1, 7, 0, 0, 0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(unpack_rkey(&b), Ok(0xdead_beef));
        assert_eq!(IbComponent::rkey_unpack(&b), Ok((0xdead_beef, 0)));
        assert_eq!(unpack_rkey(&b[..7]), Err(Status::InvalidParam.into()));
        b[0] = 2;
        assert_eq!(unpack_rkey(&b), Err(Status::InvalidParam.into()));
        assert_eq!(
            pack_rkey(1, AccessFlags::NONE, &mut [0u8; 3]),
            Err(Status::BufferTooSmall.into())
        );
    }

    #[test]
    fn memh_carries_the_lkey() {
        let memh = ((5u64 + 1) << 32 | 0x1234_5678) as usize;
        assert_eq!(lkey_of_memh(memh), Some(0x1234_5678));
        assert_eq!(IbMd::slot(memh), Some(5));
        assert_eq!(lkey_of_memh(0), None);
        assert_eq!(lkey_of_memh(0x1234), None, "a handle without a slot is not ours");
    }

    #[test]
    fn access_mapping() {
        assert_eq!(access_flags(MemAccess::ALL), AccessFlags::ALL_REMOTE);
        assert_eq!(access_flags(MemAccess::EMPTY), AccessFlags::ALL_REMOTE);
        assert_eq!(access_flags(MemAccess::REMOTE_GET), AccessFlags::REMOTE_READ);
        assert_eq!(
            access_flags(MemAccess::REMOTE_PUT),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        );
        assert_eq!(access_flags(MemAccess::LOCAL_READ), AccessFlags::NONE);
    }
}
