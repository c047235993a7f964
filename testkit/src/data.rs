//! Test data: message sizes, per-size byte patterns, readable byte comparisons, iov layouts.

/// Sizes from `min` to `max`: every size up to `min + exhaustive`, then powers of two and their
/// neighbours, then `max - 1` and `max`. Sorted, without duplicates.
pub fn sizes(min: usize, max: usize, exhaustive: usize) -> Vec<usize> {
    if max < min {
        return Vec::new();
    }
    let mut v: Vec<usize> = (min..=max.min(min.saturating_add(exhaustive))).collect();
    let mut p = 1usize;
    while p <= max {
        for s in [p - 1, p, p + 1] {
            if (min..=max).contains(&s) {
                v.push(s);
            }
        }
        p = match p.checked_mul(2) {
            Some(n) => n,
            None => break,
        };
    }
    v.extend([max.saturating_sub(1).max(min), max]);
    v.sort_unstable();
    v.dedup();
    v
}

/// `len` bytes that differ per size and per `seed` (so a message of one size never matches
/// another's, and a shifted copy never matches).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x =
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (len as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ 0x5555;
    (0..len)
        .map(|_| {
            // xorshift64: cheap, deterministic, no zero runs.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Asserts `got == want`, reporting the first differing offset instead of dumping the buffers.
#[track_caller]
pub fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    if got.len() != want.len() {
        panic!("{what}: length {} instead of {}", got.len(), want.len());
    }
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .expect("some byte differs");
    let end = (i + 16).min(got.len());
    panic!(
        "{what}: first difference at byte {i} of {}: got {:02x?}, want {:02x?}",
        got.len(),
        &got[i..end],
        &want[i..end]
    );
}

/// Splits `n` bytes into `k` consecutive lengths (as even as possible; `k` is at least 1).
pub fn split(n: usize, k: usize) -> Vec<usize> {
    let k = k.max(1);
    (0..k).map(|j| n * (j + 1) / k - n * j / k).collect()
}

/// Gap left between scattered iov entries in a local buffer, so gathering must skip it.
pub const GAP: usize = 3;

/// Offsets of entries with lengths `lens` laid out with [`GAP`] bytes between them, and the
/// buffer size needed.
pub fn scatter(lens: &[usize]) -> (Vec<usize>, usize) {
    let mut off = GAP;
    let offs = lens
        .iter()
        .map(|l| {
            let o = off;
            off += l + GAP;
            o
        })
        .collect();
    (offs, off)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_behave() {
        assert_eq!(sizes(0, 5, 100), vec![0, 1, 2, 3, 4, 5]);
        let s = sizes(0, 1000, 8);
        assert!(
            s.contains(&511) && s.contains(&512) && s.contains(&513) && s.contains(&999) && s.contains(&1000)
        );
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*s.last().unwrap(), 1000);
        assert!(sizes(5, 4, 10).is_empty());
        assert_ne!(pattern(16, 1), pattern(16, 2));
        assert_ne!(pattern(16, 1)[..15], pattern(15, 1)[..]);
        assert_eq!(split(10, 3), vec![3, 3, 4]);
        assert_eq!(split(10, 3).iter().sum::<usize>(), 10);
        assert_eq!(scatter(&[2, 4]), (vec![3, 8], 15));
    }
}
