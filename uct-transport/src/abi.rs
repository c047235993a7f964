//! The plugin boundary: `#[repr(C)]` descriptors and tables of `extern "C"` functions.
//!
//! Every transport, built in or loaded from a `.so`, is reached only through these tables, so both
//! forms run the same code path. Rules of the boundary:
//! - only `#[repr(C)]` data, raw pointers, fixed-size arrays and `extern "C"` functions cross it:
//!   no trait objects, `String`, `Vec` or allocator;
//! - an object is destroyed by the side that created it (plugin objects through their table's
//!   `*_destroy`/`*_close`, host objects through callbacks the host supplies), and never while
//!   one of its own calls is running: destroying an endpoint from inside the pack or unpack
//!   callback of an operation on that same endpoint is undefined, as in UCX (the call still
//!   uses the object). The Rust API cannot express it (the call borrows the
//!   endpoint); a C host must defer the destroy until the call returned;
//! - a panic never crosses it: every entry point catches unwinding and returns a status;
//! - [`ABI_VERSION`] must match exactly, otherwise the loader skips the plugin.
//!
//! [`crate::export`] turns the safe traits of [`crate::traits`] into these tables (plugin side);
//! the `uct` crate calls through them (host side).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};

use crate::types::{IfaceAttr, MdAttr, TlResource};

/// Bumped on any change to a `Raw*` type or table. A plugin with another version is skipped.
pub const ABI_VERSION: u32 = 5;

/// Status as it crosses the boundary (`ucs::Status::as_raw`).
pub type RawStatus = i8;

/// Completion (`uct_completion_t`): owned by the host, updated by the transport through
/// [`completion_update`]. `func` runs when `count` drops to zero.
#[repr(C)]
pub struct RawCompletion {
    pub func: unsafe extern "C" fn(comp: *mut RawCompletion),
    pub count: i32,
    /// First error seen since the last time `func` ran (`UCS_OK` if none).
    pub status: RawStatus,
}

/// Pending request (`uct_pending_req_t`): owned by the host; the transport only keeps the pointer
/// until `func` returns `UCS_OK` or the request is handed back by purge.
#[repr(C)]
pub struct RawPendingReq {
    /// Returns `OK` (done: forget the pointer), `INPROGRESS` (keep it, go on) or another status
    /// (keep it, stop dispatching this queue).
    pub func: unsafe extern "C" fn(req: *mut RawPendingReq) -> RawStatus,
}

/// Callback the transport calls for every request it hands back in `pending_purge`.
pub type RawPurgeCb = unsafe extern "C" fn(req: *mut RawPendingReq, arg: *mut c_void);

/// Receive descriptor a transport lends to an AM handler that asks to keep the data.
/// The transport fills `release`; the host calls it exactly once when done.
#[repr(C)]
pub struct RawRxDesc {
    pub release: unsafe extern "C" fn(desc: *mut RawRxDesc),
}

/// AM handler: `desc` is null when the data cannot be kept (the handler must copy it).
/// `flags`: [`AM_PARAM_SHARED`] or 0. Returns `OK`, or `INPROGRESS` when it kept `desc` (then
/// it will call `desc.release`).
pub type RawAmCb = unsafe extern "C" fn(
    arg: *mut c_void,
    data: *const u8,
    len: usize,
    desc: *mut RawRxDesc,
    flags: u32,
) -> RawStatus;

/// [`RawAmCb`] flag: `data` lies in memory another process can write while the handler runs
/// (a shared-memory FIFO element); the handler copies what it reads (never through a
/// reference to it) and cannot keep it (`desc` is null). Only handlers installed with
/// `AmCbFlags::SHARED_DATA` get it.
pub const AM_PARAM_SHARED: u32 = 1;

/// bcopy pack callback: writes at most `max` bytes at `dest`, returns the length written.
pub type RawPackCb = unsafe extern "C" fn(arg: *mut c_void, dest: *mut u8, max: usize) -> usize;

/// get_bcopy unpack callback: called exactly once, with the data (`data` non-null) or, when the
/// operation failed or was canceled, with `data` null so the host can drop its state.
pub type RawUnpackCb = unsafe extern "C" fn(arg: *mut c_void, data: *const u8, len: usize);

/// Error handler: `ep` is the transport's ep handle (as returned by `ep_create*`).
pub type RawErrHandler =
    unsafe extern "C" fn(arg: *mut c_void, ep: *mut c_void, status: RawStatus) -> RawStatus;

