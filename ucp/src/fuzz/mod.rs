//! Fuzz bodies for UCP's message parsers (the cargo-fuzz targets in `fuzz/` and the seeded
//! tests below call them): decoding never panics, errors carry a message, and what decodes
//! re-encodes to the same bytes (every format is canonical).
#![doc(hidden)]

mod frames;

pub use frames::fuzz_frames;

use ucs::Status;

use crate::wire;
#[cfg(test)]
use crate::wire::{AmHeader, ReplyTo};

fn check_error(e: &ucs::Error) {
    assert!(
        matches!(e.status(), Status::InvalidParam | Status::Unsupported),
        "unexpected status {e}"
    );
    assert!(
        e.context().is_some_and(|c| !c.is_empty()),
        "an error without a message"
    );
}

/// Target `ucp_am`: the first byte picks the message kind (single, first fragment, later
/// fragment, rendezvous RTS, ATS, RTR, DATA, tag eager, tag sync, tag first fragment, tag sync
/// acknowledgement, tag RTS, stream), the rest is the message.
pub fn fuzz_am(data: &[u8]) {
    let Some((&kind, b)) = data.split_first() else {
        return;
    };
    let kind = kind % 13;
    if kind == 12 {
        return match crate::stream::decode(b) {
            Ok((worker, ep, d)) => {
                assert_eq!([&worker.to_le_bytes()[..], &ep.to_le_bytes()[..], d].concat(), b)
            }
            Err(e) => check_error(&e),
        };
    }
    if kind >= 7 {
        return fuzz_tag(kind, b);
    }
    if kind >= 3 {
        return fuzz_rndv(kind, b);
    }
    match kind {
        0 => match wire::decode_single(b) {
            Ok(s) => {
                let mut p = [0u8; 24];
                let n = wire::put_single_prefix(&mut p, s.hdr, s.reply);
                assert_eq!([&p[..n], s.user_hdr, s.data].concat(), b);
            }
            Err(e) => check_error(&e),
        },
        // As the receiver decodes: from the message's head and its length.
        1 => match wire::decode_first_head(&b[..b.len().min(wire::FIRST_HEAD_LEN)], b.len()) {
            Ok(f) => {
                assert!((b.len() - f.data_at) as u64 <= f.total);
                assert!(f.user_hdr_at <= f.data_at && f.data_at <= b.len());
                let mut p = [0u8; 40];
                let n = wire::put_first_prefix(&mut p, f.hdr, f.worker, f.msg_id, f.total, f.reply_ep);
                assert_eq!((n, &p[..n]), (f.user_hdr_at, &b[..n]));
            }
            Err(e) => check_error(&e),
        },
        _ => match wire::decode_middle(b) {
            Ok(m) => {
                let mut p = [0u8; wire::MIDDLE_PREFIX_LEN];
                wire::put_middle_prefix(&mut p, m.worker, m.msg_id, m.offset);
                assert_eq!([&p[..], m.data].concat(), b);
            }
            Err(e) => check_error(&e),
        },
    }
}

fn fuzz_rndv(kind: u8, b: &[u8]) {
    use crate::rndv::wire as rw;
    match kind {
        3 => match rw::decode_rts(b) {
            Ok(r) => assert_eq!(r.encode(), b),
            Err(e) => check_error(&e),
        },
        4 => match rw::decode_ats(b) {
            Ok(a) => {
                // Unknown error codes decode to a known one: compare what is canonical.
                let again = rw::decode_ats(&a.encode()).expect("re-encoded ATS decodes");
                assert_eq!(again, a);
            }
            Err(e) => check_error(&e),
        },
        5 => match rw::decode_rtr(b) {
            Ok(r) => assert_eq!(r.encode(), b),
            Err(e) => check_error(&e),
        },
        _ => match rw::decode_data(b) {
            Ok(d) => {
                let mut p = [0u8; rw::DATA_PREFIX_LEN];
                rw::put_data_prefix(&mut p, d.recv_id, d.worker, d.offset);
                assert_eq!([&p[..], d.data].concat(), b);
            }
            Err(e) => check_error(&e),
        },
    }
}

