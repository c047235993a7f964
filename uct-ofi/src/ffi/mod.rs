//! libfabric, bound: the generated bindings ([`sys`], from the installed headers, plus the C shim
//! for the `static inline` calls) and thin owning wrappers. Every object closes itself on drop
//! and holds an `Rc` of what it was opened on, so libfabric sees them closed child first.
//!
//! Control-path calls are safe methods. Data-path calls hand libfabric buffers it reads or writes
//! after the call returns, so they are `unsafe fn`: the caller keeps the memory valid until the
//! operation's completion has been read from the CQ (or the endpoint is closed).
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::os::raw::c_int;
use std::ptr;

/// The generated bindings (`build.rs`).
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
pub mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

use sys::*;

mod cm;
mod endpoint;
mod objects;
pub use cm::*;
pub use endpoint::*;
pub use objects::*;

/// `FI_ADDR_UNSPEC` (a cast bindgen does not evaluate).
pub const ADDR_UNSPEC: u64 = u64::MAX;

/// The libfabric error numbers the transport reacts to (positive; calls return them negated).
pub mod errno {
    pub const EAGAIN: i32 = 11;
    pub const ENODATA: i32 = 61;
    pub const ENOSYS: i32 = 38;
    pub const ECANCELED: i32 = 125;
    pub const EAVAIL: i32 = 259;
    pub const ETRUNC: i32 = 265;
}

/// `fi_strerror` of a (positive or negative) libfabric error number.
pub fn strerror(code: i64) -> String {
    let c = code.unsigned_abs().min(i32::MAX as u64) as c_int;
    // SAFETY: fi_strerror returns a static NUL-terminated string for any number.
    unsafe { CStr::from_ptr(fi_strerror(c)) }
        .to_string_lossy()
        .into_owned()
}

/// The version of the libfabric loaded at run time, `(major, minor)`.
pub fn lib_version() -> (u32, u32) {
    // SAFETY: no arguments, no state.
    let v = unsafe { rucx_fi_lib_version() };
    (v >> 16, v & 0xffff)
}

/// The API version these bindings were generated for.
pub fn version() -> u32 {
    // SAFETY: no arguments, no state.
    unsafe { rucx_fi_version() }
}

/// What `fi_getinfo` is asked for.
#[derive(Clone, Copy, Debug)]
pub struct Hints {
    /// Required capabilities (`FI_MSG | FI_RMA | …`).
    pub caps: u64,
    /// Modes the transport supports (`FI_CONTEXT`, …).
    pub mode: u64,
    /// `mr_mode` bits the transport honours.
    pub mr_mode: i32,
    /// The endpoint type wanted (`bits::EP_RDM`, `bits::EP_MSG`).
    pub ep_type: u32,
}

/// A list of `fi_info` from `fi_getinfo` (freed on drop).
pub struct InfoList {
    pub(super) head: *mut fi_info,
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: `head` came from fi_getinfo and is freed once.
            unsafe { fi_freeinfo(self.head) }
        }
    }
}

/// Turns libfabric's registration cache off (`FI_MR_CACHE_MAX_COUNT=0`) before libfabric
/// initializes, unless the user set that variable. With the cache, `fi_close` of a memory region
/// keeps the provider's registration (verbs: the `ibv_mr`) alive, so a peer holding the old key
/// could still write or read memory the application released; rucx's `mem_dereg` must make the
/// key useless at once.
fn no_registration_cache() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("FI_MR_CACHE_MAX_COUNT").is_none() {
            // SAFETY: runs once, before the first fi_getinfo (libfabric reads its variables in
            // fi_ini there and starts no thread before); rucx's own threads read the
            // environment only through std, which serializes with set_var.
            unsafe { std::env::set_var("FI_MR_CACHE_MAX_COUNT", "0") };
        }
    });
}

