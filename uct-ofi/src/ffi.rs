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
use std::rc::Rc;

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
    head: *mut fi_info,
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: `head` came from fi_getinfo and is freed once.
            unsafe { fi_freeinfo(self.head) }
        }
    }
}

/// `fi_getinfo` with `hints` (`None`: no hints, every provider and endpoint type). No match is an
/// empty list; other failures return the libfabric error number (negative).
pub fn getinfo(hints: Option<Hints>) -> Result<InfoList, i32> {
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
    p: &'a fi_info,
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
    p: *mut fi_info,
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
fn close(fid: *mut fid, what: &str) {
    // SAFETY: called once per object from its Drop, with the fid it opened.
    let r = unsafe { rucx_fi_close(fid) };
    if r != 0 {
        tracing::warn!("ofi: closing the {what} failed: {}", strerror(r as i64));
    }
}

/// A fabric (`fi_fabric`).
pub struct Fabric {
    p: *mut fid_fabric,
}

impl Fabric {
    pub fn open(info: &Info) -> Result<Rc<Fabric>, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: the info's fabric_attr is valid; p receives the fabric.
        check(unsafe { fi_fabric((*info.p).fabric_attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Fabric { p }))
    }

    /// `fi_trywait` on `cq`: `Ok` when it is safe to sleep on the CQ's fd, `Err(-FI_EAGAIN)`
    /// when completions are pending or progress is needed.
    pub fn trywait(&self, cq: &Cq) -> Result<(), i32> {
        let mut f = cq.fid();
        // SAFETY: one valid fid of an object opened on this fabric.
        check(unsafe { rucx_fi_trywait(self.p, &mut f, 1) })
    }

    /// `fi_trywait` on `eq`: `Ok` when its fd is armed again (some providers' fds stay
    /// signalled until this is called), `Err(-FI_EAGAIN)` when events wait.
    pub fn trywait_eq(&self, eq: &Eq) -> Result<(), i32> {
        let mut f = eq.fid();
        // SAFETY: one valid fid of an object opened on this fabric.
        check(unsafe { rucx_fi_trywait(self.p, &mut f, 1) })
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: fid_fabric starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "fabric");
    }
}

/// A domain (`fi_domain`).
pub struct Domain {
    p: *mut fid_domain,
    pub fabric: Rc<Fabric>,
}

impl Domain {
    pub fn open(fabric: &Rc<Fabric>, info: &Info) -> Result<Rc<Domain>, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid fabric and info; p receives the domain.
        check(unsafe { rucx_fi_domain(fabric.p, info.p, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Domain {
            p,
            fabric: fabric.clone(),
        }))
    }

    /// Registers `[addr, addr + len)` with `FI_*` access bits and (unless the provider picks keys)
    /// `key`.
    ///
    /// # Safety
    /// The memory must stay mapped until the returned region is dropped: peers (and the provider)
    /// read and write it through the region without further checks.
    pub unsafe fn mr_reg(
        self: &Rc<Self>,
        addr: *const u8,
        len: usize,
        access: u64,
        key: u64,
    ) -> Result<Mr, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: forwarded to the caller (the range stays valid); p receives the region.
        check(unsafe {
            rucx_fi_mr_reg(
                self.p,
                addr.cast(),
                len,
                access,
                0,
                key,
                0,
                &mut p,
                ptr::null_mut(),
            )
        })?;
        Ok(Mr {
            p,
            _domain: self.clone(),
        })
    }
}

impl Domain {
    /// Whether the domain's endpoints support `op` on `datatype` (`fi_query_atomic`).
    pub fn atomic_valid(&self, kind: AtomicKind, datatype: u32, op: u32) -> bool {
        let flags = match kind {
            AtomicKind::Post => 0,
            AtomicKind::Fetch => FI_FETCH_ATOMIC,
            AtomicKind::Compare => FI_COMPARE_ATOMIC,
        };
        let mut attr = fi_atomic_attr::default();
        // SAFETY: a query into our attr struct.
        let r = unsafe { rucx_fi_query_atomic(self.p, datatype, op, &mut attr, flags) };
        r == 0 && attr.count >= 1
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: fid_domain starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "domain");
    }
}

