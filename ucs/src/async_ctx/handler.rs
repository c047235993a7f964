//! A registered handler and the per-context event sink it delivers into.
//!
//! Delivery (any thread: the async thread, or the dispatcher in poll mode) ORs event bits into the
//! handler's `pending` word and, if the handler is not queued yet, pushes it onto the context's
//! [`EventSink`] and signals the sink's eventfd. Running (owner thread) clears `queued` first, then
//! takes the bits, so an event that arrives while the handler runs queues it again: coalesced, never
//! lost.

use super::events::Events;
use crate::callbackq::CallbackQueueHandle;
use crate::mpmc::MpmcQueue;
use crate::{Result, Status};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Pending bit of a timer tick (outside the user-visible [`Events`] bits).
pub(super) const TIMER_BIT: u32 = 1 << 31;

pub(super) type HandlerFn = Box<dyn FnMut(Events) + Send>;

pub(super) enum Kind {
    Fd { fd: RawFd, events: AtomicU32 },
    Timer,
}

pub(super) struct Handler {
    pub id: u64,
    pub kind: Kind,
    sink: Arc<EventSink>,
    pending: AtomicU32,
    queued: AtomicBool,
    pub removed: AtomicBool,
    /// Token of the thread running the callback, 0 when idle (for reentrancy checks).
    running_on: AtomicU64,
    /// The lock is held while the callback runs; `remove_handler(sync)` waits on it.
    cb: Mutex<HandlerFn>,
}

impl Handler {
    pub fn new(id: u64, kind: Kind, sink: Arc<EventSink>, cb: HandlerFn) -> Self {
        Self {
            id,
            kind,
            sink,
            pending: AtomicU32::new(0),
            queued: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            running_on: AtomicU64::new(0),
            cb: Mutex::new(cb),
        }
    }

    /// Interest of an fd handler (`NONE` for timers).
    pub fn fd_events(&self) -> Events {
        match &self.kind {
            Kind::Fd { events, .. } => Events::from_bits_truncate(events.load(Ordering::Relaxed)),
            Kind::Timer => Events::NONE,
        }
    }

    pub fn is_fd(&self) -> bool {
        matches!(self.kind, Kind::Fd { .. })
    }

    /// Records `bits` and queues the handler on its context unless it is queued already.
    /// Never runs user code.
    pub fn deliver(self: &Arc<Self>, bits: u32) {
        self.pending.fetch_or(bits, Ordering::AcqRel);
        self.enqueue();
    }

    fn enqueue(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.sink.push(self.clone());
        }
    }

    /// Runs the callback for a dequeued entry on the calling thread; returns whether it ran.
    pub fn run(self: &Arc<Self>) -> bool {
        self.queued.store(false, Ordering::SeqCst);
        if self.removed.load(Ordering::Acquire) {
            return false;
        }
        let me = thread_token();
        if self.running_on.load(Ordering::Relaxed) == me {
            // A dispatch nested inside this very handler: run it later, from the outer level.
            self.enqueue();
            return false;
        }
        // A panic in an earlier call poisons the lock; the closure itself is still usable.
        let mut cb = self.cb.lock().unwrap_or_else(PoisonError::into_inner);
        if self.removed.load(Ordering::Acquire) {
            return false; // removed while we waited for another dispatcher
        }
        let bits = self.pending.swap(0, Ordering::AcqRel);
        if bits == 0 {
            return false; // an earlier run already consumed this entry's events
        }
        self.running_on.store(me, Ordering::Relaxed);
        let _idle = ResetOnDrop(&self.running_on);
        (cb)(Events::from_bits_truncate(bits));
        true
    }

    /// Waits until the callback is not running, unless the calling thread is the one running it.
    pub fn wait_idle(&self) {
        if self.running_on.load(Ordering::Relaxed) != thread_token() {
            drop(self.cb.lock());
        }
    }
}

struct ResetOnDrop<'a>(&'a AtomicU64);