/// `fi_getinfo` with `hints` (`None`: no hints, every provider and endpoint type). No match is an
/// empty list; other failures return the libfabric error number (negative).
pub fn getinfo(hints: Option<Hints>) -> Result<InfoList, i32> {
    no_registration_cache();
    let mut h: *mut fi_info = ptr::null_mut();
    if let Some(want) = hints {
        // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with its attribute structs
        // (fi_allocinfo); we only write plain fields of those structs and free it below.
        unsafe {
            h = fi_dupinfo(ptr::null());
            if h.is_null() {
                return Err(-12);
            }
            (*h).caps = want.caps;
            (*h).mode = want.mode;
            (*(*h).ep_attr).type_ = want.ep_type;
            (*(*h).domain_attr).mr_mode = want.mr_mode;
            (*(*h).domain_attr).threading = fi_threading_FI_THREAD_DOMAIN;
        }
    }
    let mut out: *mut fi_info = ptr::null_mut();
    // SAFETY: hints is null or a valid fi_info; out receives a list we own.
    let ret = unsafe { fi_getinfo(version(), ptr::null(), ptr::null(), 0, h, &mut out) };
    if !h.is_null() {
        // SAFETY: allocated above, freed once.
        unsafe { fi_freeinfo(h) }
    }
    match ret {
        0 => Ok(InfoList { head: out }),
        r if -r == errno::ENODATA => Ok(InfoList {
            head: ptr::null_mut(),
        }),
        r => Err(r),
    }
}

impl InfoList {
    /// The entries in libfabric's preference order.
    pub fn iter(&self) -> impl Iterator<Item = InfoRef<'_>> + '_ {
        let mut p = self.head;
        std::iter::from_fn(move || {
            if p.is_null() {
                return None;
            }
            // SAFETY: p is a node of the list we own; the borrow ties it to the list.
            let r = unsafe { &*p };
            p = r.next;
            Some(InfoRef { p: r })
        })
    }
}

/// One `fi_info`, borrowed.
#[derive(Clone, Copy)]
pub struct InfoRef<'a> {
    pub(super) p: &'a fi_info,
}

/// Reads a C string field (null reads as empty).
fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's name fields are NUL-terminated strings owned by the fi_info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl InfoRef<'_> {
    fn fabric(&self) -> Option<&fi_fabric_attr> {
        // SAFETY: attribute pointers of an fi_info are null or valid as long as it is.
        unsafe { self.p.fabric_attr.as_ref() }
    }
    fn domain(&self) -> Option<&fi_domain_attr> {
        // SAFETY: as above.
        unsafe { self.p.domain_attr.as_ref() }
    }
    fn ep(&self) -> Option<&fi_ep_attr> {
        // SAFETY: as above.
        unsafe { self.p.ep_attr.as_ref() }
    }
    fn tx(&self) -> Option<&fi_tx_attr> {
        // SAFETY: as above.
        unsafe { self.p.tx_attr.as_ref() }
    }
    fn rx(&self) -> Option<&fi_rx_attr> {
        // SAFETY: as above.
        unsafe { self.p.rx_attr.as_ref() }
    }
    /// Provider name, layered ones as libfabric writes them (`tcp;ofi_rxm`).
    pub fn prov_name(&self) -> String {
        self.fabric().map(|f| cstr(f.prov_name)).unwrap_or_default()
    }
    pub fn fabric_name(&self) -> String {
        self.fabric().map(|f| cstr(f.name)).unwrap_or_default()
    }
    pub fn domain_name(&self) -> String {
        self.domain().map(|d| cstr(d.name)).unwrap_or_default()
    }
    pub fn caps(&self) -> u64 {
        self.p.caps
    }
    pub fn mode(&self) -> u64 {
        self.p.mode
    }
    pub fn is_rdm(&self) -> bool {
        self.ep().is_some_and(|e| e.type_ == fi_ep_type_FI_EP_RDM)
    }
    pub fn is_msg(&self) -> bool {
        self.ep().is_some_and(|e| e.type_ == fi_ep_type_FI_EP_MSG)
    }
    /// Shared receive contexts an endpoint may use (0: none).
    pub fn max_ep_srx_ctx(&self) -> usize {
        self.domain().map_or(0, |d| d.max_ep_srx_ctx)
    }
    pub fn ep_type(&self) -> u32 {
        self.ep().map_or(0, |e| e.type_)
    }
    pub fn mr_mode(&self) -> i32 {
        self.domain().map_or(0, |d| d.mr_mode)
    }
    pub fn mr_key_size(&self) -> usize {
        self.domain().map_or(0, |d| d.mr_key_size)
    }
    pub fn manual_progress(&self) -> bool {
        self.domain()
            .is_some_and(|d| d.data_progress != fi_progress_FI_PROGRESS_AUTO)
    }
    pub fn max_msg_size(&self) -> usize {
        self.ep().map_or(0, |e| e.max_msg_size)
    }
    pub fn inject_size(&self) -> usize {
        self.tx().map_or(0, |t| t.inject_size)
    }
    pub fn tx_size(&self) -> usize {
        self.tx().map_or(0, |t| t.size)
    }
    pub fn rx_size(&self) -> usize {
        self.rx().map_or(0, |r| r.size)
    }
    pub fn iov_limit(&self) -> usize {
        self.tx().map_or(1, |t| t.iov_limit.max(1))
    }
    pub fn rma_iov_limit(&self) -> usize {
        self.tx().map_or(1, |t| t.rma_iov_limit.max(1))
    }
    /// A copy that outlives the list.
    pub fn dup(&self) -> Result<Info, i32> {
        // SAFETY: duplicates a valid fi_info (without its `next`).
        let p = unsafe { fi_dupinfo(self.p) };
        if p.is_null() {
            return Err(-12);
        }
        Ok(Info { p })
    }
}