/// A registered memory region.
pub struct Mr {
    p: *mut fid_mr,
    _domain: Rc<Domain>,
}

impl Mr {
    /// The local descriptor data calls take (`fi_mr_desc`).
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: valid region.
        unsafe { rucx_fi_mr_desc(self.p) }
    }
    /// The key peers use (`fi_mr_key`).
    pub fn key(&self) -> u64 {
        // SAFETY: valid region.
        unsafe { rucx_fi_mr_key(self.p) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: fid_mr starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "memory region");
    }
}

/// One completion (`struct fi_cq_msg_entry`).
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct CqEntry(fi_cq_msg_entry);

impl CqEntry {
    pub fn context(&self) -> usize {
        self.0.op_context as usize
    }
    pub fn flags(&self) -> u64 {
        self.0.flags
    }
    pub fn len(&self) -> usize {
        self.0.len
    }
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
}

/// An error completion, decoded.
#[derive(Debug)]
pub struct CqError {
    pub context: usize,
    pub flags: u64,
    pub err: i32,
    pub message: String,
}

/// A completion queue (`fi_cq_open`, `FI_CQ_FORMAT_MSG`).
pub struct Cq {
    p: *mut fid_cq,
    _domain: Rc<Domain>,
}

impl Cq {
    /// Opens a CQ of `size` entries, with an fd wait object when `wait_fd`.
    pub fn open(domain: &Rc<Domain>, size: usize, wait_fd: bool) -> Result<Rc<Cq>, i32> {
        let mut attr = fi_cq_attr {
            size,
            format: fi_cq_format_FI_CQ_FORMAT_MSG,
            wait_obj: if wait_fd {
                fi_wait_obj_FI_WAIT_FD
            } else {
                fi_wait_obj_FI_WAIT_NONE
            },
            ..Default::default()
        };
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and attributes; p receives the CQ.
        check(unsafe { rucx_fi_cq_open(domain.p, &mut attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Cq {
            p,
            _domain: domain.clone(),
        }))
    }

    fn fid(&self) -> *mut fid {
        // SAFETY: fid_cq starts with its fid.
        unsafe { &mut (*self.p).fid }
    }

    /// The CQ's wait fd (`FI_GETWAIT`), when it has one.
    pub fn wait_fd(&self) -> Option<i32> {
        let mut fd: c_int = -1;
        // SAFETY: FI_GETWAIT on an FI_WAIT_FD CQ writes an int.
        let r = unsafe { rucx_fi_control(self.fid(), FI_GETWAIT as c_int, (&mut fd as *mut c_int).cast()) };
        (r == 0 && fd >= 0).then_some(fd)
    }

    /// Reads up to `out.len()` completions: the count, 0 when none, or a negative error
    /// (`-FI_EAVAIL`: an error entry waits for [`Cq::readerr`]).
    #[inline]
    pub fn read(&self, out: &mut [CqEntry]) -> isize {
        // SAFETY: out has room for out.len() entries of the CQ's format.
        unsafe { rucx_fi_cq_read(self.p, out.as_mut_ptr().cast(), out.len()) }
    }

    /// Reads one error entry.
    pub fn readerr(&self) -> Option<CqError> {
        let mut e = fi_cq_err_entry::default();
        // SAFETY: e is a valid error entry (err_data null: the provider keeps its own).
        let r = unsafe { rucx_fi_cq_readerr(self.p, &mut e, 0) };
        if r < 1 {
            return None;
        }
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: the provider's message for its own error, into our buffer.
        let s = unsafe { rucx_fi_cq_strerror(self.p, e.prov_errno, e.err_data, buf.as_mut_ptr(), buf.len()) };
        let prov = if s.is_null() { String::new() } else { cstr(s) };
        Some(CqError {
            context: e.op_context as usize,
            flags: e.flags,
            err: e.err,
            message: format!("{} ({prov})", strerror(e.err as i64)),
        })
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        close(self.fid(), "completion queue");
    }
}

/// An address vector (`fi_av_open`, `FI_AV_TABLE`).
pub struct Av {
    p: *mut fid_av,
    _domain: Rc<Domain>,
}

impl Av {
    pub fn open(domain: &Rc<Domain>, count: usize) -> Result<Rc<Av>, i32> {
        let mut attr = fi_av_attr {
            type_: fi_av_type_FI_AV_TABLE,
            count,
            ..Default::default()
        };
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and attributes; p receives the AV.
        check(unsafe { rucx_fi_av_open(domain.p, &mut attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Av {
            p,
            _domain: domain.clone(),
        }))
    }

    /// Inserts one peer address (as its `fi_getname` gave it); returns its `fi_addr_t`.
    pub fn insert(&self, addr: &[u8]) -> Result<u64, i32> {
        let mut out: fi_addr_t = ADDR_UNSPEC;
        // SAFETY: one address of the provider's format (the length was checked by the caller
        // against the iface address length; libfabric reads addrlen bytes).
        let r = unsafe { rucx_fi_av_insert(self.p, addr.as_ptr().cast(), 1, &mut out, 0, ptr::null_mut()) };
        if r == 1 && out != ADDR_UNSPEC {
            Ok(out)
        } else if r < 0 {
            Err(r)
        } else {
            Err(-22)
        }
    }
}

impl Drop for Av {
    fn drop(&mut self) {
        // SAFETY: fid_av starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "address vector");
    }
}

/// Operation codes and datatypes for atomics.
pub mod atomic {
    use super::sys::*;
    pub const U32: u32 = fi_datatype_FI_UINT32;
    pub const U64: u32 = fi_datatype_FI_UINT64;
    pub const SUM: u32 = fi_op_FI_SUM;
    pub const BAND: u32 = fi_op_FI_BAND;
    pub const BOR: u32 = fi_op_FI_BOR;
    pub const BXOR: u32 = fi_op_FI_BXOR;
    pub const WRITE: u32 = fi_op_FI_ATOMIC_WRITE;
    pub const CSWAP: u32 = fi_op_FI_CSWAP;
}

/// Which flavour of atomic is asked about in [`Endpoint::atomic_valid`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicKind {
    Post,
    Fetch,
    Compare,
}

/// What an endpoint was opened on and bound to, kept open while it is.
#[derive(Default)]
struct Keep {
    _domain: Option<Rc<Domain>>,
    _cq: Option<Rc<Cq>>,
    _av: Option<Rc<Av>>,
    _srx: Option<Rc<Endpoint>>,
    _eq: Option<Rc<Eq>>,
}

/// An endpoint: a reliable-datagram one bound to a CQ (send and receive) and an AV; a
/// connected one bound to a CQ, a shared receive context and an EQ; or a shared receive
/// context (`fi_srx_context`, receives only). Enabled when opened.
pub struct Endpoint {
    p: *mut fid_ep,
    /// Connected: shut down before it is closed, so the peer hears of it.
    msg: bool,
    keep: Keep,
}

impl Endpoint {
    pub fn open(domain: &Rc<Domain>, info: &Info, cq: &Rc<Cq>, av: &Rc<Av>) -> Result<Endpoint, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and info; p receives the endpoint.
        check(unsafe { rucx_fi_endpoint(domain.p, info.p, &mut p, ptr::null_mut()) })?;
        let ep = Endpoint {
            p,
            msg: false,
            keep: Keep {
                _cq: Some(cq.clone()),
                _av: Some(av.clone()),
                ..Keep::default()
            },
        };
        let flags = (FI_TRANSMIT | FI_RECV) as u64;
        // SAFETY: binding a valid CQ and AV of the same domain to the endpoint, then enabling it.
        unsafe {
            check(rucx_fi_ep_bind(ep.p, cq.fid(), flags))?;
            check(rucx_fi_ep_bind(ep.p, &mut (*av.p).fid, 0))?;
            check(rucx_fi_enable(ep.p))?;
        }
        Ok(ep)
    }

