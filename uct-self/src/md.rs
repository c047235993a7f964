//! The `self` component and memory domain: registrations go to a per-thread region table, since
//! self endpoints only reach interfaces on their own thread.

use std::ffi::CStr;
use std::rc::Rc;

use ucs::config::Overrides;
use ucs::{Error, Result, Status};
use uct_transport::rma::{RegionTable, PACKED_RKEY_LEN};
use uct_transport::traits::{TransportComponent, TransportMd};
use uct_transport::types::{LinearFunc, MdAttr, MdFlags, MemAccess};

thread_local! {
    /// The thread's registrations: self connects only within a thread, so every memory domain
    /// of the thread shares them (an rkey of one MD works on an endpoint of another).
    static REGIONS: Rc<RegionTable> = Rc::new(RegionTable::new());
}

/// The thread's registration table (endpoints keep it, so RMA needs no thread-local lookup).
pub(crate) fn regions() -> Rc<RegionTable> {
    REGIONS.with(Rc::clone)
}

pub struct SelfComponent;

impl TransportComponent for SelfComponent {
    type Md = SelfMd;
    const NAME: &'static CStr = c"self";

    fn md_resources() -> Result<Vec<String>> {
        Ok(vec!["self".into()])
    }

    fn md_open(name: &str, _config: &Overrides) -> Result<SelfMd> {
        if name != "self" {
            return Err(Error::new(
                Status::NoDevice,
                format!("no memory domain {name:?}: the self component has one, \"self\""),
            ));
        }
        Ok(SelfMd)
    }

    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)> {
        Ok((RegionTable::unpack(packed)?, 0))
    }
}

pub struct SelfMd;

impl TransportMd for SelfMd {
    fn query(&self) -> MdAttr {
        MdAttr {
            flags: MdFlags::REG | MdFlags::NEED_RKEY,
            max_reg: usize::MAX,
            rkey_packed_size: PACKED_RKEY_LEN,
            reg_cost: LinearFunc { c: 5e-9, m: 0.0 },
        }
    }

    fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<usize> {
        Ok(REGIONS.with(|t| t.register(addr, len, access)))
    }

    fn mem_dereg(&self, memh: usize) -> Result<()> {
        REGIONS.with(|t| t.deregister(memh))
    }

    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        REGIONS.with(|t| t.pack(memh, buf))
    }
}
