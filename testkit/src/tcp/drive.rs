//! A raw peer in a helper thread while the test's thread progresses the interfaces it talks
//! to (blocking socket calls and a single-threaded worker cannot share a thread).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::STEP;
use crate::wait::Progress;

/// Counts progress rounds of the test's thread, so the helper thread can wait until the
/// transport had several chances to read what it sent.
#[derive(Clone, Default)]
pub struct Ticks(Arc<AtomicU64>);

impl Ticks {
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Waits (in the helper thread) until the test's thread progressed `n` more rounds.
    pub fn wait_rounds(&self, n: u64) {
        let target = self.now() + n;
        let start = Instant::now();
        while self.now() < target && start.elapsed() < STEP {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Runs `f` in a helper thread while this thread progresses `p`; returns `f`'s result.
/// Panics if `f` is not done after `limit`.
pub fn drive<T: Send + 'static>(
    p: &(impl Progress + ?Sized),
    limit: Duration,
    f: impl FnOnce(Ticks) -> T + Send + 'static,
) -> T {
    drive_with(p, limit, f, || {})
}

/// [`drive`], also calling `step` on this thread after each progress round (to send from here
/// while the helper thread works).
pub fn drive_with<T: Send + 'static>(
    p: &(impl Progress + ?Sized),
    limit: Duration,
    f: impl FnOnce(Ticks) -> T + Send + 'static,
    mut step: impl FnMut(),
) -> T {
    let ticks = Ticks::default();
    let t2 = ticks.clone();
    let h = std::thread::spawn(move || f(t2));
    let start = Instant::now();
    while !h.is_finished() {
        assert!(
            start.elapsed() < limit,
            "helper thread still running after {limit:?}"
        );
        let n = p.progress();
        ticks.0.fetch_add(1, Ordering::Relaxed);
        step();
        if n == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    match h.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}
