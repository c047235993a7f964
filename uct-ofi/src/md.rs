//! The `ofi` component and its memory domains: one per device (a provider's domain), each with
//! its own fabric and domain objects.
//!
//! Registration honours the provider's `mr_mode`: keys are picked by the provider under
//! `FI_MR_PROV_KEY`, else by us (a per-domain counter); local descriptors are passed to data
//! calls only under `FI_MR_LOCAL`; RMA addresses are virtual under `FI_MR_VIRT_ADDR`, else
//! offsets into the region, which is why the packed rkey carries the region's base address.
//!
//! Memory handles are `slot + 1` in the domain's registration table. Packed rkey, 32 bytes,
//! little-endian: `[u8 version = 2][u8 virt_addr][u16 0][u32 0][u64 key][u64 base][u64 len]`.
//! The initiator refuses RMA and atomics outside `[base, base + len)`: not every provider
//! checks at the target (`shm` reads and writes through CMA without asking it).
//! Unpacked rkeys live in a process-wide table (an rkey may be used on any interface); the u64
//! the host passes to RMA calls is its index there.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::rc::Rc;
use std::sync::Mutex;

use slab::Slab;
use ucs::config::Overrides;
use ucs::{Error, Result, Status};
use uct_transport::traits::{TransportComponent, TransportMd};
use uct_transport::types::{LinearFunc, MdAttr, MdFlags, MemAccess};

use crate::device::{self, Device};
use crate::ffi::{self, bits, Domain, Fabric, Info, Mr};

/// Length of a packed rkey.
pub const RKEY_PACKED_LEN: usize = 32;
const RKEY_VERSION: u8 = 2;

/// An unpacked remote key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteKey {
    pub key: u64,
    pub base: u64,
    /// Bytes registered from `base`.
    pub len: u64,
    pub virt: bool,
}

impl RemoteKey {
    /// The address libfabric's RMA calls take for `len` bytes at remote address `raddr`, or
    /// `InvalidParam` where they are not all inside the region.
    #[inline]
    pub fn target(&self, raddr: u64, len: usize) -> Result<u64> {
        let off = raddr.wrapping_sub(self.base);
        if raddr < self.base || off > self.len || len as u64 > self.len - off {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ofi: {len} bytes at {raddr:#x} are outside the remote region {:#x}+{} of this rkey",
                    self.base, self.len
                ),
            ));
        }
        Ok(if self.virt { raddr } else { off })
    }
}

static RKEYS: Mutex<Slab<RemoteKey>> = Mutex::new(Slab::new());

/// The remote key the host's `rkey` stands for.
#[inline]
pub fn remote_key(rkey: u64) -> Result<RemoteKey> {
    let t = RKEYS.lock().unwrap_or_else(|p| p.into_inner());
    t.get(rkey as usize).copied().ok_or_else(|| {
        Error::new(
            Status::InvalidParam,
            format!("ofi: rkey {rkey} is not an unpacked ofi rkey (released, or from another component)"),
        )
    })
}

/// Parses a packed rkey.
pub fn unpack(packed: &[u8]) -> Result<RemoteKey> {
    if packed.len() < RKEY_PACKED_LEN || packed[0] != RKEY_VERSION {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "not an ofi packed rkey ({} bytes; expected {RKEY_PACKED_LEN}, version {RKEY_VERSION}): was it packed by another component?",
                packed.len()
            ),
        ));
    }
    let u = |o: usize| u64::from_le_bytes(packed[o..o + 8].try_into().expect("8 bytes"));
    Ok(RemoteKey {
        virt: packed[1] != 0,
        key: u(8),
        base: u(16),
        len: u(24),
    })
}

/// Writes a packed rkey.
pub fn pack(k: RemoteKey, buf: &mut [u8]) -> Result<()> {
    let out = buf.get_mut(..RKEY_PACKED_LEN).ok_or(Status::BufferTooSmall)?;
    out.fill(0);
    out[0] = RKEY_VERSION;
    out[1] = k.virt as u8;
    out[8..16].copy_from_slice(&k.key.to_le_bytes());
    out[16..24].copy_from_slice(&k.base.to_le_bytes());
    out[24..32].copy_from_slice(&k.len.to_le_bytes());
    Ok(())
}

/// The memory-domain name of a provider that cannot serve ends with this.
pub const UNUSABLE_SUFFIX: &str = " (not usable)";

