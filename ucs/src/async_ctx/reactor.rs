//! Event source of the async context: one epoll set for fd handlers plus a timer queue.
//!
//! A reactor only *delivers* events (see [`Handler::deliver`]); it never runs handlers. The global
//! async thread owns one reactor shared by all thread-mode contexts; each poll-mode context owns its
//! own and polls it from `dispatch`.
//!
//! Fds are registered with `EPOLLONESHOT`: once reported, an fd stays disarmed until its handler has
//! run on the owner thread and [`Reactor::rearm`] re-enables it, so a level-triggered fd is neither
//! lost nor reported again and again while the owner is slow.
//!
//! Deliveries happen under the `fds` / `timers` locks, so once a handler is removed from them no
//! delivery of it is in flight. Handlers removed from the maps are returned to the caller, to be
//! dropped (running the user closure's destructor) outside the locks.
#![allow(unsafe_code)] // BorrowedFd::borrow_raw for fds given to us as RawFd

use super::events::Events;
use super::handler::{errno_status, Handler, Kind, TIMER_BIT};
use super::timerq::TimerQueue;
use crate::{Error, Result, Status};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::collections::HashMap;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// epoll data of the wake-up eventfd; handler ids start at 1.
const WAKE_ID: u64 = 0;
/// Events fetched per `epoll_wait` (UCX uses 16 as well).
const MAX_EVENTS: usize = 16;

