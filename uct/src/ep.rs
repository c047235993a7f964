//! Endpoints as the application sees them: the data path.
//!
//! Each call is one indirect call into the transport's table; short sends pass borrowed buffers
//! straight through (no allocation). Operations that may finish later (zcopy, get, fetching
//! atomics, flush) count themselves on a [`Completion`] and keep their memory alive through it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::PendingResult;

use crate::completion::{AtomicResult, Completion, KeepAlive};
use crate::component::Md;
use crate::component::Rkey;
use crate::host::{check, length, outcome, pack_tramp, unpack_tramp};
use crate::iface::{EpKey, IfaceInner};
use crate::mem::MemIov;
use uct_transport::abi::{RawIov, RawPendingReq, RawStatus};
use uct_transport::types::{AtomicOp, EpAttr, FlushFlags};

/// Most I/O-vector entries one call accepts (transports advertise their own `max_iov`).
pub const MAX_IOV: usize = 16;

/// Atomic width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicWidth {
    /// 32-bit operands (the discriminant is the width in bytes).
    U32 = 4,
    /// 64-bit operands.
    U64 = 8,
}

/// An endpoint. Destroyed when dropped (after its pending requests are purged).
///
/// ```
/// use std::{cell::Cell, rc::Rc};
/// use uct::{AmCbFlags, Iface, IfaceParams, Status, Worker};
/// let ctx = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
/// let (md, _) = ctx.find_resource("self", "memory0")?;
/// let worker = Worker::new()?;
/// let iface = Iface::open(&md, &worker, IfaceParams::new("self", "memory0"))?;
/// let sum = Rc::new(Cell::new(0));
/// let s = sum.clone();
/// iface.set_am_handler(3, AmCbFlags::SYNC, move |m| s.set(s.get() + m.header()))?;
/// let ep = iface.ep_create_connected(&iface.device_address()?, &iface.address()?)?;
/// ep.am_short(3, 40, b"")?; // self delivers before the call returns
/// ep.am_bcopy(3, |buf| { buf[..8].copy_from_slice(&2u64.to_le_bytes()); 8 })?;
/// assert_eq!(sum.get(), 42);
/// // Misuse comes back with its reason.
/// let e = ep.am_short(40, 0, b"").unwrap_err();
/// assert_eq!(e, Status::InvalidParam);
/// assert!(e.context().is_some());
/// # Ok::<(), uct::Error>(())
/// ```
pub struct Ep {
    handle: *mut c_void,
    iface: Rc<IfaceInner>,
    key: EpKey,
    /// False for the view a pending request's callback borrows: dropping it destroys nothing.
    owned: bool,
}

fn gather(md: &Md, iov: &[MemIov], out: &mut [RawIov; MAX_IOV]) -> Result<usize> {
    if iov.len() > MAX_IOV {
        return Err(Error::new(
            Status::InvalidParam,
            format!("{} I/O-vector entries: at most {MAX_IOV} per call", iov.len()),
        ));
    }
    for (o, e) in out.iter_mut().zip(iov) {
        if !e.mem.md().same(md) {
            return Err(foreign_mem(e, md));
        }
        *o = e.mem.raw_iov(e.offset, e.len);
    }
    Ok(iov.len())
}

#[cold]
fn foreign_mem(e: &MemIov, md: &Md) -> Error {
    Error::new(
        Status::InvalidParam,
        format!(
            "{:?} is registered on memory domain {}, not on the interface's {}: register it with \
             the interface's memory domain",
            e.mem,
            e.mem.md().name(),
            md.name()
        ),
    )
}

const NULL_IOV: RawIov = RawIov {
    buffer: std::ptr::null_mut(),
    length: 0,
    memh: std::ptr::null_mut(),
};

impl Ep {
    pub(crate) fn from_raw(handle: *mut c_void, iface: Rc<IfaceInner>) -> Ep {
        let key = iface.eps.add(handle);
        Ep {
            handle,
            iface,
            key,
            owned: true,
        }
    }

    /// The key error reports carry for this endpoint.
    pub fn key(&self) -> EpKey {
        self.key
    }

    fn view(&self) -> EpView {
        EpView {
            handle: self.handle,
            iface: self.iface.clone(),
            key: self.key,
        }
    }

