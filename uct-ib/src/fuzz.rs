//! Fuzz-target bodies for the ib wire formats, shared by the cargo-fuzz crate (`fuzz/`) and by
//! the seeded unit tests below, so stable CI runs the same checks without a nightly toolchain.
//!
//! * `ud_packet`: a received UD packet (header, then a connection request or reply body, whose
//!   device address is unpacked too), as `ud::recv` takes it apart.
//! * `ib_addr`: what a peer hands over out of band: device address, packed rkey, rc and ud
//!   endpoint/interface addresses, and the rc AM header byte.
//!
//! Not part of the transport API (allocation is fine here).
#![doc(hidden)]

use ucs::Status;
use uct_transport::rng::XorShift;

use crate::device::{DeviceAddr, DEV_ADDR_LEN};
use crate::md::{pack_rkey, unpack_rkey, RKEY_PACKED_LEN};
use crate::rc::wire as rc;
use crate::ud::wire::{
    get_u24, put_u24, restamp, Crep, Creq, Header, Kind, WireError, EP_ADDR_LEN, HDR_LEN, ID_MASK,
    MAX_DEV_ADDR, VERSION,
};
use uct_ib_verbs::{AccessFlags, Gid};

/// Fuzz body `ud_packet`: `Header::decode` refuses exactly what the format forbids, with the
/// first reason; a decoded header re-encodes to the same bytes except the reserved top byte of
/// `dest_ep`; the body of a connection request / reply decodes the same way and round-trips.
pub fn ud_packet(data: &[u8]) {
    let hdr = match Header::decode(data) {
        Ok(h) => h,
        Err(e) => {
            let want = if data.len() < HDR_LEN {
                WireError::Short
            } else if data[0] != VERSION {
                WireError::Version(data[0])
            } else if !(1..=5).contains(&data[1]) {
                WireError::Kind(data[1])
            } else {
                assert_eq!(data[1], Kind::Am as u8, "{e:?} for a valid control header");
                WireError::AmId(data[2])
            };
            assert_eq!(e, want);
            return;
        }
    };
    assert!(data.len() >= HDR_LEN && data[0] == VERSION);
    assert!(hdr.kind != Kind::Am || hdr.am_id < uct_transport::types::AM_ID_MAX);
    assert!(hdr.dest_ep <= ID_MASK);
    let mut want = [0u8; HDR_LEN];
    want.copy_from_slice(&data[..HDR_LEN]);
    want[7] = 0; // ids are 24 bits; the top byte is ignored
    let bytes = hdr.to_bytes();
    assert_eq!(bytes, want);
    assert_eq!(Header::decode(&bytes), Ok(hdr));
    assert_eq!(hdr.ack_req(), data[3] & 1 != 0);
    // A resend stamps a new ack and flags into the header and changes nothing else.
    let mut re = bytes;
    restamp(&mut re, hdr.ack_psn.wrapping_add(1), hdr.flags ^ 1);
    let h2 = Header::decode(&re).expect("restamped header");
    assert_eq!(
        (h2.ack_psn, h2.flags),
        (hdr.ack_psn.wrapping_add(1), hdr.flags ^ 1)
    );
    assert_eq!(
        Header {
            ack_psn: hdr.ack_psn,
            flags: hdr.flags,
            ..h2
        },
        hdr
    );

    let body = &data[HDR_LEN..];
    match hdr.kind {
        Kind::Creq => creq(body),
        Kind::Crep => match Crep::decode(body) {
            Ok(c) => {
                assert!(body.len() >= Crep::LEN);
                assert_eq!(c.to_bytes()[..3], body[..3]);
                assert_eq!(Crep::decode(&c.to_bytes()), Ok(c));
            }
            Err(e) => assert!(body.len() < Crep::LEN && e == WireError::Body),
        },
        Kind::Am | Kind::Ack | Kind::Disc => {}
    }
}

fn creq(body: &[u8]) {
    let n = body.get(8).map(|&n| usize::from(n));
    match Creq::decode(body) {
        Ok(c) => {
            let n = n.expect("length byte");
            assert!(n <= MAX_DEV_ADDR && body.len() >= 9 + n && c.dev_addr.len() == n);
            assert_eq!(c.len(), 9 + n);
            let mut out = vec![0u8; c.len()];
            assert_eq!(c.encode(&mut out), c.len());
            let mut want = body[..c.len()].to_vec();
            want[3] = 0; // 24-bit ids
            want[7] = 0;
            assert_eq!(out, want);
            assert_eq!(Creq::decode(&out), Ok(c));
            // `ud::recv` takes only a full ib device address from here.
            if n == DEV_ADDR_LEN {
                device_addr(c.dev_addr);
            }
        }
        Err(e) => {
            assert_eq!(e, WireError::Body);
            assert!(n.is_none_or(|n| n > MAX_DEV_ADDR || body.len() < 9 + n));
        }
    }
}