/// An owned `fi_info` (one entry).
pub struct Info {
    pub(super) p: *mut fi_info,
}

impl Info {
    /// A copy whose endpoints connect to `dest` (an address as the peer's `fi_getname` gave
    /// it) and take a shared receive context.
    pub fn for_connect(&self, dest: &[u8]) -> Result<Info, i32> {
        let mut copy = self.get().dup()?;
        // SAFETY: copy.p is a valid fi_info we own; the shim replaces dest_addr with a malloc'd
        // copy of the dest.len() bytes, which fi_freeinfo frees.
        check(unsafe { rucx_fi_info_set_dest(copy.p, dest.as_ptr().cast(), dest.len()) })?;
        copy.set_shared_rx();
        Ok(copy)
    }

    /// Endpoints opened with this info take a shared receive context.
    pub fn set_shared_rx(&mut self) {
        // SAFETY: p is a valid fi_info we own.
        unsafe { rucx_fi_info_set_shared_rx(self.p) }
    }

    pub fn get(&self) -> InfoRef<'_> {
        // SAFETY: p is valid while self lives.
        InfoRef {
            p: unsafe { &*self.p },
        }
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: from fi_dupinfo, freed once.
        unsafe { fi_freeinfo(self.p) }
    }
}

/// Turns a libfabric return value into `Ok` or its (negative) error number.
fn check(ret: c_int) -> Result<(), i32> {
    if ret == 0 {
        Ok(())
    } else {
        Err(ret)
    }
}

/// Closes a fid, logging a failure (nothing else can be done on drop).
/// The wait object of a CQ or EQ: an fd, or none.
fn wait_obj(fd: bool) -> fi_wait_obj {
    if fd {
        fi_wait_obj_FI_WAIT_FD
    } else {
        fi_wait_obj_FI_WAIT_NONE
    }
}