pub struct OfiComponent;

impl TransportComponent for OfiComponent {
    type Md = OfiMd;
    const NAME: &'static CStr = c"ofi";

    /// The usable devices, then one name per provider that cannot serve
    /// (`"<provider> (not usable)"`): opening that one fails with the reason, so `rucx-info -d`
    /// lists the provider and why, and contexts skip it.
    fn md_resources() -> Result<Vec<String>> {
        let filter = device::provider_filter(&Overrides::default())?;
        let devs = device::scan(&filter)?;
        let mut names: Vec<String> = devs.into_iter().map(|d| d.name).collect();
        names.extend(
            device::unusable(&filter)
                .into_iter()
                .map(|u| format!("{}{UNUSABLE_SUFFIX}", u.provider)),
        );
        Ok(names)
    }

    fn md_open(name: &str, config: &Overrides) -> Result<OfiMd> {
        if let Some(prov) = name.strip_suffix(UNUSABLE_SUFFIX) {
            let filter = device::provider_filter(config)?;
            let reason = device::unusable(&filter)
                .into_iter()
                .find(|u| u.provider == prov)
                .map_or_else(|| "not offered".to_owned(), |u| u.reason);
            return Err(Error::new(
                Status::Unsupported,
                format!("provider {prov} not used: {reason}"),
            ));
        }
        let Device { name, info } = device::find(name, config)?;
        let err = |what: &str, e: i32| {
            Error::new(
                Status::IoError,
                format!("ofi {name}: {what} failed: {}", ffi::strerror(e as i64)),
            )
        };
        let fabric = Fabric::open(&info).map_err(|e| err("fi_fabric", e))?;
        let domain = Domain::open(&fabric, &info).map_err(|e| err("fi_domain", e))?;
        let i = info.get();
        let mr_mode = i.mr_mode();
        let mut access = bits::SEND | bits::RECV;
        if i.caps() & (bits::RMA | bits::ATOMIC) != 0 {
            access |= bits::READ | bits::WRITE | bits::REMOTE_READ | bits::REMOTE_WRITE;
        }
        Ok(OfiMd {
            inner: Rc::new(MdInner {
                name,
                regs: RefCell::new(Slab::new()),
                next_key: Cell::new(1),
                access,
                mr_mode,
                domain,
                info,
            }),
        })
    }

    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)> {
        let k = unpack(packed)?;
        let i = RKEYS.lock().unwrap_or_else(|p| p.into_inner()).insert(k);
        Ok((i as u64, i))
    }

    fn rkey_release(_rkey: u64, handle: usize) {
        RKEYS.lock().unwrap_or_else(|p| p.into_inner()).try_remove(handle);
    }
}

struct Reg {
    mr: Mr,
    base: u64,
    len: u64,
}

/// What a memory domain shares with the interfaces opened on it.
pub struct MdInner {
    pub name: String,
    regs: RefCell<Slab<Reg>>,
    next_key: Cell<u64>,
    access: u64,
    pub mr_mode: i32,
    pub domain: Rc<Domain>,
    pub info: Info,
}

impl MdInner {
    /// Whether local buffers need registration and descriptors (`FI_MR_LOCAL`).
    pub fn mr_local(&self) -> bool {
        self.mr_mode & bits::MR_LOCAL != 0
    }

    /// Registers `[addr, addr + len)` for sends, receives and (where the provider has them)
    /// RMA and atomics.
    ///
    /// # Safety
    /// The memory stays valid until the returned region is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn register(&self, addr: *const u8, len: usize) -> Result<Mr> {
        let key = if self.mr_mode & bits::MR_PROV_KEY != 0 {
            0
        } else {
            let k = self.next_key.get();
            self.next_key.set(k + 1);
            k
        };
        // SAFETY: forwarded to the caller.
        unsafe { self.domain.mr_reg(addr, len, self.access, key) }.map_err(|e| {
            Error::new(
                Status::IoError,
                format!(
                    "ofi {}: fi_mr_reg of {len} bytes failed: {}",
                    self.name,
                    ffi::strerror(e as i64)
                ),
            )
        })
    }

    /// The local descriptor of memory handle `memh` (null for none, or when the provider does
    /// not need descriptors).
    #[inline]
    pub fn desc(&self, memh: usize) -> *mut std::ffi::c_void {
        if memh == 0 || !self.mr_local() {
            return std::ptr::null_mut();
        }
        self.regs
            .borrow()
            .get(memh - 1)
            .map_or(std::ptr::null_mut(), |r| r.mr.desc())
    }
}

