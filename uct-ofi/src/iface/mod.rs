//! The ofi interface: one RDM endpoint with its CQ (sends and receives) and AV, receive buffers
//! posted on it, and the table of operations in flight. On a connected (`FI_EP_MSG`) device the
//! RDM endpoint's place is taken by a shared receive context, and each uct endpoint has its own
//! connected libfabric endpoint (see `msg`), on the same CQ.
//!
//! Every operation that completes through the CQ takes a slot: slot `i` owns operation
//! context `i` (64 bytes, `FI_CONTEXT2`) and send buffer `i` (`SEG_SIZE` bytes, registered when
//! the provider wants `FI_MR_LOCAL`); receive buffer `j` owns context `tx_len + j`. A completion's
//! context address gives the slot back. No free slot, or `-FI_EAGAIN` from the provider, is
//! `NoResource`; endpoints queue pending requests, dispatched from progress.
//!
//! Progress is manual: `progress` reads the CQ (which is also what drives providers with manual
//! progress, `tcp;ofi_rxm` and `efa` among them), delivers AMs, completes operations, then
//! dispatches pending requests.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::am::AmTable;
use uct_transport::callbacks::{Comp, ErrHandler, ResultPtr};
use uct_transport::traits::{IfaceOpenParams, Transport, TransportIface};
use uct_transport::types::*;

use crate::config::OFI_CONFIG;
use crate::ep::{EpState, OfiEp};
use crate::ffi::{self, atomic, bits, AtomicKind, Av, Buffers, Cq, CqEntry, Endpoint, Mr};
use crate::md::{MdInner, OfiMd};
use crate::msg::Msg;
use crate::wire;

mod open;
mod progress;

/// Bytes of one operation context (`struct fi_context2`).
const CTX_LEN: usize = 64;
/// Completions read per `fi_cq_read`.
const CQ_BATCH: usize = 16;

pub struct OfiTransport;

impl Transport for OfiTransport {
    type Md = OfiMd;
    type Iface = OfiIface;
    const NAME: &'static CStr = c"ofi";

    fn query_devices(md: &OfiMd) -> Result<Vec<TlResource>> {
        let ty = if md.inner.info.get().prov_name() == "shm" {
            DeviceType::Shm
        } else {
            DeviceType::Net
        };
        let r = TlResource::new("ofi", &md.inner.name, ty);
        Ok(vec![match crate::device::duplicate_of(&md.inner.name) {
            Some((tl, dev)) => r.duplicating(tl, &dev),
            None => r,
        }])
    }

    fn iface_open(md: &OfiMd, params: IfaceOpenParams) -> Result<OfiIface> {
        if params.dev_name != md.inner.name {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "ofi: no device {:?} in memory domain {:?} (one device per domain)",
                    params.dev_name, md.inner.name
                ),
            ));
        }
        OfiIface::open(md.inner.clone(), params)
    }
}

/// What an operation in flight completes.
pub(crate) enum Op {
    Free,
    /// A send from the slot's buffer, or a zcopy/RMA operation.
    Plain {
        ep: Rc<EpState>,
        comp: Comp,
    },
    /// An atomic that fetches into the slot's buffer (offset 16).
    Fetch {
        ep: Rc<EpState>,
        comp: Comp,
        result: Option<ResultPtr>,
        wide: bool,
    },
}

/// Atomic operations the provider supports, per width.
#[derive(Clone, Copy, Default)]
pub(crate) struct AtomicSupport {
    pub a32: AtomicCaps,
    pub a64: AtomicCaps,
}