    /// What the endpoint knows about its peer: whether it is connected, and the largest active
    /// message the peer accepts (0 while unknown).
    pub fn attr(&self) -> Result<EpAttr> {
        let mut a = EpAttr::default();
        // SAFETY: valid handle and out-pointer.
        check(unsafe { (self.iface.ops.ep_query)(self.handle, &mut a) })?;
        Ok(a)
    }

    /// This endpoint's address (`ep_addr_len` bytes), for the connect-to-ep model.
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut b = vec![0; self.iface.attr.ep_addr_len];
        // SAFETY: valid handle and buffer of the advertised size.
        check(unsafe { (self.iface.ops.ep_get_address)(self.handle, b.as_mut_ptr(), b.len()) })?;
        Ok(b)
    }

    /// Connects to the peer endpoint whose device and ep addresses were exchanged out of band.
    pub fn connect_to_ep(&self, dev_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        // SAFETY: valid handle and buffers.
        check(unsafe {
            (self.iface.ops.ep_connect_to_ep)(
                self.handle,
                dev_addr.as_ptr(),
                dev_addr.len(),
                ep_addr.as_ptr(),
                ep_addr.len(),
            )
        })
    }

    /// Sends a short AM: the 8-byte `header` and `payload` (`header + payload <= am.max_short`).
    #[inline]
    pub fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        // SAFETY: valid handle; `payload` is valid for the call.
        check(unsafe {
            (self.iface.ops.ep_am_short)(self.handle, id, header, payload.as_ptr(), payload.len())
        })
    }

    /// Sends a short AM gathered from several buffers.
    pub fn am_short_iov(&self, id: u8, parts: &[&[u8]]) -> Result<()> {
        if parts.len() > MAX_IOV {
            return Err(Error::new(
                Status::InvalidParam,
                format!("am_short_iov: {} parts, at most {MAX_IOV} (MAX_IOV)", parts.len()),
            ));
        }
        let mut raw = [NULL_IOV; MAX_IOV];
        for (o, p) in raw.iter_mut().zip(parts) {
            *o = RawIov {
                buffer: p.as_ptr() as *mut u8,
                length: p.len(),
                memh: std::ptr::null_mut(),
            };
        }
        // SAFETY: the entries point to borrowed buffers valid for this synchronous call, which
        // transports only read.
        check(unsafe { (self.iface.ops.ep_am_short_iov)(self.handle, id, raw.as_ptr(), parts.len()) })
    }

    /// Sends an AM whose payload `pack` writes into a transport buffer (up to `am.max_bcopy`);
    /// returns the length sent.
    #[inline]
    pub fn am_bcopy<F: FnOnce(&mut [u8]) -> usize>(&self, id: u8, pack: F) -> Result<usize> {
        let mut f = Some(pack);
        // SAFETY: `f` lives on this stack for the synchronous pack callback.
        let n = unsafe {
            (self.iface.ops.ep_am_bcopy)(
                self.handle,
                id,
                pack_tramp::<F>,
                &mut f as *mut Option<F> as *mut c_void,
                0,
            )
        };
        length(n)
    }

    fn comp<'a>(&'a self, comp: Option<&'a Completion>) -> &'a Completion {
        comp.unwrap_or(&self.iface.orphan)
    }

    fn finish(c: &Completion, st: RawStatus) -> Result<Outcome> {
        if st != Status::InProgress.as_raw() {
            c.disarm();
        }
        outcome(st)
    }

    /// Sends an AM with `header` copied and the payload taken from registered memory.
    /// `Ok(InProgress)`: the memory is in use until `comp` fires (it is kept alive until then).
    pub fn am_zcopy(
        &self,
        id: u8,
        header: &[u8],
        iov: &[MemIov],
        comp: Option<&Completion>,
    ) -> Result<Outcome> {
        let mut raw = [NULL_IOV; MAX_IOV];
        let n = gather(&self.iface.md, iov, &mut raw)?;
        let c = self.comp(comp);
        let p = c.arm(iov.iter().map(|e| KeepAlive::Mem(e.mem.clone())));
        // SAFETY: valid handle; the memory is kept alive by the armed completion.
        let st = unsafe {
            (self.iface.ops.ep_am_zcopy)(
                self.handle,
                id,
                header.as_ptr(),
                header.len(),
                raw.as_ptr(),
                n,
                0,
                p,
            )
        };
        Self::finish(c, st)
    }

    /// Writes `data` to remote memory at `raddr` (up to `put.max_short`).
    #[inline]
    pub fn put_short(&self, data: &[u8], raddr: u64, rkey: &Rkey) -> Result<()> {
        // SAFETY: valid handle; `data` is valid for the call.
        check(unsafe {
            (self.iface.ops.ep_put_short)(self.handle, data.as_ptr(), data.len(), raddr, rkey.rkey)
        })
    }

    /// Writes what `pack` produces (up to `put.max_bcopy`) to remote memory.
    pub fn put_bcopy<F: FnOnce(&mut [u8]) -> usize>(
        &self,
        pack: F,
        raddr: u64,
        rkey: &Rkey,
    ) -> Result<usize> {
        let mut f = Some(pack);
        // SAFETY: `f` lives on this stack for the synchronous pack callback.
        let n = unsafe {
            (self.iface.ops.ep_put_bcopy)(
                self.handle,
                pack_tramp::<F>,
                &mut f as *mut Option<F> as *mut c_void,
                raddr,
                rkey.rkey,
            )
        };
        length(n)
    }

    /// Writes registered memory to remote memory.
    pub fn put_zcopy(
        &self,
        iov: &[MemIov],
        raddr: u64,
        rkey: &Rkey,
        comp: Option<&Completion>,
    ) -> Result<Outcome> {
        let mut raw = [NULL_IOV; MAX_IOV];
        let n = gather(&self.iface.md, iov, &mut raw)?;
        let c = self.comp(comp);
        let p = c.arm(iov.iter().map(|e| KeepAlive::Mem(e.mem.clone())));
        // SAFETY: valid handle; memory kept alive by the armed completion.
        let st = unsafe { (self.iface.ops.ep_put_zcopy)(self.handle, raw.as_ptr(), n, raddr, rkey.rkey, p) };
        Self::finish(c, st)
    }

    /// Reads remote memory into `buf` synchronously (up to `get.max_short`).
    pub fn get_short(&self, buf: &mut [u8], raddr: u64, rkey: &Rkey) -> Result<()> {
        // SAFETY: valid handle; `buf` is valid for writing during the call.
        check(unsafe {
            (self.iface.ops.ep_get_short)(self.handle, buf.as_mut_ptr(), buf.len(), raddr, rkey.rkey)
        })
    }

    /// Reads `len` bytes of remote memory; `unpack` receives them (possibly later, from progress).
    pub fn get_bcopy<F: FnOnce(&[u8]) + 'static>(
        &self,
        len: usize,
        raddr: u64,
        rkey: &Rkey,
        unpack: F,
        comp: Option<&Completion>,
    ) -> Result<Outcome> {
        let c = self.comp(comp);
        let arg = Box::into_raw(Box::new(unpack)) as *mut c_void;
        let p = c.arm([]);
        // SAFETY: valid handle; the transport calls `unpack_tramp` exactly once, which frees `arg`.
        let st = unsafe {
            (self.iface.ops.ep_get_bcopy)(self.handle, unpack_tramp::<F>, arg, len, raddr, rkey.rkey, p)
        };
        Self::finish(c, st)
    }

    /// Reads remote memory into registered memory.
    pub fn get_zcopy(
        &self,
        iov: &[MemIov],
        raddr: u64,
        rkey: &Rkey,
        comp: Option<&Completion>,
    ) -> Result<Outcome> {
        let mut raw = [NULL_IOV; MAX_IOV];
        let n = gather(&self.iface.md, iov, &mut raw)?;
        let c = self.comp(comp);
        let p = c.arm(iov.iter().map(|e| KeepAlive::Mem(e.mem.clone())));
        // SAFETY: valid handle; memory kept alive by the armed completion.
        let st = unsafe { (self.iface.ops.ep_get_zcopy)(self.handle, raw.as_ptr(), n, raddr, rkey.rkey, p) };
        Self::finish(c, st)
    }

    /// An atomic operation without result (`Cswap` is not allowed here).
    pub fn atomic_post(
        &self,
        width: AtomicWidth,
        op: AtomicOp,
        value: u64,
        raddr: u64,
        rkey: &Rkey,
    ) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe {
            (self.iface.ops.ep_atomic_post)(self.handle, width as u8, op as u8, value, raddr, rkey.rkey)
        })
    }

    /// An atomic operation returning the old value in `result`.
    #[allow(clippy::too_many_arguments)]
    pub fn atomic_fetch(
        &self,
        width: AtomicWidth,
        op: AtomicOp,
        value: u64,
        result: &AtomicResult,
        raddr: u64,
        rkey: &Rkey,
        comp: Option<&Completion>,
    ) -> Result<Outcome> {
        let c = self.comp(comp);
        let p = c.arm([KeepAlive::Result(result.clone())]);
        // SAFETY: valid handle; the result slot is kept alive by the armed completion.
        let st = unsafe {
            (self.iface.ops.ep_atomic_fetch)(
                self.handle,
                width as u8,
                op as u8,
                value,
                result.ptr(),
                raddr,
                rkey.rkey,
                p,
            )
        };
        Self::finish(c, st)
    }

    /// Compare-and-swap: writes `swap` if the remote value equals `compare`; the old value goes
    /// to `result`.
    #[allow(clippy::too_many_arguments)]
    pub fn atomic_cswap(
        &self,
        width: AtomicWidth,
        compare: u64,
        swap: u64,
        result: &AtomicResult,
        raddr: u64,
        rkey: &Rkey,
        comp: Option<&Completion>,
    ) -> Result<Outcome> {
        let c = self.comp(comp);
        let p = c.arm([KeepAlive::Result(result.clone())]);
        // SAFETY: valid handle; the result slot is kept alive by the armed completion.
        let st = unsafe {
            (self.iface.ops.ep_atomic_cswap)(
                self.handle,
                width as u8,
                compare,
                swap,
                result.ptr(),
                raddr,
                rkey.rkey,
                p,
            )
        };
        Self::finish(c, st)
    }

    /// Queues `req` to run when resources free up. `Err((Busy, req))`: resources are available
    /// now, retry the send; other errors also hand the request back.
    pub fn pending_add(&self, mut req: PendingRequest) -> std::result::Result<(), (Error, PendingRequest)> {
        req.0.ep = Some(self.view());
        let raw = Box::into_raw(req.0) as *mut RawPendingReq;
        // SAFETY: valid handle; on success the transport owns the pointer until it dispatches
        // it with Ok or purges it; `pending_tramp` and `purge_tramp` free it.
        let st = unsafe { (self.iface.ops.ep_pending_add)(self.handle, raw, 0) };
        if st == 0 {
            return Ok(());
        }
        // SAFETY: the transport refused it, so it is ours again.
        let mut b = unsafe { Box::from_raw(raw as *mut PendingBox) };
        b.ep = None;
        Err((uct_transport::error_context::take(st), PendingRequest(b)))
    }

    /// Hands back every queued request.
    pub fn pending_purge(&self, mut f: impl FnMut(PendingRequest)) {
        let mut dynf: &mut dyn FnMut(PendingRequest) = &mut f;
        // SAFETY: `dynf` lives on this stack for the synchronous purge.
        unsafe {
            (self.iface.ops.ep_pending_purge)(
                self.handle,
                purge_tramp,
                &mut dynf as *mut &mut dyn FnMut(PendingRequest) as *mut c_void,
            )
        }
    }

    /// Flushes: `Ok(Outcome::Done)` when all prior operations completed, `Ok(InProgress)` when `comp`
    /// will fire, `Err(NoResource)` to retry (or add a pending request).
    /// Without a completion it only reports the state (UCX's `comp == NULL`): poll again later.
    pub fn flush(&self, flags: FlushFlags, comp: Option<&Completion>) -> Result<Outcome> {
        let Some(c) = comp else {
            // SAFETY: valid handle; a null completion is allowed by the boundary.
            let st = unsafe { (self.iface.ops.ep_flush)(self.handle, flags.0, std::ptr::null_mut()) };
            return outcome(st);
        };
        let p = c.arm([]);
        // SAFETY: valid handle; completion alive while armed.
        let st = unsafe { (self.iface.ops.ep_flush)(self.handle, flags.0, p) };
        Self::finish(c, st)
    }

    /// Orders operations before and after the fence.
    pub fn fence(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { (self.iface.ops.ep_fence)(self.handle, 0) })
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        self.pending_purge(drop);
        self.iface.eps.remove(self.handle);
        // SAFETY: destroyed once; the iface outlives it (we hold an Rc).
        unsafe { (self.iface.ops.ep_destroy)(self.handle) }
    }
}

