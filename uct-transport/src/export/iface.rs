//! Transport, interface and endpoint-lifecycle entry points, and the operation table.

use super::ep::*;
use super::*;

/// The iface as the host holds it: the transport's iface plus what the glue manages.
struct IfaceBox<I: TransportIface> {
    inner: I,
    worker: WorkerRef,
    am: Rc<AmTable>,
    progress_id: Cell<Option<ProgressId>>,
    progress_flags: Cell<u32>,
}

/// # Safety
/// `iface` must be a handle returned by `iface_open` of a transport whose iface type is `I`.
#[inline(always)]
unsafe fn iface_ref<'a, I: TransportIface>(iface: *mut c_void) -> &'a IfaceBox<I> {
    // SAFETY: forwarded to the caller.
    unsafe { &*(iface as *const IfaceBox<I>) }
}

/// # Safety
/// The [boundary contract](super).
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
        Err(e) => err(e),
    })
}

/// # Safety
/// The [boundary contract](super).
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
        let params = IfaceOpenParams {
            dev_name: p.dev_name.as_str().to_owned(),
            worker,
            am: am.clone(),
            err_handler: ErrHandler {
                func: p.err_handler,
                arg: p.err_handler_arg,
            },
            rx_headroom: p.rx_headroom,
            // SAFETY: the host passes `num_config` valid pairs.
            config: unsafe { read_config_pairs(p.config, p.num_config) },
            wakeup: p.features & crate::abi::IFACE_FEATURE_WAKEUP != 0,
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
            Err(e) => err(e),
        }
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_close<I: TransportIface>(iface: *mut c_void) {
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
/// The [boundary contract](super).
unsafe extern "C" fn iface_query<I: TransportIface>(
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
/// The [boundary contract](super).
unsafe extern "C" fn iface_get_device_address<I: TransportIface>(
    iface: *mut c_void,
    buf: *mut u8,
    len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { iface_ref::<I>(iface).inner.device_address(bytes_mut(buf, len)) }))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_get_address<I: TransportIface>(
    iface: *mut c_void,
    buf: *mut u8,
    len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { iface_ref::<I>(iface).inner.iface_address(bytes_mut(buf, len)) }))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_is_reachable<I: TransportIface>(
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
/// The [boundary contract](super).
unsafe extern "C" fn iface_set_am_handler<I: TransportIface>(
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
/// The [boundary contract](super).
unsafe extern "C" fn iface_progress_enable<I: TransportIface>(iface: *mut c_void, flags: u32) {
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
                Err(e) => ucs::error!("cannot register iface progress: {e}"),
            }
        }
    }));
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_progress_disable<I: TransportIface>(iface: *mut c_void, flags: u32) {
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
/// The [boundary contract](super).
unsafe extern "C" fn iface_progress<I: TransportIface>(iface: *mut c_void) -> u32 {
    // SAFETY: valid handle.
    catch_unwind(AssertUnwindSafe(|| {
        unsafe { iface_ref::<I>(iface) }.inner.progress()
    }))
    .unwrap_or(0)
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_flush<I: TransportIface>(
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
/// The [boundary contract](super).
unsafe extern "C" fn iface_fence<I: TransportIface>(iface: *mut c_void, flags: u32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| st(unsafe { iface_ref::<I>(iface) }.inner.fence(flags)))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_event_fd<I: TransportIface>(iface: *mut c_void, fd: *mut i32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| match unsafe { iface_ref::<I>(iface) }.inner.event_fd() {
        Ok(f) => {
            // SAFETY: valid out-pointer.
            unsafe { *fd = f };
            0
        }
        Err(e) => err(e),
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn iface_event_arm<I: TransportIface>(iface: *mut c_void, events: u32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| {
        st(unsafe { iface_ref::<I>(iface) }
            .inner
            .event_arm(ArmEvents(events)))
    })
}

fn box_ep<E: TransportEp>(r: ucs::Result<E>, out: *mut *mut c_void) -> RawStatus {
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
        Err(e) => err(e),
    }
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn ep_create<I: TransportIface>(iface: *mut c_void, ep: *mut *mut c_void) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| box_ep(unsafe { iface_ref::<I>(iface) }.inner.ep_create(), ep))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn ep_create_connected<I: TransportIface>(
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
/// The [boundary contract](super).
unsafe extern "C" fn ep_destroy<E: TransportEp>(ep: *mut c_void) {
    // SAFETY: the host destroys each ep once.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(ep as *mut E) })));
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn ep_query<E: TransportEp>(ep: *mut c_void, attr: *mut crate::types::EpAttr) -> RawStatus {
    // SAFETY: valid handle and out-pointer.
    guard(|| unsafe {
        *attr = ep_ref::<E>(ep).query();
        0
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn ep_get_address<E: TransportEp>(ep: *mut c_void, buf: *mut u8, len: usize) -> RawStatus {
    // SAFETY: valid handle and buffer.
    guard(|| st(unsafe { ep_ref::<E>(ep).get_address(bytes_mut(buf, len)) }))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn ep_connect_to_ep<E: TransportEp>(
    ep: *mut c_void,
    dev: *const u8,
    dev_len: usize,
    addr: *const u8,
    addr_len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffers.
    guard(|| st(unsafe { ep_ref::<E>(ep).connect_to_ep(bytes(dev, dev_len), bytes(addr, addr_len)) }))
}

pub const fn iface_ops<I: TransportIface>() -> RawIfaceOps {
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
        ep_query: ep_query::<I::Ep>,
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
