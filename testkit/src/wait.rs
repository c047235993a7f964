//! Waiting: progress until a condition holds, failing with a clear message after a deadline
//! (remote transports only ever wait, so every wait is bounded); retrying while a transport has
//! no resources; and the completion contract of operations that may finish later.

use std::time::{Duration, Instant};

use uct::{Completion, Ep, FlushFlags, Outcome, Status, Worker};

use crate::entity::Entity;

/// How long a wait may take before the test fails, unless the test says otherwise.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// What a test progresses: a worker, an entity, a pair, or several of them (in order).
pub trait Progress {
    /// One round; returns the work done.
    fn progress(&self) -> u32;
}

impl Progress for Worker {
    fn progress(&self) -> u32 {
        Worker::progress(self)
    }
}

impl Progress for Entity {
    fn progress(&self) -> u32 {
        self.worker.progress()
    }
}

impl<T: Progress + ?Sized> Progress for &T {
    fn progress(&self) -> u32 {
        (**self).progress()
    }
}

impl<T: Progress> Progress for [T] {
    fn progress(&self) -> u32 {
        self.iter().map(|p| p.progress()).sum()
    }
}

impl<T: Progress, const N: usize> Progress for [T; N] {
    fn progress(&self) -> u32 {
        self[..].progress()
    }
}

/// Progresses `p` until `done()` holds; panics naming `what` after `limit`. After a long run
/// of idle rounds it sleeps a little between rounds, leaving the CPU to the peers it waits for
/// (threads, processes).
pub fn wait_for(p: &(impl Progress + ?Sized), limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    let mut idle = 0u32;
    while !done() {
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        idle = if p.progress() == 0 { idle + 1 } else { 0 };
        if idle > 200 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Progresses `p` for `d` (to let things settle; nothing is asserted about time).
pub fn progress_for(p: &(impl Progress + ?Sized), d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        if p.progress() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Runs `op` until it returns anything but `Err(NoResource)`, progressing `p` in between;
/// panics naming `what` after `limit`.
pub fn retry<T>(
    p: &(impl Progress + ?Sized),
    limit: Duration,
    what: &str,
    mut op: impl FnMut() -> uct::Result<T>,
) -> uct::Result<T> {
    let start = Instant::now();
    loop {
        match op() {
            Err(e) if e == Status::NoResource => {
                if start.elapsed() > limit {
                    panic!("{what}: still NoResource after {limit:?}");
                }
                p.progress();
            }
            r => return r,
        }
    }
}

/// The completion contract for the result `r` of one operation given the fresh completion
/// `comp`: `Ok(Done)` leaves it untouched, `Ok(InProgress)` fires it once with `Ok` (waited
/// for, progressing `p`); an error fails the test.
pub fn check_completion(
    p: &(impl Progress + ?Sized),
    limit: Duration,
    what: &str,
    comp: &Completion,
    r: uct::Result<Outcome>,
) {
    match r {
        Ok(Outcome::Done) => {
            assert_eq!(comp.fired(), 0, "{what}: returned Ok but fired its completion");
            assert_eq!(
                comp.outstanding(),
                0,
                "{what}: returned Ok but left the completion counted"
            );
        }
        Ok(Outcome::InProgress) => {
            wait_for(p, limit, &format!("{what} completion"), || comp.fired() > 0);
            assert_eq!(comp.fired(), 1, "{what}: completion fired more than once");
            assert_eq!(comp.last_status(), Status::Ok, "{what}: completed with an error");
            assert_eq!(comp.outstanding(), 0, "{what}");
        }
        Err(e) => panic!("{what}: {e:?}"),
    }
}

/// Runs an operation that takes a completion (retrying `NoResource`), requires success and
/// waits for it ([`check_completion`]).
pub fn complete(
    p: &(impl Progress + ?Sized),
    limit: Duration,
    what: &str,
    mut op: impl FnMut(&Completion) -> uct::Result<Outcome>,
) {
    let comp = Completion::counter();
    let r = retry(p, limit, what, || op(&comp));
    check_completion(p, limit, what, &comp, r)
}

/// Flushes `ep` (local completion) and waits for it.
pub fn flush(p: &(impl Progress + ?Sized), limit: Duration, ep: &Ep) {
    complete(p, limit, "ep flush", |c| ep.flush(FlushFlags::LOCAL, Some(c)))
}

/// What an operation that returned `r` with `comp` ended with: its error, or (waiting for the
/// completion when it returned `InProgress`) the completion's status.
pub fn outcome(
    p: &(impl Progress + ?Sized),
    limit: Duration,
    r: uct::Result<Outcome>,
    comp: &Completion,
) -> Status {
    match r {
        Ok(Outcome::Done) => Status::Ok,
        Ok(Outcome::InProgress) => {
            wait_for(p, limit, "completion", || comp.fired() > 0);
            comp.last_status()
        }
        Err(e) => e.status(),
    }
}
