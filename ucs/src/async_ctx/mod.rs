//! Async context: fd and timer handlers whose events are noticed in the background and handled on
//! the owner thread (UCX `ucs_async_context`).
//!
//! # Modes
//! * [`AsyncMode::Thread`]: one process-global thread (started by the first thread-mode context,
//!   stopped with the last) waits in `epoll` for the fds of all thread-mode contexts and keeps their
//!   timers. It never runs a handler: it queues the event on the owning context (an MPMC queue) and
//!   makes the context's [`event_fd`](AsyncContext::event_fd) readable.
//! * [`AsyncMode::Poll`]: no thread. [`dispatch`](AsyncContext::dispatch) itself polls the
//!   context's fds (`epoll_wait` with timeout 0) and timers, then runs what is due.
//!
//! In both modes handlers run only inside `dispatch`, on the thread that calls it (the worker's
//! progress), so a handler never races with the owner's data path and needs no locking against it.
//!
//! # Nothing is silently lost
//! UCX runs handlers on its async thread and, when the owner holds the context lock, parks the event
//! in a "missed" queue that only `ucp_worker_progress` replays; a UCT-only user could miss events.
//! Here every event goes through the queue: an event that arrives while the owner is busy stays
//! queued until the owner's next `dispatch`, however long that takes. Coalescing keeps the queue
//! bounded: a handler is queued at most once; events arriving meanwhile are OR-ed into that entry
//! (fd bits), or merged into one tick (periodic timers). An event arriving while its handler runs
//! queues it again, so it is handled by a later dispatch.
//!
//! # Fds
//! Fds are watched one-shot: after a report the fd is disarmed until its handler has run, then
//! re-armed. A level-triggered fd that the handler leaves readable is reported again after that run,
//! never in a busy loop while the owner is slow. Keep the fd open until its handler is removed. In
//! thread mode all contexts share one epoll set, so an fd can have one handler in the process.
//!
//! # Sleeping until there is work
//! `event_fd()` is readable while events are queued (it can also be spuriously readable). Before
//! blocking on it, call [`arm`](AsyncContext::arm): `Err(Busy)` means events are queued, dispatch
//! instead of sleeping. In poll mode events are only discovered by `dispatch`, so there the fd only
//! reflects events already queued.
//!
//! # Cost of an idle dispatch
//! Thread mode: one atomic load (no lock, no system call). Poll mode: the same plus one relaxed load
//! per kind of handler when the context has none; with handlers, one `epoll_wait(0)`.
//!
//! # Waking the owner
//! [`add_waker`](AsyncContext::add_waker) registers a callback queue to wake (see
//! `CallbackQueueHandle::wake`) after each queued event. A worker does this, so its idle progress
//! reads only its queue's state byte and calls [`dispatch_queued`](AsyncContext::dispatch_queued)
//! when woken.
//!
//! # Threads and reentrancy
//! Handlers can be added, modified and removed from any thread and from inside any handler,
//! including a handler removing itself. `remove_handler(id, sync = true)` returns once the handler is
//! not running (not waiting when called from inside it); after `remove_handler` returns, the handler
//! never starts again.

mod events;
mod handler;
mod reactor;
mod thread;
mod timerq;

#[cfg(test)]
mod tests;

pub use events::{Events, HandlerId};

use handler::{EventSink, Handler, HandlerFn, Kind};
use nix::sys::epoll::EpollTimeout;
use reactor::Reactor;
use std::collections::HashMap;
use std::fmt;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use thread::ThreadRef;

use crate::callbackq::CallbackQueueHandle;
use crate::{Error, Result, Status};

/// Where events are detected (see the [module documentation](self)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AsyncMode {
    /// A process-global background thread detects events and queues them for the owner.
    Thread,
    /// The owner's `dispatch` polls for events; no background thread.
    Poll,
}

/// An async context; cheap to clone (shared), usable from any thread.
#[derive(Clone)]
pub struct AsyncContext {
    inner: Arc<Inner>,
}

struct Inner {
    mode: AsyncMode,
    sink: Arc<EventSink>,
    reactor: Arc<Reactor>,
    handlers: Mutex<HashMap<u64, Arc<Handler>>>,
    /// Keeps the global thread alive (thread mode); dropped after the handlers are unregistered.
    _thread: Option<ThreadRef>,
}

