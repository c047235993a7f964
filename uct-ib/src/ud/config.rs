//! `RUCX_UD_*` variables: the reliability parameters of ud_verbs and its test hooks. The
//! device, queue and path settings come from the shared `RUCX_IB_*` table.

use std::time::Duration;

use ucs::config::{ConfigField, ConfigKind, ConfigReader, ConfigTable, Overrides};
use ucs::{Error, Result, Status};

use super::inject::FaultConfig;
use super::reliability::{RelConfig, MAX_WINDOW_LIMIT, MIN_WINDOW};

/// The ud_verbs configuration.
pub static UD_CONFIG: ConfigTable = ConfigTable {
    name: "ud",
    prefix: "UD_",
    fields: &[
        ConfigField::new(
            "TIMEOUT",
            "30s",
            ConfigKind::Time,
            "A peer that acknowledges nothing for this long is declared dead (EndpointTimeout).",
        ),
        ConfigField::new(
            "TIMER_TICK",
            "10ms",
            ConfigKind::Time,
            "Timer granularity and first resend timeout (checked by progress).",
        ),
        ConfigField::new(
            "TIMER_BACKOFF",
            "2.0",
            ConfigKind::Float,
            "Resend timeout multiplier after a resend without progress (>= 1).",
        ),
        ConfigField::new(
            "MAX_RESEND_TIMEOUT",
            "1s",
            ConfigKind::Time,
            "Upper bound of the resend timeout.",
        ),
        ConfigField::new(
            "MAX_WINDOW",
            "1024",
            ConfigKind::Uint,
            "Largest congestion window: unacknowledged packets per endpoint (2..16384).",
        ),
        ConfigField::new(
            "TX_BUFS",
            "4096",
            ConfigKind::Uint,
            "Send buffers per interface (held until acknowledged; allocated on demand).",
        ),
        ConfigField::new(
            "TEST_LOSS",
            "0",
            ConfigKind::Float,
            "Test hook: percentage of received packets dropped on purpose.",
        ),
        ConfigField::new(
            "TEST_DUP",
            "0",
            ConfigKind::Float,
            "Test hook: percentage of received packets processed twice.",
        ),
        ConfigField::new(
            "TEST_REORDER",
            "0",
            ConfigKind::Float,
            "Test hook: percentage of received packets held back and processed after later ones.",
        ),
        ConfigField::new(
            "TEST_SEED",
            "1",
            ConfigKind::Uint,
            "Test hook: seed of the fault injection.",
        ),
    ],
};

/// Validated values of [`UD_CONFIG`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UdConfig {
    pub rel: RelConfig,
    pub timer_tick: Duration,
    pub tx_bufs: usize,
    pub faults: FaultConfig,
}

/// An invalid variable: logged for the operator, and returned to the caller as the context.
#[cold]
fn bad(var: &str, why: &str) -> Error {
    let msg = format!("RUCX_UD_{var}: {why}");
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

fn time(t: ConfigReader<'_>, var: &str, min: Duration) -> Result<Duration> {
    let d = t.get_time(var)?.duration_or(min);
    if d < min {
        return Err(bad(var, &format!("{d:?} is too short; use at least {min:?}")));
    }
    Ok(d)
}

fn percent(t: ConfigReader<'_>, var: &str) -> Result<f64> {
    let v = t.get_f64(var)?;
    if !(0.0..=100.0).contains(&v) {
        return Err(bad(var, &format!("{v}; use a percentage between 0 and 100")));
    }
    Ok(v / 100.0)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl UdConfig {
    /// Reads and checks every variable; an invalid one gives `InvalidParam` saying which and why,
    /// and one log line.
    pub fn read() -> Result<UdConfig> {
        Self::read_with(&Overrides::new())
    }

    /// [`UdConfig::read`] with `code` (set in code) on top of the environment.
    pub fn read_with(code: &Overrides) -> Result<UdConfig> {
        let t = UD_CONFIG.with(code);
        let timeout = time(t, "TIMEOUT", Duration::from_millis(1))?;
        let tick = time(t, "TIMER_TICK", Duration::from_micros(100))?;
        let max_rto = time(t, "MAX_RESEND_TIMEOUT", tick)?;
        let backoff = t.get_f64("TIMER_BACKOFF")?;
        if !(1.0..=100.0).contains(&backoff) {
            return Err(bad("TIMER_BACKOFF", &format!("{backoff}; use 1.0 .. 100")));
        }
        let win = t.get_uint("MAX_WINDOW")?;
        if !(MIN_WINDOW as u64..=MAX_WINDOW_LIMIT as u64).contains(&win) {
            return Err(bad(
                "MAX_WINDOW",
                &format!("{win}; use {MIN_WINDOW}..={MAX_WINDOW_LIMIT}"),
            ));
        }
        let tx_bufs = t.get_uint("TX_BUFS")?;
        if !(16..=1 << 20).contains(&tx_bufs) {
            return Err(bad("TX_BUFS", &format!("{tx_bufs}; use 16..=1048576")));
        }
        let faults = FaultConfig {
            loss: percent(t, "TEST_LOSS")?,
            dup: percent(t, "TEST_DUP")?,
            reorder: percent(t, "TEST_REORDER")?,
            seed: t.get_uint("TEST_SEED")?,
        };
        if faults.loss + faults.dup + faults.reorder > 0.9 {
            return Err(bad(
                "TEST_LOSS",
                "loss + duplication + reordering above 90% leaves no working network",
            ));
        }
        Ok(UdConfig {
            rel: RelConfig {
                max_window: win as u16,
                initial_rto: nanos(tick),
                max_rto: nanos(max_rto),
                backoff,
                peer_timeout: nanos(timeout),
            },
            timer_tick: tick,
            tx_bufs: tx_bufs as usize,
            faults,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ucx_like() {
        // no RUCX_UD_* variables are set in unit tests
        let c = UdConfig::read().unwrap();
        assert_eq!(c.rel.peer_timeout, 30_000_000_000);
        assert_eq!(c.rel.initial_rto, 10_000_000);
        assert_eq!((c.rel.max_window, c.rel.backoff, c.tx_bufs), (1024, 2.0, 4096));
        assert!(!c.faults.is_active());
    }
}