/// A callback with an argument and the function that frees the argument (called by the host when
/// the registration is removed, so the creator frees what it created).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawCallback {
    pub func: unsafe extern "C" fn(arg: *mut c_void) -> u32,
    pub arg: *mut c_void,
    pub drop_arg: Option<unsafe extern "C" fn(arg: *mut c_void)>,
}

/// Async fd event callback (events: bit 0 read, bit 1 write, bit 2 error).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawEventCallback {
    pub func: unsafe extern "C" fn(arg: *mut c_void, events: u32),
    pub arg: *mut c_void,
    pub drop_arg: Option<unsafe extern "C" fn(arg: *mut c_void)>,
}

/// One scatter/gather entry of registered memory (`uct_iov_t`, without stride/count).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawIov {
    pub buffer: *mut u8,
    pub length: usize,
    pub memh: *mut c_void,
}

/// The worker services a transport may use, provided by the host (`uct_worker`).
#[repr(C)]
pub struct RawWorkerApi {
    /// Adds a progress callback; returns its id (> 0) or 0 on failure.
    pub progress_add: unsafe extern "C" fn(worker: *mut c_void, cb: RawCallback) -> u64,
    pub progress_remove: unsafe extern "C" fn(worker: *mut c_void, id: u64),
    /// One-shot callback run at the next progress; same-key callbacks run in order.
    pub oneshot_add: unsafe extern "C" fn(worker: *mut c_void, key: u64, cb: RawCallback),
    pub oneshot_remove: unsafe extern "C" fn(worker: *mut c_void, key: u64),
    /// Periodic timer delivered on the worker's thread; returns an id > 0, or a negative status.
    pub timer_add: unsafe extern "C" fn(worker: *mut c_void, interval_ns: u64, cb: RawCallback) -> i64,
    /// fd event handler delivered on the worker's thread; returns an id > 0, or a negative status.
    pub fd_add: unsafe extern "C" fn(worker: *mut c_void, fd: i32, events: u32, cb: RawEventCallback) -> i64,
    pub fd_modify: unsafe extern "C" fn(worker: *mut c_void, id: i64, events: u32) -> RawStatus,
    pub handler_remove: unsafe extern "C" fn(worker: *mut c_void, id: i64),
}

/// A worker as a transport sees it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawWorker {
    pub handle: *mut c_void,
    pub api: *const RawWorkerApi,
}

/// Parameters of `iface_open`.
#[repr(C)]
pub struct RawIfaceParams {
    pub dev_name: crate::types::DevName,
    pub worker: RawWorker,
    /// Bytes the transport reserves before received AM data in kept descriptors.
    pub rx_headroom: usize,
    pub err_handler: Option<RawErrHandler>,
    pub err_handler_arg: *mut c_void,
    /// Configuration set in code (context and interface settings merged, the interface's
    /// winning): `num_config` pairs, valid for the call.
    pub config: *const RawConfigPair,
    pub num_config: usize,
    /// What the caller will use the interface for: `IFACE_FEATURE_*` bits.
    pub features: u64,
}

/// [`RawIfaceParams::features`]: the caller will wait on the interface's event fd.
pub const IFACE_FEATURE_WAKEUP: u64 = 1;

/// One configuration variable set in code: name without `RUCX_` and value, UTF-8, each valid
/// for the call it is passed to.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawConfigPair {
    pub name: *const u8,
    pub name_len: usize,
    pub value: *const u8,
    pub value_len: usize,
}

impl RawConfigPair {
    /// A pair borrowing `name` and `value`.
    pub fn new(name: &str, value: &str) -> RawConfigPair {
        RawConfigPair {
            name: name.as_ptr(),
            name_len: name.len(),
            value: value.as_ptr(),
            value_len: value.len(),
        }
    }
}

/// Copies `n` pairs at `p` into [`ucs::config::Overrides`] (invalid UTF-8 is replaced).
///
/// # Safety
/// `p` must point to `n` pairs whose byte ranges are valid for reading, or `n` must be 0.
pub unsafe fn read_config_pairs(p: *const RawConfigPair, n: usize) -> ucs::config::Overrides {
    let mut out = ucs::config::Overrides::new();
    if n == 0 || p.is_null() {
        return out;
    }
    // SAFETY: forwarded to the caller.
    let pairs = unsafe { std::slice::from_raw_parts(p, n) };
    for c in pairs {
        // SAFETY: forwarded to the caller (each range valid for reading).
        let (k, v) = unsafe {
            (
                std::slice::from_raw_parts(c.name, c.name_len),
                std::slice::from_raw_parts(c.value, c.value_len),
            )
        };
        out.set(&String::from_utf8_lossy(k), &String::from_utf8_lossy(v));
    }
    out
}