    /// A shared receive context on `domain` (`fi_srx_context` with the info's receive
    /// attributes), its receive completions going to `cq`.
    pub fn srx(domain: &Rc<Domain>, info: &Info, cq: &Rc<Cq>) -> Result<Rc<Endpoint>, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid domain; the info's rx_attr is valid or null; p receives the context.
        check(unsafe { rucx_fi_srx_context(domain.p, (*info.p).rx_attr, &mut p, ptr::null_mut()) })?;
        let srx = Endpoint {
            p,
            msg: false,
            keep: Keep {
                _domain: Some(domain.clone()),
                _cq: Some(cq.clone()),
                ..Keep::default()
            },
        };
        // Some providers complete shared receives on the CQ bound to the context (tcp), others
        // on the CQ of the endpoint that received (verbs, which refuses this bind).
        // SAFETY: binding a valid CQ of the same domain.
        let r = unsafe { rucx_fi_ep_bind(srx.p, cq.fid(), FI_RECV as u64) };
        if r != 0 && -r != errno::ENOSYS {
            return Err(r);
        }
        Ok(Rc::new(srx))
    }

    /// A connected endpoint (not yet connected: see [`Endpoint::connect`], [`Endpoint::accept`])
    /// from `info` (the device's, with the peer's address; or a connection request's), bound to
    /// `cq`, the shared receive context `srx` and `eq`, enabled.
    pub fn open_msg(
        domain: &Rc<Domain>,
        info: &Info,
        cq: &Rc<Cq>,
        srx: &Rc<Endpoint>,
        eq: &Rc<Eq>,
    ) -> Result<Endpoint, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and info; p receives the endpoint.
        check(unsafe { rucx_fi_endpoint(domain.p, info.p, &mut p, ptr::null_mut()) })?;
        let ep = Endpoint {
            p,
            msg: false,
            keep: Keep {
                _cq: Some(cq.clone()),
                _srx: Some(srx.clone()),
                _eq: Some(eq.clone()),
                ..Keep::default()
            },
        };
        // SAFETY: binding a valid CQ, shared receive context and EQ of the same domain and
        // fabric, then enabling.
        unsafe {
            check(rucx_fi_ep_bind(ep.p, cq.fid(), (FI_TRANSMIT | FI_RECV) as u64))?;
            check(rucx_fi_ep_bind(ep.p, &mut (*srx.p).fid, 0))?;
            check(rucx_fi_ep_bind(ep.p, &mut (*eq.p).fid, 0))?;
            check(rucx_fi_enable(ep.p))?;
        }
        Ok(ep)
    }

    /// Starts connecting to the address its info names (`fi_connect`); the EQ reports
    /// `FI_CONNECTED` or an error.
    pub fn connect(&mut self, dest: &[u8]) -> Result<(), i32> {
        self.msg = true;
        // SAFETY: dest is an address of the provider's format (dest.len() bytes read); no
        // connection data.
        check(unsafe { rucx_fi_connect(self.p, dest.as_ptr().cast(), ptr::null(), 0) })
    }

    /// Accepts the connection request it was opened for (`fi_accept`).
    pub fn accept(&mut self) -> Result<(), i32> {
        self.msg = true;
        // SAFETY: valid endpoint opened from a connection request's info; no data.
        check(unsafe { rucx_fi_accept(self.p, ptr::null(), 0) })
    }

    /// The endpoint's fid, as EQ events name it.
    pub fn fid(&self) -> usize {
        self.p as usize
    }

    /// The endpoint's address (`fi_getname`), what peers insert into their AV.
    pub fn name(&self) -> Result<Vec<u8>, i32> {
        // SAFETY: the endpoint's fid starts its struct.
        getname(unsafe { &mut (*self.p).fid })
    }

    /// Whether `op` on `datatype` is supported (`fi_*atomicvalid`).
    pub fn atomic_valid(&self, kind: AtomicKind, datatype: u32, op: u32) -> bool {
        let mut count = 0usize;
        // SAFETY: queries only.
        let r = unsafe {
            match kind {
                AtomicKind::Post => rucx_fi_atomicvalid(self.p, datatype, op, &mut count),
                AtomicKind::Fetch => rucx_fi_fetch_atomicvalid(self.p, datatype, op, &mut count),
                AtomicKind::Compare => rucx_fi_compare_atomicvalid(self.p, datatype, op, &mut count),
            }
        };
        r == 0 && count >= 1
    }

    /// `fi_inject`: `buf` is copied before the call returns; no completion.
    #[inline]
    pub fn inject(&self, buf: &[u8], dest: u64) -> isize {
        // SAFETY: inject copies buf out before returning.
        unsafe { rucx_fi_inject(self.p, buf.as_ptr().cast(), buf.len(), dest) }
    }

    /// `fi_send` of `[buf, buf + len)`, completing with context `ctx`.
    ///
    /// # Safety
    /// The buffer stays valid and unmodified until the completion for `ctx` is read; `desc` is
    /// its region's descriptor (or null where the provider does not need one); `ctx` points to
    /// 64 writable bytes reserved for the operation until then (`FI_CONTEXT2`).
    #[inline]
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: u64,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: forwarded to the caller.
        unsafe { rucx_fi_send(self.p, buf.cast(), len, desc, dest, ctx) }
    }

    /// `fi_sendmsg` of an I/O vector.
    ///
    /// # Safety
    /// As [`Endpoint::send`], for every entry of `iov` (with `descs` in step).
    pub unsafe fn sendmsg(
        &self,
        iov: &[iovec],
        descs: &mut [*mut c_void],
        dest: u64,
        ctx: *mut c_void,
    ) -> isize {
        let msg = fi_msg {
            msg_iov: iov.as_ptr(),
            desc: descs.as_mut_ptr(),
            iov_count: iov.len(),
            addr: dest,
            context: ctx,
            data: 0,
        };
        // SAFETY: forwarded to the caller; msg lives for the call.
        unsafe { rucx_fi_sendmsg(self.p, &msg, FI_COMPLETION as u64) }
    }

    /// `fi_recv` into `[buf, buf + len)` from any peer.
    ///
    /// # Safety
    /// The buffer stays valid (and is not read) until the completion for `ctx` is read; `ctx`
    /// as in [`Endpoint::send`].
    pub unsafe fn recv(&self, buf: *mut u8, len: usize, desc: *mut c_void, ctx: *mut c_void) -> isize {
        // SAFETY: forwarded to the caller.
        unsafe { rucx_fi_recv(self.p, buf.cast(), len, desc, ADDR_UNSPEC, ctx) }
    }

    /// `fi_writemsg` (`write`) or `fi_readmsg` of a local I/O vector to/from remote
    /// `[addr, addr + total)` under `key`, delivery-complete for writes.
    ///
    /// # Safety
    /// As [`Endpoint::send`], for every entry of `iov` (written to, for reads).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rma(
        &self,
        write: bool,
        iov: &[iovec],
        descs: &mut [*mut c_void],
        dest: u64,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> isize {
        let total = iov.iter().map(|v| v.iov_len).sum();
        let rma = fi_rma_iov {
            addr,
            len: total,
            key,
        };
        let msg = fi_msg_rma {
            msg_iov: iov.as_ptr(),
            desc: descs.as_mut_ptr(),
            iov_count: iov.len(),
            addr: dest,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: ctx,
            data: 0,
        };
        // SAFETY: forwarded to the caller; msg and rma live for the call.
        unsafe {
            if write {
                rucx_fi_writemsg(self.p, &msg, (FI_COMPLETION | FI_DELIVERY_COMPLETE) as u64)
            } else {
                rucx_fi_readmsg(self.p, &msg, FI_COMPLETION as u64)
            }
        }
    }

    /// `fi_inject_atomic` of one element: `operand` is copied before the call returns.
    pub fn inject_atomic(
        &self,
        operand: &[u8],
        dest: u64,
        addr: u64,
        key: u64,
        datatype: u32,
        op: u32,
    ) -> isize {
        // SAFETY: the operand is copied out before returning.
        unsafe { rucx_fi_inject_atomic(self.p, operand.as_ptr().cast(), 1, dest, addr, key, datatype, op) }
    }

    /// `fi_fetch_atomic` (`compare` none) or `fi_compare_atomic` of one element.
    ///
    /// # Safety
    /// `operand`, `compare` and `result` (8 bytes each, described by `desc`) stay valid until
    /// the completion for `ctx` is read; `ctx` as in [`Endpoint::send`]. (On a provider that
    /// takes the operand and compare pointers' values as the operands, see
    /// `Shared::atomic_by_value`, those two are values and never dereferenced.)
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn fetch_atomic(
        &self,
        operand: *const u8,
        compare: Option<*const u8>,
        result: *mut u8,
        desc: *mut c_void,
        dest: u64,
        addr: u64,
        key: u64,
        datatype: u32,
        op: u32,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: forwarded to the caller.
        unsafe {
            match compare {
                None => rucx_fi_fetch_atomic(
                    self.p,
                    operand.cast(),
                    1,
                    desc,
                    result.cast(),
                    desc,
                    dest,
                    addr,
                    key,
                    datatype,
                    op,
                    ctx,
                ),
                Some(c) => rucx_fi_compare_atomic(
                    self.p,
                    operand.cast(),
                    1,
                    desc,
                    c.cast(),
                    desc,
                    result.cast(),
                    desc,
                    dest,
                    addr,
                    key,
                    datatype,
                    op,
                    ctx,
                ),
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.msg {
            // SAFETY: a valid connected (or connecting) endpoint; failing is harmless here.
            unsafe { rucx_fi_shutdown(self.p, 0) };
        }
        // SAFETY: fid_ep starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "endpoint");
        let _ = &self.keep;
    }
}

/// `fi_getname` of `fid`.
fn getname(fid: *mut fid) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; 256];
    let mut len = buf.len();
    // SAFETY: buf has len bytes; fid is a valid endpoint's.
    let mut r = unsafe { rucx_fi_getname(fid, buf.as_mut_ptr().cast(), &mut len) };
    if -r == 257 && len > buf.len() {
        buf.resize(len, 0);
        // SAFETY: as above, with the size the provider asked for.
        r = unsafe { rucx_fi_getname(fid, buf.as_mut_ptr().cast(), &mut len) };
    }
    check(r)?;
    buf.truncate(len);
    Ok(buf)
}

