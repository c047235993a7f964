//! Test hook: seeded fault injection on received packets (loss, duplication, reordering).
//!
//! Enabled only through the `RUCX_UD_TEST_*` variables (all 0 by default); used by the tests to
//! prove that the reliability layer delivers every message exactly once and in order over a
//! bad network. The receive path asks [`Injector::decide`] for each packet's fate. Pure and
//! deterministic for a given seed.

/// A small, fast PRNG (SplitMix64): deterministic per seed, good enough for fault injection
/// and simulations, no dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Probabilities (0..=1) of each fault, per received packet.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct FaultConfig {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub seed: u64,
}

impl FaultConfig {
    /// True when any fault is configured.
    pub fn is_active(&self) -> bool {
        self.loss > 0.0 || self.dup > 0.0 || self.reorder > 0.0
    }
}

/// What happens to one received packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Deliver,
    /// Lost.
    Drop,
    /// Processed twice.
    Duplicate,
    /// Held back and processed after a later packet (reordered).
    Hold,
}

/// Counts of what the injector did (for test logs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub seen: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub held: u64,
}

/// Decides the fate of each packet.
#[derive(Clone, Debug)]
pub struct Injector {
    cfg: FaultConfig,
    rng: Rng,
    pub stats: FaultStats,
}

impl Injector {
    pub fn new(cfg: FaultConfig) -> Injector {
        Injector {
            cfg,
            rng: Rng::new(cfg.seed),
            stats: FaultStats::default(),
        }
    }

    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    pub fn decide(&mut self) -> Fate {
        self.stats.seen += 1;
        let r = self.rng.next_f64();
        let c = &self.cfg;
        if r < c.loss {
            self.stats.dropped += 1;
            Fate::Drop
        } else if r < c.loss + c.dup {
            self.stats.duplicated += 1;
            Fate::Duplicate
        } else if r < c.loss + c.dup + c.reorder {
            self.stats.held += 1;
            Fate::Hold
        } else {
            Fate::Deliver
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spread() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(1);
        let mean = (0..10_000).map(|_| r.next_f64()).sum::<f64>() / 10_000.0;
        assert!((0.45..0.55).contains(&mean), "mean {mean}");
        assert!((0..1000).all(|_| r.below(7) < 7));
    }

    #[test]
    fn fates_follow_the_probabilities() {
        let mut inj = Injector::new(FaultConfig {
            loss: 0.1,
            dup: 0.05,
            reorder: 0.05,
            seed: 7,
        });
        for _ in 0..20_000 {
            inj.decide();
        }
        let s = inj.stats;
        assert_eq!(s.seen, 20_000);
        assert!((1600..2400).contains(&s.dropped), "{s:?}");
        assert!((700..1300).contains(&s.duplicated), "{s:?}");
        assert!((700..1300).contains(&s.held), "{s:?}");
        let mut off = Injector::new(FaultConfig::default());
        assert!(!off.config().is_active());
        assert!((0..1000).all(|_| off.decide() == Fate::Deliver));
    }
}
