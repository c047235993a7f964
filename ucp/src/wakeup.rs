//! Sleeping until a worker has work (UCX's `ucp_worker_get_efd`, `ucp_worker_arm`,
//! `ucp_worker_wait`, `ucp_worker_signal`).
//!
//! With [`Features::WAKEUP`](crate::Features::WAKEUP) a worker keeps an epoll set holding
//! every interface's event fd, its uct worker's async-context fd and an eventfd of its own
//! ([`WorkerWaker`]). That one fd ([`Worker::event_fd`]) is readable when an armed interface
//! event fired, an async event is queued, or someone called [`WorkerWaker::wake`].
//!
//! [`Worker::arm`] answers `Busy` whenever `progress` has work that no fd would announce: the
//! worker was woken, an interface has events or completions already, the async context has
//! queued events, the transports deferred callbacks, or an endpoint has queued sends or wireup
//! messages that can go now. Fragments being reassembled need nothing: the last one completes
//! the message inside its handler, and the ones still to come arrive as interface events.
//! So `loop { while w.progress() > 0 {} ; if w.arm() is Ok { sleep on event_fd } }` loses
//! nothing: what arrives after `arm` makes the fd readable, what came before makes `arm` Busy.
//!
//! Nothing here runs in `progress` or in a send: the cost is all in `arm`.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use ucs::{Error, Result, Status};
use uct::{ArmEvents, AsyncMode, DeviceType, EventFlags, FlushFlags, Iface, IfaceFlags, Outcome};

use crate::worker::{WIface, Worker, WorkerInner};

/// The worker's wakeup fd and what feeds it.
pub(crate) struct Wakeup {
    epoll: Epoll,
    signal: Arc<EventFd>,
    /// A poll-mode async context with handlers was reported once.
    warned_poll: std::cell::Cell<bool>,
}

/// What an interface is armed for: sends completing (requests, resources for queued sends)
/// and receives.
pub(crate) fn arm_events(iface: &Iface) -> ArmEvents {
    let f = iface.attr().event_flags;
    let mut ev = ArmEvents::EMPTY;
    if f.contains(EventFlags::SEND_COMP) {
        ev |= ArmEvents::SEND_COMP;
    }
    if f.contains(EventFlags::RECV) {
        ev |= ArmEvents::RECV;
    } else if f.contains(EventFlags::RECV_SIG) {
        ev |= ArmEvents::RECV_SIG;
    }
    ev
}

/// Whether a worker that wants wakeup can use `iface`: it has an event fd and events to arm, or it is a self
/// interface. Self needs none: it reaches only its own worker (see `worker::reachable`) and
/// delivers inside the sender's call, on the worker's thread, so it never holds an event that
/// `arm` could miss.
pub(crate) fn usable(iface: &Iface, dev_type: DeviceType) -> bool {
    dev_type == DeviceType::SelfDev
        || (iface.attr().event_flags.contains(EventFlags::FD) && !arm_events(iface).is_empty())
}

/// Whether a worker with wakeup keeps an interface that has no event fd: only one without
/// active messages of its own whose puts, gets or atomics complete without the peer's
/// software (cma: the kernel copies). Nothing arrives on it that the worker must be woken
/// for, and the peer needs no progress for it either: its rendezvous announcements and
/// acknowledgements travel on the AM lane, which has an event fd. (A transport with AM may
/// serve RMA by its own messages, which a sleeping peer would never answer.)
pub(crate) fn serves_without_fd(flags: IfaceFlags) -> bool {
    let am = IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY | IfaceFlags::AM_ZCOPY;
    let rma = IfaceFlags::PUT_SHORT
        | IfaceFlags::PUT_BCOPY
        | IfaceFlags::PUT_ZCOPY
        | IfaceFlags::GET_SHORT
        | IfaceFlags::GET_BCOPY
        | IfaceFlags::GET_ZCOPY
        | IfaceFlags::ATOMIC_CPU
        | IfaceFlags::ATOMIC_DEVICE;
    !flags.intersects(am) && flags.intersects(rma)
}

fn os_err(what: &str, e: Errno) -> Error {
    Error::new(Status::IoError, format!("ucp: wakeup: {what}: {e}"))
}

impl Wakeup {
    /// The epoll set over `ifaces`' event fds (those that have one), the async context's fd
    /// and the wakeup eventfd.
    pub fn new(uct: &uct::Worker, ifaces: &[WIface]) -> Result<Wakeup> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| os_err("epoll_create", e))?;
        let signal = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| os_err("eventfd", e))?;
        let add = |fd: BorrowedFd<'_>, what: &str| {
            epoll
                .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, 0))
                .map_err(|e| os_err(&format!("adding {what} to the epoll set"), e))
        };
        add(signal.as_fd(), "the wakeup eventfd")?;
        add(uct.async_context().event_fd(), "the async context's fd")?;
        for w in ifaces.iter().filter(|w| !w.arm_events.is_empty()) {
            let fd = w.iface.event_fd().map_err(|e| {
                e.context_with(format_args!(
                    "ucp: {}/{} event fd",
                    w.info.tl_name, w.info.dev_name
                ))
            })?;
            add(fd, &format!("{}/{}'s event fd", w.info.tl_name, w.info.dev_name))?;
        }
        Ok(Wakeup {
            epoll,
            signal: Arc::new(signal),
            warned_poll: std::cell::Cell::new(false),
        })
    }

    /// True (and cleared) when the worker was woken since the last call.
    fn take_signal(&self) -> bool {
        matches!(self.signal.read(), Ok(n) if n > 0)
    }
}

