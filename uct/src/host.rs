//! Host side of the boundary: the worker services table handed to transports, and the
//! trampolines through which transports call back into host closures (AM handlers, pack/unpack,
//! pending requests, completions, error handlers, plugin logging).
//!
//! Every trampoline catches panics from the user's closure: a panic in user code is logged and
//! turned into an error status instead of unwinding through a transport.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ucs::Status;

use crate::worker::WorkerInner;
use uct_transport::abi::*;

// ---------------------------------------------------------------- worker services

/// Releases a transport-provided callback argument with the transport's own drop function.
pub(crate) struct CbGuard(pub RawCallback);

impl Drop for CbGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.drop_arg {
            // SAFETY: the transport gave us `arg` together with `drop_arg` to free it once.
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { d(self.0.arg) }));
        }
    }
}

impl CbGuard {
    #[inline]
    pub fn call(&self) -> u32 {
        // SAFETY: the transport keeps `arg` valid until `drop_arg` runs, which is after this.
        unsafe { (self.0.func)(self.0.arg) }
    }
}

pub(crate) struct EvGuard(pub RawEventCallback);

impl Drop for EvGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.drop_arg {
            // SAFETY: as for CbGuard.
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { d(self.0.arg) }));
        }
    }
}

impl EvGuard {
    pub fn call(&self, ev: u32) {
        // SAFETY: as for CbGuard.
        unsafe { (self.0.func)(self.0.arg, ev) }
    }
}

// SAFETY: async handlers are run only by the worker's own thread (`AsyncContext::dispatch` is
// called from `Worker::progress`), and removed by it; the background thread only queues events.
unsafe impl Send for CbGuard {}
// SAFETY: as above.
unsafe impl Send for EvGuard {}

