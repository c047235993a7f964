//! A fast keyed hasher for integer keys on hot paths (tags, request and message ids).
//!
//! std's SipHash costs tens of nanoseconds per lookup, a large share of a UCP tag match. This
//! one is a folded multiply of the key with a per-table random seed: a few cycles, and its
//! output still depends on a secret, so a peer choosing tags cannot pick colliding ones
//! without knowing the seed. Only for fixed-size integer keys; byte strings go through
//! `write` one word at a time.

use std::hash::{BuildHasher, Hasher};

/// Builds [`FastHasher`]s with a seed drawn once per table (from std's random keys).
#[derive(Clone, Copy, Debug)]
pub struct FastHash {
    seed: u64,
}

impl Default for FastHash {
    fn default() -> FastHash {
        let s = std::collections::hash_map::RandomState::new();
        // Any keyed value will do: the seed only has to be unknown to peers.
        FastHash {
            seed: s.hash_one(0x5eed_u64) | 1,
        }
    }
}

impl BuildHasher for FastHash {
    type Hasher = FastHasher;

    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher { state: self.seed }
    }
}

/// The hasher of [`FastHash`].
#[derive(Clone, Copy, Debug)]
pub struct FastHasher {
    state: u64,
}

/// An odd constant with well-spread bits (the fractional part of the golden ratio).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        let p = u128::from(self.state ^ v) * u128::from(K);
        self.state = (p as u64) ^ ((p >> 64) as u64);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.mix(u64::from(v));
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
}

/// A `HashMap` with [`FastHash`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastHash>;

/// Gives back the memory of a map that a burst grew and removals then emptied (a connection
/// storm's pairing tables): when fewer than a quarter of its slots are used, the table is
/// rebuilt at twice its length. A map never shrinks by itself, so without this a table that
/// once held a million entries keeps their memory for good. The rebuild costs one pass over
/// what is left, and the factor 4 between growing and shrinking keeps it amortized O(1) per
/// removal. Call it after removing.
///
/// ```
/// let mut m: std::collections::HashMap<u64, u64> = (0..10_000).map(|i| (i, i)).collect();
/// m.retain(|k, _| *k < 10);
/// ucs::hash::trim(&mut m);
/// assert!(m.capacity() < 100);
/// ```
pub fn trim<K: Eq + std::hash::Hash, V, S: BuildHasher>(m: &mut std::collections::HashMap<K, V, S>) {
    let cap = m.capacity();
    if cap > 32 && m.len() < cap / 4 {
        m.shrink_to(m.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_frees_a_drained_map_and_keeps_a_used_one() {
        let mut m: FastMap<u64, u64> = (0..4096).map(|i| (i, i)).collect();
        let full = m.capacity();
        trim(&mut m);
        assert_eq!(m.capacity(), full, "a full map is left alone");
        for i in 0..4000 {
            m.remove(&i);
        }
        trim(&mut m);
        assert!(
            m.capacity() < full / 8,
            "capacity {} after draining",
            m.capacity()
        );
        assert_eq!(m.len(), 96);
        assert!((4000..4096).all(|i| m.get(&i) == Some(&i)));
        m.clear();
        trim(&mut m);
        assert_eq!(m.capacity(), 0);
    }

    #[test]
    fn spreads_sequential_and_strided_keys() {
        let b = FastHash::default();
        // Both the low bits (bucket) and the top 7 bits (hashbrown's control byte) vary.
        for stride in [1u64, 8, 1 << 20, 1 << 40] {
            let hs: Vec<u64> = (0..1024u64).map(|i| b.hash_one(i * stride)).collect();
            let low: std::collections::HashSet<u64> = hs.iter().map(|h| h & 1023).collect();
            let top: std::collections::HashSet<u64> = hs.iter().map(|h| h >> 57).collect();
            assert!(low.len() > 550, "stride {stride}: {} low buckets", low.len());
            assert!(top.len() > 100, "stride {stride}: {} top values", top.len());
        }
    }

    #[test]
    fn seeds_differ_between_tables() {
        let (a, b) = (FastHash::default(), FastHash::default());
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
        let mut m: FastMap<u64, u64> = FastMap::default();
        for i in 0..10_000 {
            m.insert(i, i * 2);
        }
        assert!((0..10_000).all(|i| m[&i] == i * 2));
    }
}
