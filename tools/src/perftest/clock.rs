//! The measurement clocks, as UCX's perftest uses them: a cheap tick counter read once per
//! iteration (`ucs_get_time()`: the time-stamp counter on x86_64 when it is invariant) for the
//! percentile and the report interval, and an accurate clock (`ucs_get_accurate_time()`) read at
//! the start, at each report and at the end, for averages, bandwidth and message rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Set once the calibration found an invariant TSC: the per-iteration read is then this
/// flag and `rdtsc`, the rest out of line.
static TSC: AtomicBool = AtomicBool::new(false);

struct Calib {
    base: Instant,
    /// [`mono_ns`] at `base`: the slow tick clock counts from here.
    base_ns: u64,
    tsc: bool,
    ticks_per_sec: f64,
}

fn calib() -> &'static Calib {
    static C: OnceLock<Calib> = OnceLock::new();
    C.get_or_init(|| {
        let base = Instant::now();
        let base_ns = mono_ns().unwrap_or(0);
        let tsc = invariant_tsc();
        let ticks_per_sec = if tsc { measure_tsc_rate() } else { 1e9 };
        TSC.store(tsc, Ordering::Relaxed);
        Calib {
            base,
            base_ns,
            tsc,
            ticks_per_sec,
        }
    })
}

/// Like UCX, trusts the TSC only when the kernel reports it constant and non-stop.
fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") || std::env::var_os("RUCX_PERFTEST_NO_TSC").is_some() {
        return false;
    }
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("constant_tsc") && has("nonstop_tsc")
}

fn measure_tsc_rate() -> f64 {
    let t0 = Instant::now();
    let c0 = raw_tsc();
    while t0.elapsed() < Duration::from_millis(20) {
        std::hint::spin_loop();
    }
    let c1 = raw_tsc();
    let dt = t0.elapsed().as_secs_f64();
    (c1.wrapping_sub(c0)) as f64 / dt
}

#[inline(always)]
fn raw_tsc() -> u64 {
    ucs::arch::read_hres_clock()
}

/// Calibrates now (20 ms), so that it does not happen inside a measurement.
pub fn init() {
    calib();
}

/// The per-iteration clock, in ticks ([`ticks_per_sec`] of them per second).
#[inline(always)]
pub fn ticks() -> u64 {
    if TSC.load(Ordering::Relaxed) {
        raw_tsc()
    } else {
        ticks_slow()
    }
}

/// Before [`init`], or without an invariant TSC: nanoseconds of the accurate clock.
#[cold]
#[inline(never)]
fn ticks_slow() -> u64 {
    let c = calib();
    if c.tsc {
        raw_tsc()
    } else {
        match mono_ns() {
            Some(ns) => ns.wrapping_sub(c.base_ns),
            // Not on Linux (the clock always exists); keep counting rather than stop.
            None => c.base.elapsed().as_nanos() as u64,
        }
    }
}

/// CLOCK_MONOTONIC (what `Instant` reads) in nanoseconds, read straight: without an invariant
/// TSC this is read every iteration, and `Instant::elapsed`'s checked arithmetic would add a
/// dozen code blocks to the ping-pong's critical path.
#[inline(always)]
fn mono_ns() -> Option<u64> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    Some(
        (ts.tv_sec() as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec() as u64),
    )
}

/// Ticks per second of [`ticks`].
pub fn ticks_per_sec() -> f64 {
    calib().ticks_per_sec
}

/// Converts seconds to ticks (saturating).
pub fn ticks_from_sec(s: f64) -> u64 {
    let t = s * ticks_per_sec();
    if t >= u64::MAX as f64 {
        u64::MAX
    } else {
        t as u64
    }
}

/// The accurate clock: seconds since the first use of this module.
#[inline]
pub fn accurate() -> f64 {
    calib().base.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_at_the_calibrated_rate() {
        init();
        let (t0, a0) = (ticks(), accurate());
        std::thread::sleep(Duration::from_millis(30));
        let (t1, a1) = (ticks(), accurate());
        let secs = (t1 - t0) as f64 / ticks_per_sec();
        let real = a1 - a0;
        assert!(real >= 0.03);
        // Generous: a loaded VM may deschedule between the reads.
        assert!(
            (secs - real).abs() < 0.02,
            "tick clock {secs} s vs accurate {real} s"
        );
        assert_eq!(ticks_from_sec(f64::INFINITY), u64::MAX);
    }

    #[test]
    fn monotonic_nanoseconds_follow_real_time() {
        let a = mono_ns().expect("CLOCK_MONOTONIC");
        let i = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = mono_ns().expect("CLOCK_MONOTONIC");
        let real = i.elapsed().as_nanos() as u64;
        assert!(b - a >= 20_000_000, "{} ns", b - a);
        // Generous: a loaded VM may deschedule between the reads.
        assert!((b - a).abs_diff(real) < 10_000_000, "{} ns vs {real} ns", b - a);
    }
}
