//! Where rucx's events go: to the application's `tracing` subscriber when it has one (its global
//! default or this thread's), otherwise straight to stderr at `RUCX_LOG_LEVEL` (default `warn`).
//!
//! rucx never sets the global default: `tracing` allows that once per process, and an
//! application calling `tracing_subscriber::fmt().init()` after rucx had set it would panic.
//! Instead rucx's macros ([`crate::warn!`] and its siblings) check, per enabled event, whether
//! the application has a subscriber, and run the event under a private stderr subscriber
//! (`tracing::dispatcher::with_default`) when it has none. An event below `RUCX_LOG_LEVEL` that
//! the application's subscriber does not want costs two relaxed loads and compares.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use tracing::level_filters::LevelFilter;
use tracing::subscriber::NoSubscriber;
use tracing::{Dispatch, Level};

#[doc(hidden)]
pub use tracing;
#[doc(hidden)]
pub use tracing::Level as __Level;

/// `RUCX_LOG_LEVEL` as a rank (0 off, 1 error .. 5 trace), or [`UNREAD`] until first needed
/// (which lets every level through to the slow path, where it is read).
static STDERR_RANK: AtomicU8 = AtomicU8::new(UNREAD);
const UNREAD: u8 = u8::MAX;

/// [`super::level_to_index`] shifted by one, so that 0 is "off".
#[inline(always)]
fn rank(level: Level) -> u8 {
    super::level_to_index(level) + 1
}

fn filter_from_rank(rank: u8) -> LevelFilter {
    match rank.checked_sub(1) {
        None => LevelFilter::OFF,
        Some(i) => super::level_from_index(i.min(4)).map_or(LevelFilter::TRACE, LevelFilter::from_level),
    }
}

/// Runs `event` (one `tracing` macro invocation) under the stderr subscriber when the
/// application has none and `level` is within `RUCX_LOG_LEVEL`, else as it is.
#[doc(hidden)]
#[inline(always)]
pub fn route(level: Level, event: impl FnOnce()) {
    if rank(level) <= STDERR_RANK.load(Ordering::Relaxed) && to_stderr(level) {
        tracing::dispatcher::with_default(stderr_dispatch(), event)
    } else {
        event()
    }
}

#[inline(never)]
fn to_stderr(level: Level) -> bool {
    rank(level) <= stderr_rank() && !app_has_subscriber()
}

/// Whether the application installed a subscriber visible here (global or this thread's).
pub(super) fn app_has_subscriber() -> bool {
    tracing::dispatcher::get_default(|d| !d.is::<NoSubscriber>())
}

/// `RUCX_LOG_LEVEL` as a rank, read on first use; a bad value is reported once (at error).
fn stderr_rank() -> u8 {
    let r = STDERR_RANK.load(Ordering::Relaxed);
    if r != UNREAD {
        return r;
    }
    let (r, bad) = match crate::config::GLOBAL_TABLE.read("LOG_LEVEL") {
        Ok(crate::config::ConfigValue::Enum(i)) => (i as u8 + 1, None),
        Ok(_) => (rank(Level::WARN), None),
        Err(e) => (rank(Level::WARN), Some(e)),
    };
    match STDERR_RANK.compare_exchange(UNREAD, r, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => {
            if let Some(e) = bad {
                crate::error!("{e}; using warn");
            }
            r
        }
        Err(now) => now,
    }
}

/// The level rucx writes to stderr at when the application has no subscriber.
pub(super) fn stderr_level() -> LevelFilter {
    filter_from_rank(stderr_rank())
}

fn stderr_dispatch() -> &'static Dispatch {
    static STDERR: OnceLock<Dispatch> = OnceLock::new();
    STDERR.get_or_init(|| {
        let sub = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_max_level(stderr_level())
            .finish();
        Dispatch::new(sub)
    })
}

/// Logs at error level, like `tracing::error!` (same syntax), reaching stderr when the
/// application has no subscriber (see [`crate::log`]).
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => {
        $crate::log::route::route($crate::log::route::__Level::ERROR, || {
            $crate::log::route::tracing::error!($($arg)+)
        })
    };
}

/// Logs at warn level, like `tracing::warn!` (same syntax), reaching stderr when the
/// application has no subscriber (see [`crate::log`]).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => {
        $crate::log::route::route($crate::log::route::__Level::WARN, || {
            $crate::log::route::tracing::warn!($($arg)+)
        })
    };
}

/// Logs at info level, like `tracing::info!` (same syntax), reaching stderr when the
/// application has no subscriber and `RUCX_LOG_LEVEL` is info or above (see [`crate::log`]).
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => {
        $crate::log::route::route($crate::log::route::__Level::INFO, || {
            $crate::log::route::tracing::info!($($arg)+)
        })
    };
}

/// Logs at debug level, like `tracing::debug!` (same syntax), reaching stderr when the
/// application has no subscriber and `RUCX_LOG_LEVEL` is debug or above (see [`crate::log`]).
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => {
        $crate::log::route::route($crate::log::route::__Level::DEBUG, || {
            $crate::log::route::tracing::debug!($($arg)+)
        })
    };
}

/// Logs at trace level, like `tracing::trace!` (same syntax), reaching stderr when the
/// application has no subscriber and `RUCX_LOG_LEVEL` is trace (see [`crate::log`]).
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => {
        $crate::log::route::route($crate::log::route::__Level::TRACE, || {
            $crate::log::route::tracing::trace!($($arg)+)
        })
    };
}
