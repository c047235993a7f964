//! Fuzz-target bodies for what arrives from the network, shared by the cargo-fuzz crate
//! (`fuzz/`) and the seeded unit tests below.
//!
//! * `ofi_wire`: a received message's AM header (`wire::parse`) and a peer's packed rkey
//!   (`md::unpack`): refused exactly when the format forbids, and what decodes re-encodes to
//!   the same value.
//!
//! Not part of the transport API (allocation is fine here).
#![doc(hidden)]

use uct_transport::types::AM_ID_MAX;

use crate::md::{pack, unpack};
use crate::wire::{parse, Bad, HDR_LEN};

/// Fuzz body `ofi_wire`.
pub fn ofi_wire(data: &[u8]) {
    match parse(data) {
        Ok((id, rest)) => {
            assert!(id < AM_ID_MAX);
            assert_eq!(rest, &data[HDR_LEN..]);
            assert_eq!(data[0], id);
        }
        Err(Bad::Short(n)) => assert!(n < HDR_LEN && n == data.len()),
        Err(Bad::Magic(m)) => assert_eq!(m, data[1]),
        Err(Bad::Id(id)) => assert!(id >= AM_ID_MAX),
    }
    if let Ok(k) = unpack(data) {
        let mut b = [0u8; crate::md::RKEY_PACKED_LEN];
        pack(k, &mut b).expect("room for an rkey");
        let again = unpack(&b).expect("a packed rkey unpacks");
        assert_eq!(again, k);
        assert_eq!(b[8..], data[8..crate::md::RKEY_PACKED_LEN]);
        // the range check never panics, whatever the peer packed
        let _ = k.target(k.base.wrapping_add(data.len() as u64), data.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_transport::rng::XorShift;

    #[test]
    fn fuzz_body_ofi_wire_seeded() {
        let mut am = crate::wire::header(5).to_vec();
        am.extend_from_slice(b"payload");
        let mut rkey = [0u8; crate::md::RKEY_PACKED_LEN];
        pack(
            crate::md::RemoteKey {
                virt: true,
                key: 0x1234,
                base: 0x7f00_0000_0000,
                len: 4096,
            },
            &mut rkey,
        )
        .unwrap();
        let valid = [am, rkey.to_vec(), crate::wire::header(0).to_vec()];
        let mut rng = XorShift::new(0x0f1);
        for i in 0..5000 {
            let mut v = valid[i % valid.len()].clone();
            for _ in 0..rng.below(4) {
                if !v.is_empty() {
                    let j = rng.below(v.len());
                    v[j] = match rng.below(3) {
                        0 => rng.below(4) as u8,
                        1 => [0u8, 1, 0xf1, 31, 32, 63, 64, 255][rng.below(8)],
                        _ => rng.next_u64() as u8,
                    };
                }
            }
            if rng.below(4) == 0 {
                v.truncate(rng.below(v.len() + 1));
            }
            ofi_wire(&v);
        }
    }
}