pub struct OfiMd {
    pub(crate) inner: Rc<MdInner>,
}

impl TransportMd for OfiMd {
    fn query(&self) -> MdAttr {
        let mut flags = MdFlags::REG;
        if self.inner.info.get().caps() & (bits::RMA | bits::ATOMIC) != 0 {
            flags |= MdFlags::NEED_RKEY;
        }
        if self.inner.mr_local() {
            flags |= MdFlags::NEED_MEMH;
        }
        MdAttr {
            flags,
            max_reg: usize::MAX,
            rkey_packed_size: RKEY_PACKED_LEN,
            reg_cost: LinearFunc { c: 1e-6, m: 1e-10 },
        }
    }

    #[allow(unsafe_code)]
    fn mem_reg(&self, addr: *mut u8, len: usize, _access: MemAccess) -> Result<usize> {
        // SAFETY: the host keeps the memory valid until mem_dereg (TransportMd::mem_reg), which
        // drops the region.
        let mr = unsafe { self.inner.register(addr, len) }?;
        let slot = self.inner.regs.borrow_mut().insert(Reg {
            mr,
            base: addr as u64,
            len: len as u64,
        });
        Ok(slot + 1)
    }

    fn mem_dereg(&self, memh: usize) -> Result<()> {
        let r = memh
            .checked_sub(1)
            .and_then(|s| self.inner.regs.borrow_mut().try_remove(s));
        match r {
            Some(_) => Ok(()),
            None => Err(Error::new(
                Status::InvalidParam,
                format!("ofi: memory handle {memh} is not registered here"),
            )),
        }
    }

    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        let regs = self.inner.regs.borrow();
        let r = memh.checked_sub(1).and_then(|s| regs.get(s)).ok_or_else(|| {
            Error::new(
                Status::InvalidParam,
                format!("ofi: memory handle {memh} is not registered here"),
            )
        })?;
        pack(
            RemoteKey {
                key: r.mr.key(),
                base: r.base,
                len: r.len,
                virt: self.inner.mr_mode & bits::MR_VIRT_ADDR != 0,
            },
            buf,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Providers that cannot serve are listed as memory domains that refuse to open, with the
    /// reason (what `rucx-info -d` shows); the usable ones open.
    #[test]
    fn unusable_providers_are_listed_with_their_reason() {
        let Ok(names) = OfiComponent::md_resources() else {
            return; // no libfabric providers at all
        };
        let filter = device::provider_filter(&Overrides::default()).unwrap();
        let unusable = device::unusable(&filter);
        for u in &unusable {
            let name = format!("{}{UNUSABLE_SUFFIX}", u.provider);
            assert!(names.contains(&name), "{name} not listed in {names:?}");
            let e = OfiComponent::md_open(&name, &Overrides::default())
                .err()
                .expect("refused");
            assert_eq!(e, Status::Unsupported);
            assert!(e.to_string().contains(&u.reason), "{e} lacks {:?}", u.reason);
        }
        let usable = names.iter().filter(|n| !n.ends_with(UNUSABLE_SUFFIX)).count();
        assert_eq!(usable + unusable.len(), names.len());
    }

    #[test]
    fn rkey_round_trip_and_target() {
        let k = RemoteKey {
            key: 0x1234,
            base: 0x7000,
            len: 0x100,
            virt: false,
        };
        let mut b = [0u8; RKEY_PACKED_LEN];
        pack(k, &mut b).unwrap();
        assert_eq!(unpack(&b).unwrap(), k);
        assert_eq!(k.target(0x7010, 8).unwrap(), 0x10);
        assert_eq!(RemoteKey { virt: true, ..k }.target(0x7010, 8).unwrap(), 0x7010);
        assert_eq!(k.target(0x7000, 0x100).unwrap(), 0);
        for (addr, len) in [
            (0x6fff, 1),
            (0x70f9, 8),
            (0x7100, 1),
            (0x7000, 0x101),
            (u64::MAX, 2),
        ] {
            assert!(k.target(addr, len).is_err(), "{addr:#x}+{len}");
        }
        assert!(unpack(&b[..8]).is_err());
        b[0] = 9;
        assert!(unpack(&b).is_err());
    }
}
