//! Plugin side of the boundary: builds the C tables from the safe traits of
//! [`crate::transport`]. Every entry point catches panics and turns them into `UCS_ERR_IO_ERROR`
//! (or a harmless default), so no unwinding crosses `extern "C"`.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use ucs::Status;

use super::*;
use crate::am::AmTable;
use crate::callbacks::{Comp, ErrHandler, PackCb, PendingReq, PurgeCb, ResultPtr, UnpackCb};
use crate::iov::Iov;
use crate::transport::{AtomicSize, Component, Ep, EpHandle, Iface, IfaceParams, Md, Transport};
use crate::types::{AmCbFlags, ArmEvents, AtomicOp, FlushFlags, MemAccess, ProgressFlags};
use crate::worker_ref::{ProgressId, WorkerRef};

const PANIC: RawStatus = Status::IoError.as_raw();

#[inline(always)]
fn guard(f: impl FnOnce() -> RawStatus) -> RawStatus {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!("panic inside a transport (caught at the plugin boundary)");
        PANIC
    })
}

#[inline(always)]
fn st(r: ucs::Result<()>) -> RawStatus {
    match r {
        Ok(()) => 0,
        Err(e) => e.as_raw(),
    }
}

#[inline(always)]
fn st2(r: ucs::Result<Status>) -> RawStatus {
    match r {
        Ok(s) => s.as_raw(),
        Err(e) => e.as_raw(),
    }
}

/// # Safety
/// `p` must be valid for `n` bytes when `n > 0` (any value, null too, when `n == 0`).
#[inline(always)]
unsafe fn bytes<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// # Safety
/// `p` must be valid for writing `n` bytes when `n > 0` (any value when `n == 0`).
#[inline(always)]
unsafe fn bytes_mut<'a>(p: *mut u8, n: usize) -> &'a mut [u8] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

fn atomic_size(size: u8) -> Result<AtomicSize, Status> {
    match size {
        4 => Ok(AtomicSize::U32),
        8 => Ok(AtomicSize::U64),
        _ => Err(Status::InvalidParam),
    }
}

fn atomic_op(op: u8) -> Result<AtomicOp, Status> {
    AtomicOp::from_raw(op).ok_or(Status::InvalidParam)
}

