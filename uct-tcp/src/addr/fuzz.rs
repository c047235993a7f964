//! Fuzz-target body `tcp_addr` (the addresses and the packed rkey a peer hands over out of
//! band), shared by the cargo-fuzz crate (`fuzz/`, through `uct_tcp::wire::fuzz::tcp_addr`) and
//! the seeded unit tests below.
#![doc(hidden)]

use std::net::IpAddr;

use uct_transport::rma::PACKED_RKEY_LEN;
use uct_transport::traits::TransportComponent;

use super::{decode_ep_addr, decode_iface_addr, encode_ep_addr, encode_iface_addr, DevAddr};
use super::{EP_ADDR_LEN, IFACE_ADDR_LEN};
use crate::md::TcpComponent;

/// Whether `b` is a well-formed device address, straight from the format (docs/wire-tcp.md §4):
/// family 4 or 6, only the loopback flag, the exact length, a unicast address that is loopback
/// exactly when the flag says so.
fn dev_addr_valid(b: &[u8]) -> bool {
    let (Some(&family), Some(&flags)) = (b.first(), b.get(1)) else {
        return false;
    };
    let lo = flags == 1;
    let ip: IpAddr = match (family, b.len().wrapping_sub(if lo { 8 } else { 0 })) {
        (4, 6) => <[u8; 4]>::try_from(&b[2..6]).expect("4 bytes").into(),
        (6, 18) => <[u8; 16]>::try_from(&b[2..18]).expect("16 bytes").into(),
        _ => return false,
    };
    flags <= 1 && !ip.is_unspecified() && !ip.is_multicast() && ip.is_loopback() == lo
}

/// Fuzz body `tcp_addr`: every decoder accepts exactly the well-formed encodings, and what it
/// accepts re-encodes to the same bytes (all three address formats are canonical).
pub fn tcp_addr(data: &[u8]) {
    let dev = DevAddr::decode(data);
    assert_eq!(dev.is_some(), dev_addr_valid(data), "device address {data:02x?}");
    if let Some(a) = dev {
        assert_eq!(a.len(), data.len());
        let mut out = vec![0u8; a.len()];
        a.encode(&mut out).expect("room for len()");
        assert_eq!(out, data);
        assert!(a.reaches(&a));
        let s = a.socket_addr(1, 7);
        assert_eq!((s.ip(), s.port()), (a.ip, 1));
        assert_eq!(a.order_key().0, if a.ip.is_ipv4() { 4 } else { 6 });
    }

    let iface = decode_iface_addr(data);
    let want =
        (data.len() == IFACE_ADDR_LEN && data != [0, 0]).then(|| u16::from_le_bytes([data[0], data[1]]));
    assert_eq!(iface, want);
    if let Some(port) = iface {
        let mut out = [0u8; IFACE_ADDR_LEN];
        encode_iface_addr(port, &mut out).expect("room");
        assert_eq!(out[..], *data);
    }

    let ep = decode_ep_addr(data);
    let valid = data.len() == EP_ADDR_LEN && data[..2] != [0, 0] && data[2..] != [0; 8];
    assert_eq!(ep.is_some(), valid);
    if let Some((port, key)) = ep {
        let mut out = [0u8; EP_ADDR_LEN];
        encode_ep_addr(port, key, &mut out).expect("room");
        assert_eq!(out[..], *data);
    }

    match TcpComponent::rkey_unpack(data) {
        Ok((key, handle)) => {
            assert!(data.len() >= PACKED_RKEY_LEN);
            assert_eq!((&key.to_le_bytes()[..], handle), (&data[..8], 0));
        }
        Err(_) => assert!(data.len() < PACKED_RKEY_LEN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fuzz::XorShift;

    fn enc(a: DevAddr) -> Vec<u8> {
        let mut b = vec![0u8; a.len()];
        a.encode(&mut b).unwrap();
        b
    }

    #[test]
    fn fuzz_body_tcp_addr_seeded() {
        let dev = |ip: &str, loopback, domain| DevAddr {
            ip: ip.parse().unwrap(),
            loopback,
            domain,
        };
        let mut ep = [0u8; EP_ADDR_LEN];
        encode_ep_addr(13337, 0x1122_3344_5566_7788, &mut ep).unwrap();
        let mut rkey = vec![0u8; PACKED_RKEY_LEN];
        rkey[..8].copy_from_slice(&0x0000_0001_dead_beefu64.to_le_bytes());
        let valid = [
            enc(dev("10.1.2.3", false, 0)),
            enc(dev("127.0.0.1", true, 0x0123_4567_89ab_cdef)),
            enc(dev("fe80::1", false, 0)),
            enc(dev("::1", true, 9)),
            enc(dev("2001:db8::7", false, 0)),
            vec![0x39, 0x05],
            ep.to_vec(),
            rkey,
        ];
        for v in &valid {
            tcp_addr(v);
        }
        let mut rng = XorShift::new(0xadd7);
        for i in 0..4000 {
            let mut v = valid[i % valid.len()].clone();
            match rng.below(5) {
                0 => v = (0..rng.below(32)).map(|_| rng.next_u64() as u8).collect(),
                1 => v.truncate(rng.below(v.len() + 1)),
                2 => v.extend((0..1 + rng.below(9)).map(|_| rng.next_u64() as u8)),
                _ => {}
            }
            for _ in 0..rng.below(3) {
                if !v.is_empty() {
                    let j = rng.below(v.len());
                    // small values too, so family/flag bytes hit their valid values
                    v[j] = if rng.below(2) == 0 {
                        rng.below(8) as u8
                    } else {
                        rng.next_u64() as u8
                    };
                }
            }
            tcp_addr(&v);
        }
    }
}
