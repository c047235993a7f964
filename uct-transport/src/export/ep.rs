//! The data path: active messages, RMA, atomics, pending, flush and fence.

use super::*;

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_am_short<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_am_short_iov<E: TransportEp>(
    ep: *mut c_void,
    id: u8,
    iov: *const RawIov,
    n: usize,
) -> RawStatus {
    // SAFETY: valid handle and iov array.
    guard(|| st(unsafe { ep_ref::<E>(ep).am_short_iov(id, Iov::slice_from_raw(iov, n)) }))
}

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_am_bcopy<E: TransportEp>(
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
            Err(e) => err(e) as isize,
        }
    }))
    .unwrap_or(PANIC as isize)
}

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_am_zcopy<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_put_short<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_put_bcopy<E: TransportEp>(
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
            Err(e) => err(e) as isize,
        }
    }))
    .unwrap_or(PANIC as isize)
}

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_put_zcopy<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_get_short<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_get_bcopy<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_get_zcopy<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_atomic_post<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_atomic_fetch<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_atomic_cswap<E: TransportEp>(
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
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_pending_add<E: TransportEp>(
    ep: *mut c_void,
    req: *mut RawPendingReq,
    flags: u32,
) -> RawStatus {
    // SAFETY: valid handle; the request is the host's.
    guard(|| st(unsafe { ep_ref::<E>(ep) }.pending_add(PendingReq(req), flags)))
}

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_pending_purge<E: TransportEp>(
    ep: *mut c_void,
    cb: RawPurgeCb,
    arg: *mut c_void,
) {
    // SAFETY: valid handle.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        unsafe { ep_ref::<E>(ep) }.pending_purge(PurgeCb { func: cb, arg })
    }));
}

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_flush<E: TransportEp>(
    ep: *mut c_void,
    flags: u32,
    comp: *mut RawCompletion,
) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| st2(unsafe { ep_ref::<E>(ep) }.flush(FlushFlags(flags), Comp(comp))))
}

/// # Safety
/// The [boundary contract](super).
pub(super) unsafe extern "C" fn ep_fence<E: TransportEp>(ep: *mut c_void, flags: u32) -> RawStatus {
    // SAFETY: valid handle.
    guard(|| st(unsafe { ep_ref::<E>(ep) }.fence(flags)))
}