/// The operation table of one transport's interfaces and endpoints (`uct_iface_ops_t`).
/// `iface` and `ep` arguments are the handles returned by `iface_open` / `ep_create*`.
#[repr(C)]
pub struct RawIfaceOps {
    // interface
    pub iface_close: unsafe extern "C" fn(iface: *mut c_void),
    pub iface_query: unsafe extern "C" fn(iface: *mut c_void, attr: *mut IfaceAttr) -> RawStatus,
    pub iface_get_device_address:
        unsafe extern "C" fn(iface: *mut c_void, buf: *mut u8, len: usize) -> RawStatus,
    pub iface_get_address: unsafe extern "C" fn(iface: *mut c_void, buf: *mut u8, len: usize) -> RawStatus,
    pub iface_is_reachable: unsafe extern "C" fn(
        iface: *mut c_void,
        dev: *const u8,
        dev_len: usize,
        addr: *const u8,
        addr_len: usize,
    ) -> bool,
    pub iface_set_am_handler: unsafe extern "C" fn(
        iface: *mut c_void,
        id: u8,
        cb: Option<RawAmCb>,
        arg: *mut c_void,
        flags: u32,
    ) -> RawStatus,
    pub iface_progress_enable: unsafe extern "C" fn(iface: *mut c_void, flags: u32),
    pub iface_progress_disable: unsafe extern "C" fn(iface: *mut c_void, flags: u32),
    pub iface_progress: unsafe extern "C" fn(iface: *mut c_void) -> u32,
    pub iface_flush:
        unsafe extern "C" fn(iface: *mut c_void, flags: u32, comp: *mut RawCompletion) -> RawStatus,
    pub iface_fence: unsafe extern "C" fn(iface: *mut c_void, flags: u32) -> RawStatus,
    pub iface_event_fd: unsafe extern "C" fn(iface: *mut c_void, fd: *mut i32) -> RawStatus,
    pub iface_event_arm: unsafe extern "C" fn(iface: *mut c_void, events: u32) -> RawStatus,
    // endpoint lifecycle
    pub ep_create: unsafe extern "C" fn(iface: *mut c_void, ep: *mut *mut c_void) -> RawStatus,
    pub ep_create_connected: unsafe extern "C" fn(
        iface: *mut c_void,
        dev: *const u8,
        dev_len: usize,
        addr: *const u8,
        addr_len: usize,
        ep: *mut *mut c_void,
    ) -> RawStatus,
    pub ep_destroy: unsafe extern "C" fn(ep: *mut c_void),
    pub ep_query: unsafe extern "C" fn(ep: *mut c_void, attr: *mut crate::types::EpAttr) -> RawStatus,
    pub ep_get_address: unsafe extern "C" fn(ep: *mut c_void, buf: *mut u8, len: usize) -> RawStatus,
    pub ep_connect_to_ep: unsafe extern "C" fn(
        ep: *mut c_void,
        dev: *const u8,
        dev_len: usize,
        addr: *const u8,
        addr_len: usize,
    ) -> RawStatus,
    // active messages
    pub ep_am_short:
        unsafe extern "C" fn(ep: *mut c_void, id: u8, header: u64, data: *const u8, len: usize) -> RawStatus,
    pub ep_am_short_iov:
        unsafe extern "C" fn(ep: *mut c_void, id: u8, iov: *const RawIov, iovcnt: usize) -> RawStatus,
    /// Returns the packed length (>= 0) or a negative status.
    pub ep_am_bcopy:
        unsafe extern "C" fn(ep: *mut c_void, id: u8, pack: RawPackCb, arg: *mut c_void, flags: u32) -> isize,
    pub ep_am_zcopy: unsafe extern "C" fn(
        ep: *mut c_void,
        id: u8,
        header: *const u8,
        header_len: usize,
        iov: *const RawIov,
        iovcnt: usize,
        flags: u32,
        comp: *mut RawCompletion,
    ) -> RawStatus,
    // RMA
    pub ep_put_short: unsafe extern "C" fn(
        ep: *mut c_void,
        data: *const u8,
        len: usize,
        raddr: u64,
        rkey: u64,
    ) -> RawStatus,
    pub ep_put_bcopy: unsafe extern "C" fn(
        ep: *mut c_void,
        pack: RawPackCb,
        arg: *mut c_void,
        raddr: u64,
        rkey: u64,
    ) -> isize,
    pub ep_put_zcopy: unsafe extern "C" fn(
        ep: *mut c_void,
        iov: *const RawIov,
        iovcnt: usize,
        raddr: u64,
        rkey: u64,
        comp: *mut RawCompletion,
    ) -> RawStatus,
    pub ep_get_short:
        unsafe extern "C" fn(ep: *mut c_void, buf: *mut u8, len: usize, raddr: u64, rkey: u64) -> RawStatus,
    pub ep_get_bcopy: unsafe extern "C" fn(
        ep: *mut c_void,
        unpack: RawUnpackCb,
        arg: *mut c_void,
        len: usize,
        raddr: u64,
        rkey: u64,
        comp: *mut RawCompletion,
    ) -> RawStatus,
    pub ep_get_zcopy: unsafe extern "C" fn(
        ep: *mut c_void,
        iov: *const RawIov,
        iovcnt: usize,
        raddr: u64,
        rkey: u64,
        comp: *mut RawCompletion,
    ) -> RawStatus,
    // atomics: `size` is 4 or 8 bytes
    pub ep_atomic_post: unsafe extern "C" fn(
        ep: *mut c_void,
        size: u8,
        op: u8,
        value: u64,
        raddr: u64,
        rkey: u64,
    ) -> RawStatus,
    pub ep_atomic_fetch: unsafe extern "C" fn(
        ep: *mut c_void,
        size: u8,
        op: u8,
        value: u64,
        result: *mut u64,
        raddr: u64,
        rkey: u64,
        comp: *mut RawCompletion,
    ) -> RawStatus,
    pub ep_atomic_cswap: unsafe extern "C" fn(
        ep: *mut c_void,
        size: u8,
        compare: u64,
        swap: u64,
        result: *mut u64,
        raddr: u64,
        rkey: u64,
        comp: *mut RawCompletion,
    ) -> RawStatus,
    // pending, flush, fence
    pub ep_pending_add:
        unsafe extern "C" fn(ep: *mut c_void, req: *mut RawPendingReq, flags: u32) -> RawStatus,
    pub ep_pending_purge: unsafe extern "C" fn(ep: *mut c_void, cb: RawPurgeCb, arg: *mut c_void),
    pub ep_flush: unsafe extern "C" fn(ep: *mut c_void, flags: u32, comp: *mut RawCompletion) -> RawStatus,
    pub ep_fence: unsafe extern "C" fn(ep: *mut c_void, flags: u32) -> RawStatus,
}