impl std::fmt::Debug for Ep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ep({:?})", self.key)
    }
}

// ---------------------------------------------------------------- pending requests

/// What a pending request's callback needs to hand it its endpoint.
struct EpView {
    handle: *mut c_void,
    iface: Rc<IfaceInner>,
    key: EpKey,
}

impl EpView {
    /// A borrowed-only `Ep` for the callback: same handle, dropping it destroys nothing.
    fn ep(&self) -> Ep {
        Ep {
            handle: self.handle,
            iface: self.iface.clone(),
            key: self.key,
            owned: false,
        }
    }
}

type PendingFn = Box<dyn FnMut(&Ep) -> PendingResult>;

#[repr(C)]
pub(crate) struct PendingBox {
    /// First field: the transport sees a pointer to it.
    raw: RawPendingReq,
    f: PendingFn,
    /// The endpoint it was added on (set by `pending_add`).
    ep: Option<EpView>,
}

/// A request to run when the endpoint has resources again (`uct_pending_req_t`). Its callback
/// gets the endpoint it was added on (to send again) and returns [`PendingResult::Done`] (done:
/// the request is dropped), [`PendingResult::InProgress`] (progress made: keep it, go on with
/// the queue) or [`PendingResult::Stop`] (no resources: keep it, stop dispatching).
pub struct PendingRequest(Box<PendingBox>);

