//! Logging. rucx logs through `tracing`, with its own macros ([`crate::error!`],
//! [`crate::warn!`], [`crate::info!`], [`crate::debug!`], [`crate::trace!`]; `tracing`'s syntax)
//! so that nobody has to set logging up: when the application has a `tracing` subscriber
//! (installed before or after rucx's first event, global or for the thread), rucx's events go
//! there; when it has none, rucx writes them to stderr itself, at `RUCX_LOG_LEVEL` (default
//! `warn`). rucx never installs a global subscriber, so an application's own always wins.
//! Plugins, which carry their own copy of `tracing`, call [`init_forwarding`] with a sink from
//! the host (e.g. [`emit`]) so their events reach the host's subscriber (or its stderr).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::config::LOG_LEVELS;

pub mod limit;
#[doc(hidden)]
pub mod route;

/// Function receiving forwarded events: level, target (module path) and formatted message.
pub type LogSink = fn(Level, &str, &str);

/// Parses `error|warn|info|debug|trace|off` (any case).
pub fn parse_level(s: &str) -> Option<LevelFilter> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Some(LevelFilter::OFF);
    }
    crate::config::parse_enum(s, LOG_LEVELS).map(|i| level_filter_from_index(i as u8))
}

/// `0..=4` = error, warn, info, debug, trace (the order of [`LOG_LEVELS`]); for C-ABI use.
#[inline]
pub fn level_to_index(level: Level) -> u8 {
    match level {
        Level::ERROR => 0,
        Level::WARN => 1,
        Level::INFO => 2,
        Level::DEBUG => 3,
        Level::TRACE => 4,
    }
}

/// Inverse of [`level_to_index`]; out-of-range values give `None`.
pub fn level_from_index(index: u8) -> Option<Level> {
    [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE]
        .get(index as usize)
        .copied()
}

fn level_filter_from_index(index: u8) -> LevelFilter {
    level_from_index(index).map_or(LevelFilter::OFF, LevelFilter::from_level)
}

/// Reads `RUCX_LOG_LEVEL` now (reporting a bad value) and returns the effective maximum level.
/// Optional: rucx's events reach stderr without it; it installs no subscriber, so the
/// application can still install its own, before or after.
pub fn init() -> LevelFilter {
    route::stderr_level();
    max_level()
}

/// The highest level rucx's events are currently wanted at: the application's subscribers'
/// when it has one, else `RUCX_LOG_LEVEL` (use it to skip costly formatting).
pub fn max_level() -> LevelFilter {
    if route::app_has_subscriber() {
        LevelFilter::current()
    } else {
        route::stderr_level()
    }
}

/// Installs a global [`ForwardingSubscriber`]; false if a global subscriber already exists.
pub fn init_forwarding(sink: LogSink, level: LevelFilter) -> bool {
    tracing::subscriber::set_global_default(ForwardingSubscriber::new(sink, level)).is_ok()
}

/// Emits a forwarded event as one of rucx's own (to the application's subscriber, or stderr),
/// with the origin as field `origin` (tracing targets must be static). Use it as the host side
/// of [`init_forwarding`].
pub fn emit(level: Level, target: &str, message: &str) {
    match level {
        Level::ERROR => crate::error!(origin = target, "{message}"),
        Level::WARN => crate::warn!(origin = target, "{message}"),
        Level::INFO => crate::info!(origin = target, "{message}"),
        Level::DEBUG => crate::debug!(origin = target, "{message}"),
        Level::TRACE => crate::trace!(origin = target, "{message}"),
    }
}

/// A subscriber that formats each enabled event as `message key=value...` and hands it to a
/// sink. Spans are accepted and ignored.
pub struct ForwardingSubscriber {
    sink: LogSink,
    level: LevelFilter,
    next_span: AtomicU64,
}

impl ForwardingSubscriber {
    /// A subscriber handing `sink` every event at `level` or more severe.
    pub fn new(sink: LogSink, level: LevelFilter) -> ForwardingSubscriber {
        ForwardingSubscriber {
            sink,
            level,
            next_span: AtomicU64::new(1),
        }
    }
}

/// Collects an event's fields: the message first, then `key=value` pairs.
struct MessageVisitor {
    message: String,
    fields: String,
}

impl Visit for MessageVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={:?}", field.name(), value);
        }
    }
}

impl Subscriber for ForwardingSubscriber {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.level
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.level)
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut v = MessageVisitor {
            message: String::new(),
            fields: String::new(),
        };
        event.record(&mut v);
        v.message.push_str(&v.fields);
        (self.sink)(*meta.level(), meta.target(), &v.message);
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<(Level, String, String)>> = Mutex::new(Vec::new());

    fn record(level: Level, target: &str, msg: &str) {
        SEEN.lock()
            .unwrap()
            .push((level, target.to_string(), msg.to_string()));
    }

    fn seen_with(marker: &str) -> Vec<(Level, String, String)> {
        SEEN.lock()
            .unwrap()
            .iter()
            .filter(|e| e.2.contains(marker))
            .cloned()
            .collect()
    }

    #[test]
    fn levels() {
        assert_eq!(parse_level("warn"), Some(LevelFilter::WARN));
        assert_eq!(parse_level("TRACE"), Some(LevelFilter::TRACE));
        assert_eq!(parse_level("off"), Some(LevelFilter::OFF));
        assert_eq!(parse_level("loud"), None);
        for i in 0..5 {
            assert_eq!(level_to_index(level_from_index(i).unwrap()), i);
        }
        assert_eq!(level_from_index(5), None);
    }

    #[test]
    fn forwarding_formats_and_filters() {
        let sub = ForwardingSubscriber::new(record, LevelFilter::INFO);
        tracing::subscriber::with_default(sub, || {
            tracing::info!(peer = 7, "fwd-marker-1 hello {}", "world");
            tracing::debug!("fwd-marker-1 filtered out");
            let span = tracing::info_span!("s");
            let _g = span.enter();
            tracing::error!(target: "plugin::x", "fwd-marker-1 bad");
        });
        let got = seen_with("fwd-marker-1");
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, Level::INFO);
        assert_eq!(got[0].1, module_path!());
        assert_eq!(got[0].2, "fwd-marker-1 hello world peer=7");
        assert_eq!((got[1].0, got[1].1.as_str()), (Level::ERROR, "plugin::x"));
    }

    #[test]
    fn emit_reaches_current_subscriber() {
        let sub = ForwardingSubscriber::new(record, LevelFilter::TRACE);
        tracing::subscriber::with_default(sub, || {
            emit(Level::WARN, "libuct_fake", "fwd-marker-2 from plugin");
        });
        let got = seen_with("fwd-marker-2");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, Level::WARN);
        assert_eq!(got[0].2, "fwd-marker-2 from plugin origin=libuct_fake");
    }

    #[test]
    fn init_keeps_application_subscriber() {
        // The "application" installs its subscriber first; rucx's events go there.
        let _ = init_forwarding(record, LevelFilter::WARN);
        let first = init();
        assert_eq!(init(), first, "idempotent");
        std::thread::spawn(|| crate::warn!("fwd-marker-3 global"))
            .join()
            .unwrap();
        assert_eq!(seen_with("fwd-marker-3").len(), 1);
        assert!(max_level() >= LevelFilter::WARN);
    }
}