/// One transport of a component (`uct_tl_t`).
#[repr(C)]
pub struct RawTransport {
    pub name: *const c_char,
    /// Fills up to `max` resources for memory domain `md`; `*count` gets the number available.
    pub query_devices: unsafe extern "C" fn(
        md: *mut c_void,
        out: *mut TlResource,
        max: usize,
        count: *mut usize,
    ) -> RawStatus,
    pub iface_open: unsafe extern "C" fn(
        md: *mut c_void,
        params: *const RawIfaceParams,
        iface: *mut *mut c_void,
    ) -> RawStatus,
    pub ops: *const RawIfaceOps,
}

/// Memory-domain operations (`uct_md_ops_t`).
#[repr(C)]
pub struct RawMdOps {
    pub close: unsafe extern "C" fn(md: *mut c_void),
    pub query: unsafe extern "C" fn(md: *mut c_void, attr: *mut MdAttr) -> RawStatus,
    /// Registers `[addr, addr+len)`; `*memh` gets the handle.
    pub mem_reg: unsafe extern "C" fn(
        md: *mut c_void,
        addr: *mut u8,
        len: usize,
        access: u32,
        memh: *mut *mut c_void,
    ) -> RawStatus,
    pub mem_dereg: unsafe extern "C" fn(md: *mut c_void, memh: *mut c_void) -> RawStatus,
    /// Packs the rkey of `memh` into `buf` (`len` >= `MdAttr::rkey_packed_size`).
    pub mkey_pack:
        unsafe extern "C" fn(md: *mut c_void, memh: *mut c_void, buf: *mut u8, len: usize) -> RawStatus,
}

