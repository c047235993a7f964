//! The worker: the progress engine of one thread (`uct_worker_h`).
//!
//! `progress()` dispatches the worker's callback queue: async events queued for this worker
//! (fd readiness and timers, detected by the async context's background thread and handed
//! over through its queue, so none is lost while the owner is busy), one-shot callbacks, then
//! the progress callbacks: the ifaces' progress functions and the application's. With nothing
//! to do this is one load: no allocation, lock or syscall. The async context wakes the
//! callback queue when it queues an event; in poll mode, polling the context is itself a
//! callback there.

use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;
use std::time::Duration;

use slab::Slab;
use ucs::async_ctx::{AsyncContext, AsyncMode, Events, HandlerId};
use ucs::callbackq::{CallbackId, CallbackQueue};
use ucs::{Result, Status};

use crate::host::{CbGuard, EvGuard, WORKER_API};
use uct_transport::abi::RawWorker;

pub(crate) struct WorkerInner {
    cbq: CallbackQueue,
    async_ctx: AsyncContext,
    /// Progress callback ids handed to transports (slab index + 1) → callback queue ids.
    progress_ids: RefCell<Slab<CallbackId>>,
    /// Async handler ids handed to transports (slab index + 1) → async ids.
    async_ids: RefCell<Slab<HandlerId>>,
}

impl WorkerInner {
    /// Everything queued: async events, one-shots, the progress callbacks. Out of line, so an
    /// idle `progress` stays one load and a branch in the caller.
    #[inline(never)]
    fn progress_all(&self) -> u32 {
        self.cbq.dispatch_with(|| self.async_ctx.dispatch_queued() as u32)
    }

    pub(crate) fn progress_add(&self, cb: CbGuard) -> u64 {
        let id = self.cbq.add(move || cb.call());
        self.progress_ids.borrow_mut().insert(id) as u64 + 1
    }

    pub(crate) fn progress_remove(&self, id: u64) {
        let Some(idx) = (id as usize).checked_sub(1) else {
            return;
        };
        let cid = self.progress_ids.borrow_mut().try_remove(idx);
        if let Some(cid) = cid {
            self.cbq.remove(cid);
        }
    }

    pub(crate) fn oneshot_add(&self, key: u64, cb: CbGuard) {
        self.cbq.add_oneshot(key, move || {
            cb.call();
        });
    }

    pub(crate) fn oneshot_remove(&self, key: u64) {
        self.cbq.remove_oneshot(key);
    }

    pub(crate) fn timer_add(&self, interval_ns: u64, cb: CbGuard) -> Result<i64> {
        let id = self
            .async_ctx
            .add_timer(Duration::from_nanos(interval_ns), move || {
                cb.call();
            })?;
        Ok(self.async_ids.borrow_mut().insert(id) as i64 + 1)
    }

    pub(crate) fn fd_add(&self, fd: i32, events: u32, cb: EvGuard) -> Result<i64> {
        let id = self
            .async_ctx
            .add_fd_handler(fd, to_events(events), move |ev: Events| cb.call(from_events(ev)))?;
        Ok(self.async_ids.borrow_mut().insert(id) as i64 + 1)
    }

    pub(crate) fn fd_modify(&self, id: i64, events: u32) -> Result<()> {
        let hid = self.async_id(id).ok_or(Status::InvalidParam)?;
        self.async_ctx.modify_fd_handler(hid, to_events(events))
    }

    pub(crate) fn handler_remove(&self, id: i64) {
        let Some(idx) = usize::try_from(id).ok().and_then(|i| i.checked_sub(1)) else {
            return;
        };
        let hid = self.async_ids.borrow_mut().try_remove(idx);
        if let Some(hid) = hid {
            // Not sync: this may be called from inside the handler itself.
            let _ = self.async_ctx.remove_handler(hid, false);
        }
    }

    fn async_id(&self, id: i64) -> Option<HandlerId> {
        let idx = usize::try_from(id).ok()?.checked_sub(1)?;
        self.async_ids.borrow().get(idx).copied()
    }
}

fn to_events(bits: u32) -> Events {
    // The boundary's fd event bits are the async context's bits (read 1, write 2, error 4).
    Events::from_bits_truncate(bits)
}

fn from_events(e: Events) -> u32 {
    e.bits()
}

/// A worker. Cheap to clone (shared handle); `!Send`.
///
/// ```
/// let worker = uct::Worker::new()?;
/// assert_eq!(worker.progress(), 0); // nothing opened: nothing to do
/// // An application's own progress callback runs on every progress.
/// let id = worker.progress_register(|| 1);
/// assert_eq!(worker.progress(), 1);
/// worker.progress_unregister(id);
/// # Ok::<(), uct::Error>(())
/// ```
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
}

