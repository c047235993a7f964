//! The worker: the progress engine of one thread (`uct_worker_h`).
//!
//! `progress()` first calls the ifaces' progress functions (straight, one indirect call each:
//! `transport_progress`), then runs async events queued for this worker (fd readiness and
//! timers, detected by the async context's background thread and handed over through its
//! queue, so none is lost while the owner is busy) and the other callbacks (one-shot and
//! application ones). With nothing to do this is one load: no allocation, lock or syscall.
//! The async context wakes the callback queue when it queues an event; in poll mode, polling
//! the context is itself a callback there.

use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;
use std::time::Duration;

use slab::Slab;
use ucs::async_ctx::{AsyncContext, AsyncMode, Events, HandlerId};
use ucs::callbackq::{CallbackId, CallbackQueue, QueueState};
use ucs::{Result, Status};

use crate::host::{CbGuard, EvGuard, WORKER_API};
use crate::transport_progress::TransportProgress;
use uct_transport::abi::RawWorker;

/// Threading mode of a worker (`ucs_thread_mode_t`). Only `Single` is supported: a worker and
/// its objects belong to the thread that created them (they are `!Send`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadMode {
    Single,
    Serialized,
    Multi,
}

pub(crate) struct WorkerInner {
    /// The transports' progress functions, called first and straight.
    transports: TransportProgress,
    cbq: CallbackQueue,
    async_ctx: AsyncContext,
    /// Progress callback ids handed to transports (slab index + 1) → `transports` ids.
    progress_ids: RefCell<Slab<u64>>,
    /// Async handler ids handed to transports (slab index + 1) → async ids.
    async_ids: RefCell<Slab<HandlerId>>,
}

impl WorkerInner {
    /// The transports' progress functions (`st.held()`), then async events, one-shot and
    /// application callbacks (`st.has_work()`, the rarer case).
    #[inline(never)]
    fn progress_busy(&self, st: QueueState) -> u32 {
        let mut n = 0;
        if st.held() {
            n = self.transports.dispatch();
        }
        if st.has_work() {
            n = n.wrapping_add(self.dispatch_callbacks());
        }
        n
    }

    /// Async events, one-shot and application callbacks: out of line, off the polling path.
    #[cold]
    #[inline(never)]
    fn dispatch_callbacks(&self) -> u32 {
        self.cbq.dispatch_with(|| self.async_ctx.dispatch_queued() as u32)
    }

    pub(crate) fn progress_add(&self, cb: CbGuard) -> u64 {
        let id = self.transports.add(cb);
        self.cbq.set_held(true);
        self.progress_ids.borrow_mut().insert(id) as u64 + 1
    }

    pub(crate) fn progress_remove(&self, id: u64) {
        let Some(idx) = (id as usize).checked_sub(1) else {
            return;
        };
        let tid = self.progress_ids.borrow_mut().try_remove(idx);
        if let Some(tid) = tid {
            self.transports.remove(tid);
            self.cbq.set_held(!self.transports.is_empty());
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
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
}

impl Worker {
    /// Creates a worker with its own async context in `mode`.
    pub fn new(mode: AsyncMode, thread_mode: ThreadMode) -> Result<Worker> {
        Self::with_async(AsyncContext::new(mode)?, thread_mode)
    }

    /// Creates a worker over an existing async context (which it then owns the dispatch of).
    pub fn with_async(async_ctx: AsyncContext, thread_mode: ThreadMode) -> Result<Worker> {
        if thread_mode == ThreadMode::Multi {
            tracing::error!("uct workers support only single-threaded use (ThreadMode::Single/Serialized)");
            return Err(Status::Unsupported);
        }
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
                transports: TransportProgress::new(),
                cbq,
                async_ctx,
                progress_ids: RefCell::new(Slab::new()),
                async_ids: RefCell::new(Slab::new()),
            }),
        })
    }

    /// Runs the transports' progress functions, then async events and the other callbacks;
    /// returns the amount of work done. With nothing registered and nothing queued this is one
    /// load and a branch, inlined. With only transports registered and nothing queued (a
    /// polling loop's usual case) their functions are called from here, as UCX's inline
    /// `uct_worker_progress` calls them: one call level less per poll; anything else is one
    /// direct call (`progress_busy`).
    #[inline(always)]
    pub fn progress(&self) -> u32 {
        let st = self.inner.cbq.state();
        if st.is_idle() {
            return 0;
        }
        if st.held_only() {
            return self.inner.transports.dispatch();
        }
        self.inner.progress_busy(st)
    }

    /// The async context (its `event_fd` is readable while async events wait for `progress`).
    pub fn async_context(&self) -> &AsyncContext {
        &self.inner.async_ctx
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
            let w = Worker::new(mode, ThreadMode::Single).unwrap();
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
