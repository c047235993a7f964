//! Ending the whole test process when a test hangs: a safety net behind the tests' own
//! deadlines, for tests whose helpers (threads, child processes) could block past them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ends the process if it is still alive after `limit` (children notice the parent's exit
/// through their stdin and quit). Disarmed when dropped.
pub struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    pub fn new(name: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !d.load(Ordering::Relaxed) {
                if start.elapsed() > limit {
                    eprintln!("WATCHDOG: test {name} still running after {limit:?}: ending the test process");
                    std::process::exit(1);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
