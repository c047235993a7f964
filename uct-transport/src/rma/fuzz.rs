//! Fuzz-target body `rkey_table`, shared by the cargo-fuzz crate (`fuzz/`) and the seeded unit
//! tests below: a packed rkey and a run of remote requests (key, address, length, operation)
//! as a peer would send them, checked against a model of the registered memory.
//!
//! Not part of the transport API (allocation is fine here).
#![doc(hidden)]
#![deny(unsafe_code)]

use super::{RegionTable, PACKED_RKEY_LEN};
use crate::traits::AtomicSize;
use crate::types::{AtomicOp, MemAccess};
use ucs::Status;

/// Bytes of the test memory; the region is its middle half, the rest are guard bytes.
const MEM: usize = 128;
const BASE: usize = 32;
const LEN: usize = 64;

/// Fuzz body `rkey_table`. Byte 0 picks the region's access rights; then, while input lasts,
/// each request takes 5 bytes: operation, key choice, address offset (i16 from the region
/// base) and length, followed for puts by `length` data bytes. Properties: `unpack` accepts
/// exactly [`PACKED_RKEY_LEN`]+ bytes and returns the key packed; an access succeeds iff the key
/// is the live one, the range lies inside the region, the right is granted and an atomic is
/// aligned; successful accesses read and write what a plain model of the memory says; the
/// guard bytes and any refused access leave memory untouched.
pub fn rkey_table(data: &[u8]) {
    // unpack of arbitrary bytes: the first 8 bytes iff the whole packed rkey is there
    match RegionTable::unpack(data) {
        Ok(k) => {
            assert!(data.len() >= PACKED_RKEY_LEN);
            assert_eq!(k.to_le_bytes()[..], data[..8]);
        }
        Err(e) => {
            assert!(data.len() < PACKED_RKEY_LEN);
            assert_eq!(e, Status::InvalidParam);
        }
    }
    let Some((&rights, mut rest)) = data.split_first() else {
        return;
    };
    let mut access = MemAccess::EMPTY;
    for (bit, a) in [
        (1, MemAccess::REMOTE_PUT),
        (2, MemAccess::REMOTE_GET),
        (4, MemAccess::REMOTE_ATOMIC),
    ] {
        if rights & bit != 0 {
            access = access.union(a);
        }
    }
    let mut words = vec![0u64; MEM / 8]; // u64s: 8-byte aligned for atomics
    let mut model: Vec<u8> = (0..MEM).map(|i| i as u8 ^ 0xa5).collect();
    for (w, c) in words.iter_mut().zip(model.chunks(8)) {
        *w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    let mem = words.as_mut_ptr() as *mut u8;
    let base = mem as u64 + BASE as u64;
    let t = RegionTable::new();
    // A stale key: registered, packed, deregistered; the slot is then reused by `live`.
    let gone = t.register(mem.wrapping_add(BASE), LEN, MemAccess::ALL);
    let stale = packed_key(&t, gone);
    t.deregister(gone).expect("registered");
    let live = t.register(mem.wrapping_add(BASE), LEN, access);
    let key = packed_key(&t, live);
    assert_ne!(key, stale, "a reused slot gets a new key");

    while rest.len() >= 5 {
        let (req, tail) = rest.split_at(5);
        rest = tail;
        let op = req[0];
        let k = match req[1] % 4 {
            0 | 1 => key,
            2 => stale,
            _ => key ^ (1u64 << (req[1] >> 2)), // one flipped bit
        };
        let off = i64::from(i16::from_le_bytes([req[2], req[3]]));
        // mostly near the region; sometimes far away or at the top of the address space
        let addr = match op >> 5 {
            6 => u64::MAX - (off as u64 & 0xff),
            7 => off as u64 & 0xfff,
            _ => base.wrapping_add(off as u64),
        };
        let len = usize::from(req[4]) % 96;
        let in_region = in_region_len(addr, len, base);
        let idx = addr.wrapping_sub(mem as u64) as usize; // only used when in_region
        let live_key = k == key;
        match op % 4 {
            0 => {
                let n = len.min(rest.len());
                let (d, tail) = rest.split_at(n);
                rest = tail;
                let ok = live_key && access.contains(MemAccess::REMOTE_PUT) && in_region_len(addr, n, base);
                let r = t.write(k, addr, d);
                assert_eq!(r.is_ok(), ok, "put {n} at {:+}", addr.wrapping_sub(base) as i64);
                if ok {
                    model[idx..idx + n].copy_from_slice(d);
                }
            }
            1 => {
                let mut out = vec![0u8; len];
                let ok = live_key && access.contains(MemAccess::REMOTE_GET) && in_region;
                let r = t.read(k, addr, &mut out);
                assert_eq!(r.is_ok(), ok, "get {len} at {:+}", addr.wrapping_sub(base) as i64);
                if ok {
                    assert_eq!(out[..], model[idx..idx + len]);
                }
            }
            2 => {
                let ok = live_key && access.contains(MemAccess::REMOTE_GET) && in_region;
                let r = t.with_source(k, addr, len, |s| s.to_vec());
                assert_eq!(r.is_ok(), ok);
                if let Ok(v) = r {
                    assert_eq!(v[..], model[idx..idx + len]);
                }
            }
            _ => {
                let (size, width) = if op & 4 != 0 {
                    (AtomicSize::U64, 8)
                } else {
                    (AtomicSize::U32, 4)
                };
                let aop = AtomicOp::from_raw((op >> 3) % 6).expect("0..6 are ops");
                let operand = u64::from(req[4]).wrapping_mul(0x0101_0101_0101_0101) ^ 0xf0f0;
                let compare = if req[2] & 1 == 0 {
                    operand
                } else {
                    model_word(&model, idx, width)
                };
                let ok = live_key
                    && access.contains(MemAccess::REMOTE_ATOMIC)
                    && addr.is_multiple_of(width as u64)
                    && in_region_len(addr, width, base);
                let r = t.atomic(k, addr, size, aop, operand, compare);
                assert_eq!(
                    r.is_ok(),
                    ok,
                    "atomic {width} at {:+}",
                    addr.wrapping_sub(base) as i64
                );
                if let Ok(old) = r {
                    assert_eq!(old, model_word(&model, idx, width));
                    let mask = if width == 8 { u64::MAX } else { u64::from(u32::MAX) };
                    let (v, c) = (operand & mask, compare & mask);
                    let new = match aop {
                        AtomicOp::Add => old.wrapping_add(v) & mask,
                        AtomicOp::And => old & v,
                        AtomicOp::Or => old | v,
                        AtomicOp::Xor => old ^ v,
                        AtomicOp::Swap => v,
                        AtomicOp::Cswap => {
                            if old == c {
                                v
                            } else {
                                old
                            }
                        }
                    };
                    model[idx..idx + width].copy_from_slice(&new.to_le_bytes()[..width]);
                }
            }
        }
    }
    t.deregister(live).expect("registered");
    let got: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(
        got, model,
        "memory differs from the model (guard bytes or a refused access)"
    );
}

fn in_region_len(addr: u64, n: usize, base: u64) -> bool {
    addr >= base && addr.checked_add(n as u64).is_some_and(|e| e <= base + LEN as u64)
}

fn model_word(model: &[u8], idx: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = model.get(idx..idx.wrapping_add(width)) {
        b[..width].copy_from_slice(s);
    }
    u64::from_le_bytes(b)
}

fn packed_key(t: &RegionTable, memh: usize) -> u64 {
    let mut p = [0u8; PACKED_RKEY_LEN];
    t.pack(memh, &mut p).expect("registered");
    RegionTable::unpack(&p).expect("packed rkey")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::XorShift;

    /// A request that mostly lands in or near the region, with put data.
    fn request(rng: &mut XorShift, out: &mut Vec<u8>) {
        let op = rng.next_u64() as u8;
        let off = (rng.below(112) as i16 - 24).to_le_bytes();
        let len = [1, 4, 8, 16, 64, 65][rng.below(6)] as u8;
        // mostly the live key (choice 0), sometimes a stale or a corrupted one
        let k = if rng.below(4) == 0 {
            rng.next_u64() as u8
        } else {
            0
        };
        out.extend_from_slice(&[op, k, off[0], off[1], len]);
        if op.is_multiple_of(4) {
            out.extend((0..len).map(|_| rng.next_u64() as u8));
        }
    }

    #[test]
    fn fuzz_body_rkey_table_seeded() {
        let mut rng = XorShift::new(0x5eed);
        for _ in 0..3000 {
            let mut input = vec![rng.next_u64() as u8];
            for _ in 0..rng.below(12) {
                request(&mut rng, &mut input);
            }
            // sometimes random bytes, a flip or a cut
            if rng.below(4) == 0 {
                let n = rng.below(64);
                input.extend((0..n).map(|_| rng.next_u64() as u8));
            }
            if !input.is_empty() && rng.below(3) == 0 {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            if rng.below(4) == 0 {
                input.truncate(rng.below(input.len() + 1));
            }
            rkey_table(&input);
        }
    }

    #[test]
    fn fuzz_body_rkey_table_edges() {
        rkey_table(&[]);
        rkey_table(&[7; PACKED_RKEY_LEN - 1]);
        // full rights; a put that ends exactly at the region's end, one that crosses it
        let mut v = vec![7, 0, 0, 56, 0, 8];
        v.extend([1u8; 8]);
        v.extend([0, 0, 57, 0, 8]);
        v.extend([2u8; 8]);
        rkey_table(&v);
    }
}
