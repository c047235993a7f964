//! Transport-side views of the callbacks the host passes through the boundary.
//!
//! Each type wraps the raw pointers of one callback and offers a safe method to invoke it. The
//! host guarantees (see [`crate::abi`]) that the pointers stay valid for as long as the
//! operation they came with is outstanding: until the completion is updated, the pending request
//! is dispatched with `Ok` or purged, the unpack callback is called.
#![allow(unsafe_code)]

use std::ffi::c_void;

use ucs::{Error, Status};

use crate::abi::{self, RawCompletion, RawErrHandler, RawPackCb, RawPendingReq, RawPurgeCb, RawUnpackCb};
use crate::traits::EpHandle;

/// A completion to update when an operation finishes; may be empty (the host did not ask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comp(pub(crate) *mut RawCompletion);

impl Comp {
    /// No completion.
    pub const NONE: Comp = Comp(std::ptr::null_mut());

    /// True when there is no completion to update.
    pub fn is_none(&self) -> bool {
        self.0.is_null()
    }

    /// Marks one operation finished with `status` (first error wins; the callback runs when the
    /// outstanding count reaches zero). Call it exactly once per operation that returned
    /// `InProgress`.
    pub fn complete(self, status: Status) {
        // SAFETY: the host keeps the completion alive while operations that carry it are
        // outstanding, and only this thread touches it.
        unsafe { abi::completion_update(self.0, status) }
    }
}

/// A bcopy pack callback: fills a transport buffer.
pub struct PackCb {
    pub(crate) func: RawPackCb,
    pub(crate) arg: *mut c_void,
}

impl PackCb {
    /// Lets the host write into `dest`; returns the number of bytes written (<= `dest.len()`).
    /// A callback that claims more than `dest.len()` is a host bug reported as `MessageTruncated`.
    /// Inlined: a bcopy send's stack stays one frame shallower (see `uct-self`'s `am_bcopy`).
    #[inline]
    pub fn pack(self, dest: &mut [u8]) -> ucs::Result<usize> {
        // SAFETY: `dest` is a valid writable buffer of `dest.len()` bytes; `arg` is the host's.
        let n = unsafe { (self.func)(self.arg, dest.as_mut_ptr(), dest.len()) };
        if n > dest.len() {
            return Err(pack_overrun(n, dest.len()));
        }
        Ok(n)
    }
}

#[cold]
#[inline(never)]
fn pack_overrun(n: usize, max: usize) -> Error {
    Error::new(
        Status::MessageTruncated,
        format!("the bcopy pack callback claims {n} bytes, more than the {max} it was given"),
    )
}

/// A get_bcopy unpack callback. Must be consumed exactly once: `deliver` or `cancel`.
pub struct UnpackCb {
    pub(crate) func: RawUnpackCb,
    pub(crate) arg: *mut c_void,
}

impl UnpackCb {
    /// Hands the fetched data to the host.
    pub fn deliver(self, data: &[u8]) {
        // SAFETY: `data` is valid for its length during the call; the arg is the host's.
        unsafe { (self.func)(self.arg, data.as_ptr(), data.len()) }
    }

    /// Tells the host the operation failed, so it frees its state.
    pub fn cancel(self) {
        // SAFETY: null data means "canceled" by the boundary's contract.
        unsafe { (self.func)(self.arg, std::ptr::null(), 0) }
    }
}

/// Where a fetching atomic writes the old value.
#[derive(Clone, Copy, Debug)]
pub struct ResultPtr(pub(crate) *mut u64);

impl ResultPtr {
    /// Stores the fetched value (before completing the operation).
    pub fn set(self, v: u64) {
        // SAFETY: the host keeps the result slot alive until the operation completes; it is an
        // aligned u64 owned by the host and only touched from this thread.
        unsafe { self.0.write(v) }
    }
}

/// A pending request owned by the host (`uct_pending_req_t`).
#[derive(Debug, PartialEq, Eq)]
pub struct PendingReq(pub(crate) *mut RawPendingReq);

/// Result of dispatching one pending request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingResult {
    /// Done: the request is gone.
    Done,
    /// Progress made, keep the request and go on with the queue.
    InProgress,
    /// Out of resources: keep the request, stop dispatching.
    Stop,
}

impl PendingReq {
    /// Runs the request's callback. On `Done` the request has been consumed.
    pub fn dispatch(&self) -> PendingResult {
        // SAFETY: the host keeps the request alive until it returns OK or it is purged.
        let st = unsafe { ((*self.0).func)(self.0) };
        match Status::from_raw(st) {
            Status::Ok => PendingResult::Done,
            Status::InProgress => PendingResult::InProgress,
            _ => PendingResult::Stop,
        }
    }
}

/// The purge callback: every request still queued is handed back through it.
#[derive(Clone, Copy)]
pub struct PurgeCb {
    pub(crate) func: RawPurgeCb,
    pub(crate) arg: *mut c_void,
}

impl PurgeCb {
    /// Gives `req` back to the host.
    pub fn purge(&self, req: PendingReq) {
        // SAFETY: the request is the host's and is not used by the transport afterwards.
        unsafe { (self.func)(req.0, self.arg) }
    }
}

/// The iface error handler (peer failure), possibly unset.
#[derive(Clone, Copy)]
pub struct ErrHandler {
    pub(crate) func: Option<RawErrHandler>,
    pub(crate) arg: *mut c_void,
}

impl ErrHandler {
    /// A handler that is not set.
    pub const NONE: ErrHandler = ErrHandler {
        func: None,
        arg: std::ptr::null_mut(),
    };

    /// Reports that `ep` failed with `status`. Returns `false` when no handler is set or the
    /// user's handler did not handle it; the transport then logs the failure at error level.
    pub fn report(&self, ep: EpHandle, status: Status) -> bool {
        match self.func {
            // SAFETY: the host keeps the handler argument alive for the iface's lifetime.
            Some(f) => unsafe { f(self.arg, ep.0 as *mut c_void, status.as_raw()) == 0 },
            None => false,
        }
    }

    /// True when the user installed a handler.
    pub fn is_set(&self) -> bool {
        self.func.is_some()
    }
}