fn fuzz_tag(kind: u8, b: &[u8]) {
    use crate::tag::wire as tw;
    match kind {
        7 => match tw::decode_eager(b) {
            Ok((tag, d)) => assert_eq!([&tag.to_le_bytes()[..], d].concat(), b),
            Err(e) => check_error(&e),
        },
        8 => match tw::decode_sync(b) {
            Ok((tag, from, d)) => {
                let mut p = [0u8; tw::SYNC_LEN];
                tw::put_sync_prefix(&mut p, tag, from);
                assert_eq!([&p[..], d].concat(), b);
            }
            Err(e) => check_error(&e),
        },
        9 => match tw::decode_first_head(&b[..b.len().min(tw::FIRST_LEN)], b.len()) {
            Ok(f) => {
                assert!((b.len() - tw::FIRST_LEN) as u64 <= f.total);
                assert_eq!(f.prefix(), b[..tw::FIRST_LEN]);
            }
            Err(e) => check_error(&e),
        },
        10 => match tw::decode_ack(b) {
            Ok((req, worker)) => assert_eq!(tw::encode_ack(req, worker), b),
            Err(e) => check_error(&e),
        },
        _ => match crate::rndv::wire::decode_tag_rts(b) {
            Ok(r) => {
                assert!(r.user_hdr.is_empty());
                assert_eq!(r.encode(), b);
            }
            Err(e) => check_error(&e),
        },
    }
}

/// Target `ucp_wireup`: a wireup message (REQUEST / REPLY / ACK).
pub fn fuzz_wireup(data: &[u8]) {
    match crate::wireup::Msg::decode(data) {
        Ok(m) => assert_eq!(m.encode(), data, "re-encoding changed the bytes"),
        Err(e) => check_error(&e),
    }
}

/// Target `ucp_cm`: a connection-manager message, read whole and streamed in pieces (the first
/// byte picks the piece sizes).
pub fn fuzz_cm(data: &[u8]) {
    crate::cm::wire::fuzz_cm(data);
}