impl Worker {
    /// Creates a worker with its own async context, whose events a background thread detects
    /// ([`AsyncMode::Thread`], UCX's default). A worker and everything opened on it belong to
    /// the thread that created them (UCX's `UCS_THREAD_MODE_SINGLE`; they are `!Send`).
    pub fn new() -> Result<Worker> {
        Self::with_async_mode(AsyncMode::Thread)
    }

    /// Creates a worker with its own async context in `mode` ([`AsyncMode::Poll`]: no
    /// background thread; `progress` polls for events).
    pub fn with_async_mode(mode: AsyncMode) -> Result<Worker> {
        Self::with_async(AsyncContext::new(mode)?)
    }

    /// Creates a worker over an existing async context (which it then owns the dispatch of).
    pub fn with_async(async_ctx: AsyncContext) -> Result<Worker> {
        let cbq = CallbackQueue::new();
        // Queued async events wake the progress list, so an idle progress checks only that.
        async_ctx.add_waker(cbq.handle());
        if async_ctx.mode() == AsyncMode::Poll {
            // Nobody else looks for events: polling is one of the progress callbacks.
            let ctx = async_ctx.clone();
            cbq.add(move || ctx.dispatch() as u32);
        }
        Ok(Worker {
            inner: Rc::new(WorkerInner {
                cbq,
                async_ctx,
                progress_ids: RefCell::new(Slab::new()),
                async_ids: RefCell::new(Slab::new()),
            }),
        })
    }

    /// Runs async events, one-shot callbacks and the progress callbacks (the interfaces' and
    /// the application's); returns the amount of work done. With nothing registered and
    /// nothing queued this is one load and a branch, inlined.
    #[inline(always)]
    pub fn progress(&self) -> u32 {
        if self.inner.cbq.is_idle() {
            return 0;
        }
        self.inner.progress_all()
    }

    /// The async context (its `event_fd` is readable while async events wait for `progress`).
    pub fn async_context(&self) -> &AsyncContext {
        &self.inner.async_ctx
    }

    /// True while one-shot callbacks (work the transports deferred) wait for the next
    /// `progress`: an application about to sleep must progress instead.
    pub fn has_oneshots(&self) -> bool {
        self.inner.cbq.oneshot_len() != 0
    }

    /// Adds an application progress callback.
    pub fn progress_register(&self, cb: impl FnMut() -> u32 + 'static) -> CallbackId {
        self.inner.cbq.add(cb)
    }

    /// Removes an application progress callback.
    pub fn progress_unregister(&self, id: CallbackId) {
        self.inner.cbq.remove(id);
    }

    pub(crate) fn raw(&self) -> RawWorker {
        RawWorker {
            handle: Rc::as_ptr(&self.inner) as *mut c_void,
            api: &WORKER_API,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// An idle progress checks only the progress list; the async context must wake it when it
    /// queues an event, in both modes, for timers and fds, and again after it went idle.
    #[test]
    fn async_events_wake_an_idle_worker() {
        for mode in [AsyncMode::Thread, AsyncMode::Poll] {
            let w = Worker::with_async_mode(mode).unwrap();
            if mode == AsyncMode::Thread {
                assert!(w.inner.cbq.is_idle(), "a thread-mode worker starts idle");
                assert_eq!(w.progress(), 0);
            }
            let ticks = Arc::new(AtomicU32::new(0));
            let t = ticks.clone();
            let tid = w
                .async_context()
                .add_timer(Duration::from_millis(2), move || {
                    t.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while ticks.load(Ordering::Relaxed) < 3 {
                w.progress();
                assert!(
                    Instant::now() < deadline,
                    "{mode:?}: timer never ran through progress"
                );
            }
            w.async_context().remove_handler(tid, true).unwrap();

            let (mut rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
            rx.set_nonblocking(true).unwrap();
            let seen = Arc::new(AtomicU32::new(0));
            let s = seen.clone();
            let rfd = rx.as_raw_fd();
            let hid = w
                .async_context()
                .add_fd_handler(rfd, Events::READ, move |_| {
                    let mut b = [0u8; 16];
                    let n = rx.read(&mut b).unwrap_or(0);
                    s.fetch_add(n as u32, Ordering::Relaxed);
                })
                .unwrap();
            for round in 1..=3u32 {
                tx.write_all(b"x").unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                while seen.load(Ordering::Relaxed) < round {
                    w.progress();
                    assert!(
                        Instant::now() < deadline,
                        "{mode:?}: fd event {round} never handled"
                    );
                }
            }
            w.async_context().remove_handler(hid, true).unwrap();
        }
    }
}
