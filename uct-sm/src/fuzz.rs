//! Fuzz-target bodies for what a peer on the same host controls, shared by the cargo-fuzz crate
//! (`fuzz/`) and the seeded unit tests below, so stable CI runs the same checks.
//!
//! * `sm_fifo`: a receive FIFO whose element area a hostile peer overwrote with `data`: the
//!   receiver's reads over two rounds report only ids and lengths the format allows and copy at
//!   most an element's payload; and a peer's segment whose header is `data`, which opens only
//!   when its shape fits the mapping.
//! * `sm_addr`: an interface address and a cma packed rkey, as a peer hands them over.
//!
//! Not part of the transport API (allocation is fine here).
#![doc(hidden)]

use uct_transport::traits::TransportComponent;
use uct_transport::types::AM_ID_MAX;

use crate::addr::{MmAddr, MM_ADDR_LEN};
use crate::fifo::{Fifo, Peek, HDR_LEN};
use crate::sys::{anon_mapping, page_align};

const COUNT: u64 = 8;
const ELEM: usize = 128;

/// Reads every element of `f` over two rounds as the receiver does.
fn drain(f: &Fifo) {
    for idx in 0..2 * f.count() {
        match f.peek(idx) {
            Peek::Msg { id, len } => {
                assert!(id < AM_ID_MAX, "id {id} passed");
                assert!(len <= f.payload_cap(), "length {len} passed");
                let mut dst = vec![0u8; len];
                f.copy_out(idx, &mut dst);
            }
            Peek::Empty | Peek::Skip | Peek::Corrupt(_) => {}
        }
    }
}

/// Fuzz body `sm_fifo`.
pub fn sm_fifo(data: &[u8]) {
    // Our own FIFO, its elements overwritten by the peer.
    let len = page_align(HDR_LEN + COUNT as usize * ELEM);
    let Ok(map) = anon_mapping(len) else { return };
    let Ok(f) = Fifo::init(map, COUNT, ELEM, 7) else {
        return;
    };
    for off in (HDR_LEN..len).step_by(data.len().max(1)) {
        f.scribble(off, data);
    }
    drain(&f);
    // A peer's segment: its header (and everything after) is `data`.
    let seg = page_align(data.len().max(HDR_LEN));
    let Ok(map) = anon_mapping(seg) else { return };
    let nonce = data
        .get(8..16)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let probe = match Fifo::init(map, 1, 64, 0) {
        Ok(p) => p,
        Err(_) => return,
    };
    probe.scribble(0, data);
    let map = probe.into_mapping();
    if let Ok(peer) = Fifo::open(map, nonce) {
        assert!(HDR_LEN as u64 + peer.count() * peer.payload_cap() as u64 <= seg as u64);
        drain(&peer);
    }
}

/// Fuzz body `sm_addr`.
pub fn sm_addr(data: &[u8]) {
    if let Some(a) = MmAddr::unpack(data) {
        let mut b = [0u8; MM_ADDR_LEN];
        a.pack(&mut b).expect("room for the address");
        assert_eq!(&b[..], data, "the address round-trips");
    }
    if let Ok((rkey, handle)) = crate::cma::CmaComponent::rkey_unpack(data) {
        crate::cma::CmaComponent::rkey_release(rkey, handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_transport::rng::XorShift;

    fn mutate(rng: &mut XorShift, valid: &[u8], max_len: usize) -> Vec<u8> {
        let mut v = if rng.below(4) == 0 {
            (0..rng.below(max_len)).map(|_| rng.next_u64() as u8).collect()
        } else {
            valid.to_vec()
        };
        for _ in 0..rng.below(6) {
            if !v.is_empty() {
                let i = rng.below(v.len());
                v[i] = match rng.below(3) {
                    0 => rng.below(4) as u8,
                    1 => [0u8, 1, 2, 3, 63, 64, 127, 128, 255][rng.below(9)],
                    _ => rng.next_u64() as u8,
                };
            }
        }
        if rng.below(4) == 0 {
            v.truncate(rng.below(v.len() + 1));
        }
        v
    }

    /// An element as a sender writes it: flags, id, length, payload.
    fn element(owner: u32, id: u8, len: u32) -> Vec<u8> {
        let mut e = vec![0u8; ELEM];
        e[..4].copy_from_slice(&owner.to_le_bytes());
        e[4] = id;
        e[8..12].copy_from_slice(&len.to_le_bytes());
        e
    }

    #[test]
    fn fuzz_body_sm_fifo_seeded() {
        let mut header = b"RUCXSMF1".to_vec();
        header.extend_from_slice(&9u64.to_le_bytes());
        header.extend_from_slice(&8u32.to_le_bytes());
        header.extend_from_slice(&128u32.to_le_bytes());
        header.resize(HDR_LEN, 0);
        let valid = [element(0, 3, 5), element(0, 40, 9), element(1, 1, 4000), header];
        let mut rng = XorShift::new(0x5f1f0);
        for i in 0..600 {
            sm_fifo(&mutate(&mut rng, &valid[i % valid.len()], 300));
        }
    }

    #[test]
    fn fuzz_body_sm_addr_seeded() {
        let mut a = [0u8; MM_ADDR_LEN];
        MmAddr {
            pid: 7,
            seg_id: 1,
            seg_len: 4096,
            nonce: 5,
            proc_link: true,
        }
        .pack(&mut a)
        .unwrap();
        let mut rkey = vec![0u8; 24];
        rkey[..4].copy_from_slice(&1u32.to_le_bytes());
        rkey[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let valid = [a.to_vec(), rkey];
        let mut rng = XorShift::new(0xadd7);
        for i in 0..5000 {
            sm_addr(&mutate(&mut rng, &valid[i % valid.len()], 40));
        }
    }
}
