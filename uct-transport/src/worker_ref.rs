//! The worker services a transport uses, through the host's [`RawWorkerApi`](crate::abi::RawWorkerApi) table.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::time::Duration;

use ucs::{Result, Status};

use crate::abi::{RawCallback, RawEventCallback, RawWorker};

/// Bits of fd events.
pub mod fd_events {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const ERR: u32 = 4;
}

/// A handle to the host's worker, valid for the lifetime of the iface it was given to.
#[derive(Clone, Copy)]
pub struct WorkerRef {
    raw: RawWorker,
}

/// Id of a registered progress callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgressId(pub u64);

/// Id of a timer or fd handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncId(pub i64);

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn call_boxed<F: FnMut() -> u32>(arg: *mut c_void) -> u32 {
    // SAFETY: `arg` is the Box<F> leaked in `boxed`, alive until `drop_boxed`. Panics are caught
    // because this is called across the boundary.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*(arg as *mut F))() })).unwrap_or_else(
        |_| {
            ucs::error!("panic in a transport progress/timer callback (caught)");
            0
        },
    )
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn call_boxed_ev<F: FnMut(u32)>(arg: *mut c_void, ev: u32) {
    // SAFETY: as in `call_boxed`.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*(arg as *mut F))(ev) }));
    if r.is_err() {
        ucs::error!("panic in a transport fd handler (caught)");
    }
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn drop_boxed<F>(arg: *mut c_void) {
    // SAFETY: `arg` came from Box::into_raw in `boxed`/`boxed_ev` and is dropped once, by the
    // host, when it removes the registration.
    drop(unsafe { Box::from_raw(arg as *mut F) });
}

fn boxed<F: FnMut() -> u32 + 'static>(f: F) -> RawCallback {
    RawCallback {
        func: call_boxed::<F>,
        arg: Box::into_raw(Box::new(f)) as *mut c_void,
        drop_arg: Some(drop_boxed::<F>),
    }
}

fn boxed_ev<F: FnMut(u32) + 'static>(f: F) -> RawEventCallback {
    RawEventCallback {
        func: call_boxed_ev::<F>,
        arg: Box::into_raw(Box::new(f)) as *mut c_void,
        drop_arg: Some(drop_boxed::<F>),
    }
}

impl WorkerRef {
    pub(crate) fn from_raw(raw: RawWorker) -> WorkerRef {
        WorkerRef { raw }
    }

    /// The raw form (to pass on).
    pub fn raw(&self) -> RawWorker {
        self.raw
    }

    /// Adds a progress callback run by every `Worker::progress`.
    pub fn progress_add(&self, f: impl FnMut() -> u32 + 'static) -> Result<ProgressId> {
        // SAFETY: the host's table and handle are valid for the iface's lifetime.
        let id = unsafe { ((*self.raw.api).progress_add)(self.raw.handle, boxed(f)) };
        if id == 0 {
            return Err(Status::NoMemory.into());
        }
        Ok(ProgressId(id))
    }

    /// Removes a progress callback (safe from inside it).
    pub fn progress_remove(&self, id: ProgressId) {
        // SAFETY: as above.
        unsafe { ((*self.raw.api).progress_remove)(self.raw.handle, id.0) }
    }

    /// Runs `f` once at the next progress. Callbacks with the same key run in order, and
    /// `oneshot_remove(key)` cancels them (UCX uses this for deferred error reports).
    pub fn oneshot_add(&self, key: u64, f: impl FnOnce() + 'static) {
        let mut f = Some(f);
        let cb = boxed(move || {
            if let Some(f) = f.take() {
                f();
            }
            0
        });
        // SAFETY: as above.
        unsafe { ((*self.raw.api).oneshot_add)(self.raw.handle, key, cb) }
    }

    /// Cancels the one-shot callbacks of `key` not yet run.
    pub fn oneshot_remove(&self, key: u64) {
        // SAFETY: as above.
        unsafe { ((*self.raw.api).oneshot_remove)(self.raw.handle, key) }
    }

    /// A periodic timer, run on the worker's thread at its next progress after expiry.
    pub fn timer_add(&self, interval: Duration, mut f: impl FnMut() + 'static) -> Result<AsyncId> {
        let ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX).max(1);
        // SAFETY: as above.
        let id = unsafe {
            ((*self.raw.api).timer_add)(
                self.raw.handle,
                ns,
                boxed(move || {
                    f();
                    0
                }),
            )
        };
        if id <= 0 {
            return Err(Status::from_raw(id.clamp(-100, -1) as i8).into());
        }
        Ok(AsyncId(id))
    }

    /// An fd handler (bits of [`fd_events`]), run on the worker's thread at its next progress.
    pub fn fd_add(&self, fd: i32, events: u32, f: impl FnMut(u32) + 'static) -> Result<AsyncId> {
        // SAFETY: as above.
        let id = unsafe { ((*self.raw.api).fd_add)(self.raw.handle, fd, events, boxed_ev(f)) };
        if id <= 0 {
            return Err(Status::from_raw(id.clamp(-100, -1) as i8).into());
        }
        Ok(AsyncId(id))
    }

    /// Changes the events of an fd handler.
    pub fn fd_modify(&self, id: AsyncId, events: u32) -> Result<()> {
        // SAFETY: as above.
        Status::from_raw(unsafe { ((*self.raw.api).fd_modify)(self.raw.handle, id.0, events) }).check()
    }

    /// Removes a timer or fd handler (safe from inside it).
    pub fn handler_remove(&self, id: AsyncId) {
        // SAFETY: as above.
        unsafe { ((*self.raw.api).handler_remove)(self.raw.handle, id.0) }
    }
}
