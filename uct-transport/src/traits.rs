//! The safe traits a transport implements. [`crate::export`] turns them into the C-ABI
//! tables, so a transport crate contains no `extern "C"` code of its own.
//!
//! Threading: a worker and everything opened on it (interfaces, endpoints, memory domains used
//! with it) live on one thread. All methods take `&self`; transports use `Cell`/`RefCell` inside,
//! and must not hold a `RefCell` borrow while calling user callbacks (AM handlers, completions,
//! pending callbacks, error handlers), because those may call back into the transport.

use std::ffi::CStr;
use std::os::fd::RawFd;
use std::rc::Rc;

use ucs::config::Overrides;
use ucs::{Outcome, Result, Status};

use crate::am::AmTable;
use crate::callbacks::{Comp, ErrHandler, PackCb, PendingReq, PurgeCb, ResultPtr, UnpackCb};
use crate::iov::Iov;
use crate::types::{ArmEvents, AtomicOp, EpAttr, FlushFlags, IfaceAttr, MdAttr, MemAccess, TlResource};
use crate::worker_ref::WorkerRef;

/// A component: a family of memory domains (`uct_component_t`).
pub trait TransportComponent: 'static {
    type Md: TransportMd;
    const NAME: &'static CStr;
    /// Names of the memory domains this component can open.
    fn md_resources() -> Result<Vec<String>>;
    /// Opens memory domain `name`; `config` (set in code) is read on top of the environment
    /// for it and for what its resources query (e.g. `NET_DEVICES`).
    fn md_open(name: &str, config: &Overrides) -> Result<Self::Md>;
    /// Unpacks a packed rkey into the value used in RMA calls and a handle for `rkey_release`.
    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)>;
    fn rkey_release(_rkey: u64, _handle: usize) {}
}

/// A memory domain (`uct_md_h`).
pub trait TransportMd: 'static {
    fn query(&self) -> MdAttr;
    /// Registers `[addr, addr+len)`; returns a handle (any value but 0 is fine).
    /// The host keeps the memory valid until `mem_dereg`.
    fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<usize> {
        let _ = (addr, len, access);
        Err(Status::Unsupported.into())
    }
    /// Deregisters: when it returns `Ok`, no peer reaches the memory any more through a key of
    /// this registration (the host frees it next). `Err` when that cannot be made sure: the
    /// host then never frees the memory.
    fn mem_dereg(&self, memh: usize) -> Result<()> {
        let _ = memh;
        Err(Status::Unsupported.into())
    }
    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        let _ = (memh, buf);
        Err(Status::Unsupported.into())
    }
}

/// What `iface_open` receives.
pub struct IfaceOpenParams {
    pub dev_name: String,
    pub worker: WorkerRef,
    /// The AM handler table; the host fills it through `set_am_handler`.
    pub am: Rc<AmTable>,
    pub err_handler: ErrHandler,
    pub rx_headroom: usize,
    /// Configuration set in code for this interface; read the transport's tables through it
    /// (`TABLE.with(&params.config)`), so it wins over the `RUCX_*` environment.
    pub config: Overrides,
    /// The caller will wait on the interface's event fd (`event_fd` / `event_arm`). A transport
    /// whose event fd costs something per operation may set it up only then.
    pub wakeup: bool,
}

/// A transport (`uct_tl_t`) on memory domains of type `Md`.
pub trait Transport: 'static {
    type Md: TransportMd;
    type Iface: TransportIface;
    const NAME: &'static CStr;
    fn query_devices(md: &Self::Md) -> Result<Vec<TlResource>>;
    fn iface_open(md: &Self::Md, params: IfaceOpenParams) -> Result<Self::Iface>;
}

/// An interface (`uct_iface_h`). Unsupported operations keep the default `Unsupported`.
pub trait TransportIface: 'static {
    type Ep: TransportEp;
    /// False for transports whose `progress` never has work (e.g. synchronous delivery): then
    /// `progress_enable` registers nothing and the worker's progress skips them entirely.
    const NEEDS_PROGRESS: bool = true;
    fn query(&self) -> IfaceAttr;
    fn device_address(&self, buf: &mut [u8]) -> Result<()>;
    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        let _ = buf;
        Ok(())
    }
    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool;
    /// One round of progress; returns the amount of work done.
    fn progress(&self) -> u32;
    /// `Ok(Done)` when everything is complete, `Ok(InProgress)` when `comp` will be updated.
    fn flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        let _ = (flags, comp);
        Err(Status::Unsupported.into())
    }
    fn fence(&self, _flags: u32) -> Result<()> {
        Ok(())
    }
    fn event_fd(&self) -> Result<RawFd> {
        Err(Status::Unsupported.into())
    }
    /// `Err(Busy)` when events are already pending (do not sleep).
    fn event_arm(&self, events: ArmEvents) -> Result<()> {
        let _ = events;
        Err(Status::Unsupported.into())
    }
    fn ep_create(&self) -> Result<Self::Ep> {
        Err(Status::Unsupported.into())
    }
    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<Self::Ep> {
        let _ = (dev, iface);
        Err(Status::Unsupported.into())
    }
}

/// Identifies an endpoint to the host (the handle the host holds); passed to the error handler.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EpHandle(pub usize);

/// Width of an atomic operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AtomicSize {
    U32,
    U64,
}

/// An endpoint (`uct_ep_h`). Unsupported operations keep the default `Unsupported`.
///
/// Send calls return `Err(NoResource)` when resources are exhausted (and while a pending queue
/// is non-empty, so nothing overtakes — except sends made by the pending request being
/// dispatched, which is the head of the queue), `Ok(Outcome::Done)` when complete,
/// `Ok(InProgress)` when `comp` will be updated later. A `Comp` may be empty (`is_none`):
/// flush without a completion only reports the state.
///
/// 32-bit atomics use the low 32 bits of `value`/`compare`/`swap` and return the old value
/// zero-extended.
#[allow(unused_variables, clippy::too_many_arguments)]
pub trait TransportEp: 'static {
    /// Called once, right after creation, with the handle the host will see in error reports.
    fn on_created(&self, handle: EpHandle) {}
    /// What the endpoint knows about its peer.
    fn query(&self) -> EpAttr {
        EpAttr::default()
    }
    fn get_address(&self, buf: &mut [u8]) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn connect_to_ep(&self, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn am_bcopy(&self, id: u8, pack: PackCb, flags: u32) -> Result<usize> {
        Err(Status::Unsupported.into())
    }
    fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], flags: u32, comp: Comp) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    fn put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn put_bcopy(&self, pack: PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        Err(Status::Unsupported.into())
    }
    fn put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    fn get_short(&self, buf: &mut [u8], raddr: u64, rkey: u64) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn get_bcopy(&self, unpack: UnpackCb, len: usize, raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    fn get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    fn atomic_post(&self, size: AtomicSize, op: AtomicOp, value: u64, raddr: u64, rkey: u64) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    /// The old value is written through `result` before `comp` is updated (or before returning Ok).
    fn atomic_fetch(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    fn atomic_cswap(
        &self,
        size: AtomicSize,
        compare: u64,
        swap: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    /// `Err(Busy)` when resources are available now (the caller should retry the send).
    fn pending_add(&self, req: PendingReq, flags: u32) -> Result<()> {
        Err(Status::Unsupported.into())
    }
    fn pending_purge(&self, purge: PurgeCb) {}
    fn flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        Err(Status::Unsupported.into())
    }
    fn fence(&self, flags: u32) -> Result<()> {
        Ok(())
    }
}