/// Wakes a worker sleeping in [`Worker::wait`] or in `poll` on its [`Worker::event_fd`], from
/// any thread (UCX's `ucp_worker_signal`). A wake that comes before the worker armed makes its
/// next [`Worker::arm`] return `Busy`, so it is never lost. Cheap to clone.
#[derive(Clone)]
pub struct WorkerWaker {
    signal: Arc<EventFd>,
}

impl WorkerWaker {
    /// Makes the worker's event fd readable until its next [`Worker::arm`].
    pub fn wake(&self) {
        // EAGAIN: the counter is full, so the fd is readable anyway.
        let _ = self.signal.write(1);
    }
}

impl std::fmt::Debug for WorkerWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerWaker")
    }
}

fn busy() -> Error {
    Status::Busy.into()
}

impl WorkerInner {
    fn wakeup(&self, what: &str) -> Result<&Wakeup> {
        self.wakeup.as_ref().ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                format!(
                    "ucp: Worker::{what} needs Features::WAKEUP: build the context with \
                     ContextBuilder::features(Features::AM | Features::WAKEUP)"
                ),
            )
        })
    }

    /// Work `progress` would do that no fd announces: endpoint failures to report, queued
    /// sends and wireup messages that can go now, and callbacks the transports deferred.
    fn has_unannounced_work(&self) -> bool {
        // Failed endpoints are acted on by the next progress (error handlers, requests).
        if self.has_failed.get() || self.keepalive.is_due() || self.uct.has_oneshots() {
            return true;
        }
        // Borrowed: `arm` was called from inside progress (a handler); progress must finish.
        let Ok(eps) = self.eps.try_borrow() else {
            return true;
        };
        let ready = eps.live().any(|ep| ep.can_progress_sends());
        ready
    }
}

impl Worker {
    /// The fd to sleep on (`poll`/`epoll`, or an async runtime's reactor): readable when the
    /// worker has events for `progress`, once [`Worker::arm`] returned `Ok`. Owned by the
    /// worker. `Unsupported` without [`Features::WAKEUP`](crate::Features::WAKEUP).
    pub fn event_fd(&self) -> Result<BorrowedFd<'_>> {
        Ok(self.inner.wakeup("event_fd")?.epoll.0.as_fd())
    }

    /// Prepares [`Worker::event_fd`] for sleeping: `Ok` when nothing is pending, so that any
    /// later event makes the fd readable; `Err(Busy)` when the worker has work already (call
    /// `progress` instead of sleeping, then arm again). `Unsupported` without
    /// [`Features::WAKEUP`](crate::Features::WAKEUP).
    pub fn arm(&self) -> Result<()> {
        let inner = &*self.inner;
        let wk = inner.wakeup("arm")?;
        if wk.take_signal() {
            return Err(busy());
        }
        let actx = inner.uct.async_context();
        if actx.mode() == AsyncMode::Poll && actx.num_handlers() > 0 {
            // Only progress polls such a context: its fds and timers raise nothing to sleep on.
            if !wk.warned_poll.replace(true) {
                ucs::warn!(
                    "ucp: the worker's async context is in poll mode and has handlers, whose \
                     events only progress finds: arm answers Busy (no sleeping); create the \
                     worker with Worker::new (thread mode) to sleep"
                );
            }
            return Err(busy());
        }
        actx.arm()?;
        for w in inner.ifaces.iter().filter(|w| w.arm_events != ArmEvents::EMPTY) {
            w.iface.event_arm(w.arm_events)?;
        }
        // No fd announces the completions of an interface without one: while it has
        // operations outstanding, progress must poll it.
        for w in inner.ifaces.iter().filter(|w| w.no_fd) {
            if !matches!(w.iface.flush(FlushFlags::LOCAL, None), Ok(Outcome::Done)) {
                return Err(busy());
            }
        }
        // Last: arming may complete sends, whose callbacks may queue more.
        if inner.has_unannounced_work() {
            return Err(busy());
        }
        Ok(())
    }

    /// Sleeps until the worker has something for `progress` (UCX's `ucp_worker_wait`): arms it
    /// and waits for [`Worker::event_fd`]; returns at once when `arm` says `Busy`. Call
    /// `progress` afterwards. A [`WorkerWaker`] ends the wait from another thread.
    pub fn wait(&self) -> Result<()> {
        match self.arm() {
            Ok(()) => {}
            Err(e) if e == Status::Busy => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut fds = [PollFd::new(self.event_fd()?, PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => Ok(()),
            Err(e) => Err(os_err("poll", e)),
        }
    }

    /// Makes the next [`Worker::arm`] return `Busy` and the event fd readable (UCX's
    /// `ucp_worker_signal`), from the worker's own thread, e.g. a callback that queued work
    /// for the loop; other threads use a [`Worker::waker`]. `Unsupported` without
    /// [`Features::WAKEUP`](crate::Features::WAKEUP).
    pub fn signal(&self) -> Result<()> {
        let _ = self.inner.wakeup("signal")?.signal.write(1);
        Ok(())
    }

    /// A handle that wakes this worker from any thread. `Unsupported` without
    /// [`Features::WAKEUP`](crate::Features::WAKEUP).
    pub fn waker(&self) -> Result<WorkerWaker> {
        Ok(WorkerWaker {
            signal: self.inner.wakeup("waker")?.signal.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rma_only_interfaces_serve_without_an_fd() {
        let cma = IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY | IfaceFlags::CONNECT_TO_IFACE;
        assert!(serves_without_fd(cma));
        // AM of its own (libfabric's shm): its RMA may need the peer's progress.
        assert!(!serves_without_fd(cma | IfaceFlags::AM_BCOPY));
        assert!(!serves_without_fd(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY));
        assert!(!serves_without_fd(IfaceFlags::CONNECT_TO_IFACE));
        assert!(serves_without_fd(IfaceFlags::ATOMIC_CPU));
    }
}