/// `DeviceAddr::unpack`: accepts version 1 with at least [`DEV_ADDR_LEN`] bytes; the result
/// packs back to the same address (unknown flag bits and a GID without the GID flag are not
/// kept), and to the same bytes when there were none of those.
fn device_addr(data: &[u8]) {
    match DeviceAddr::unpack(data) {
        Ok(a) => {
            assert!(data.len() >= DEV_ADDR_LEN && data[0] == 1);
            let mut out = [0u8; DEV_ADDR_LEN];
            a.pack(&mut out).expect("room");
            assert_eq!(DeviceAddr::unpack(&out), Ok(a));
            assert_eq!(a.lid.to_le_bytes(), data[2..4]);
            assert_eq!(a.eth, data[1] & 1 != 0);
            let gid: [u8; 16] = data[4..20].try_into().expect("16 bytes");
            assert_eq!(a.gid.map(|g| g.0), (data[1] & 2 != 0).then_some(gid));
            let gid_bytes_kept = data[1] & 2 != 0 || data[4..20] == Gid::ZERO.0;
            if data[1] & !3 == 0 && gid_bytes_kept {
                assert_eq!(out[..], data[..DEV_ADDR_LEN]);
            }
        }
        Err(e) => {
            assert_eq!(e, Status::InvalidAddr);
            assert!(data.len() < DEV_ADDR_LEN || data[0] != 1);
        }
    }
}

/// Fuzz body `ib_addr`: each out-of-band format parsed from the same bytes, with the
/// acceptance rule and round trip of each.
pub fn ib_addr(data: &[u8]) {
    device_addr(data);

    match unpack_rkey(data) {
        Ok(rkey) => {
            assert!(data.len() >= RKEY_PACKED_LEN && data[0] == 1);
            assert_eq!(rkey.to_le_bytes(), data[4..8]);
            let mut access = AccessFlags::NONE;
            for (bit, f) in [
                (1, AccessFlags::REMOTE_WRITE),
                (2, AccessFlags::REMOTE_READ),
                (4, AccessFlags::REMOTE_ATOMIC),
            ] {
                if data[1] & bit != 0 {
                    access = access | f;
                }
            }
            let mut out = [0u8; RKEY_PACKED_LEN];
            pack_rkey(rkey, access, &mut out).expect("room");
            assert_eq!(unpack_rkey(&out), Ok(rkey));
            if data[1] <= 7 && data[2..4] == [0, 0] {
                assert_eq!(out[..], data[..RKEY_PACKED_LEN]);
            }
        }
        Err(e) => {
            assert_eq!(e, Status::InvalidParam);
            assert!(data.len() < RKEY_PACKED_LEN || data[0] != 1);
        }
    }

    match rc::unpack_ep_addr(data) {
        Ok(qpn) => {
            assert!(data.len() >= rc::EP_ADDR_LEN && data[0] == 1 && qpn <= ID_MASK);
            let mut out = [0u8; rc::EP_ADDR_LEN];
            rc::pack_ep_addr(qpn, &mut out).expect("room");
            assert_eq!(out[..], data[..rc::EP_ADDR_LEN]);
        }
        Err(e) => {
            assert_eq!(e, Status::InvalidAddr);
            assert!(data.len() < rc::EP_ADDR_LEN || data[0] != 1);
        }
    }

    if let Some(&b) = data.first() {
        let (id, flags) = rc::parse_am_hdr(b);
        assert!(id < uct_transport::types::AM_ID_MAX);
        assert_eq!(rc::am_hdr(id, flags), b);
    }

    // ud interface address (the QP number) and endpoint address (QP number, ep id), read the
    // way `ud::conn` reads them.
    let qpn = get_u24(data);
    assert_eq!(qpn.is_some(), data.len() >= 3);
    let ep = data.get(3..EP_ADDR_LEN).and_then(get_u24);
    assert_eq!(qpn.is_some() && ep.is_some(), data.len() >= EP_ADDR_LEN);
    for (v, at) in [(qpn, 0), (ep, 3)] {
        if let Some(v) = v {
            assert!(v <= ID_MASK);
            let mut out = [0u8; 3];
            put_u24(&mut out, v);
            assert_eq!(out[..], data[at..at + 3]);
        }
    }
}

