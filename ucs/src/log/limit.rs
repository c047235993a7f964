//! Rate-limited log lines: what a peer can trigger (garbage frames, refused remote accesses)
//! must not turn every message into a line. [`crate::warn_limited!`] and
//! [`crate::error_limited!`] let one event per call site through every `RUCX_LOG_RATE_LIMIT`
//! (1 s by default; 0 lets every event through); the next line let through says how many were
//! suppressed since the last one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// One call site's limiter (a `static` the macros declare).
pub struct RateLimit {
    /// Nanoseconds (since the first limited event of the process) before which events are
    /// suppressed.
    next_ns: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    /// A limiter that lets its first event through.
    pub const fn new() -> RateLimit {
        RateLimit {
            next_ns: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when an event may be logged now (`n` events were suppressed since the last
    /// one let through); `None` when it is suppressed (and counted).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(now_ns(), interval_ns())
    }

    fn admit_at(&self, now: u64, interval: u64) -> Option<u64> {
        if interval == 0 {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        let next = self.next_ns.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_ns
                .compare_exchange(
                    next,
                    now.saturating_add(interval),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit::new()
    }
}

fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now)
        .elapsed()
        .as_nanos()
        .min(u64::MAX as u128) as u64
}

/// `RUCX_LOG_RATE_LIMIT` in nanoseconds, read once (a bad value is reported, and 1 s used).
fn interval_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        let default = std::time::Duration::from_secs(1);
        let d = match crate::config::GLOBAL_TABLE.read("LOG_RATE_LIMIT") {
            Ok(crate::config::ConfigValue::Time(t)) => t.duration_or(default),
            Ok(_) => default,
            Err(e) => {
                crate::error!("{e}; using 1s");
                default
            }
        };
        d.as_nanos().min(u64::MAX as u128) as u64
    })
}

/// [`crate::warn!`] at most once per `RUCX_LOG_RATE_LIMIT` from this call site; the next line
/// let through counts the suppressed ones. For what a peer or the network can trigger.
///
/// ```
/// for _ in 0..1000 {
///     ucs::warn_limited!("garbage frame from {}: dropped", "192.0.2.7:4000");
/// }
/// // One line on stderr (the others within the second are counted, not printed).
/// ```
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => { $crate::__log_limited!(warn, $($arg)+) };
}

/// [`crate::error!`] at most once per `RUCX_LOG_RATE_LIMIT` from this call site (see
/// [`crate::warn_limited!`]).
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)+) => { $crate::__log_limited!(error, $($arg)+) };
}

/// The body of [`crate::warn_limited!`] and [`crate::error_limited!`]: a limiter per call site.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMIT: $crate::log::limit::RateLimit = $crate::log::limit::RateLimit::new();
        if let ::std::option::Option::Some(n) = LIMIT.admit() {
            if n == 0 {
                $crate::$level!($($arg)+);
            } else {
                $crate::$level!("{} ({n} similar lines suppressed)", ::std::format_args!($($arg)+));
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_interval_and_the_count_of_the_others() {
        let l = RateLimit::new();
        assert_eq!(l.admit_at(5, 100), Some(0));
        for t in [6, 50, 104] {
            assert_eq!(l.admit_at(t, 100), None);
        }
        assert_eq!(l.admit_at(105, 100), Some(3));
        assert_eq!(l.admit_at(106, 100), None);
        assert_eq!(l.admit_at(1000, 100), Some(1));
    }

    #[test]
    fn no_interval_lets_everything_through() {
        let l = RateLimit::new();
        for t in 0..10 {
            assert_eq!(l.admit_at(t, 0), Some(0));
        }
    }
}
