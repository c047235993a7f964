//! Interfaces as the application sees them: open, query, addresses, AM handlers, error handler,
//! progress and events, endpoint creation.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::BorrowedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use ucs::config::Overrides;
use ucs::{Error, Outcome, Result, Status};

use crate::host::{check, outcome};

use crate::completion::Completion;
use crate::component::Md;
use crate::ep::Ep;
use crate::worker::Worker;
use uct_transport::abi::{RawConfigPair, RawIfaceOps, RawIfaceParams, RawRxDesc, RawStatus};
use uct_transport::types::{AmCbFlags, ArmEvents, DevName, FlushFlags, IfaceAttr, ProgressFlags, AM_ID_MAX};

/// Identifies an endpoint in error reports; compare with [`Ep::key`]. Unique in the process
/// for its lifetime: a key never names another endpoint after its own was dropped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EpKey(u64);

impl EpKey {
    pub(crate) fn next() -> EpKey {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        EpKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Parameters of [`Iface::open`].
pub struct IfaceParams {
    /// The transport to open, e.g. `tcp`.
    pub tl_name: String,
    /// The device to open it on, e.g. `lo`.
    pub dev_name: String,
    /// Bytes reserved in front of received data in kept descriptors.
    pub rx_headroom: usize,
    /// Called (from progress) when a peer fails; the endpoint is dead afterwards.
    pub err_handler: Option<Box<dyn FnMut(EpKey, Status)>>,
    /// Progress directions enabled at open (default: send and receive); empty: none, until
    /// [`Iface::progress_enable`].
    pub progress: ProgressFlags,
    /// Configuration set in code for this interface (`RUCX_*` names without the prefix); it
    /// wins over the environment and over the context's settings.
    pub config: Overrides,
    /// The caller will wait on the interface's event fd ([`Iface::event_fd`], `event_arm`):
    /// transports whose event notification costs per operation (ofi) set it up only then.
    /// Without it, such a transport may report no event fd.
    pub wakeup: bool,
}

impl IfaceParams {
    /// Parameters for transport `tl` on device `dev`.
    pub fn new(tl: &str, dev: &str) -> IfaceParams {
        IfaceParams {
            tl_name: tl.into(),
            dev_name: dev.into(),
            rx_headroom: 0,
            err_handler: None,
            progress: ProgressFlags::SEND | ProgressFlags::RECV,
            config: Overrides::new(),
            wakeup: false,
        }
    }

    /// Asks for an interface the caller will sleep on (see [`IfaceParams::wakeup`]).
    pub fn wakeup(mut self, on: bool) -> IfaceParams {
        self.wakeup = on;
        self
    }

    /// Sets the peer-failure handler.
    pub fn err_handler(mut self, f: impl FnMut(EpKey, Status) + 'static) -> IfaceParams {
        self.err_handler = Some(Box::new(f));
        self
    }

    /// Sets configuration variable `name` (e.g. `TCP_SNDBUF`, with or without `RUCX_`) for
    /// this interface.
    pub fn config(mut self, name: &str, value: &str) -> IfaceParams {
        self.config.set(name, value);
        self
    }

    /// Sets the progress directions enabled at open.
    pub fn progress(mut self, flags: ProgressFlags) -> IfaceParams {
        self.progress = flags;
        self
    }
}

/// A received active message, handed to an AM handler.
///
/// A handler installed with [`AmCbFlags::SHARED_DATA`] may get a message that still lies in
/// memory a peer process can write (a shared-memory FIFO element, [`AmMessage::is_shared`]):
/// [`AmMessage::copy_to`] copies it straight to where it goes (the only copy), and
/// [`AmMessage::data`] copies it once into a buffer of the handler's.
pub struct AmMessage<'a> {
    /// The data, `len` bytes: private (readable as a slice for `'a`), or in shared memory
    /// (`SHARED`: only copied from, never borrowed).
    ptr: *const u8,
    len: usize,
    desc: *mut RawRxDesc,
    /// `SHARED`, `COPIED` (`scratch` holds this message's data), `KEPT`.
    state: Cell<u8>,
    /// The handler's buffer that [`AmMessage::data`] copies shared data into.
    scratch: &'a Scratch,
    iface: &'a std::rc::Weak<IfaceInner>,
    _data: std::marker::PhantomData<&'a [u8]>,
}

const SHARED: u8 = 1;
const COPIED: u8 = 2;
const KEPT: u8 = 4;
/// Counted in [`crate::copy_stats`] already.
#[cfg(feature = "copy-stats")]
const COUNTED: u8 = 8;

/// A handler's copy of shared data; filled by one message at a time (a handler is never
/// re-entered: [`HandlerBox`] defers what arrives while it runs).
type Scratch = std::cell::UnsafeCell<Vec<u8>>;

impl<'a> AmMessage<'a> {
    /// A message of `len` bytes at `ptr` (in shared memory when `shared`; then `desc` is null).
    ///
    /// # Safety
    /// `ptr` must be readable for `len` bytes for `'a`, and, unless `shared`, not written
    /// meanwhile; `desc`, when not null, the transport's descriptor of that data.
    #[inline(always)]
    unsafe fn new(
        ptr: *const u8,
        len: usize,
        shared: bool,
        desc: *mut RawRxDesc,
        scratch: &'a Scratch,
        iface: &'a std::rc::Weak<IfaceInner>,
    ) -> AmMessage<'a> {
        AmMessage {
            ptr,
            len,
            desc,
            state: Cell::new(if shared { SHARED } else { 0 }),
            scratch,
            iface,
            _data: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    fn private(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: private data, readable and unchanged for `'a` (the constructor's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The message: for `am_short`, the 8-byte header (little-endian) followed by the payload.
    /// Shared data ([`AmMessage::is_shared`]) is copied on the first call (into a buffer the
    /// handler reuses: no allocation once it is large enough).
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        let st = self.state.get();
        if st & SHARED == 0 {
            return self.private();
        }
        if st & COPIED == 0 {
            // SAFETY: no slice of the scratch buffer is alive: `COPIED` is not set, and the
            // only message that hands them out is this one (a handler is never re-entered, see
            // `HandlerBox`, and a slice does not outlive the handler call).
            let v = unsafe { &mut *self.scratch.get() };
            v.clear();
            self.extend_vec(0, v); // from the shared bytes: `COPIED` is still clear
            #[cfg(feature = "copy-stats")]
            crate::copy_stats::staged(v.len());
            self.state.set(st | COPIED);
        }
        // SAFETY: filled above; not written again while this message lives.
        unsafe { &*self.scratch.get() }.as_slice()
    }

    /// The message's length in bytes (without copying shared data).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty message.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the data lies in memory a peer can write: read it through
    /// [`AmMessage::copy_to`] (one copy, to where it goes) rather than [`AmMessage::data`].
    #[inline]
    pub fn is_shared(&self) -> bool {
        self.state.get() & SHARED != 0
    }

    /// Copies the bytes from `offset` on into `dst` (as many as both have); returns how many.
    #[inline]
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) -> usize {
        // SAFETY: `dst` is writable for its length.
        unsafe { self.copy_raw(offset, dst.as_mut_ptr(), dst.len()) }
    }

    /// Appends the bytes from `offset` on to `v` (one copy, into its spare capacity).
    pub fn extend_vec(&self, offset: usize, v: &mut Vec<u8>) {
        let n = self.len.saturating_sub(offset);
        v.reserve(n);
        let spare = v.spare_capacity_mut();
        // SAFETY: the spare capacity is writable for `n` bytes (reserved above); `copy_raw`
        // writes all `n` (the message has `n` bytes after `offset`) before `set_len` exposes
        // them.
        unsafe {
            let copied = self.copy_raw(offset, spare.as_mut_ptr().cast::<u8>(), n);
            v.set_len(v.len() + copied);
        }
    }

    /// Copies up to `cap` bytes from `offset` on to `dst`; returns how many.
    ///
    /// # Safety
    /// `dst` must be writable for `cap` bytes and not overlap the message.
    #[inline]
    pub(crate) unsafe fn copy_raw(&self, offset: usize, dst: *mut u8, cap: usize) -> usize {
        let n = self.len.saturating_sub(offset).min(cap);
        if n == 0 {
            return 0;
        }
        let src = if self.state.get() & (SHARED | COPIED) == (SHARED | COPIED) {
            // SAFETY: our copy holds `len` bytes; `offset + n <= len`.
            unsafe { (*self.scratch.get()).as_ptr().add(offset) }
        } else {
            #[cfg(feature = "copy-stats")]
            if self.state.get() & SHARED != 0 {
                let st = self.state.get();
                crate::copy_stats::copied(n, st & COUNTED == 0);
                self.state.set(st | COUNTED);
            }
            // SAFETY: `offset + n <= len`: inside the message.
            unsafe { self.ptr.add(offset) }
        };
        // SAFETY: `n` readable bytes at `src` (private data, our copy, or shared bytes that
        // stay readable during the handler, where a peer's writes only change which bytes we
        // copy); `dst` is writable for `n <= cap` (the caller's contract).
        unsafe { ucs::arch::copy_maybe_overlapping(src, dst, n) };
        n
    }

    /// The `am_short` header (first 8 bytes, little-endian); 0 if the message is shorter.
    #[inline]
    pub fn header(&self) -> u64 {
        let mut b = [0u8; 8];
        if self.copy_to(0, &mut b) < 8 {
            return 0;
        }
        u64::from_le_bytes(b)
    }

    /// Keeps the data beyond the handler: the transport's descriptor itself when it can lend
    /// it (zero copy), otherwise a copy (always for shared data).
    pub fn keep(&self) -> RxDesc {
        let st = self.state.get();
        if !self.desc.is_null() && st & KEPT == 0 {
            if let Some(iface) = self.iface.upgrade() {
                self.state.set(st | KEPT);
                return RxDesc(Kept::Lent {
                    desc: self.desc,
                    data: self.ptr,
                    len: self.len,
                    _iface: iface,
                });
            }
        }
        RxDesc(Kept::Copied(self.data().to_vec()))
    }

    /// The handler kept the descriptor.
    #[inline(always)]
    fn kept(&self) -> bool {
        self.state.get() & KEPT != 0
    }
}

/// Data an AM handler kept; released (returned to the transport) when dropped. A lent
/// descriptor keeps its interface open until then (so storing kept descriptors inside the
/// handler's own state keeps the interface alive: drain them before closing it).
pub struct RxDesc(Kept);

enum Kept {
    Lent {
        desc: *mut RawRxDesc,
        data: *const u8,
        len: usize,
        _iface: Rc<IfaceInner>,
    },
    Copied(Vec<u8>),
}

impl RxDesc {
    /// True when this is the transport's own buffer (zero copy), false for a copy.
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.0, Kept::Lent { .. })
    }
}