/// Random bytes, or `valid` with a few bytes changed (often to small or boundary values, so
/// version, kind, id and length bytes hit both sides of their limits), maybe cut or extended.
pub fn mutate(rng: &mut XorShift, valid: &[u8], max_len: usize) -> Vec<u8> {
    const EDGES: [u8; 12] = [0, 1, 2, 5, 6, 19, 20, 31, 32, 64, 65, 255];
    let mut v = if rng.below(5) == 0 {
        (0..rng.below(max_len)).map(|_| rng.next_u64() as u8).collect()
    } else {
        valid.to_vec()
    };
    for _ in 0..rng.below(4) {
        if !v.is_empty() {
            let i = rng.below(v.len());
            v[i] = match rng.below(3) {
                0 => rng.below(8) as u8,
                1 => EDGES[rng.below(EDGES.len())],
                _ => rng.next_u64() as u8,
            };
        }
    }
    match rng.below(4) {
        0 => v.truncate(rng.below(v.len() + 1)),
        1 => v.extend((0..1 + rng.below(8)).map(|_| rng.next_u64() as u8)),
        _ => {}
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev_addr(gid: bool) -> [u8; DEV_ADDR_LEN] {
        let a = DeviceAddr {
            eth: gid,
            lid: 0x1234,
            gid: gid.then_some(Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])),
        };
        let mut b = [0u8; DEV_ADDR_LEN];
        a.pack(&mut b).unwrap();
        b
    }

    fn packet(kind: Kind, am_id: u8, body: &[u8]) -> Vec<u8> {
        let h = Header {
            kind,
            am_id,
            flags: 1,
            dest_ep: 0x12_3456,
            psn: 0xbeef,
            ack_psn: 7,
        };
        let mut p = h.to_bytes().to_vec();
        p.extend_from_slice(body);
        p
    }

    #[test]
    fn fuzz_body_ud_packet_seeded() {
        let dev = dev_addr(true);
        let mut creq = [0u8; 64];
        let n = Creq {
            src_ep: 5,
            src_qpn: 0xab_cdef,
            dev_addr: &dev,
        }
        .encode(&mut creq);
        let mut big = [0u8; 9 + MAX_DEV_ADDR];
        let m = Creq {
            src_ep: 0xff_ffff,
            src_qpn: 1,
            dev_addr: &[7; MAX_DEV_ADDR],
        }
        .encode(&mut big);
        let valid = [
            packet(Kind::Am, 3, b"hello"),
            packet(Kind::Am, 31, b""),
            packet(Kind::Ack, 0, b""),
            packet(Kind::Creq, 0, &creq[..n]),
            packet(Kind::Creq, 0, &big[..m]),
            packet(Kind::Crep, 0, &Crep { src_ep: 9 }.to_bytes()),
            packet(Kind::Disc, 0, b""),
        ];
        let mut rng = XorShift::new(0x0d9a);
        for i in 0..7000 {
            ud_packet(&mutate(&mut rng, &valid[i % valid.len()], 96));
        }
        for v in &valid {
            ud_packet(v);
        }
        // every length byte around the limits, with one byte too few, exactly enough, one more
        for n in [0, 1, 19, 20, 21, 63, 64, 65, 66, 255] {
            for extra in [-1, 0, 1] {
                let mut body = vec![1, 0, 0, 0, 2, 0, 0, 0, n as u8];
                body.resize((9 + n as isize + extra) as usize, 1);
                ud_packet(&packet(Kind::Creq, 0, &body));
            }
        }
    }

    #[test]
    fn fuzz_body_ib_addr_seeded() {
        let mut rkey = [0u8; RKEY_PACKED_LEN];
        pack_rkey(0xdead_beef, AccessFlags::ALL_REMOTE, &mut rkey).unwrap();
        let mut rc_ep = [0u8; rc::EP_ADDR_LEN];
        rc::pack_ep_addr(0xab_cdef, &mut rc_ep).unwrap();
        let valid: [&[u8]; 5] = [
            &dev_addr(true),
            &dev_addr(false),
            &rkey,
            &rc_ep,
            &[0x56, 0x34, 0x12, 9, 0, 0],
        ];
        let mut rng = XorShift::new(0x1bad);
        for i in 0..5000 {
            ib_addr(&mutate(&mut rng, valid[i % valid.len()], 32));
        }
        for v in valid {
            ib_addr(v);
        }
    }
}
