//! Deadlines of an interface (handshake and connect timeouts, reconnect backoff), on a
//! `timerfd` in the interface's epoll set: they cost nothing while none is due, and an
//! application sleeping on the event fd wakes up for them.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use ucs::{Result, Status};

/// What a deadline is for. Connections are named by their epoll token, endpoints by key; an
/// expired entry whose object is gone (or has moved on) is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// An accepted connection has not sent its CONN_REQ.
    Handshake(u64),
    /// A connection attempt (connect + CONN_ACK) takes too long.
    Attempt(u64),
    /// Reconnect an endpoint after a backoff.
    Retry(u64),
    /// An endpoint waits for its peer to connect to it (connect-to-ep, or the refused side of a
    /// simultaneous connect-to-iface).
    PeerWait(u64),
}

pub struct Timers {
    pub fd: TimerFd,
    list: RefCell<Vec<(Instant, Deadline)>>,
    armed: Cell<Option<Instant>>,
}

impl Timers {
    pub fn new() -> Result<Timers> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(|e| {
            ucs::error!("tcp: timerfd_create failed: {e}");
            Status::IoError
        })?;
        Ok(Timers {
            fd,
            list: RefCell::new(Vec::new()),
            armed: Cell::new(None),
        })
    }

    /// Adds a deadline `after` from now (never, for `Duration::MAX`).
    pub fn add(&self, after: Duration, what: Deadline) {
        let Some(at) = Instant::now().checked_add(after) else {
            return;
        };
        self.list.borrow_mut().push((at, what));
        if self.armed.get().is_none_or(|a| at < a) {
            self.arm(at);
        }
    }

    fn arm(&self, at: Instant) {
        let d = at
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(1));
        match self
            .fd
            .set(Expiration::OneShot(TimeSpec::from(d)), TimerSetTimeFlags::empty())
        {
            Ok(()) => self.armed.set(Some(at)),
            Err(e) => ucs::error!("tcp: timerfd_settime failed: {e}; timeouts may fire late"),
        }
    }

    /// The deadlines that are due (called when the timer fd is readable); re-arms for the next.
    pub fn expired(&self) -> Vec<Deadline> {
        let _ = self.fd.wait(); // consume the expiration (non-blocking)
        self.armed.set(None);
        let now = Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut list = self.list.borrow_mut();
            list.retain(|&(at, w)| {
                if at <= now {
                    due.push(w);
                    false
                } else {
                    true
                }
            });
            if list.len() < list.capacity() / 4 {
                let keep = list.len() * 2;
                list.shrink_to(keep); // a connection burst's deadlines have expired
            }
            list.iter().map(|e| e.0).min()
        };
        if let Some(at) = next {
            self.arm(at);
        }
        due
    }

    /// Number of deadlines waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.list.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_fire_in_time() {
        let t = Timers::new().unwrap();
        t.add(Duration::from_millis(1), Deadline::Retry(1));
        t.add(Duration::from_secs(3600), Deadline::Retry(2));
        t.add(Duration::MAX, Deadline::Retry(3));
        assert_eq!(t.len(), 2);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(t.expired(), vec![Deadline::Retry(1)]);
        assert_eq!(t.len(), 1);
        assert!(t.expired().is_empty());
    }
}