pub(super) struct Reactor {
    epoll: Epoll,
    fds: Mutex<HashMap<u64, Arc<Handler>>>,
    timers: Mutex<TimerQueue>,
    nfds: AtomicUsize,
    ntimers: AtomicUsize,
    /// Wakes a thread blocked in `poll` (thread mode only).
    wake: Option<EventFd>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No user code runs under these locks, so a poisoned one still holds consistent data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn borrow_fd<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: the borrow only lives for one epoll_ctl call. The caller promised (API docs of
    // add_fd_handler) to keep the fd open while its handler is registered; if it did not, the
    // kernel answers EBADF/ENOENT, which we report, and no memory is touched through the fd.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

fn interest(h: &Handler) -> EpollEvent {
    let ev = h.fd_events();
    let mut flags = EpollFlags::EPOLLONESHOT;
    if ev.contains(Events::READ) {
        flags |= EpollFlags::EPOLLIN;
    }
    if ev.contains(Events::WRITE) {
        flags |= EpollFlags::EPOLLOUT;
    }
    EpollEvent::new(flags, h.id)
}

fn reported(flags: EpollFlags) -> Events {
    let mut ev = Events::NONE;
    if flags.contains(EpollFlags::EPOLLIN) {
        ev |= Events::READ;
    }
    if flags.contains(EpollFlags::EPOLLOUT) {
        ev |= Events::WRITE;
    }
    if flags.intersects(EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
        ev |= Events::ERR;
    }
    ev
}

fn fd_of(h: &Handler) -> RawFd {
    match h.kind {
        Kind::Fd { fd, .. } => fd,
        Kind::Timer => -1,
    }
}

impl Reactor {
    pub fn new(with_wake: bool) -> Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| {
            crate::error!("async: epoll_create failed: {e}; raise the open-files limit (ulimit -n)");
            Error::from(errno_status(e))
        })?;
        let wake = if with_wake {
            let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .and_then(|efd| {
                    epoll.add(&efd, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_ID))?;
                    Ok(efd)
                })
                .map_err(|e| {
                    crate::error!("async: wake-up eventfd setup failed: {e}");
                    errno_status(e)
                })?;
            Some(efd)
        } else {
            None
        };
        Ok(Self {
            epoll,
            fds: Mutex::default(),
            timers: Mutex::default(),
            nfds: AtomicUsize::new(0),
            ntimers: AtomicUsize::new(0),
            wake,
        })
    }

    /// Whether any fd or timer is registered (poll mode skips the system call otherwise).
    #[inline]
    pub fn has_handlers(&self) -> bool {
        self.nfds.load(Ordering::Relaxed) != 0 || self.ntimers.load(Ordering::Relaxed) != 0
    }

    pub fn add_fd(&self, h: &Arc<Handler>) -> Result<()> {
        let fd = fd_of(h);
        let mut fds = lock(&self.fds);
        self.epoll.add(borrow_fd(fd), interest(h)).map_err(|e| {
            match e {
                Errno::EEXIST => crate::warn!(
                    fd,
                    "async: fd already has a handler (one handler per fd in the process for thread \
                     mode); remove it first or use modify_fd_handler"
                ),
                _ => crate::warn!(fd, "async: cannot watch fd: {e}; pass an open, pollable fd"),
            }
            errno_status(e)
        })?;
        fds.insert(h.id, h.clone());
        self.nfds.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Applies a new interest set and re-arms the fd.
    pub fn modify_fd(&self, h: &Handler) -> Result<()> {
        let fd = fd_of(h);
        // Under the lock, so a concurrent remove + re-add of the same fd cannot be overwritten
        // with our (stale) handler id.
        let fds = lock(&self.fds);
        if !fds.contains_key(&h.id) {
            return Err(Status::NoElem.into());
        }
        self.epoll.modify(borrow_fd(fd), &mut interest(h)).map_err(|e| {
            Error::new(
                errno_status(e),
                format!(
                    "async: cannot modify the handler of fd {fd}: {e}; was the fd closed before removal?"
                ),
            )
        })
    }

    /// Re-enables a one-shot fd after its handler ran (unless it was removed meanwhile).
    pub fn rearm(&self, h: &Handler) {
        let fds = lock(&self.fds);
        if !fds.contains_key(&h.id) {
            return;
        }
        if let Err(e) = self.epoll.modify(borrow_fd(fd_of(h)), &mut interest(h)) {
            crate::warn!(
                fd = fd_of(h),
                "async: cannot re-arm fd handler: {e}; close fds only after removing their handler"
            );
        }
    }

    pub fn remove_fd(&self, id: u64) -> Option<Arc<Handler>> {
        let mut fds = lock(&self.fds);
        let h = fds.remove(&id)?;
        self.nfds.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = self.epoll.delete(borrow_fd(fd_of(&h))) {
            // The fd was closed already: the kernel dropped the registration with it.
            crate::debug!(fd = fd_of(&h), "async: epoll delete: {e}");
        }
        drop(fds);
        Some(h)
    }

    pub fn add_timer(&self, h: &Arc<Handler>, interval: Duration) {
        let earliest = lock(&self.timers).add(h.clone(), interval, Instant::now());
        self.ntimers.fetch_add(1, Ordering::Relaxed);
        if earliest {
            self.wake();
        }
    }

    pub fn remove_timer(&self, id: u64) -> Option<Arc<Handler>> {
        let h = lock(&self.timers).remove(id)?;
        self.ntimers.fetch_sub(1, Ordering::Relaxed);
        Some(h)
    }

    /// Interrupts a `poll` blocked in another thread.
    pub fn wake(&self) {
        if let Some(efd) = &self.wake {
            if let Err(e) = efd.write(1) {
                crate::warn!("async: wake-up write failed: {e}");
            }
        }
    }

    /// Waits up to `timeout` for fd readiness and delivers what was reported, then delivers the
    /// timers that are due.
    pub fn poll(&self, timeout: EpollTimeout) {
        let mut events = [EpollEvent::empty(); MAX_EVENTS];
        let n = match self.epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => {
                crate::warn!("async: epoll_wait failed: {e}");
                0
            }
        };
        if n > 0 {
            let fds = lock(&self.fds);
            for ev in &events[..n] {
                if ev.data() == WAKE_ID {
                    if let Some(efd) = &self.wake {
                        let _ = efd.read(); // EAGAIN is fine: another poll drained it
                    }
                } else if let Some(h) = fds.get(&ev.data()) {
                    h.deliver(reported(ev.events()).bits());
                }
            }
        }
        if self.ntimers.load(Ordering::Relaxed) != 0 {
            lock(&self.timers).expire(Instant::now(), |h| h.deliver(TIMER_BIT));
        }
    }

    /// How long a blocking poll may sleep before the next timer is due (`NONE`: no timer).
    pub fn timeout(&self) -> EpollTimeout {
        let Some(deadline) = lock(&self.timers).next_deadline() else {
            return EpollTimeout::NONE;
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        // Round up so we do not wake just before the deadline and spin; cap at ~65 s.
        let ms = wait.as_nanos().div_ceil(1_000_000).min(u128::from(u16::MAX));
        EpollTimeout::from(ms as u16)
    }
}