/// # Safety
/// The [boundary contract](uct_transport::export); `req` is the first field of a `PendingBox`
/// that `pending_add` leaked.
unsafe extern "C" fn pending_tramp(req: *mut RawPendingReq) -> RawStatus {
    // SAFETY: `req` is the first field of a PendingBox leaked by `pending_add`.
    let b = unsafe { &mut *(req as *mut PendingBox) };
    let Some(view) = &b.ep else {
        return Status::Ok.as_raw();
    };
    let ep = view.ep();
    let r = catch_unwind(AssertUnwindSafe(|| (b.f)(&ep))).unwrap_or_else(|_| {
        ucs::error!("panic in a pending request (caught); request dropped");
        PendingResult::Done
    });
    drop(ep);
    match r {
        PendingResult::Done => {
            // SAFETY: done: the transport forgets the pointer, so we free it (we created it).
            drop(unsafe { Box::from_raw(req as *mut PendingBox) });
            Status::Ok.as_raw()
        }
        PendingResult::InProgress => Status::InProgress.as_raw(),
        PendingResult::Stop => Status::NoResource.as_raw(),
    }
}

/// # Safety
/// The [boundary contract](uct_transport::export); `req` is a request `pending_add` leaked and
/// `arg` the `&mut dyn FnMut` on `pending_purge`'s stack.
unsafe extern "C" fn purge_tramp(req: *mut RawPendingReq, arg: *mut c_void) {
    // SAFETY: `req` is ours again; `arg` is the `&mut dyn FnMut` on `pending_purge`'s stack.
    let mut b = unsafe { Box::from_raw(req as *mut PendingBox) };
    b.ep = None;
    // SAFETY: as above.
    let f = unsafe { &mut *(arg as *mut &mut dyn FnMut(PendingRequest)) };
    if catch_unwind(AssertUnwindSafe(|| f(PendingRequest(b)))).is_err() {
        ucs::error!("panic in a pending purge callback (caught)");
    }
}

impl PendingRequest {
    /// Wraps a callback.
    pub fn new(f: impl FnMut(&Ep) -> PendingResult + 'static) -> PendingRequest {
        PendingRequest(Box::new(PendingBox {
            raw: RawPendingReq { func: pending_tramp },
            f: Box::new(f),
            ep: None,
        }))
    }

    /// Runs the callback directly on `ep` (e.g. after `pending_add` answered `Busy`).
    pub fn run(&mut self, ep: &Ep) -> PendingResult {
        (self.0.f)(ep)
    }
}