/// Target `ucp_rkey`: a packed remote key ([`crate::MemHandle::rkey_pack`]).
pub fn fuzz_rkey(data: &[u8]) {
    match crate::rma::rkey::PackedRkey::decode(data) {
        Ok(k) => assert_eq!(k.encode(), data, "re-encoding changed the bytes"),
        Err(e) => check_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64, so the seeded inputs never change.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Valid messages of each kind, then each with bytes flipped, cut and extended.
    fn seeds() -> Vec<Vec<u8>> {
        let hdr = |flags, uh| AmHeader {
            id: 7,
            flags,
            user_hdr_len: uh,
        };
        let mut out = Vec::new();
        for reply in [None, Some(ReplyTo { worker: 1, ep: 2 })] {
            let mut p = [0u8; 24];
            let n = wire::put_single_prefix(&mut p, hdr(u8::from(reply.is_some()), 3), reply);
            out.push([&[0u8][..], &p[..n], b"hdrdata"].concat());
        }
        for reply in [None, Some(9)] {
            let mut p = [0u8; 40];
            let n = wire::put_first_prefix(&mut p, hdr(u8::from(reply.is_some()), 2), 5, 6, 100, reply);
            out.push([&[1u8][..], &p[..n], b"hhfirst"].concat());
        }
        let mut p = [0u8; wire::MIDDLE_PREFIX_LEN];
        wire::put_middle_prefix(&mut p, 5, 6, 5);
        out.push([&[2u8][..], &p[..], b"middle"].concat());
        let rts = |word, user_hdr: &'static [u8]| crate::rndv::wire::Rts {
            word,
            worker: 1,
            ep: 2,
            rndv_id: 3,
            total: 4096,
            addr: 0x1000,
            resource: 0,
            rkey: b"key",
            user_hdr,
        };
        out.push([&[3u8][..], &rts(hdr(0, 2).word(), b"hh").encode()].concat());
        let ats = crate::rndv::wire::Ats {
            rndv_id: 3,
            worker: 1,
            status: Status::Ok,
        };
        out.push([&[4u8][..], &ats.encode()].concat());
        let rtr = crate::rndv::wire::Rtr {
            rndv_id: 3,
            recv_id: 4,
            worker: 1,
        };
        out.push([&[5u8][..], &rtr.encode()].concat());
        let mut d = [0u8; crate::rndv::wire::DATA_PREFIX_LEN];
        crate::rndv::wire::put_data_prefix(&mut d, 4, 1, 0);
        out.push([&[6u8][..], &d[..], b"data"].concat());
        out.push([&[7u8][..], &42u64.to_le_bytes()[..], b"tagged"].concat());
        let from = crate::tag::wire::SyncFrom {
            worker: 1,
            ep: 2,
            req: 3,
        };
        let mut sp = [0u8; crate::tag::wire::SYNC_LEN];
        crate::tag::wire::put_sync_prefix(&mut sp, 42, from);
        out.push([&[8u8][..], &sp[..], b"sync"].concat());
        let f = crate::tag::wire::First {
            tag: 42,
            worker: 1,
            msg_id: 2,
            total: 100,
            req: 3,
            ep: 4,
            data: b"",
        };
        out.push([&[9u8][..], &f.prefix()[..], b"first"].concat());
        out.push([&[10u8][..], &crate::tag::wire::encode_ack(3, 1)[..]].concat());
        out.push([&[11u8][..], &rts(42, b"").encode()].concat());
        out.push([&[12u8][..], &[1u8; 16][..], b"stream"].concat());
        out
    }

    #[test]
    fn am_seeds_and_mutations() {
        let mut r = rng(0x9e37_79b9_7f4a_7c15);
        for s in seeds() {
            fuzz_am(&s);
            for _ in 0..2000 {
                let mut m = s.clone();
                match r() % 3 {
                    0 => {
                        let i = 1 + (r() as usize) % (m.len() - 1);
                        m[i] ^= 1 << (r() % 8);
                    }
                    1 => m.truncate(1 + (r() as usize) % m.len()),
                    _ => m.extend((0..r() % 16).map(|_| r() as u8)),
                }
                fuzz_am(&m);
            }
        }
        fuzz_am(&[]);
    }

    #[test]
    fn unknown_flags_and_reserved_bits_are_refused() {
        let mut m = seeds()[0][1..].to_vec();
        m[2] |= 0x80;
        assert_eq!(wire::decode_single(&m).unwrap_err(), Status::InvalidParam);
        let mut m = seeds()[0][1..].to_vec();
        m[3] = 1;
        assert_eq!(wire::decode_single(&m).unwrap_err(), Status::InvalidParam);
    }

    #[test]
    fn rkey_seeds_and_mutations() {
        use crate::rma::rkey::{PackedRkey, RkeyEntry};
        let s = PackedRkey {
            worker: 7,
            addr: 0x1000,
            len: 64,
            entries: vec![
                RkeyEntry {
                    resource: 0,
                    component: "tcp".into(),
                    key: vec![1; 16],
                },
                RkeyEntry {
                    resource: 3,
                    component: "ib".into(),
                    key: vec![2; 12],
                },
            ],
        }
        .encode();
        fuzz_rkey(&s);
        let mut r = rng(0x7f4a_7c15_9e37_79b9);
        for _ in 0..5000 {
            let mut m = s.clone();
            match r() % 3 {
                0 => {
                    let i = (r() as usize) % m.len();
                    m[i] ^= 1 << (r() % 8);
                }
                1 => m.truncate((r() as usize) % m.len()),
                _ => m.extend((0..r() % 16).map(|_| r() as u8)),
            }
            fuzz_rkey(&m);
        }
    }

    #[test]
    fn wireup_seeds_and_mutations() {
        use crate::wireup::{LaneAddr, Msg};
        let msg = Msg {
            flags: 1,
            kind: 1,
            src_worker: 11,
            src_ep: 12,
            dst_ep: 0,
            conn_sn: 3,
            address: b"RXWA....".to_vec(),
            lanes: vec![LaneAddr {
                sender_rsc: 1,
                receiver_rsc: 2,
                addr: vec![9; 6],
            }],
        };
        let s = msg.encode();
        fuzz_wireup(&s);
        let mut r = rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..5000 {
            let mut m = s.clone();
            match r() % 3 {
                0 => {
                    let i = (r() as usize) % m.len();
                    m[i] ^= 1 << (r() % 8);
                }
                1 => m.truncate((r() as usize) % m.len()),
                _ => m.extend((0..r() % 16).map(|_| r() as u8)),
            }
            fuzz_wireup(&m);
        }
    }
}