static NEXT_HANDLER_ID: AtomicU64 = AtomicU64::new(1);

impl AsyncContext {
    /// Creates a context. Thread mode starts the global async thread if it is not running.
    pub fn new(mode: AsyncMode) -> Result<Self> {
        let sink = Arc::new(EventSink::new()?);
        let (reactor, thread) = match mode {
            AsyncMode::Thread => {
                let t = ThreadRef::acquire()?;
                (t.reactor().clone(), Some(t))
            }
            AsyncMode::Poll => (Arc::new(Reactor::new(false)?), None),
        };
        crate::debug!(?mode, event_fd = sink.fd(), "async: context created");
        Ok(Self {
            inner: Arc::new(Inner {
                mode,
                sink,
                reactor,
                handlers: Mutex::default(),
                _thread: thread,
            }),
        })
    }

    /// The mode given at creation.
    pub fn mode(&self) -> AsyncMode {
        self.inner.mode
    }

    /// An fd that is readable while events are queued for [`dispatch`](Self::dispatch)
    /// (also through [`AsFd`](std::os::fd::AsFd)).
    pub fn event_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.sink.as_fd()
    }

    /// Prepares [`event_fd`](Self::event_fd) for sleeping: `Err(Busy)` if events are queued
    /// (dispatch them first), otherwise clears stale readiness so the fd fires on new events only.
    pub fn arm(&self) -> Result<()> {
        self.inner.sink.arm()
    }

    /// Wakes `waker` (see [`CallbackQueueHandle::wake`]) whenever an event is queued, so the
    /// owner's progress needs no check of its own while nothing happens: a worker looks at its
    /// events only when its progress list was woken (then it calls
    /// [`dispatch_queued`](Self::dispatch_queued)).
    pub fn add_waker(&self, waker: CallbackQueueHandle) {
        self.inner.sink.add_waker(waker);
    }

    /// Runs the handlers of events already queued, without polling (see
    /// [`dispatch`](Self::dispatch) for that); returns how many ran.
    #[inline]
    pub fn dispatch_queued(&self) -> usize {
        if !self.inner.sink.has_events() {
            return 0;
        }
        self.run_queued()
    }

    /// Number of events queued for `dispatch` (a hint under concurrency).
    pub fn queued_events(&self) -> usize {
        self.inner.sink.len()
    }

    /// Number of registered handlers.
    pub fn num_handlers(&self) -> usize {
        self.handlers().len()
    }

    /// Runs the handlers of queued events on the calling thread and returns how many ran. In poll
    /// mode it first polls the context's fds and timers. Events queued while it runs are left for
    /// the next call.
    #[inline]
    pub fn dispatch(&self) -> usize {
        let inner = &*self.inner;
        if inner.mode == AsyncMode::Poll && inner.reactor.has_handlers() {
            inner.reactor.poll(EpollTimeout::ZERO);
        }
        if !inner.sink.has_events() {
            return 0;
        }
        self.run_queued()
    }

    fn run_queued(&self) -> usize {
        let inner = &*self.inner;
        inner.sink.clear_signal();
        let mut ran = 0;
        for _ in 0..inner.sink.len() {
            let Some(h) = inner.sink.pop() else { break };
            if h.run() {
                ran += 1;
                if h.is_fd() {
                    inner.reactor.rearm(&h);
                }
            }
            // `h` may be the last reference of a removed handler: its closure drops here, on the
            // owner thread, with no lock held.
        }
        ran
    }

    /// Calls `handler` (on the dispatching thread) when `fd` has any of `events`; ERR is always
    /// reported. The fd must stay open until the handler is removed.
    pub fn add_fd_handler(
        &self,
        fd: RawFd,
        events: Events,
        handler: impl FnMut(Events) + Send + 'static,
    ) -> Result<HandlerId> {
        if fd < 0 {
            crate::warn!(fd, "async: add_fd_handler with a negative fd; pass an open fd");
            return Err(Status::InvalidParam.into());
        }
        let kind = Kind::Fd {
            fd,
            events: AtomicU32::new(events.bits()),
        };
        let h = self.register(kind, Box::new(handler));
        if let Err(e) = self.inner.reactor.add_fd(&h) {
            self.handlers().remove(&h.id);
            return Err(e);
        }
        crate::debug!(id = h.id, fd, ?events, "async: fd handler added");
        Ok(HandlerId(h.id))
    }

    /// Changes the events an fd handler waits for (and re-arms it).
    pub fn modify_fd_handler(&self, id: HandlerId, events: Events) -> Result<()> {
        let h = self.lookup(id)?;
        let Kind::Fd {
            events: ref interest, ..
        } = h.kind
        else {
            crate::warn!(
                id = id.0,
                "async: modify_fd_handler on a timer; pass an fd handler id"
            );
            return Err(Status::InvalidParam.into());
        };
        interest.store(events.bits(), Ordering::Relaxed);
        self.inner.reactor.modify_fd(&h)
    }

    /// Calls `handler` (on the dispatching thread) every `interval`. Ticks that pass while a tick
    /// is still queued merge into it.
    pub fn add_timer(
        &self,
        interval: Duration,
        mut handler: impl FnMut() + Send + 'static,
    ) -> Result<HandlerId> {
        if interval.is_zero() || Instant::now().checked_add(interval).is_none() {
            crate::warn!(?interval, "async: add_timer interval must be non-zero and finite");
            return Err(Status::InvalidParam.into());
        }
        let h = self.register(Kind::Timer, Box::new(move |_| handler()));
        self.inner.reactor.add_timer(&h, interval);
        crate::debug!(id = h.id, ?interval, "async: timer added");
        Ok(HandlerId(h.id))
    }

    /// Removes a handler; it never starts again after this returns. With `sync`, also waits until
    /// it is not running (unless called from inside it). `Err(NoElem)` if `id` is not registered.
    pub fn remove_handler(&self, id: HandlerId, sync: bool) -> Result<()> {
        let Some(h) = self.handlers().remove(&id.0) else {
            crate::warn!(
                id = id.0,
                "async: remove_handler of an unknown handler (removed twice?)"
            );
            return Err(Status::NoElem.into());
        };
        h.removed.store(true, Ordering::Release);
        let registered = match h.kind {
            Kind::Fd { .. } => self.inner.reactor.remove_fd(h.id),
            Kind::Timer => self.inner.reactor.remove_timer(h.id),
        };
        drop(registered);
        if sync {
            h.wait_idle();
        }
        crate::debug!(id = id.0, "async: handler removed");
        Ok(())
    }

    fn register(&self, kind: Kind, cb: HandlerFn) -> Arc<Handler> {
        let id = NEXT_HANDLER_ID.fetch_add(1, Ordering::Relaxed);
        let h = Arc::new(Handler::new(id, kind, self.inner.sink.clone(), cb));
        // In the map before the reactor sees it, so that the handler can remove itself.
        self.handlers().insert(id, h.clone());
        h
    }

    fn lookup(&self, id: HandlerId) -> Result<Arc<Handler>> {
        self.handlers()
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Error::new(Status::NoElem, format!("async: unknown handler id {}", id.0)))
    }

    fn handlers(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handler>>> {
        self.inner.handlers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Unregister first, so the reactor stops delivering into our sink, then break the
        // handler <-> sink reference cycle by draining the queue. `thread` drops after this.
        let handlers: Vec<_> = self
            .handlers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, h)| h)
            .collect();
        let mut unregistered = Vec::with_capacity(handlers.len());
        for h in &handlers {
            h.removed.store(true, Ordering::Release);
            unregistered.push(match h.kind {
                Kind::Fd { .. } => self.reactor.remove_fd(h.id),
                Kind::Timer => self.reactor.remove_timer(h.id),
            });
        }
        while self.sink.pop().is_some() {}
        drop(unregistered);
        drop(handlers);
        crate::debug!(mode = ?self.mode, "async: context destroyed");
    }
}

impl std::os::fd::AsFd for AsyncContext {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.event_fd()
    }
}

impl fmt::Debug for AsyncContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncContext")
            .field("mode", &self.inner.mode)
            .field("event_fd", &self.inner.sink.fd())
            .field("queued_events", &self.queued_events())
            .finish()
    }
}