/// The interface's state, shared with its endpoints. Field order is drop order: the endpoints
/// close first (connected ones and operations in flight are dropped in `Drop`), then the
/// objects and memory they used.
pub(crate) struct Shared {
    /// Connection management on a connected device.
    pub(crate) msg: Option<Msg>,
    /// Where receives are posted: the RDM endpoint (which also sends), or the shared receive
    /// context of the connected endpoints.
    pub(crate) rx: Rc<Endpoint>,
    pub(crate) cq: Rc<Cq>,
    pub(crate) av: Option<Rc<Av>>,
    /// Each peer's AV entry, by its address: endpoints to one peer share it (providers bound
    /// their AV: shm takes a few hundred entries).
    peers: RefCell<std::collections::HashMap<Box<[u8]>, u64>>,
    tx_mr: Option<Mr>,
    rx_mr: Option<Mr>,
    pub(crate) md: Rc<MdInner>,
    pub(crate) tx_bufs: Buffers,
    rx_bufs: Buffers,
    contexts: Buffers,
    pub(crate) ops: RefCell<Vec<Op>>,
    free: RefCell<Vec<u32>>,
    pub(crate) seg: usize,
    pub(crate) tx_len: usize,
    rx_len: usize,
    /// Consumed receive buffers not yet posted again (capacity `rx_len`: pushing never
    /// allocates), and how many may wait before they are.
    rx_done: RefCell<Vec<u32>>,
    rx_batch: usize,
    pub(crate) max_short: usize,
    pub(crate) max_rma: usize,
    pub(crate) am_iov: usize,
    pub(crate) rma_iov: usize,
    pub(crate) rma: bool,
    pub(crate) atomics: AtomicSupport,
    /// libfabric 1.17's verbs connected endpoint puts the operand and compare *pointers* into
    /// the work request as the values (`compare_add = (uintptr_t)buf`): pass the values there.
    pub(crate) atomic_by_value: bool,
    pub(crate) name: Vec<u8>,
    dev_addr: [u8; 16],
    am: Rc<AmTable>,
    pub(crate) err_handler: ErrHandler,
    /// Endpoints with pending requests, in arrival order.
    pub(crate) arbiter: RefCell<VecDeque<Rc<EpState>>>,
    /// The endpoint whose pending request is being dispatched (its sends may go ahead).
    pub(crate) dispatching: Cell<usize>,
    outstanding: Cell<usize>,
    flush_waiters: RefCell<Vec<Comp>>,
    /// am_short's staging buffer (`max_short` bytes).
    pub(crate) short_buf: RefCell<Vec<u8>>,
    wait_fd: Option<RawFd>,
    warned_cq: Cell<bool>,
    /// Endpoints whose sends found the provider full; failed after `peer_timeout`.
    pub(crate) stalled: RefCell<Vec<Rc<EpState>>>,
    peer_timeout: std::time::Duration,
    /// Progress calls, to look at `stalled` every few of them.
    ticks: Cell<u32>,
}

pub struct OfiIface {
    pub(crate) s: Rc<Shared>,
}

fn op_of(atomic: AtomicOp) -> Option<u32> {
    Some(match atomic {
        AtomicOp::Add => atomic::SUM,
        AtomicOp::And => atomic::BAND,
        AtomicOp::Or => atomic::BOR,
        AtomicOp::Xor => atomic::BXOR,
        AtomicOp::Swap => atomic::WRITE,
        AtomicOp::Cswap => atomic::CSWAP,
    })
}

pub(crate) fn fi_op(op: AtomicOp) -> u32 {
    op_of(op).unwrap_or(atomic::SUM)
}

impl Shared {
    /// The context address of slot `i` (send) or `tx_len + j` (receive).
    #[inline]
    pub(crate) fn ctx(&self, i: usize) -> *mut std::ffi::c_void {
        self.contexts.addr(i * CTX_LEN).cast()
    }

    /// The send descriptor of the send buffers (null without `FI_MR_LOCAL`).
    #[inline]
    pub(crate) fn tx_desc(&self) -> *mut std::ffi::c_void {
        self.tx_mr.as_ref().map_or(std::ptr::null_mut(), Mr::desc)
    }

