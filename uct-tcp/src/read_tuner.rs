//! How progress waits for a reply on its lone connection: by `recv()`ing the socket directly
//! (one system call less per message) or by asking epoll first (which touches none of the
//! socket's state while the peer's packet is being delivered into it).
//!
//! Which is faster depends on where the two processes run: with both CPUs under one L3 cache
//! direct reads win; with the CPUs on different dies a `recv()` that touches the socket while
//! the peer's packet is being delivered into it pulls its cache lines across and loses. The
//! placement is the hypervisor's and can change at run time, so with
//! `RUCX_TCP_DIRECT_READS=auto` the tuner measures: every [`EXPLOIT`] waits it times
//! [`TRIAL`] waits, half each way (drawn at random), and keeps the one whose median wait was
//! shorter. Outside a trial the tuner costs a counter per wait, inside one two clock reads
//! (vDSO).

use std::cell::{Cell, RefCell};
use std::time::Instant;

/// Waits timed per trial (half each way).
pub const TRIAL: usize = 128;

/// Waits between two trials (at ~10 µs a round trip, a trial every ~40 ms).
pub const EXPLOIT: u32 = 4096;

/// `RUCX_TCP_DIRECT_READS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectReads {
    /// Measured (see the module docs).
    Auto,
    Always,
    Never,
}

struct Trial {
    /// Nanoseconds of each timed wait, by way (0: epoll first, 1: direct).
    ns: [[u32; TRIAL / 2]; 2],
    n: [usize; 2],
}

/// Chooses, at the start of each wait for a reply, whether progress reads directly.
pub struct ReadTuner {
    setting: DirectReads,
    /// The way of the current wait: what `direct_conn` asks.
    direct: Cell<bool>,
    /// The way kept outside trials.
    chosen: Cell<bool>,
    /// Waits left until the next trial; 0 while one runs.
    until_trial: Cell<u32>,
    /// When the current timed wait began.
    started: Cell<Option<Instant>>,
    trial: RefCell<Trial>,
    /// State of [`Self::coin`] (never 0).
    rng: Cell<u32>,
}

impl ReadTuner {
    /// `seed`: any value; it varies the trials' draws between processes.
    pub fn new(setting: DirectReads, seed: u32) -> ReadTuner {
        ReadTuner {
            setting,
            direct: Cell::new(setting != DirectReads::Never),
            chosen: Cell::new(true),
            // The first trial starts with the first wait.
            until_trial: Cell::new(0),
            started: Cell::new(None),
            trial: RefCell::new(Trial {
                ns: [[0; TRIAL / 2]; 2],
                n: [0; 2],
            }),
            rng: Cell::new(seed | 1),
        }
    }

    /// Whether the current wait reads directly.
    #[inline]
    pub fn direct(&self) -> bool {
        self.direct.get()
    }

    /// A send began a wait for a reply (nothing had been sent since data last arrived).
    /// `timed` says whether the wait can be timed (the interface has this one connection); it
    /// is asked only in a trial.
    #[inline]
    pub fn wait_started(&self, timed: impl FnOnce() -> bool) {
        if self.setting != DirectReads::Auto {
            return;
        }
        let left = self.until_trial.get();
        if left > 0 {
            self.until_trial.set(left - 1);
            return;
        }
        if !timed() {
            self.started.set(None);
            self.direct.set(self.chosen.get());
            return;
        }
        // In a trial: each wait's way is drawn at random. Not alternated: the peer runs the
        // same trials in lockstep, and its way (which changes our waits as much as ours does)
        // would always pair with the same one of ours.
        let t = self.trial.borrow();
        let half = TRIAL / 2;
        let direct = if t.n[1] >= half {
            false
        } else if t.n[0] >= half {
            true
        } else {
            self.coin()
        };
        drop(t);
        self.direct.set(direct);
        self.started.set(Some(Instant::now()));
    }

    /// Data arrived: the wait (if one was timed) is over.
    #[inline]
    pub fn reply_arrived(&self) {
        if let Some(t0) = self.started.take() {
            let ns = t0.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32;
            self.record(self.direct.get(), ns);
        }
    }

    /// A random bit (xorshift32).
    fn coin(&self) -> bool {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng.set(x);
        x & 1 != 0
    }