/// Fixed-size name record for `query_md_resources`.
pub type RawMdResource = crate::types::MdName;

/// A component (`uct_component_t`): memory domains and the transports that run on them.
#[repr(C)]
pub struct RawComponent {
    pub name: *const c_char,
    pub query_md_resources:
        unsafe extern "C" fn(out: *mut RawMdResource, max: usize, count: *mut usize) -> RawStatus,
    /// Opens memory domain `name` with `num_config` configuration pairs set in code (valid for
    /// the call).
    pub md_open: unsafe extern "C" fn(
        name: *const c_char,
        config: *const RawConfigPair,
        num_config: usize,
        md: *mut *mut c_void,
    ) -> RawStatus,
    pub md_ops: *const RawMdOps,
    /// Unpacks a packed rkey into `*rkey` (used in RMA calls) and `*handle` (for release).
    pub rkey_unpack: unsafe extern "C" fn(
        buf: *const u8,
        len: usize,
        rkey: *mut u64,
        handle: *mut *mut c_void,
    ) -> RawStatus,
    pub rkey_release: unsafe extern "C" fn(rkey: u64, handle: *mut c_void),
    pub num_transports: usize,
    pub transports: *const RawTransport,
}

/// One configuration variable a module reads (for `rucx-info -c` and unknown-variable checks).
#[repr(C)]
pub struct RawConfigField {
    /// Full name without the `RUCX_` prefix, e.g. `TCP_TX_SEG_SIZE`.
    pub name: *const c_char,
    pub default: *const c_char,
    pub doc: *const c_char,
    pub kind: *const c_char,
}

/// Logging sink the host gives a plugin: level 1 error .. 5 trace.
pub type RawLogFn =
    unsafe extern "C" fn(level: u8, target: *const u8, target_len: usize, msg: *const u8, msg_len: usize);

/// Takes the context of the error `status` that the plugin is about to return (UTF-8 bytes
/// valid for the call); see [`crate::error_context`].
pub type RawSetErrorFn = unsafe extern "C" fn(status: RawStatus, msg: *const u8, len: usize);

/// What the host hands a plugin at init.
#[repr(C)]
pub struct RawHostApi {
    pub abi_version: u32,
    /// Maximum level the host wants (0 off, 1 error .. 5 trace).
    pub log_level: u8,
    pub log: RawLogFn,
    pub set_error: RawSetErrorFn,
}

/// A module descriptor: what a plugin's entry symbol returns and what a built-in crate exposes.
#[repr(C)]
pub struct RawModule {
    pub abi_version: u32,
    pub name: *const c_char,
    /// Called once for plugins before any component is used; built-ins are not initialised.
    pub init: unsafe extern "C" fn(host: *const RawHostApi) -> RawStatus,
    pub num_components: usize,
    pub components: *const RawComponent,
    pub num_config: usize,
    pub config: *const RawConfigField,
}

// SAFETY: descriptors are immutable after construction and point only to 'static data and
// functions, so sharing them between threads is sound.
unsafe impl Sync for RawModule {}
// SAFETY: as above.
unsafe impl Send for RawModule {}
// SAFETY: as above.
unsafe impl Sync for RawComponent {}
// SAFETY: as above.
unsafe impl Sync for RawTransport {}
// SAFETY: as above.
unsafe impl Sync for RawConfigField {}

/// Marks one operation on `comp` finished with `status` (`uct_invoke_completion`): keeps the first
/// error, and runs `func` when the count reaches zero. Transports call this; `comp` may be null.
///
/// # Safety
/// `comp` must be null or point to a live `RawCompletion` owned by the host, on the worker thread.
#[inline]
pub unsafe fn completion_update(comp: *mut RawCompletion, status: ucs::Status) {
    if comp.is_null() {
        return;
    }
    // SAFETY: the caller guarantees `comp` is live and only touched from this thread.
    unsafe {
        if status.is_err() && (*comp).status == 0 {
            (*comp).status = status.as_raw();
        }
        (*comp).count -= 1;
        if (*comp).count == 0 {
            ((*comp).func)(comp);
        }
    }
}

/// Name of the entry symbol of plugin `name`: `rucx_module_<name>`.
pub fn entry_symbol(name: &str) -> String {
    format!("rucx_module_{name}")
}
