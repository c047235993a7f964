//! The `tcp` component and memory domain.
//!
//! Unlike UCX's tcp (no registration, the target writes wherever the peer says), registration
//! here records the region in a bounds-checked [`RegionTable`]: remote puts, gets and atomics
//! name `(address, rkey)` and the target's progress checks them against it before touching
//! memory. The interfaces opened on a memory domain share its table.

use std::ffi::CStr;
use std::rc::Rc;

use ucs::config::Overrides;
use ucs::{Error, Result, Status};
use uct_transport::rma::{RegionTable, PACKED_RKEY_LEN};
use uct_transport::traits::{TransportComponent, TransportMd};
use uct_transport::types::{LinearFunc, MdAttr, MdFlags, MemAccess};

/// The only memory domain of the component.
pub const MD_NAME: &str = "tcp";

pub struct TcpComponent;

impl TransportComponent for TcpComponent {
    type Md = TcpMd;
    const NAME: &'static CStr = c"tcp";

    fn md_resources() -> Result<Vec<String>> {
        Ok(vec![MD_NAME.into()])
    }

    fn md_open(name: &str, config: &Overrides) -> Result<TcpMd> {
        if name != MD_NAME {
            return Err(Error::new(
                Status::NoDevice,
                format!("no memory domain {name:?}: the tcp component has one, \"{MD_NAME}\""),
            ));
        }
        Ok(TcpMd {
            regions: Rc::new(RegionTable::new()),
            config: config.clone(),
        })
    }

    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)> {
        if packed.len() < PACKED_RKEY_LEN {
            ucs::error!(
                len = packed.len(),
                "tcp: packed rkey of {} bytes (need {PACKED_RKEY_LEN})",
                packed.len()
            );
            return Err(Status::InvalidParam.into());
        }
        Ok((RegionTable::unpack(packed)?, 0))
    }
}

/// A memory domain: the registrations remote peers may access.
pub struct TcpMd {
    pub(crate) regions: Rc<RegionTable>,
    /// Configuration set in code for this memory domain (the context's).
    pub(crate) config: Overrides,
}

impl TransportMd for TcpMd {
    fn query(&self) -> MdAttr {
        MdAttr {
            flags: MdFlags::REG | MdFlags::NEED_RKEY,
            max_reg: usize::MAX,
            rkey_packed_size: PACKED_RKEY_LEN,
            reg_cost: LinearFunc { c: 20e-9, m: 0.0 },
        }
    }

    fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<usize> {
        Ok(self.regions.register(addr, len, access))
    }

    fn mem_dereg(&self, memh: usize) -> Result<()> {
        self.regions.deregister(memh)
    }

    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        self.regions.pack(memh, buf)
    }
}
