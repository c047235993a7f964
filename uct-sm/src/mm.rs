//! The posix and sysv components: one memory domain each (`posix`, `sysv`), one transport of
//! the same name with one device, `memory`. They differ only in how the FIFO segment is created
//! and mapped ([`Mapper`]); the interface and endpoints are shared (`iface`, `ep`).

use std::ffi::CStr;
use std::marker::PhantomData;

use ucs::config::{Overrides, Ternary};
use ucs::{Error, Result, Status};
use uct_transport::traits::{IfaceOpenParams, Transport, TransportComponent, TransportMd};
use uct_transport::types::{DeviceType, LinearFunc, MdAttr, MdFlags, MemAccess, TlResource};

use crate::config::{posix_proc_link, sysv_hugetlb};
use crate::iface::MmIface;
use crate::sys::{self, Mapping};

/// The one device of every shared-memory transport.
pub const DEVICE: &str = "memory";

/// A segment created for an interface's FIFO.
pub struct OwnSeg {
    pub map: Mapping,
    pub id: u64,
    pub proc_link: bool,
    /// The posix name to unlink when the interface closes (only without proc link).
    pub name: Option<String>,
    /// Keeps the posix fd open: peers map it through /proc/<pid>/fd.
    pub _fd: Option<std::os::fd::OwnedFd>,
}

/// How a FIFO segment is created and mapped.
pub trait Mapper: 'static {
    const NAME: &'static CStr;
    const STR: &'static str;
    fn create(len: usize, config: &Overrides) -> Result<OwnSeg>;
    fn attach(pid: u32, id: u64, len: usize, proc_link: bool) -> Result<Mapping>;
}

pub struct Posix;
pub struct Sysv;

impl Mapper for Posix {
    const NAME: &'static CStr = c"posix";
    const STR: &'static str = "posix";

    fn create(len: usize, config: &Overrides) -> Result<OwnSeg> {
        let proc_link = posix_proc_link(config)?;
        let s = sys::posix_create(len, proc_link)?;
        Ok(OwnSeg {
            map: s.map,
            id: s.id,
            proc_link,
            name: s.name,
            _fd: Some(s.fd),
        })
    }

    fn attach(pid: u32, id: u64, len: usize, proc_link: bool) -> Result<Mapping> {
        sys::posix_attach(pid, id, len, proc_link)
    }
}

impl Mapper for Sysv {
    const NAME: &'static CStr = c"sysv";
    const STR: &'static str = "sysv";

    fn create(len: usize, config: &Overrides) -> Result<OwnSeg> {
        let s = match sysv_hugetlb(config)? {
            Ternary::No => sys::sysv_create(len, false)?,
            Ternary::Yes => sys::sysv_create(len, true)?,
            Ternary::Try => sys::sysv_create(len, true).or_else(|_| sys::sysv_create(len, false))?,
        };
        Ok(OwnSeg {
            map: s.map,
            id: s.id,
            proc_link: false,
            name: None,
            _fd: None,
        })
    }

    fn attach(_pid: u32, id: u64, len: usize, _proc_link: bool) -> Result<Mapping> {
        sys::sysv_attach(id, len)
    }
}

pub struct MmComponent<M>(PhantomData<M>);

impl<M: Mapper> TransportComponent for MmComponent<M> {
    type Md = MmMd<M>;
    const NAME: &'static CStr = M::NAME;

    fn md_resources() -> Result<Vec<String>> {
        Ok(vec![M::STR.into()])
    }

    fn md_open(name: &str, config: &Overrides) -> Result<MmMd<M>> {
        if name != M::STR {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "no memory domain {name:?}: the {0} component has one, \"{0}\"",
                    M::STR
                ),
            ));
        }
        Ok(MmMd {
            config: config.clone(),
            _m: PhantomData,
        })
    }

    fn rkey_unpack(_packed: &[u8]) -> Result<(u64, usize)> {
        Ok((0, 0))
    }
}

/// A posix or sysv memory domain. The transports do no RMA: registration only hands out
/// handles (so memory can be registered on every domain of a context), and rkeys are empty.
pub struct MmMd<M> {
    pub(crate) config: Overrides,
    _m: PhantomData<M>,
}

impl<M: Mapper> TransportMd for MmMd<M> {
    fn query(&self) -> MdAttr {
        MdAttr {
            flags: MdFlags::REG,
            max_reg: usize::MAX,
            rkey_packed_size: 0,
            reg_cost: LinearFunc::default(),
        }
    }

    fn mem_reg(&self, _addr: *mut u8, _len: usize, _access: MemAccess) -> Result<usize> {
        Ok(1)
    }

    fn mem_dereg(&self, _memh: usize) -> Result<()> {
        Ok(())
    }

    fn mkey_pack(&self, _memh: usize, _buf: &mut [u8]) -> Result<()> {
        Ok(())
    }
}

pub struct MmTransport<M>(PhantomData<M>);

impl<M: Mapper> Transport for MmTransport<M> {
    type Md = MmMd<M>;
    type Iface = MmIface;
    const NAME: &'static CStr = M::NAME;

    fn query_devices(_md: &MmMd<M>) -> Result<Vec<TlResource>> {
        Ok(vec![TlResource::new(M::STR, DEVICE, DeviceType::Shm)])
    }

    fn iface_open(md: &MmMd<M>, params: IfaceOpenParams) -> Result<MmIface> {
        if params.dev_name != DEVICE {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "no device {:?}: {} has one device, {DEVICE}",
                    params.dev_name,
                    M::STR
                ),
            ));
        }
        let config = md.config.merged(&params.config);
        MmIface::open::<M>(params, &config)
    }
}
