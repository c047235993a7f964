//! A tiny deterministic PRNG (xorshift64*) for the seeded property tests and fuzz bodies of
//! every transport: reproducible inputs from a seed, no dependency.

/// xorshift64*; the same seed gives the same sequence on every run.
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value: 0 is made odd, xorshift needs a non-zero state).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::XorShift;

    #[test]
    fn seeded_sequences_repeat_and_stay_in_range() {
        let (mut a, mut b) = (XorShift::new(0), XorShift::new(0));
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        assert!(
            xs.iter().all(|&x| x != 0),
            "a zero seed still gives a live generator"
        );
        assert_eq!(xs, (0..100).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert!((0..1000).all(|_| a.below(7) < 7));
        assert_eq!(a.below(0), 0);
    }
}
