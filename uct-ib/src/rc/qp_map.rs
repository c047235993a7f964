//! Endpoints by local QP number, for send completions and flow-control flags: a hash map
//! with a one-multiply hash instead of std's SipHash. The keys are QP numbers this process's
//! device assigned (a completion's own QP), never bytes from a peer, so nothing can aim
//! collisions at it; UCX looks them up in a plain two-level array.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing: the multiply spreads the low bits a device counts up in over the high
/// bits the table's control bytes use.
#[derive(Default, Clone, Copy)]
pub struct QpNumHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for QpNumHasher {
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(K);
    }

    /// Other key types (unused here) still hash correctly, byte by byte.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by local QP number.
pub type QpMap<V> = HashMap<u32, V, BuildHasherDefault<QpNumHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn maps_and_spreads_consecutive_qp_numbers() {
        let mut m: QpMap<u32> = QpMap::default();
        for q in 0x11..0x11 + 1000 {
            m.insert(q, q * 2);
        }
        assert_eq!(m.get(&0x11), Some(&0x22));
        assert_eq!(m.remove(&(0x11 + 999)), Some((0x11 + 999) * 2));
        assert_eq!(m.len(), 999);
        // the top 7 bits (hashbrown's control byte) differ across neighbours
        let b = BuildHasherDefault::<QpNumHasher>::default();
        let tops: std::collections::HashSet<u64> = (0..128u32).map(|q| b.hash_one(q) >> 57).collect();
        assert!(tops.len() > 64, "only {} distinct control bytes", tops.len());
    }
}