impl Drop for ResetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// A small per-thread number (never 0), cheaper to compare than `ThreadId`.
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TOKEN.with(|t| *t)
}

/// Queue of handlers with pending events, plus an eventfd that is readable while it is non-empty.
pub(super) struct EventSink {
    queue: MpmcQueue<Arc<Handler>>,
    /// Upper bound of the queue length (incremented before push, decremented after pull): the one
    /// atomic that an idle `dispatch` reads.
    count: AtomicUsize,
    /// Whether the eventfd was written since the owner last cleared it.
    signaled: AtomicBool,
    efd: EventFd,
    /// Callback queues woken after each push (the owning workers' progress lists).
    wakers: Mutex<Vec<CallbackQueueHandle>>,
    /// `wakers` is non-empty (read without the lock on every push).
    has_wakers: AtomicBool,
}

impl EventSink {
    pub fn new() -> Result<Self> {
        let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).map_err(|e| {
            crate::error!("async: eventfd() failed: {e}; raise the open-files limit (ulimit -n)");
            errno_status(e)
        })?;
        Ok(Self {
            queue: MpmcQueue::new(),
            count: AtomicUsize::new(0),
            signaled: AtomicBool::new(false),
            efd,
            wakers: Mutex::new(Vec::new()),
            has_wakers: AtomicBool::new(false),
        })
    }

    pub fn add_waker(&self, w: CallbackQueueHandle) {
        self.wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(w.clone());
        self.has_wakers.store(true, Ordering::Release);
        // Events queued before it came: a new waker is woken for them too (a later push wakes
        // it anyway; after the store above, a push in between is seen by both).
        if self.has_events() {
            w.wake();
        }
    }

    fn push(&self, h: Arc<Handler>) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.queue.push(h);
        // After the push: a waker's dispatch that takes the wake-up then finds the event.
        if self.has_wakers.load(Ordering::Acquire) {
            for w in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                w.wake();
            }
        }
        if !self.signaled.swap(true, Ordering::AcqRel) {
            if let Err(e) = self.efd.write(1) {
                crate::warn!("async: eventfd write failed: {e}");
            }
        }
    }

    #[inline]
    pub fn has_events(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub fn pop(&self) -> Option<Arc<Handler>> {
        let h = self.queue.pull()?;
        self.count.fetch_sub(1, Ordering::AcqRel);
        Some(h)
    }

    /// Resets the eventfd before the owner drains the queue. Drain first, then clear the flag: a
    /// producer that finds the flag clear writes after our read, so its signal survives.
    pub fn clear_signal(&self) {
        if self.signaled.load(Ordering::Acquire) {
            self.drain_fd();
            self.signaled.swap(false, Ordering::AcqRel);
        }
    }

    /// Prepares for sleeping on the eventfd: `Err(Busy)` if events are queued, otherwise clears any
    /// stale readiness so the fd wakes the caller only for new events.
    pub fn arm(&self) -> Result<()> {
        if self.has_events() {
            return Err(Status::Busy.into());
        }
        self.drain_fd();
        self.signaled.swap(false, Ordering::AcqRel);
        if self.has_events() {
            return Err(Status::Busy.into());
        }
        Ok(())
    }

    fn drain_fd(&self) {
        match self.efd.read() {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => crate::warn!("async: eventfd read failed: {e}"),
        }
    }

    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.efd)
    }
}

/// Maps an OS error to the closest UCX status.
pub(super) fn errno_status(e: nix::errno::Errno) -> Status {
    use nix::errno::Errno;
    match e {
        Errno::EBADF | Errno::EINVAL | Errno::EPERM => Status::InvalidParam,
        Errno::EEXIST => Status::AlreadyExists,
        Errno::ENOENT => Status::NoElem,
        Errno::ENOMEM => Status::NoMemory,
        Errno::EMFILE | Errno::ENFILE | Errno::ENOSPC | Errno::EAGAIN => Status::NoResource,
        _ => Status::IoError,
    }
}
