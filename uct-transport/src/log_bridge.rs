//! Routes a plugin's `tracing` events to the host application (see `export::plugin_init`).

use tracing::level_filters::LevelFilter;
use tracing::Level;

/// Level numbers used at the boundary: 1 error .. 5 trace, 0 off.
pub(crate) fn level_to_u8(l: Level) -> u8 {
    match l {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

fn filter_from_u8(v: u8) -> LevelFilter {
    match v {
        0 => LevelFilter::OFF,
        1 => LevelFilter::ERROR,
        2 => LevelFilter::WARN,
        3 => LevelFilter::INFO,
        4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

static SINK: std::sync::OnceLock<fn(u8, &str, &str)> = std::sync::OnceLock::new();

fn forward(level: Level, target: &str, msg: &str) {
    if let Some(s) = SINK.get() {
        s(level_to_u8(level), target, msg);
    }
}

/// Installs a subscriber in this (plugin) copy of `tracing` that forwards to `sink`.
pub(crate) fn install_forwarding(sink: fn(u8, &str, &str), level: u8) {
    if SINK.set(sink).is_ok() {
        ucs::log::init_forwarding(forward, filter_from_u8(level));
    }
}