impl std::ops::Deref for RxDesc {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            // SAFETY: the transport keeps the descriptor's data valid until `release`, and the
            // interface is kept open by `_iface`.
            Kept::Lent { data, len, .. } => unsafe { std::slice::from_raw_parts(*data, *len) },
            Kept::Copied(v) => v,
        }
    }
}

impl std::fmt::Debug for RxDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RxDesc({} bytes, zero_copy: {})",
            self.len(),
            self.is_zero_copy()
        )
    }
}

impl Drop for RxDesc {
    fn drop(&mut self) {
        if let Kept::Lent { desc, .. } = self.0 {
            // SAFETY: the descriptor was lent to us; we release it exactly once, while the
            // interface is still open (`_iface` is dropped after this).
            unsafe { ((*desc).release)(desc) }
        }
    }
}

/// An installed handler, type-erased for ownership only (it is called through `am_tramp::<F>`).
type AmHandler = Box<dyn std::any::Any>;

/// What a handler's argument points to: the closure and a way back to its interface.
///
/// A handler may make its own interface deliver again while it runs (a reply over self is
/// delivered inside the send; a handler that progresses its interface): such a message is
/// copied and handed to the handler after the running call returns, in arrival order, so the
/// closure (`FnMut`) and its scratch buffer are never used by two calls at once.
struct HandlerBox<F> {
    iface: std::rc::Weak<IfaceInner>,
    /// Used only by the outermost delivery (`running` guards it).
    f: std::cell::UnsafeCell<F>,
    scratch: Scratch,
    running: Cell<bool>,
    /// Messages delivered while `running`, copied; `has_deferred` says there are some (one
    /// load on the fast path).
    deferred: RefCell<std::collections::VecDeque<Vec<u8>>>,
    has_deferred: Cell<bool>,
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn am_tramp<F: FnMut(&AmMessage<'_>) + 'static>(
    arg: *mut c_void,
    data: *const u8,
    len: usize,
    desc: *mut RawRxDesc,
    flags: u32,
) -> RawStatus {
    // SAFETY: `arg` points to the boxed `HandlerBox<F>` stored in the iface's handler table (kept
    // alive while installed; replaced handlers are kept until the iface closes). Only shared
    // references to it exist: the closure is reached through its `UnsafeCell`, below.
    let h = unsafe { &*(arg as *const HandlerBox<F>) };
    let shared = flags & uct_transport::abi::AM_PARAM_SHARED != 0 && len > 0;
    if h.running.replace(true) {
        // SAFETY: as this function's (the transport's `data` and `len`).
        unsafe { defer_reentered(h, data, len) };
        return 0;
    }
    // SAFETY: `running` was false: no other call uses the closure until it is reset below.
    let f = unsafe { &mut *h.f.get() };
    // SAFETY: the transport passes `len` readable bytes at `data` for the call (written by
    // nobody else unless `shared`), and a descriptor only for private data.
    let kept = deliver(f, unsafe {
        AmMessage::new(
            data,
            len,
            shared,
            if shared { std::ptr::null_mut() } else { desc },
            &h.scratch,
            &h.iface,
        )
    });
    if h.has_deferred.get() {
        drain_deferred(h, f);
    }
    h.running.set(false);
    if kept {
        Status::InProgress.as_raw()
    } else {
        0
    }
}

/// A message delivered while the handler runs: copied for [`drain_deferred`].
///
/// # Safety
/// `data` must be readable for `len` bytes.
#[cold]
#[inline(never)]
unsafe fn defer_reentered<F>(h: &HandlerBox<F>, data: *const u8, len: usize) {
    let mut v = Vec::with_capacity(len);
    if len > 0 {
        // SAFETY: `len` readable bytes at `data` (the caller's contract); `v` has room for
        // `len` and is exposed only after they are written.
        unsafe {
            ucs::arch::copy_maybe_overlapping(data, v.as_mut_ptr(), len);
            v.set_len(len);
        }
    }
    h.deferred.borrow_mut().push_back(v);
    h.has_deferred.set(true);
}

/// Hands the handler what arrived while it ran, in order (more may arrive meanwhile).
#[cold]
#[inline(never)]
fn drain_deferred<F: FnMut(&AmMessage<'_>)>(h: &HandlerBox<F>, f: &mut F) {
    loop {
        let Some(v) = h.deferred.borrow_mut().pop_front() else {
            h.has_deferred.set(false);
            return;
        };
        // SAFETY: `v` is ours, alive and unchanged for the call.
        deliver(f, unsafe {
            AmMessage::new(
                v.as_ptr(),
                v.len(),
                false,
                std::ptr::null_mut(),
                &h.scratch,
                &h.iface,
            )
        });
    }
}

/// Calls the handler with `msg`; true when it kept the transport's descriptor.
#[inline(always)]
fn deliver<F: FnMut(&AmMessage<'_>)>(f: &mut F, msg: AmMessage<'_>) -> bool {
    if catch_unwind(AssertUnwindSafe(|| f(&msg))).is_err() {
        ucs::error!("panic in an AM handler (caught); message dropped");
    }
    msg.kept()
}

/// The iface's endpoints by transport handle, and the user's peer-failure handler.
#[derive(Default)]
pub(crate) struct EpRegistry {
    keys: RefCell<HashMap<usize, EpKey>>,
    handler: RefCell<Option<ErrHandler>>,
}

type ErrHandler = Box<dyn FnMut(EpKey, Status)>;

impl EpRegistry {
    pub(crate) fn add(&self, handle: *mut c_void) -> EpKey {
        let k = EpKey::next();
        self.keys.borrow_mut().insert(handle as usize, k);
        k
    }

    pub(crate) fn remove(&self, handle: *mut c_void) {
        self.keys.borrow_mut().remove(&(handle as usize));
    }
}

/// # Safety
/// The [boundary contract](uct_transport::export); `arg` is the iface's [`EpRegistry`].
unsafe extern "C" fn err_tramp(arg: *mut c_void, ep: *mut c_void, status: RawStatus) -> RawStatus {
    // SAFETY: `arg` is the boxed registry owned by the iface, which outlives its transport.
    let reg = unsafe { &*(arg as *const EpRegistry) };
    let Some(key) = reg.keys.borrow().get(&(ep as usize)).copied() else {
        ucs::debug!("peer failure reported for an endpoint already destroyed: ignored");
        return 0;
    };
    // Taken out while it runs, so the handler may drop endpoints (which touches `keys`).
    let Some(mut h) = reg.handler.borrow_mut().take() else {
        return Status::Unsupported.as_raw();
    };
    let r = catch_unwind(AssertUnwindSafe(|| h(key, Status::from_raw(status))));
    reg.handler.borrow_mut().get_or_insert(h);
    match r {
        Ok(()) => 0,
        Err(_) => {
            ucs::error!("panic in an error handler (caught)");
            Status::IoError.as_raw()
        }
    }
}

pub(crate) struct IfaceInner {
    pub(crate) handle: *mut c_void,
    pub(crate) ops: &'static RawIfaceOps,
    pub(crate) attr: IfaceAttr,
    tl_name: String,
    dev_name: String,
    handlers: RefCell<Vec<Option<AmHandler>>>,
    /// Replaced handlers, kept until close: a handler may replace itself while running.
    retired: RefCell<Vec<AmHandler>>,
    /// Boxed: the transport holds its address for error reports.
    pub(crate) eps: Box<EpRegistry>,
    /// Stands in when the application passes no completion, to keep buffers alive.
    pub(crate) orphan: Completion,
    pub(crate) md: Md,
    pub(crate) worker: Worker,
}

impl Drop for IfaceInner {
    fn drop(&mut self) {
        // SAFETY: every ep holds an Rc to us, so all are destroyed; the handle is closed once.
        unsafe { (self.ops.iface_close)(self.handle) }
    }
}

/// An open interface. Clones share it; closed when the last clone and endpoint are gone.
///
/// ```
/// use uct::{Iface, IfaceFlags, IfaceParams, Worker};
/// let ctx = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
/// let (md, _) = ctx.find_resource("self", "memory0")?;
/// let worker = Worker::new()?;
/// let iface = Iface::open(&md, &worker, IfaceParams::new("self", "memory0").config("SELF_SEG_SIZE", "4k"))?;
/// assert!(iface.attr().flags.contains(IfaceFlags::AM_SHORT | IfaceFlags::CONNECT_TO_IFACE));
/// assert_eq!(iface.attr().am.max_bcopy, 4096);
/// // Progress is enabled at open; self delivers synchronously, so it has none to do.
/// assert_eq!(worker.progress(), 0);
/// # Ok::<(), uct::Error>(())
/// ```
#[derive(Clone)]
pub struct Iface {
    pub(crate) inner: Rc<IfaceInner>,
}

impl Iface {
    /// Opens transport `params.tl_name` on device `params.dev_name` of `md`, driven by `worker`.
    pub fn open(md: &Md, worker: &Worker, params: IfaceParams) -> Result<Iface> {
        let Some(tl) = md.transport(&params.tl_name) else {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "memory domain {} has no transport {} (rucx-info -d lists the transports and devices)",
                    md.name(),
                    params.tl_name
                ),
            ));
        };
        let config = md.inner.config.merged(&params.config);
        ucs::config::check_known(&config).map_err(|e| {
            e.context_with(format_args!(
                "opening {} on device {}",
                params.tl_name, params.dev_name
            ))
        })?;
        let pairs: Vec<RawConfigPair> = config.iter().map(|(k, v)| RawConfigPair::new(k, v)).collect();
        let has_handler = params.err_handler.is_some();
        let eps = Box::new(EpRegistry {
            keys: RefCell::new(HashMap::new()),
            handler: RefCell::new(params.err_handler),
        });
        let raw = RawIfaceParams {
            dev_name: DevName::new(&params.dev_name),
            worker: worker.raw(),
            rx_headroom: params.rx_headroom,
            err_handler: has_handler.then_some(err_tramp as uct_transport::abi::RawErrHandler),
            err_handler_arg: &*eps as *const EpRegistry as *mut c_void,
            config: pairs.as_ptr(),
            num_config: pairs.len(),
            features: if params.wakeup {
                uct_transport::abi::IFACE_FEATURE_WAKEUP
            } else {
                0
            },
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid md handle of the transport's component, params and out-pointer.
        let st = unsafe { (tl.iface_open)(md.inner.handle, &raw, &mut h) };
        check(st).map_err(|e| {
            e.context_with(format_args!(
                "opening {} on device {}",
                params.tl_name, params.dev_name
            ))
        })?;
        // SAFETY: the transport's ops table is 'static.
        let ops: &'static RawIfaceOps = unsafe { &*tl.ops };
        let mut attr = IfaceAttr::default();
        // SAFETY: fresh handle of this transport.
        let st = unsafe { (ops.iface_query)(h, &mut attr) };
        let inner = IfaceInner {
            handle: h,
            ops,
            attr,
            tl_name: params.tl_name,
            dev_name: params.dev_name,
            handlers: RefCell::new((0..AM_ID_MAX).map(|_| None).collect()),
            retired: RefCell::new(Vec::new()),
            eps,
            orphan: Completion::counter(),
            md: md.clone(),
            worker: worker.clone(),
        };
        let iface = Iface {
            inner: Rc::new(inner),
        };
        check(st)?;
        if !params.progress.is_empty() {
            iface.progress_enable(params.progress);
        }
        Ok(iface)
    }