/// The wait fd (`FI_GETWAIT`) of a CQ or EQ opened with `FI_WAIT_FD`, when it has one.
fn wait_fd_of(fid: *mut fid) -> Option<i32> {
    let mut fd: c_int = -1;
    // SAFETY: fid is a live CQ or EQ; FI_GETWAIT on an FI_WAIT_FD one writes an int (others
    // return an error and leave fd alone).
    let r = unsafe { rucx_fi_control(fid, FI_GETWAIT as c_int, (&mut fd as *mut c_int).cast()) };
    (r == 0 && fd >= 0).then_some(fd)
}

fn close(fid: *mut fid, what: &str) {
    // SAFETY: called once per object from its Drop, with the fid it opened.
    let r = unsafe { rucx_fi_close(fid) };
    if r != 0 {
        ucs::warn!("ofi: closing the {what} failed: {}", strerror(r as i64));
    }
}

/// An `iovec` for [`Endpoint::sendmsg`] / [`Endpoint::rma`].
pub fn iovec_of(addr: *const u8, len: usize) -> iovec {
    iovec {
        iov_base: addr as *mut c_void,
        iov_len: len,
    }
}

pub use sys::iovec;

/// Capability and mode bits the transport uses, as `u64`.
pub mod bits {
    use super::sys::*;
    pub const MSG: u64 = FI_MSG as u64;
    pub const RMA: u64 = FI_RMA as u64;
    pub const ATOMIC: u64 = FI_ATOMIC as u64;
    pub const READ: u64 = FI_READ as u64;
    pub const WRITE: u64 = FI_WRITE as u64;
    pub const REMOTE_READ: u64 = FI_REMOTE_READ as u64;
    pub const REMOTE_WRITE: u64 = FI_REMOTE_WRITE as u64;
    pub const SEND: u64 = FI_SEND as u64;
    pub const RECV: u64 = FI_RECV as u64;
    pub const CONTEXT: u64 = FI_CONTEXT;
    pub const CONTEXT2: u64 = FI_CONTEXT2;
    pub const RX_CQ_DATA: u64 = FI_RX_CQ_DATA;
    pub const MR_LOCAL: i32 = FI_MR_LOCAL as i32;
    pub const MR_VIRT_ADDR: i32 = FI_MR_VIRT_ADDR as i32;
    pub const MR_ALLOCATED: i32 = FI_MR_ALLOCATED as i32;
    pub const MR_PROV_KEY: i32 = FI_MR_PROV_KEY as i32;
    pub const MR_ENDPOINT: i32 = FI_MR_ENDPOINT as i32;
    pub const EP_MSG: u32 = fi_ep_type_FI_EP_MSG;
    pub const EP_DGRAM: u32 = fi_ep_type_FI_EP_DGRAM;
    pub const EP_RDM: u32 = fi_ep_type_FI_EP_RDM;
}

/// Page-aligned memory the provider reads and writes behind the compiler's back (send and
/// receive buffers, operation contexts): reachable only through raw addresses, and through
/// slices whose `unsafe` accessors say when no operation is using the range.
pub struct Buffers {
    pub(super) ptr: *mut u8,
    pub(super) layout: std::alloc::Layout,
}

impl Buffers {
    /// `len` zeroed bytes (at least 1), 4 KiB-aligned.
    pub fn new(len: usize) -> Buffers {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("buffer layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Buffers { ptr, layout }
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address of byte `off` (out-of-range offsets clamp to the end).
    #[inline]
    pub fn addr(&self, off: usize) -> *mut u8 {
        self.ptr.wrapping_add(off.min(self.len()))
    }

    /// `[off, off + len)` to read. Panics (a transport bug) when out of range.
    ///
    /// # Safety
    /// No operation that writes the range is in flight, and no `bytes_mut` of it is alive.
    #[inline]
    pub unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len()),
            "buffer range"
        );
        // SAFETY: in range; exclusivity forwarded to the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// `[off, off + len)` to write. Panics (a transport bug) when out of range.
    ///
    /// # Safety
    /// No operation that reads or writes the range is in flight, and no other slice of it is
    /// alive.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len()),
            "buffer range"
        );
        // SAFETY: in range; exclusivity forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}
