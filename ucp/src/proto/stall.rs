//! A stall timer: while something a peer started may stop progressing (a message under
//! reassembly, a rendezvous receive waiting for data), a timer on the worker's async context
//! ticks every half timeout and progress looks at one flag; no clock is read per message.
//! An entry that saw no progress during two full ticks is stalled: caught after between one
//! and one and a half timeouts.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Ticks without progress after which an entry is stalled (see the module's text).
pub(crate) const STALL_TICKS: u32 = 3;

pub(crate) struct StallTimer {
    /// `None`: never (the variable was `inf`).
    pub timeout: Option<Duration>,
    /// What the timer guards, for its log line.
    what: &'static str,
    due: Arc<AtomicBool>,
    timer: Cell<Option<ucs::async_ctx::HandlerId>>,
    tick: Cell<u32>,
}

impl StallTimer {
    pub fn new(timeout: Option<Duration>, what: &'static str) -> StallTimer {
        StallTimer {
            timeout,
            what,
            due: Arc::default(),
            timer: Cell::new(None),
            tick: Cell::new(0),
        }
    }

    /// True when a tick is due (the fast path: one load).
    #[inline]
    pub fn is_due(&self) -> bool {
        self.due.load(Ordering::Relaxed)
    }

    /// Takes a due tick: the new tick count.
    pub fn take_due(&self) -> u32 {
        self.due.store(false, Ordering::Relaxed);
        self.tick.set(self.tick.get().wrapping_add(1));
        self.tick.get()
    }

    /// The current tick (stamped on an entry when it progresses).
    pub fn now(&self) -> u32 {
        self.tick.get()
    }

    /// Whether an entry stamped `at` is stalled at tick `now`.
    pub fn stalled(at: u32, now: u32) -> bool {
        now.wrapping_sub(at) >= STALL_TICKS
    }

    /// Starts the timer if a timeout is set and it is not running.
    pub fn arm(&self, uct: &uct::Worker) {
        let Some(timeout) = self.timeout else {
            return;
        };
        if self.timer.get().is_some() {
            return;
        }
        let due = self.due.clone();
        let every = (timeout / 2).max(Duration::from_millis(1));
        match uct
            .async_context()
            .add_timer(every, move || due.store(true, Ordering::Relaxed))
        {
            Ok(id) => self.timer.set(Some(id)),
            Err(e) => ucs::warn!(
                "ucp: {} timer not started: {e}; stalled ones are kept until their peer fails",
                self.what
            ),
        }
    }

    /// Stops the timer (nothing left to guard, or the worker is going).
    pub fn disarm(&self, uct: &uct::Worker) {
        if let Some(id) = self.timer.take() {
            let _ = uct.async_context().remove_handler(id, false);
        }
    }

    /// The timeout in milliseconds, for messages (0 when none).
    pub fn millis(&self) -> u128 {
        self.timeout.map_or(0, |t| t.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_after_three_ticks_across_wrap() {
        assert!(!StallTimer::stalled(5, 7));
        assert!(StallTimer::stalled(5, 8));
        assert!(!StallTimer::stalled(u32::MAX, 1));
        assert!(StallTimer::stalled(u32::MAX, 2));
    }
}
