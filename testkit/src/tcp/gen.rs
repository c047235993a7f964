//! Deterministic test data: a small PRNG and "stamped" messages whose first 8 bytes say who sent
//! them and in which order, and whose length and content follow from that stamp, so a receiver
//! can verify every byte, detect loss, duplication and reordering per stream.
//!
//! Layout of a stamped message as the AM handler sees it (identical for am_short, am_bcopy and
//! am_zcopy with an 8-byte header): `u64 LE stamp = stream << 32 | seq`, then the payload.

use std::collections::HashMap;

/// SplitMix64: tiny, good enough to make sizes and bytes look random.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }

    /// Random bytes, a random count in `lo..=hi`.
    pub fn bytes_between(&mut self, lo: usize, hi: usize) -> Vec<u8> {
        let n = self.range(lo, hi);
        self.bytes(n)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

pub fn stamp(stream: u32, seq: u32) -> u64 {
    (stream as u64) << 32 | seq as u64
}

fn seed(stream: u32, seq: u32) -> u64 {
    stamp(stream, seq).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xA5A5
}

/// Payload length of message `seq` of `stream`, in `0..=max`.
pub fn payload_len(stream: u32, seq: u32, max: usize) -> usize {
    let mut r = Rng::new(seed(stream, seq) ^ 0x1234);
    // Favour small messages but cover the whole range, including both ends.
    match r.next_u64() % 8 {
        0 => 0,
        1 => max,
        2..=4 => r.range(0, max.min(64)),
        _ => r.range(0, max),
    }
}

/// Writes the payload of message `seq` of `stream` into `buf` (its length is the caller's).
pub fn fill_payload(stream: u32, seq: u32, buf: &mut [u8]) {
    Rng::new(seed(stream, seq)).fill(buf);
}

/// A whole stamped message (stamp + payload) with a payload of `len` bytes.
pub fn message(stream: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0; 8 + len];
    v[..8].copy_from_slice(&stamp(stream, seq).to_le_bytes());
    fill_payload(stream, seq, &mut v[8..]);
    v
}

/// Verifies stamped messages per stream: in order, no gap, no duplicate, intact.
#[derive(Default, Debug)]
pub struct Checker {
    next: HashMap<u32, u32>,
    pub total: u64,
    pub bytes: u64,
    /// The first problems seen (at most 20 kept).
    pub problems: Vec<String>,
    pub bad: u64,
    /// When set, the payload length must equal `payload_len(stream, seq, max)`.
    pub max_payload: Option<usize>,
}

impl Checker {
    pub fn new(max_payload: Option<usize>) -> Checker {
        Checker {
            max_payload,
            ..Default::default()
        }
    }

    fn problem(&mut self, p: String) {
        self.bad += 1;
        if self.problems.len() < 20 {
            self.problems.push(p);
        }
    }

    /// Checks one message; returns its (stream, seq) when it has a stamp.
    pub fn check(&mut self, data: &[u8]) -> Option<(u32, u32)> {
        self.total += 1;
        self.bytes += data.len() as u64;
        let Some(st) = data.get(..8) else {
            self.problem(format!("message of {} bytes has no 8-byte stamp", data.len()));
            return None;
        };
        let st = u64::from_le_bytes(st.try_into().expect("8 bytes"));
        let (stream, seq) = ((st >> 32) as u32, st as u32);
        let expected = *self.next.get(&stream).unwrap_or(&0);
        if seq != expected {
            self.problem(format!(
                "stream {stream}: got seq {seq}, expected {expected} (loss, duplicate or reordering)"
            ));
        }
        self.next.insert(stream, seq.wrapping_add(1).max(expected));
        let payload = &data[8..];
        if let Some(max) = self.max_payload {
            let want = payload_len(stream, seq, max);
            if payload.len() != want {
                self.problem(format!(
                    "stream {stream} seq {seq}: payload of {} bytes, expected {want}",
                    payload.len()
                ));
                return Some((stream, seq));
            }
        }
        let mut want = vec![0; payload.len()];
        fill_payload(stream, seq, &mut want);
        if payload != want.as_slice() {
            let at = payload.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            self.problem(format!(
                "stream {stream} seq {seq}: payload corrupted at byte {at} of {}",
                payload.len()
            ));
        }
        Some((stream, seq))
    }

    /// Messages received in order from `stream` so far.
    pub fn count(&self, stream: u32) -> u32 {
        *self.next.get(&stream).unwrap_or(&0)
    }
}