    /// Transport name.
    pub fn tl_name(&self) -> &str {
        &self.inner.tl_name
    }

    /// Device name.
    pub fn dev_name(&self) -> &str {
        &self.inner.dev_name
    }

    /// Attributes (queried at open).
    pub fn attr(&self) -> &IfaceAttr {
        &self.inner.attr
    }

    /// The memory domain.
    pub fn md(&self) -> &Md {
        &self.inner.md
    }

    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.inner.worker
    }

    /// The device address (`device_addr_len` bytes).
    pub fn device_address(&self) -> Result<Vec<u8>> {
        let mut b = vec![0; self.inner.attr.device_addr_len];
        // SAFETY: buffer of the advertised size.
        check(unsafe {
            (self.inner.ops.iface_get_device_address)(self.inner.handle, b.as_mut_ptr(), b.len())
        })?;
        Ok(b)
    }

    /// The interface address (`iface_addr_len` bytes; empty for connect-to-ep-only transports).
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut b = vec![0; self.inner.attr.iface_addr_len];
        // SAFETY: buffer of the advertised size.
        check(unsafe { (self.inner.ops.iface_get_address)(self.inner.handle, b.as_mut_ptr(), b.len()) })?;
        Ok(b)
    }

    /// Whether a peer with these addresses can be reached from this interface.
    pub fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        // SAFETY: valid buffers.
        unsafe {
            (self.inner.ops.iface_is_reachable)(
                self.inner.handle,
                dev.as_ptr(),
                dev.len(),
                iface.as_ptr(),
                iface.len(),
            )
        }
    }

    /// Installs the handler of AM `id` (0..31). Handlers run from `Worker::progress`.
    pub fn set_am_handler<F: FnMut(&AmMessage<'_>) + 'static>(
        &self,
        id: u8,
        flags: AmCbFlags,
        f: F,
    ) -> Result<()> {
        if id >= AM_ID_MAX {
            return Err(bad_am_id("set_am_handler", id));
        }
        let boxed = Box::new(HandlerBox {
            iface: Rc::downgrade(&self.inner),
            f: std::cell::UnsafeCell::new(f),
            scratch: Scratch::default(),
            running: Cell::new(false),
            deferred: RefCell::default(),
            has_deferred: Cell::new(false),
        });
        let arg = &*boxed as *const HandlerBox<F> as *mut c_void;
        // SAFETY: `arg` stays valid: the box is stored below and retired, not freed, if replaced.
        check(unsafe {
            (self.inner.ops.iface_set_am_handler)(self.inner.handle, id, Some(am_tramp::<F>), arg, flags.0)
        })?;
        let old = self.inner.handlers.borrow_mut()[id as usize].replace(boxed as AmHandler);
        if let Some(old) = old {
            self.inner.retired.borrow_mut().push(old);
        }
        Ok(())
    }

    /// Removes the handler of AM `id`.
    pub fn clear_am_handler(&self, id: u8) -> Result<()> {
        if id >= AM_ID_MAX {
            return Err(bad_am_id("clear_am_handler", id));
        }
        // SAFETY: removing the handler; the old box is retired, not freed.
        check(unsafe {
            (self.inner.ops.iface_set_am_handler)(self.inner.handle, id, None, std::ptr::null_mut(), 0)
        })?;
        let old = self.inner.handlers.borrow_mut()[id as usize].take();
        if let Some(old) = old {
            self.inner.retired.borrow_mut().push(old);
        }
        Ok(())
    }

    /// Adds this interface's progress to its worker (interfaces start with progress disabled).
    pub fn progress_enable(&self, flags: ProgressFlags) {
        // SAFETY: valid handle.
        unsafe { (self.inner.ops.iface_progress_enable)(self.inner.handle, flags.0) }
    }

    /// Removes this interface's progress from its worker.
    pub fn progress_disable(&self, flags: ProgressFlags) {
        // SAFETY: valid handle.
        unsafe { (self.inner.ops.iface_progress_disable)(self.inner.handle, flags.0) }
    }

    /// Progresses this interface alone.
    pub fn progress(&self) -> u32 {
        // SAFETY: valid handle.
        unsafe { (self.inner.ops.iface_progress)(self.inner.handle) }
    }

    /// Flushes every endpoint: `Ok(Outcome::Done)` when done, `Ok(InProgress)` when `comp` will fire.
    /// Without a completion it only reports the state (UCX's `comp == NULL`): poll again later.
    pub fn flush(&self, flags: FlushFlags, comp: Option<&Completion>) -> Result<Outcome> {
        let Some(c) = comp else {
            // SAFETY: valid handle; a null completion is allowed by the boundary.
            let st =
                unsafe { (self.inner.ops.iface_flush)(self.inner.handle, flags.0, std::ptr::null_mut()) };
            return outcome(st);
        };
        let raw = c.arm([]);
        // SAFETY: valid handle; the completion stays alive while armed.
        let st = unsafe { (self.inner.ops.iface_flush)(self.inner.handle, flags.0, raw) };
        if st != Status::InProgress.as_raw() {
            c.disarm();
        }
        outcome(st)
    }

    /// Orders operations before and after it.
    pub fn fence(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { (self.inner.ops.iface_fence)(self.inner.handle, 0) })
    }

    /// A file descriptor that becomes readable when armed events occur; `Unsupported` for
    /// transports without one. Owned by the interface.
    pub fn event_fd(&self) -> Result<BorrowedFd<'_>> {
        let mut fd = -1;
        // SAFETY: valid handle and out-pointer.
        check(unsafe { (self.inner.ops.iface_event_fd)(self.inner.handle, &mut fd) })?;
        if fd < 0 {
            return Err(Error::new(
                Status::IoError,
                format!("{self:?}: the transport gave no event fd"),
            ));
        }
        // SAFETY: the transport owns the fd for the interface's lifetime, which the borrow of
        // `self` bounds.
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Arms events; `Err(Busy)` means events are already pending: progress, do not sleep.
    pub fn event_arm(&self, events: ArmEvents) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { (self.inner.ops.iface_event_arm)(self.inner.handle, events.0) })
    }

    /// Creates an endpoint to be connected with [`Ep::connect_to_ep`] (connect-to-ep model).
    pub fn ep_create(&self) -> Result<Ep> {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        check(unsafe { (self.inner.ops.ep_create)(self.inner.handle, &mut h) })?;
        Ok(Ep::from_raw(h, self.inner.clone()))
    }

    /// Creates an endpoint connected to a remote interface (connect-to-iface model).
    pub fn ep_create_connected(&self, dev_addr: &[u8], iface_addr: &[u8]) -> Result<Ep> {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid handle, buffers and out-pointer.
        check(unsafe {
            (self.inner.ops.ep_create_connected)(
                self.inner.handle,
                dev_addr.as_ptr(),
                dev_addr.len(),
                iface_addr.as_ptr(),
                iface_addr.len(),
                &mut h,
            )
        })?;
        Ok(Ep::from_raw(h, self.inner.clone()))
    }
}

#[cold]
fn bad_am_id(what: &str, id: u8) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("{what}: AM id {id} out of range 0..{}", AM_ID_MAX - 1),
    )
}

impl std::fmt::Debug for Iface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Iface({}/{})", self.inner.tl_name, self.inner.dev_name)
    }
}