    fn post_recv(&self, j: usize) -> std::result::Result<(), i32> {
        let desc = self.rx_mr.as_ref().map_or(std::ptr::null_mut(), Mr::desc);
        for _ in 0..1000 {
            // SAFETY: receive buffer j and context tx_len + j belong to this receive until its
            // completion is read (they are reposted only from that completion); both live as
            // long as the endpoint (field order).
            let r = unsafe {
                self.rx.recv(
                    self.rx_bufs.addr(j * self.seg),
                    self.seg,
                    desc,
                    self.ctx(self.tx_len + j),
                )
            };
            match r {
                0 => return Ok(()),
                r if -r as i32 == ffi::errno::EAGAIN => {
                    // the provider's queue is full until it makes progress
                    let _ = self.cq.read(&mut []);
                }
                r => return Err(r as i32),
            }
        }
        Err(-(ffi::errno::EAGAIN))
    }

    /// A free slot for an operation of `ep`, or `NoResource`.
    #[inline]
    pub(crate) fn alloc(&self) -> Result<usize> {
        match self.free.borrow_mut().pop() {
            Some(i) => Ok(i as usize),
            None => Err(Status::NoResource.into()),
        }
    }

    /// Gives back a slot whose operation was not posted.
    #[inline]
    pub(crate) fn unalloc(&self, i: usize) {
        self.free.borrow_mut().push(i as u32);
    }

    /// Records the operation posted in slot `i`.
    #[inline]
    pub(crate) fn posted(&self, i: usize, op: Op, ep: &EpState) {
        self.ops.borrow_mut()[i] = op;
        ep.outstanding.set(ep.outstanding.get() + 1);
        self.outstanding.set(self.outstanding.get() + 1);
    }

    pub(crate) fn has_free(&self) -> bool {
        !self.free.borrow().is_empty()
    }

    /// The AV entry of the peer at `addr`, inserted at its first endpoint.
    pub(crate) fn peer_addr(&self, addr: &[u8]) -> std::result::Result<u64, i32> {
        if let Some(&a) = self.peers.borrow().get(addr) {
            return Ok(a);
        }
        let a = self
            .av
            .as_ref()
            .expect("an RDM interface has an AV")
            .insert(addr)?;
        self.peers.borrow_mut().insert(addr.into(), a);
        Ok(a)
    }

    /// Whether `dev`/`iface` is an address of a peer this interface can reach.
    pub(crate) fn reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        dev == self.dev_addr && iface.len() == self.name.len()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Operations in flight and pending queues hold endpoint states, and connected ones their
        // libfabric endpoints: those close before the receive context and buffers (fields).
        self.arbiter.get_mut().clear();
        for op in self.ops.get_mut().iter_mut() {
            *op = Op::Free;
        }
        if let Some(m) = &self.msg {
            m.close_all();
        }
    }
}

impl Drop for OfiIface {
    fn drop(&mut self) {
        if let Some(m) = &self.s.msg {
            m.unwatch();
        }
        // Endpoints may outlive us; the host frees the handlers next.
        self.s.am.clear();
        self.s.arbiter.borrow_mut().clear();
        self.s.drain();
        if self.s.outstanding.get() > 0 && self.s.md.info.get().prov_name().contains("ofi_rxm") {
            // Still in flight (the peer went away or stopped progressing): libfabric 1.17's RxM
            // may crash closing the endpoint now, so its objects and buffers are left open.
            ucs::debug!(
                "ofi {}: closing with {} operations in flight: endpoint left open",
                self.s.md.name,
                self.s.outstanding.get()
            );
            std::mem::forget(self.s.clone());
        }
    }
}

impl TransportIface for OfiIface {
    type Ep = OfiEp;