/// # Safety
/// `w` must be the handle of a live worker, used on its own thread.
unsafe fn worker<'a>(w: *mut c_void) -> &'a WorkerInner {
    // SAFETY: forwarded to the caller.
    unsafe { &*(w as *const WorkerInner) }
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn progress_add(w: *mut c_void, cb: RawCallback) -> u64 {
    // SAFETY: transports pass the handle they were given.
    catch_unwind(AssertUnwindSafe(|| {
        unsafe { worker(w) }.progress_add(CbGuard(cb))
    }))
    .unwrap_or(0)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn progress_remove(w: *mut c_void, id: u64) {
    // SAFETY: as above.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe { worker(w) }.progress_remove(id)));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn oneshot_add(w: *mut c_void, key: u64, cb: RawCallback) {
    // SAFETY: as above.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        unsafe { worker(w) }.oneshot_add(key, CbGuard(cb))
    }));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn oneshot_remove(w: *mut c_void, key: u64) {
    // SAFETY: as above.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe { worker(w) }.oneshot_remove(key)));
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn timer_add(w: *mut c_void, interval_ns: u64, cb: RawCallback) -> i64 {
    // SAFETY: as above.
    catch_unwind(AssertUnwindSafe(|| {
        match unsafe { worker(w) }.timer_add(interval_ns, CbGuard(cb)) {
            Ok(id) => id,
            Err(e) => e.status().as_raw() as i64,
        }
    }))
    .unwrap_or(Status::IoError.as_raw() as i64)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn fd_add(w: *mut c_void, fd: i32, events: u32, cb: RawEventCallback) -> i64 {
    // SAFETY: as above.
    catch_unwind(AssertUnwindSafe(|| {
        match unsafe { worker(w) }.fd_add(fd, events, EvGuard(cb)) {
            Ok(id) => id,
            Err(e) => e.status().as_raw() as i64,
        }
    }))
    .unwrap_or(Status::IoError.as_raw() as i64)
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn fd_modify(w: *mut c_void, id: i64, events: u32) -> RawStatus {
    // SAFETY: as above.
    catch_unwind(AssertUnwindSafe(|| {
        match unsafe { worker(w) }.fd_modify(id, events) {
            Ok(()) => 0,
            Err(e) => e.status().as_raw(),
        }
    }))
    .unwrap_or(Status::IoError.as_raw())
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn handler_remove(w: *mut c_void, id: i64) {
    // SAFETY: as above.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe { worker(w) }.handler_remove(id)));
}

/// The table every transport gets.
pub(crate) static WORKER_API: RawWorkerApi = RawWorkerApi {
    progress_add,
    progress_remove,
    oneshot_add,
    oneshot_remove,
    timer_add,
    fd_add,
    fd_modify,
    handler_remove,
};

// ---------------------------------------------------------------- logging from plugins

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
pub(crate) unsafe extern "C" fn host_log(
    level: u8,
    target: *const u8,
    tlen: usize,
    msg: *const u8,
    mlen: usize,
) {
    let _ = catch_unwind(|| {
        // SAFETY: the plugin passes byte ranges valid for the call.
        let (t, m) = unsafe {
            (
                std::slice::from_raw_parts(target, tlen),
                std::slice::from_raw_parts(msg, mlen),
            )
        };
        let t = String::from_utf8_lossy(t);
        let m = String::from_utf8_lossy(m);
        match level {
            1 => ucs::error!(target: "rucx::plugin", "[{t}] {m}"),
            2 => ucs::warn!(target: "rucx::plugin", "[{t}] {m}"),
            3 => ucs::info!(target: "rucx::plugin", "[{t}] {m}"),
            4 => ucs::debug!(target: "rucx::plugin", "[{t}] {m}"),
            _ => ucs::trace!(target: "rucx::plugin", "[{t}] {m}"),
        }
    });
}

// ---------------------------------------------------------------- user-closure trampolines

/// `RawPackCb` over a `FnOnce(&mut [u8]) -> usize` living on the caller's stack.
///
/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
pub(crate) unsafe extern "C" fn pack_tramp<F: FnOnce(&mut [u8]) -> usize>(
    arg: *mut c_void,
    dest: *mut u8,
    max: usize,
) -> usize {
    // SAFETY: `arg` points to an `Option<F>` on the stack of the call that passed it, valid for
    // this synchronous callback; `dest` is valid for `max` bytes.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        let f = (*(arg as *mut Option<F>)).take();
        match f {
            Some(f) => f(std::slice::from_raw_parts_mut(dest, max)),
            None => 0,
        }
    }))
    .unwrap_or_else(|_| {
        ucs::error!("panic in a bcopy pack callback (caught); nothing sent");
        usize::MAX
    })
}

/// `RawUnpackCb` over a boxed `FnOnce(&[u8])`.
///
/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
pub(crate) unsafe extern "C" fn unpack_tramp<F: FnOnce(&[u8])>(
    arg: *mut c_void,
    data: *const u8,
    len: usize,
) {
    // SAFETY: `arg` is the Box<F> leaked by get_bcopy; the transport calls this exactly once.
    let f = unsafe { Box::from_raw(arg as *mut F) };
    if data.is_null() {
        return; // canceled: just free the closure
    }
    // SAFETY: `data` is valid for `len` bytes during the call.
    let d = unsafe { std::slice::from_raw_parts(data, len) };
    if catch_unwind(AssertUnwindSafe(|| f(d))).is_err() {
        ucs::error!("panic in a get_bcopy unpack callback (caught)");
    }
}

// ---------------------------------------------------------------- statuses

/// A status a table returned, as a result (with the context the transport left for it).
#[inline(always)]
pub(crate) fn check(st: RawStatus) -> ucs::Result<()> {
    if st == 0 {
        Ok(())
    } else {
        Err(uct_transport::error_context::take(st))
    }
}

/// A status a table returned for an operation that may complete later.
#[inline(always)]
pub(crate) fn outcome(st: RawStatus) -> ucs::Result<ucs::Outcome> {
    match st {
        0 => Ok(ucs::Outcome::Done),
        1 => Ok(ucs::Outcome::InProgress),
        _ => Err(uct_transport::error_context::take(st)),
    }
}

/// A bcopy's return: the length packed, or a negative status.
#[inline(always)]
pub(crate) fn length(n: isize) -> ucs::Result<usize> {
    if n >= 0 {
        Ok(n as usize)
    } else {
        Err(uct_transport::error_context::take(n as RawStatus))
    }
}

/// The host's `set_error` for plugins: keeps the message in the host's thread slot.
///
/// # Safety
/// `msg` must be valid for `len` bytes during the call.
pub(crate) unsafe extern "C" fn host_set_error(status: RawStatus, msg: *const u8, len: usize) {
    let _ = catch_unwind(|| {
        let bytes = if len == 0 {
            &[][..]
        } else {
            // SAFETY: the plugin passes a byte range valid for the call.
            unsafe { std::slice::from_raw_parts(msg, len) }
        };
        uct_transport::error_context::store(status, String::from_utf8_lossy(bytes).into_owned());
    });
}