// ---------------------------------------------------------------- component and memory domain

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn query_md_resources<C: Component>(
    out: *mut RawMdResource,
    max: usize,
    count: *mut usize,
) -> RawStatus {
    guard(|| match C::md_resources() {
        Ok(names) => {
            // SAFETY: the host passes an array of `max` entries and a valid count pointer.
            unsafe {
                *count = names.len();
                for (i, n) in names.iter().take(max).enumerate() {
                    *out.add(i) = RawMdResource::new(n);
                }
            }
            0
        }
        Err(e) => e.as_raw(),
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn md_open<C: Component>(name: *const c_char, md: *mut *mut c_void) -> RawStatus {
    guard(|| {
        // SAFETY: the host passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        match C::md_open(&name) {
            Ok(m) => {
                // SAFETY: `md` is a valid out-pointer.
                unsafe { *md = Box::into_raw(Box::new(m)) as *mut c_void };
                0
            }
            Err(e) => e.as_raw(),
        }
    })
}

/// # Safety
/// `md` must be a handle returned by `md_open` of a component whose `Md` is `M`.
#[inline(always)]
unsafe fn md_ref<'a, M>(md: *mut c_void) -> &'a M {
    // SAFETY: forwarded to the caller.
    unsafe { &*(md as *const M) }
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn md_close<M: Md>(md: *mut c_void) {
    // SAFETY: the host closes each md once, after every iface on it.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(md as *mut M) })));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn md_query<M: Md>(md: *mut c_void, attr: *mut MdAttr) -> RawStatus {
    // SAFETY: valid handle and out-pointer from the host.
    guard(|| unsafe {
        *attr = md_ref::<M>(md).query();
        0
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn md_mem_reg<M: Md>(
    md: *mut c_void,
    addr: *mut u8,
    len: usize,
    access: u32,
    memh: *mut *mut c_void,
) -> RawStatus {
    // SAFETY: valid handle and out-pointer from the host.
    guard(
        || match unsafe { md_ref::<M>(md) }.mem_reg(addr, len, MemAccess(access)) {
            Ok(h) => {
                // SAFETY: valid out-pointer.
                unsafe { *memh = h as *mut c_void };
                0
            }
            Err(e) => e.as_raw(),
        },
    )
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn md_mem_dereg<M: Md>(md: *mut c_void, memh: *mut c_void) -> RawStatus {
    // SAFETY: valid handle from the host.
    guard(|| st(unsafe { md_ref::<M>(md) }.mem_dereg(memh as usize)))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn md_mkey_pack<M: Md>(
    md: *mut c_void,
    memh: *mut c_void,
    buf: *mut u8,
    len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffer from the host.
    guard(|| st(unsafe { md_ref::<M>(md) }.mkey_pack(memh as usize, bytes_mut(buf, len))))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn rkey_unpack<C: Component>(
    buf: *const u8,
    len: usize,
    rkey: *mut u64,
    handle: *mut *mut c_void,
) -> RawStatus {
    // SAFETY: valid buffer and out-pointers from the host.
    guard(|| match C::rkey_unpack(unsafe { bytes(buf, len) }) {
        Ok((k, h)) => {
            // SAFETY: valid out-pointers.
            unsafe {
                *rkey = k;
                *handle = h as *mut c_void;
            }
            0
        }
        Err(e) => e.as_raw(),
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn rkey_release<C: Component>(rkey: u64, handle: *mut c_void) {
    let _ = catch_unwind(|| C::rkey_release(rkey, handle as usize));
}

/// The memory-domain table of `M`.
pub const fn md_ops<M: Md>() -> RawMdOps {
    RawMdOps {
        close: md_close::<M>,
        query: md_query::<M>,
        mem_reg: md_mem_reg::<M>,
        mem_dereg: md_mem_dereg::<M>,
        mkey_pack: md_mkey_pack::<M>,
    }
}

/// The component descriptor of `C`; `md_ops` must be `md_ops::<C::Md>()` and `transports`
/// the transports on `C::Md`.
pub const fn component<C: Component>(
    md_ops: &'static RawMdOps,
    transports: &'static [RawTransport],
) -> RawComponent {
    RawComponent {
        name: C::NAME.as_ptr(),
        query_md_resources: query_md_resources::<C>,
        md_open: md_open::<C>,
        md_ops,
        rkey_unpack: rkey_unpack::<C>,
        rkey_release: rkey_release::<C>,
        num_transports: transports.len(),
        transports: transports.as_ptr(),
    }
}

// ---------------------------------------------------------------- transport and iface

/// The iface as the host holds it: the transport's iface plus what the glue manages.
struct IfaceBox<I: Iface> {
    inner: I,
    worker: WorkerRef,
    am: Rc<AmTable>,
    progress_id: Cell<Option<ProgressId>>,
    progress_flags: Cell<u32>,
}

/// # Safety
/// `iface` must be a handle returned by `iface_open` of a transport whose iface type is `I`.
#[inline(always)]
unsafe fn iface_ref<'a, I: Iface>(iface: *mut c_void) -> &'a IfaceBox<I> {
    // SAFETY: forwarded to the caller.
    unsafe { &*(iface as *const IfaceBox<I>) }
}

/// # Safety
/// `ep` must be a handle returned by `ep_create*` of an iface whose ep type is `E`.
#[inline(always)]
unsafe fn ep_ref<'a, E: Ep>(ep: *mut c_void) -> &'a E {
    // SAFETY: forwarded to the caller.
    unsafe { &*(ep as *const E) }
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn query_devices<T: Transport>(
    md: *mut c_void,
    out: *mut TlResource,
    max: usize,
    count: *mut usize,
) -> RawStatus {
    // SAFETY: valid handle from the host.
    guard(|| match T::query_devices(unsafe { md_ref::<T::Md>(md) }) {
        Ok(devs) => {
            // SAFETY: arrays and out-pointer from the host.
            unsafe {
                *count = devs.len();
                for (i, d) in devs.iter().take(max).enumerate() {
                    *out.add(i) = *d;
                }
            }
            0
        }
        Err(e) => e.as_raw(),
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_open<T: Transport>(
    md: *mut c_void,
    params: *const RawIfaceParams,
    iface: *mut *mut c_void,
) -> RawStatus {
    guard(|| {
        // SAFETY: valid handle and params from the host.
        let (md, p) = unsafe { (md_ref::<T::Md>(md), &*params) };
        let worker = WorkerRef::from_raw(p.worker);
        // Every rucx transport calls AM handlers from progress only (CB_SYNC).
        let am = Rc::new(AmTable::new(true));
        let params = IfaceParams {
            dev_name: p.dev_name.as_str().to_owned(),
            worker,
            am: am.clone(),
            err_handler: ErrHandler {
                func: p.err_handler,
                arg: p.err_handler_arg,
            },
            rx_headroom: p.rx_headroom,
        };
        match T::iface_open(md, params) {
            Ok(i) => {
                let b = IfaceBox {
                    inner: i,
                    worker,
                    am,
                    progress_id: Cell::new(None),
                    progress_flags: Cell::new(0),
                };
                // SAFETY: valid out-pointer.
                unsafe { *iface = Box::into_raw(Box::new(b)) as *mut c_void };
                0
            }
            Err(e) => e.as_raw(),
        }
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_close<I: Iface>(iface: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host closes each iface once, after destroying its eps.
        let b = unsafe { Box::from_raw(iface as *mut IfaceBox<I>) };
        if let Some(id) = b.progress_id.take() {
            b.worker.progress_remove(id);
        }
        drop(b);
    }));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_query<I: Iface>(
    iface: *mut c_void,
    attr: *mut crate::types::IfaceAttr,
) -> RawStatus {
    // SAFETY: valid handle and out-pointer.
    guard(|| unsafe {
        *attr = iface_ref::<I>(iface).inner.query();
        0
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_get_device_address<I: Iface>(
    iface: *mut c_void,
    buf: *mut u8,
    len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { iface_ref::<I>(iface).inner.device_address(bytes_mut(buf, len)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_get_address<I: Iface>(iface: *mut c_void, buf: *mut u8, len: usize) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { iface_ref::<I>(iface).inner.iface_address(bytes_mut(buf, len)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_is_reachable<I: Iface>(
    iface: *mut c_void,
    dev: *const u8,
    dev_len: usize,
    addr: *const u8,
    addr_len: usize,
) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: valid handle and buffers.
        unsafe {
            iface_ref::<I>(iface)
                .inner
                .is_reachable(bytes(dev, dev_len), bytes(addr, addr_len))
        }
    }))
    .unwrap_or(false)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_set_am_handler<I: Iface>(
    iface: *mut c_void,
    id: u8,
    cb: Option<RawAmCb>,
    arg: *mut c_void,
    flags: u32,
) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| {
        st(unsafe { iface_ref::<I>(iface) }
            .am
            .set(id, cb, arg, AmCbFlags(flags)))
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_progress_enable<I: Iface>(iface: *mut c_void, flags: u32) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: valid handle.
        let b = unsafe { iface_ref::<I>(iface) };
        b.progress_flags
            .set(b.progress_flags.get() | (flags & (ProgressFlags::SEND.0 | ProgressFlags::RECV.0)));
        if I::NEEDS_PROGRESS && b.progress_id.get().is_none() && b.progress_flags.get() != 0 {
            let ptr = iface as *const IfaceBox<I>;
            // SAFETY (closure): the callback is removed in `iface_close`/disable before the box
            // is freed, so `ptr` is valid whenever it runs.
            let id = b.worker.progress_add(move || unsafe { (*ptr).inner.progress() });
            match id {
                Ok(id) => b.progress_id.set(Some(id)),
                Err(e) => tracing::error!("cannot register iface progress: {e}"),
            }
        }
    }));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_progress_disable<I: Iface>(iface: *mut c_void, flags: u32) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: valid handle.
        let b = unsafe { iface_ref::<I>(iface) };
        b.progress_flags.set(b.progress_flags.get() & !flags);
        if b.progress_flags.get() == 0 {
            if let Some(id) = b.progress_id.take() {
                b.worker.progress_remove(id);
            }
        }
    }));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_progress<I: Iface>(iface: *mut c_void) -> u32 {
    // SAFETY: valid handle.
    catch_unwind(AssertUnwindSafe(|| {
        unsafe { iface_ref::<I>(iface) }.inner.progress()
    }))
    .unwrap_or(0)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_flush<I: Iface>(
    iface: *mut c_void,
    flags: u32,
    comp: *mut RawCompletion,
) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| {
        st2(unsafe { iface_ref::<I>(iface) }
            .inner
            .flush(FlushFlags(flags), Comp(comp)))
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_fence<I: Iface>(iface: *mut c_void, flags: u32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| st(unsafe { iface_ref::<I>(iface) }.inner.fence(flags)))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_event_fd<I: Iface>(iface: *mut c_void, fd: *mut i32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| match unsafe { iface_ref::<I>(iface) }.inner.event_fd() {
        Ok(f) => {
            // SAFETY: valid out-pointer.
            unsafe { *fd = f };
            0
        }
        Err(e) => e.as_raw(),
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn iface_event_arm<I: Iface>(iface: *mut c_void, events: u32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| {
        st(unsafe { iface_ref::<I>(iface) }
            .inner
            .event_arm(ArmEvents(events)))
    })
}

fn box_ep<E: Ep>(r: ucs::Result<E>, out: *mut *mut c_void) -> RawStatus {
    match r {
        Ok(e) => {
            let p = Box::into_raw(Box::new(e));
            // SAFETY: `p` is a fresh live box; `out` is a valid out-pointer from the host.
            unsafe {
                (*p).on_created(EpHandle(p as usize));
                *out = p as *mut c_void;
            }
            0
        }
        Err(e) => e.as_raw(),
    }
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_create<I: Iface>(iface: *mut c_void, ep: *mut *mut c_void) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| box_ep(unsafe { iface_ref::<I>(iface) }.inner.ep_create(), ep))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_create_connected<I: Iface>(
    iface: *mut c_void,
    dev: *const u8,
    dev_len: usize,
    addr: *const u8,
    addr_len: usize,
    ep: *mut *mut c_void,
) -> RawStatus {
    // SAFETY: valid handle and buffers.
    guard(|| {
        box_ep(
            unsafe {
                iface_ref::<I>(iface)
                    .inner
                    .ep_create_connected(bytes(dev, dev_len), bytes(addr, addr_len))
            },
            ep,
        )
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_destroy<E: Ep>(ep: *mut c_void) {
    // SAFETY: the host destroys each ep once.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(ep as *mut E) })));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_get_address<E: Ep>(ep: *mut c_void, buf: *mut u8, len: usize) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { ep_ref::<E>(ep).get_address(bytes_mut(buf, len)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_connect_to_ep<E: Ep>(
    ep: *mut c_void,
    dev: *const u8,
    dev_len: usize,
    addr: *const u8,
    addr_len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffers.
    guard(|| st(unsafe { ep_ref::<E>(ep).connect_to_ep(bytes(dev, dev_len), bytes(addr, addr_len)) }))
}

// ---------------------------------------------------------------- data path

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_am_short<E: Ep>(
    ep: *mut c_void,
    id: u8,
    header: u64,
    data: *const u8,
    len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { ep_ref::<E>(ep).am_short(id, header, bytes(data, len)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_am_short_iov<E: Ep>(
    ep: *mut c_void,
    id: u8,
    iov: *const RawIov,
    n: usize,
) -> RawStatus {
    // SAFETY: valid handle and iov array.
    guard(|| st(unsafe { ep_ref::<E>(ep).am_short_iov(id, Iov::slice_from_raw(iov, n)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_am_bcopy<E: Ep>(
    ep: *mut c_void,
    id: u8,
    pack: RawPackCb,
    arg: *mut c_void,
    flags: u32,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: valid handle.
        match unsafe { ep_ref::<E>(ep) }.am_bcopy(id, PackCb { func: pack, arg }, flags) {
            Ok(n) => n as isize,
            Err(e) => e.as_raw() as isize,
        }
    }))
    .unwrap_or(PANIC as isize)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_am_zcopy<E: Ep>(
    ep: *mut c_void,
    id: u8,
    header: *const u8,
    header_len: usize,
    iov: *const RawIov,
    n: usize,
    flags: u32,
    comp: *mut RawCompletion,
) -> RawStatus {
    // SAFETY: valid handle, header and iov array.
    guard(|| {
        st2(unsafe {
            ep_ref::<E>(ep).am_zcopy(
                id,
                bytes(header, header_len),
                Iov::slice_from_raw(iov, n),
                flags,
                Comp(comp),
            )
        })
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_put_short<E: Ep>(
    ep: *mut c_void,
    data: *const u8,
    len: usize,
    raddr: u64,
    rkey: u64,
) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { ep_ref::<E>(ep).put_short(bytes(data, len), raddr, rkey) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_put_bcopy<E: Ep>(
    ep: *mut c_void,
    pack: RawPackCb,
    arg: *mut c_void,
    raddr: u64,
    rkey: u64,
) -> isize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: valid handle.
        match unsafe { ep_ref::<E>(ep) }.put_bcopy(PackCb { func: pack, arg }, raddr, rkey) {
            Ok(n) => n as isize,
            Err(e) => e.as_raw() as isize,
        }
    }))
    .unwrap_or(PANIC as isize)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_put_zcopy<E: Ep>(
    ep: *mut c_void,
    iov: *const RawIov,
    n: usize,
    raddr: u64,
    rkey: u64,
    comp: *mut RawCompletion,
) -> RawStatus {
    // SAFETY: valid handle and iov array.
    guard(|| st2(unsafe { ep_ref::<E>(ep).put_zcopy(Iov::slice_from_raw(iov, n), raddr, rkey, Comp(comp)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_get_short<E: Ep>(
    ep: *mut c_void,
    buf: *mut u8,
    len: usize,
    raddr: u64,
    rkey: u64,
) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { ep_ref::<E>(ep).get_short(bytes_mut(buf, len), raddr, rkey) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_get_bcopy<E: Ep>(
    ep: *mut c_void,
    unpack: RawUnpackCb,
    arg: *mut c_void,
    len: usize,
    raddr: u64,
    rkey: u64,
    comp: *mut RawCompletion,
) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| {
        st2(unsafe { ep_ref::<E>(ep) }.get_bcopy(
            UnpackCb { func: unpack, arg },
            len,
            raddr,
            rkey,
            Comp(comp),
        ))
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_get_zcopy<E: Ep>(
    ep: *mut c_void,
    iov: *const RawIov,
    n: usize,
    raddr: u64,
    rkey: u64,
    comp: *mut RawCompletion,
) -> RawStatus {
    // SAFETY: valid handle and iov array.
    guard(|| st2(unsafe { ep_ref::<E>(ep).get_zcopy(Iov::slice_from_raw(iov, n), raddr, rkey, Comp(comp)) }))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_atomic_post<E: Ep>(
    ep: *mut c_void,
    size: u8,
    op: u8,
    value: u64,
    raddr: u64,
    rkey: u64,
) -> RawStatus {
    guard(|| {
        let r = atomic_size(size).and_then(|s| {
            let op = atomic_op(op)?;
            // SAFETY: valid handle.
            unsafe { ep_ref::<E>(ep) }.atomic_post(s, op, value, raddr, rkey)
        });
        st(r)
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_atomic_fetch<E: Ep>(
    ep: *mut c_void,
    size: u8,
    op: u8,
    value: u64,
    result: *mut u64,
    raddr: u64,
    rkey: u64,
    comp: *mut RawCompletion,
) -> RawStatus {
    guard(|| {
        let r = atomic_size(size).and_then(|s| {
            let op = atomic_op(op)?;
            // SAFETY: valid handle.
            unsafe { ep_ref::<E>(ep) }.atomic_fetch(s, op, value, ResultPtr(result), raddr, rkey, Comp(comp))
        });
        st2(r)
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_atomic_cswap<E: Ep>(
    ep: *mut c_void,
    size: u8,
    compare: u64,
    swap: u64,
    result: *mut u64,
    raddr: u64,
    rkey: u64,
    comp: *mut RawCompletion,
) -> RawStatus {
    guard(|| {
        let r = atomic_size(size).and_then(|s| {
            // SAFETY: valid handle.
            unsafe { ep_ref::<E>(ep) }.atomic_cswap(
                s,
                compare,
                swap,
                ResultPtr(result),
                raddr,
                rkey,
                Comp(comp),
            )
        });
        st2(r)
    })
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_pending_add<E: Ep>(
    ep: *mut c_void,
    req: *mut RawPendingReq,
    flags: u32,
) -> RawStatus {
    // SAFETY: valid handle; the request is the host's.
    guard(|| st(unsafe { ep_ref::<E>(ep) }.pending_add(PendingReq(req), flags)))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_pending_purge<E: Ep>(ep: *mut c_void, cb: RawPurgeCb, arg: *mut c_void) {
    // SAFETY: valid handle.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        unsafe { ep_ref::<E>(ep) }.pending_purge(PurgeCb { func: cb, arg })
    }));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_flush<E: Ep>(ep: *mut c_void, flags: u32, comp: *mut RawCompletion) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| st2(unsafe { ep_ref::<E>(ep) }.flush(FlushFlags(flags), Comp(comp))))
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn ep_fence<E: Ep>(ep: *mut c_void, flags: u32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| st(unsafe { ep_ref::<E>(ep) }.fence(flags)))
}

/// The operation table of interfaces of type `I` and their endpoints.
pub const fn iface_ops<I: Iface>() -> RawIfaceOps {
    RawIfaceOps {
        iface_close: iface_close::<I>,
        iface_query: iface_query::<I>,
        iface_get_device_address: iface_get_device_address::<I>,
        iface_get_address: iface_get_address::<I>,
        iface_is_reachable: iface_is_reachable::<I>,
        iface_set_am_handler: iface_set_am_handler::<I>,
        iface_progress_enable: iface_progress_enable::<I>,
        iface_progress_disable: iface_progress_disable::<I>,
        iface_progress: iface_progress::<I>,
        iface_flush: iface_flush::<I>,
        iface_fence: iface_fence::<I>,
        iface_event_fd: iface_event_fd::<I>,
        iface_event_arm: iface_event_arm::<I>,
        ep_create: ep_create::<I>,
        ep_create_connected: ep_create_connected::<I>,
        ep_destroy: ep_destroy::<I::Ep>,
        ep_get_address: ep_get_address::<I::Ep>,
        ep_connect_to_ep: ep_connect_to_ep::<I::Ep>,
        ep_am_short: ep_am_short::<I::Ep>,
        ep_am_short_iov: ep_am_short_iov::<I::Ep>,
        ep_am_bcopy: ep_am_bcopy::<I::Ep>,
        ep_am_zcopy: ep_am_zcopy::<I::Ep>,
        ep_put_short: ep_put_short::<I::Ep>,
        ep_put_bcopy: ep_put_bcopy::<I::Ep>,
        ep_put_zcopy: ep_put_zcopy::<I::Ep>,
        ep_get_short: ep_get_short::<I::Ep>,
        ep_get_bcopy: ep_get_bcopy::<I::Ep>,
        ep_get_zcopy: ep_get_zcopy::<I::Ep>,
        ep_atomic_post: ep_atomic_post::<I::Ep>,
        ep_atomic_fetch: ep_atomic_fetch::<I::Ep>,
        ep_atomic_cswap: ep_atomic_cswap::<I::Ep>,
        ep_pending_add: ep_pending_add::<I::Ep>,
        ep_pending_purge: ep_pending_purge::<I::Ep>,
        ep_flush: ep_flush::<I::Ep>,
        ep_fence: ep_fence::<I::Ep>,
    }
}

/// The transport descriptor of `T`; `ops` must be `iface_ops::<T::Iface>()`.
pub const fn transport<T: Transport>(ops: &'static RawIfaceOps) -> RawTransport {
    RawTransport {
        name: T::NAME.as_ptr(),
        query_devices: query_devices::<T>,
        iface_open: iface_open::<T>,
        ops,
    }
}

// ---------------------------------------------------------------- module

fn leak_cstr(s: &str) -> *const c_char {
    let c = CString::new(s.replace('\0', " ")).unwrap_or_default();
    Box::leak(c.into_boxed_c_str()).as_ptr()
}

/// Builds a module descriptor (once; modules are never unloaded, so it is leaked).
pub fn build_module(
    name: &'static CStr,
    init: unsafe extern "C" fn(*const RawHostApi) -> RawStatus,
    components: &'static [RawComponent],
    config: &[&'static ucs::config::ConfigTable],
) -> &'static RawModule {
    let fields: Vec<RawConfigField> = config
        .iter()
        .flat_map(|t| t.fields.iter().map(move |f| (t, f)))
        .map(|(t, f)| RawConfigField {
            name: leak_cstr(&format!("{}{}", t.prefix, f.name)),
            default: leak_cstr(f.default),
            doc: leak_cstr(f.doc),
            kind: leak_cstr(&f.kind.spec()),
        })
        .collect();
    let fields: &'static [RawConfigField] = Box::leak(fields.into_boxed_slice());
    Box::leak(Box::new(RawModule {
        abi_version: ABI_VERSION,
        name: name.as_ptr(),
        init,
        num_components: components.len(),
        components: components.as_ptr(),
        num_config: fields.len(),
        config: fields.as_ptr(),
    }))
}

static HOST_LOG: std::sync::OnceLock<(RawLogFn, u8)> = std::sync::OnceLock::new();

fn forward_log(level: u8, target: &str, msg: &str) {
    if let Some((f, max)) = HOST_LOG.get() {
        if level <= *max {
            // SAFETY: the host's log function takes borrowed byte ranges valid for the call.
            unsafe { f(level, target.as_ptr(), target.len(), msg.as_ptr(), msg.len()) }
        }
    }
}

/// The `init` every plugin exports: checks the ABI version and routes this plugin's `tracing`
/// events to the host application's subscriber, filtered by the host's level.
///
/// # Safety
/// `host` must point to a valid [`RawHostApi`].
pub unsafe extern "C" fn plugin_init(host: *const RawHostApi) -> RawStatus {
    guard(|| {
        // SAFETY: the caller passes a valid table.
        let host = unsafe { &*host };
        if host.abi_version != ABI_VERSION {
            return Status::Unsupported.as_raw();
        }
        let _ = HOST_LOG.set((host.log, host.log_level));
        crate::log_bridge::install_forwarding(forward_log, host.log_level);
        0
    })
}

/// Declares a module: `pub fn module() -> &'static RawModule` for linking it in, and the
/// `rucx_module_<name>` entry symbol for loading it as a plugin.
///
/// ```ignore
/// uct::declare_module!(tcp, COMPONENTS, [&TCP_CONFIG]);
/// ```
#[macro_export]
macro_rules! declare_module {
    ($name:ident, $components:expr, [$($table:expr),* $(,)?]) => {
        /// This module's descriptor (for registering it as a built-in).
        pub fn module() -> &'static $crate::abi::RawModule {
            static M: std::sync::OnceLock<&'static $crate::abi::RawModule> = std::sync::OnceLock::new();
            M.get_or_init(|| {
                $crate::abi::export::build_module(
                    {
                        const N: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
                            concat!(stringify!($name), "\0").as_bytes(),
                        ) {
                            Ok(c) => c,
                            Err(_) => panic!("bad module name"),
                        };
                        N
                    },
                    $crate::abi::export::plugin_init,
                    &$components,
                    &[$($table),*],
                )
            })
        }

        /// The plugin entry symbol: returns this module's descriptor.
        #[export_name = concat!("rucx_module_", stringify!($name))]
        pub extern "C" fn __rucx_module_entry() -> *const $crate::abi::RawModule {
            std::panic::catch_unwind(module).map_or(std::ptr::null(), |m| m as *const _)
        }
    };
}