    fn query(&self) -> IfaceAttr {
        let s = &self.s;
        let mut flags = IfaceFlags::AM_BCOPY
            | IfaceFlags::AM_ZCOPY
            | IfaceFlags::PENDING
            | IfaceFlags::CONNECT_TO_IFACE
            | IfaceFlags::CB_SYNC
            | IfaceFlags::ERRHANDLE_AM_ID
            | IfaceFlags::ERRHANDLE_BCOPY_LEN;
        // Connected devices: a connection's loss is an EQ event, its operations' failures CQ
        // errors. RxM stacks report a broken connection on the CQ, or refuse sends
        // (-FI_EAGAIN) while reconnecting to a peer that is gone (RUCX_OFI_PEER_TIMEOUT).
        // libfabric 1.17's shm crashes sending to a closed endpoint of the same process, and
        // efa is not verified.
        if s.msg.is_some() || s.md.info.get().prov_name().contains("ofi_rxm") {
            flags |= IfaceFlags::ERRHANDLE_PEER_FAILURE;
        }
        if s.max_short > 0 {
            flags |= IfaceFlags::AM_SHORT;
        }
        if s.rma {
            flags |= IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY;
        }
        let a = s.atomics;
        if !(a.a32.fop_flags | a.a64.fop_flags).is_empty() {
            flags |= IfaceFlags::ATOMIC_DEVICE;
        }
        if s.md.info.get().prov_name() != "shm" {
            flags |= IfaceFlags::INTER_NODE;
        }
        let am_max = s.seg - wire::HDR_LEN;
        let rma_caps = OpCaps {
            max_zcopy: s.max_rma,
            max_iov: s.rma_iov,
            opt_zcopy_align: 1,
            align_mtu: 1,
            ..Default::default()
        };
        let shm = s.md.info.get().prov_name() == "shm";
        IfaceAttr {
            flags,
            event_flags: if s.wait_fd.is_some() {
                EventFlags::FD | EventFlags::SEND_COMP | EventFlags::RECV
            } else {
                EventFlags::EMPTY
            },
            am: OpCaps {
                max_short: s.max_short,
                max_bcopy: am_max,
                min_zcopy: 0,
                max_zcopy: am_max,
                opt_zcopy_align: 1,
                align_mtu: 1,
                max_hdr: am_max.min(128),
                max_iov: s.am_iov,
            },
            put: rma_caps,
            get: rma_caps,
            atomic32: a.a32,
            atomic64: a.a64,
            device_addr_len: s.dev_addr.len(),
            iface_addr_len: s.name.len(),
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 50e-9,
            bandwidth: Bandwidth {
                dedicated: if shm { 10e9 } else { 1.25e9 },
                shared: 0.0,
            },
            latency: LinearFunc {
                c: if shm { 1e-6 } else { 10e-6 },
                m: 0.0,
            },
            priority: 0,
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..16).ok_or(Status::BufferTooSmall)?;
        out.copy_from_slice(&self.s.dev_addr);
        Ok(())
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        let n = self.s.name.len();
        let out = buf.get_mut(..n).ok_or(Status::BufferTooSmall)?;
        out.copy_from_slice(&self.s.name);
        Ok(())
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        self.s.reachable(dev, iface)
    }

    fn progress(&self) -> u32 {
        self.s.progress()
    }

    fn flush(&self, _flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        if self.s.outstanding.get() == 0 {
            return Ok(Outcome::Done);
        }
        if !comp.is_none() {
            self.s.flush_waiters.borrow_mut().push(comp);
        }
        Ok(Outcome::InProgress)
    }

    fn event_fd(&self) -> Result<RawFd> {
        self.s.wait_fd.ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                format!(
                    "ofi {}: the provider's completion queue has no fd wait object (open the interface for wakeup, or RUCX_OFI_EVENT_FD=y): poll with progress",
                    self.s.md.name
                ),
            )
        })
    }

    fn event_arm(&self, _events: ArmEvents) -> Result<()> {
        if self.s.wait_fd.is_none() {
            return Err(Status::Unsupported.into());
        }
        if !self.s.arbiter.borrow().is_empty() {
            // pending requests wait for progress, not for the fd
            return Err(Status::Busy.into());
        }
        // a sleeping interface keeps all its receive buffers posted
        self.s.repost();
        match self.s.md.domain.fabric.trywait(&self.s.cq) {
            Ok(()) => Ok(()),
            Err(_) => Err(Status::Busy.into()),
        }
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<OfiEp> {
        OfiEp::connect(&self.s, dev, iface)
    }
}