/// An event queue (`fi_eq_open`): connection events of connected endpoints.
pub struct Eq {
    p: *mut fid_eq,
    _fabric: Rc<Fabric>,
}

/// An event read from an [`Eq`].
pub enum EqEvent {
    /// A peer asks to connect; open an endpoint from `info` and accept.
    ConnReq { info: Info },
    /// The endpoint `fid` is connected.
    Connected { fid: usize },
    /// The endpoint `fid`'s connection is closed (by the peer, or it failed).
    Shutdown { fid: usize },
    /// An error for `fid` (a connection refused, or lost).
    Error { fid: usize, err: i32, message: String },
    /// An event the transport does not use.
    Other(u32),
}

impl Eq {
    /// Opens an EQ, with an fd wait object when `wait_fd` (falling back to none).
    pub fn open(fabric: &Rc<Fabric>, wait_fd: bool) -> Result<Rc<Eq>, i32> {
        let mut attr = fi_eq_attr {
            size: 64,
            wait_obj: if wait_fd {
                fi_wait_obj_FI_WAIT_FD
            } else {
                fi_wait_obj_FI_WAIT_NONE
            },
            ..Default::default()
        };
        let mut p = ptr::null_mut();
        // SAFETY: valid fabric and attributes; p receives the EQ.
        check(unsafe { rucx_fi_eq_open(fabric.p, &mut attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Eq {
            p,
            _fabric: fabric.clone(),
        }))
    }

    fn fid(&self) -> *mut fid {
        // SAFETY: fid_eq starts with its fid.
        unsafe { &mut (*self.p).fid }
    }

    /// The EQ's wait fd (`FI_GETWAIT`), when it has one.
    pub fn wait_fd(&self) -> Option<i32> {
        let mut fd: c_int = -1;
        // SAFETY: FI_GETWAIT on an FI_WAIT_FD EQ writes an int.
        let r = unsafe { rucx_fi_control(self.fid(), FI_GETWAIT as c_int, (&mut fd as *mut c_int).cast()) };
        (r == 0 && fd >= 0).then_some(fd)
    }

    /// Reads one event (`None`: none waiting, or the read failed, which is logged).
    pub fn read(&self) -> Option<EqEvent> {
        // fi_eq_cm_entry and room for connection data we never send
        let mut buf = [0u64; 16];
        let mut event: u32 = 0;
        // SAFETY: buf has room for a CM entry (fid, info, data); the provider writes at most
        // its length.
        let r = unsafe {
            rucx_fi_eq_read(
                self.p,
                &mut event,
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(&buf),
                0,
            )
        };
        if r < 0 {
            if -r as i32 == errno::EAVAIL {
                return self.readerr();
            }
            if -r as i32 != errno::EAGAIN {
                tracing::warn!("ofi: fi_eq_read failed: {}", strerror(r as i64));
            }
            return None;
        }
        // SAFETY: a CM event wrote a fi_eq_cm_entry at the start of buf (u64-aligned).
        let e = unsafe { &*(buf.as_ptr() as *const fi_eq_cm_entry) };
        // an info the provider allocated is ours to free (fi_eq_cm_entry)
        let info = (!e.info.is_null()).then_some(Info { p: e.info });
        Some(match (event, info) {
            (FI_CONNREQ, Some(info)) => EqEvent::ConnReq { info },
            (FI_CONNECTED, _) => EqEvent::Connected { fid: e.fid as usize },
            (FI_SHUTDOWN, _) => EqEvent::Shutdown { fid: e.fid as usize },
            (other, _) => EqEvent::Other(other),
        })
    }

    fn readerr(&self) -> Option<EqEvent> {
        let mut e = fi_eq_err_entry::default();
        // SAFETY: e is a valid error entry (err_data null: the provider keeps its own).
        let r = unsafe { rucx_fi_eq_readerr(self.p, &mut e, 0) };
        if r < 1 {
            return None;
        }
        Some(EqEvent::Error {
            fid: e.fid as usize,
            err: e.err,
            message: strerror(e.err as i64),
        })
    }
}

impl Drop for Eq {
    fn drop(&mut self) {
        close(self.fid(), "event queue");
    }
}

/// A listening passive endpoint (`fi_passive_ep` + `fi_listen`), its connection requests
/// reported on an [`Eq`].
pub struct PassiveEp {
    p: *mut fid_pep,
    _eq: Rc<Eq>,
    _fabric: Rc<Fabric>,
}

impl PassiveEp {
    pub fn listen(fabric: &Rc<Fabric>, info: &Info, eq: &Rc<Eq>) -> Result<PassiveEp, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid fabric and info; p receives the passive endpoint.
        check(unsafe { rucx_fi_passive_ep(fabric.p, info.p, &mut p, ptr::null_mut()) })?;
        let pep = PassiveEp {
            p,
            _eq: eq.clone(),
            _fabric: fabric.clone(),
        };
        // SAFETY: binding an EQ of the same fabric, then listening.
        unsafe {
            check(rucx_fi_pep_bind(pep.p, eq.fid(), 0))?;
            check(rucx_fi_listen(pep.p))?;
        }
        Ok(pep)
    }

    /// The address it listens at (`fi_getname`): what peers connect to.
    pub fn name(&self) -> Result<Vec<u8>, i32> {
        // SAFETY: fid_pep starts with its fid.
        getname(unsafe { &mut (*self.p).fid })
    }
}

impl Drop for PassiveEp {
    fn drop(&mut self) {
        // SAFETY: fid_pep starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "passive endpoint");
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
    ptr: *mut u8,
    layout: std::alloc::Layout,
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