    /// Adds one timed wait; the trial's last one decides.
    fn record(&self, direct: bool, ns: u32) {
        let mut t = self.trial.borrow_mut();
        let way = usize::from(direct);
        if t.n[way] < TRIAL / 2 {
            let i = t.n[way];
            t.ns[way][i] = ns;
            t.n[way] += 1;
        }
        if t.n[0] < TRIAL / 2 || t.n[1] < TRIAL / 2 {
            return;
        }
        let epoll = median(&mut t.ns[0]);
        let direct = median(&mut t.ns[1]);
        t.n = [0; 2];
        drop(t);
        let pick = direct <= epoll;
        ucs::trace!(
            "tcp: read trial: median wait {direct} ns reading directly, {epoll} ns asking epoll first"
        );
        if pick != self.chosen.get() {
            ucs::debug!(
                "tcp: reads now {} (median wait {direct} ns reading directly, {epoll} ns asking epoll first)",
                if pick { "directly" } else { "after epoll" }
            );
        }
        self.chosen.set(pick);
        self.direct.set(pick);
        self.until_trial.set(EXPLOIT);
    }
}

fn median(v: &mut [u32]) -> u32 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One timed wait whose length the test gives by way (direct or not); returns the way.
    fn wait(t: &ReadTuner, ns: impl Fn(bool) -> u32) -> bool {
        t.wait_started(|| true);
        assert!(t.started.take().is_some(), "a trial's waits are timed");
        let d = t.direct();
        t.record(d, ns(d));
        d
    }

    /// One trial in which a direct wait takes `direct_ns` and one after epoll `epoll_ns`.
    fn trial(t: &ReadTuner, direct_ns: u32, epoll_ns: u32) {
        for _ in 0..TRIAL {
            wait(t, |d| if d { direct_ns } else { epoll_ns });
        }
    }

    fn exploit(t: &ReadTuner, expect_direct: bool) {
        for _ in 0..EXPLOIT {
            t.wait_started(|| true);
            assert_eq!(t.direct(), expect_direct);
            assert!(t.started.get().is_none(), "no clock reads outside trials");
            t.reply_arrived();
        }
    }

    #[test]
    fn trial_alternates_and_keeps_the_faster_way() {
        let t = ReadTuner::new(DirectReads::Auto, 7);
        let ways: Vec<bool> = (0..TRIAL)
            .map(|_| wait(&t, |d| if d { 2000 } else { 1000 }))
            .collect();
        // Half each way, not simply alternating.
        assert_eq!(ways.iter().filter(|&&d| d).count(), TRIAL / 2);
        assert!(ways.windows(2).any(|w| w[0] == w[1]));
        exploit(&t, false);
        trial(&t, 900, 1000);
        exploit(&t, true);
        trial(&t, 1000, 950);
        exploit(&t, false);
    }

    #[test]
    fn median_ignores_outliers() {
        let t = ReadTuner::new(DirectReads::Auto, 7);
        // Direct is faster, except for a few huge stalls.
        for i in 0..TRIAL {
            wait(&t, |d| match d {
                true if i % 16 == 2 => 1_000_000,
                true => 900,
                false => 1000,
            });
        }
        exploit(&t, true);
    }

    #[test]
    fn fixed_settings_never_measure() {
        for (s, d) in [(DirectReads::Always, true), (DirectReads::Never, false)] {
            let t = ReadTuner::new(s, 7);
            for _ in 0..3 * TRIAL {
                t.wait_started(|| true);
                assert_eq!(t.direct(), d);
                assert!(t.started.get().is_none());
                t.reply_arrived();
            }
        }
    }

    #[test]
    fn untimed_waits_use_the_choice_and_measure_nothing() {
        let t = ReadTuner::new(DirectReads::Auto, 7);
        for _ in 0..TRIAL {
            t.wait_started(|| false);
            assert!(t.direct());
            t.reply_arrived();
        }
        assert_eq!(t.trial.borrow().n, [0, 0]);
    }

    #[test]
    fn clock_timed_waits_complete_a_trial() {
        let t = ReadTuner::new(DirectReads::Auto, 7);
        for _ in 0..TRIAL {
            t.wait_started(|| true);
            assert!(t.started.get().is_some());
            t.reply_arrived();
        }
        assert_eq!(t.until_trial.get(), EXPLOIT);
        assert_eq!(t.trial.borrow().n, [0, 0]);
    }
}
