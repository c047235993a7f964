//! Component and memory-domain entry points, and their tables.

use super::*;

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn query_md_resources<C: TransportComponent>(
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
        Err(e) => err(e),
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn md_open<C: TransportComponent>(
    name: *const c_char,
    config: *const RawConfigPair,
    num_config: usize,
    md: *mut *mut c_void,
) -> RawStatus {
    guard(|| {
        // SAFETY: the host passes a NUL-terminated string and `num_config` valid pairs.
        let (name, config) = unsafe {
            (
                CStr::from_ptr(name).to_string_lossy(),
                read_config_pairs(config, num_config),
            )
        };
        match C::md_open(&name, &config) {
            Ok(m) => {
                // SAFETY: `md` is a valid out-pointer.
                unsafe { *md = Box::into_raw(Box::new(m)) as *mut c_void };
                0
            }
            Err(e) => err(e),
        }
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn md_close<M: TransportMd>(md: *mut c_void) {
    // SAFETY: the host closes each md once, after every iface on it.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(md as *mut M) })));
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn md_query<M: TransportMd>(md: *mut c_void, attr: *mut MdAttr) -> RawStatus {
    // SAFETY: valid handle and out-pointer from the host.
    guard(|| unsafe {
        *attr = md_ref::<M>(md).query();
        0
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn md_mem_reg<M: TransportMd>(
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
            Err(e) => err(e),
        },
    )
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn md_mem_dereg<M: TransportMd>(md: *mut c_void, memh: *mut c_void) -> RawStatus {
    // SAFETY: valid handle from the host.
    guard(|| st(unsafe { md_ref::<M>(md) }.mem_dereg(memh as usize)))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn md_mkey_pack<M: TransportMd>(
    md: *mut c_void,
    memh: *mut c_void,
    buf: *mut u8,
    len: usize,
) -> RawStatus {
    // SAFETY: valid handle and buffer from the host.
    guard(|| st(unsafe { md_ref::<M>(md) }.mkey_pack(memh as usize, bytes_mut(buf, len))))
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn rkey_unpack<C: TransportComponent>(
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
        Err(e) => err(e),
    })
}

/// # Safety
/// The [boundary contract](super).
unsafe extern "C" fn rkey_release<C: TransportComponent>(rkey: u64, handle: *mut c_void) {
    let _ = catch_unwind(|| C::rkey_release(rkey, handle as usize));
}

/// The memory-domain table of `M`.
pub const fn md_ops<M: TransportMd>() -> RawMdOps {
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
pub const fn component<C: TransportComponent>(
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
