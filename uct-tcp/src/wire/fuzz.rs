//! Fuzz-target bodies and their helpers, shared by the cargo-fuzz crate (`fuzz/`) and by the
//! seeded unit tests below, so stable CI runs the same checks without a nightly toolchain.
//!
//! Not part of the transport API (allocation is fine here).
#![doc(hidden)]

use super::{decode_frame, decode_handshake, encode_frame, Handshake, WireError, MIN_MAX_PAYLOAD};
use crate::rx_parser::{Frame, RxParser};

/// Fuzz body `tcp_addr` (device, interface and endpoint addresses, packed rkey); it lives
/// beside the address code in `addr/fuzz.rs`.
pub use crate::addr::fuzz::tcp_addr;

/// The seeded generator of the tests and fuzz helpers (shared by every transport).
pub use uct_transport::rng::XorShift;

/// What a receiver observed, owned: a frame re-encoded to bytes, or a run of bulk data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Msg(Vec<u8>),
    Bulk(Vec<u8>),
}

/// Drains `p` into `out` as the transport does (the AM fast path `next_am` first, then
/// `next_frame`), checking bulk offsets and the `last` flag on the way.
pub fn drain(p: &mut RxParser, out: &mut Vec<Event>) {
    loop {
        if let Some((id, payload)) = p.next_am() {
            out.push(Event::Msg(reencode(&super::Msg::Am { id, payload })));
            continue;
        }
        let Some(r) = p.next_frame() else { return };
        match r {
            Ok(Frame::Msg(m)) => out.push(Event::Msg(reencode(&m))),
            Ok(Frame::Bulk { data, offset, last }) => {
                let have: usize = out
                    .iter()
                    .rev()
                    .take_while(|e| matches!(e, Event::Bulk(_)))
                    .map(|e| if let Event::Bulk(d) = e { d.len() } else { 0 })
                    .sum();
                assert_eq!(offset, have as u64, "bulk offset");
                assert!(!data.is_empty(), "empty bulk chunk");
                let d = data.to_vec();
                assert_eq!(last, p.bulk_remaining() == 0, "bulk last flag");
                out.push(Event::Bulk(d));
            }
            Err(_) => return,
        }
    }
}

/// A decoded frame's bytes, encoded again.
fn reencode(m: &super::Msg<'_>) -> Vec<u8> {
    let mut b = vec![0u8; m.encoded_len()];
    encode_frame(m, &mut b).expect("decoded frames re-encode");
    b
}

/// Merges adjacent bulk runs so differently chunked receptions compare equal.
pub fn coalesce(events: Vec<Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    for e in events {
        match (out.last_mut(), e) {
            (Some(Event::Bulk(a)), Event::Bulk(b)) => a.extend_from_slice(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

/// Reference decoding of a contiguous stream with `decode_frame` alone: the events and the
/// error that ended it (trailing incomplete bytes are not an error). Also checks that every
/// frame re-encodes to exactly its bytes (the encoding is canonical).
pub fn oracle(stream: &[u8], max_payload: u32) -> (Vec<Event>, Option<WireError>) {
    let mut ev = Vec::new();
    let mut pos = 0;
    while pos < stream.len() {
        match decode_frame(&stream[pos..], max_payload) {
            Ok((m, used)) => {
                let b = stream[pos..pos + used].to_vec();
                let mut re = vec![0u8; used];
                assert_eq!(encode_frame(&m, &mut re), Ok(used));
                assert_eq!(re, b, "canonical encoding");
                ev.push(Event::Msg(b));
                pos += used;
                let bulk = usize::try_from(m.bulk_len())
                    .unwrap_or(usize::MAX)
                    .min(stream.len() - pos);
                if bulk > 0 {
                    ev.push(Event::Bulk(stream[pos..pos + bulk].to_vec()));
                    pos += bulk;
                }
            }
            Err(WireError::Incomplete(n)) => {
                assert!(
                    n > stream.len() - pos,
                    "Incomplete({n}) with {} bytes",
                    stream.len() - pos
                );
                break;
            }
            Err(e) => return (ev, Some(e)),
        }
    }
    (ev, None)
}

/// Feeds `stream` to an [`RxParser`] in chunks drawn from `seed` (sometimes receiving bulk data
/// "directly", as a transport would into target memory), returning what the oracle returns.
pub fn run_chunked(stream: &[u8], max_payload: u32, seed: u64) -> (Vec<Event>, Option<WireError>) {
    let mut rng = XorShift::new(seed);
    let mut p = RxParser::new(max_payload);
    let cap = p.capacity();
    let mut ev = Vec::new();
    let mut pos = 0;
    while pos < stream.len() && p.error().is_none() {
        let direct = p.bulk_direct_max();
        if direct > 0 && rng.below(3) == 0 {
            let k = (1 + rng.below(2 * cap)).min(stream.len() - pos);
            let k = k.min(usize::try_from(direct).unwrap_or(usize::MAX));
            ev.push(Event::Bulk(stream[pos..pos + k].to_vec()));
            let done = p.bulk_direct_done(k as u64).expect("within bulk_direct_max");
            assert_eq!(done, p.bulk_remaining() == 0);
            pos += k;
            continue;
        }
        let want = match rng.below(4) {
            0 => 1 + rng.below(8),
            1 => 1 + rng.below(64),
            _ => 1 + rng.below(2 * cap),
        };
        let chunk = &stream[pos..stream.len().min(pos + want)];
        let n = p.feed(chunk);
        assert!(n > 0, "buf_mut() empty after draining");
        pos += n;
        drain(&mut p, &mut ev);
    }
    drain(&mut p, &mut ev);
    (coalesce(ev), p.error())
}

/// A stream of every frame type, `reps` times, with `bulk` bytes after each PUT_REQ / GET_REP.
/// AM payloads stay within 256 bytes.
pub fn sample_stream(reps: u32, bulk: u64) -> Vec<u8> {
    use super::{AtomicOp, AtomicRep, AtomicReq, AtomicSize, GetRep, GetReq, Msg, PutAck, PutReq};
    use ucs::Status;
    let mut s = Vec::new();
    let mut buf = [0u8; 512];
    let big = [0x5au8; 256];
    for r in 0..reps {
        let data: Vec<u8> = (0..bulk).map(|i| (i as u8).wrapping_add(r as u8)).collect();
        let msgs = [
            Msg::Am { id: 0, payload: b"" },
            Msg::Am {
                id: (r % 32) as u8,
                payload: b"hello, rucx!",
            },
            Msg::PutReq(PutReq {
                remote_addr: 0x1000 + u64::from(r),
                rkey: 9,
                length: bulk,
                seq: r,
                ack_req: r % 2 == 0,
            }),
            Msg::PutAck(PutAck {
                seq: r,
                status: Status::Ok,
            }),
            Msg::GetReq(GetReq {
                remote_addr: 0x2000,
                rkey: 9,
                length: bulk,
                seq: r,
            }),
            Msg::GetRep(GetRep {
                length: bulk,
                seq: r,
                status: Status::Ok,
            }),
            Msg::AtomicReq(AtomicReq {
                remote_addr: 0x3000,
                rkey: 9,
                operand: 1,
                compare: 0,
                seq: r,
                op: AtomicOp::Add,
                size: AtomicSize::Bits64,
                fetch: true,
                ack_req: false,
            }),
            Msg::AtomicRep(AtomicRep {
                value: 41,
                seq: r,
                status: Status::Ok,
            }),
            Msg::Keepalive,
            Msg::Am {
                id: 31,
                payload: if reps > 1 { &big[..] } else { &big[..5] },
            },
            Msg::Fin,
        ];
        for m in msgs {
            let n = encode_frame(&m, &mut buf).expect("sample encodes");
            s.extend_from_slice(&buf[..n]);
            if m.bulk_len() > 0 {
                s.extend_from_slice(&data);
            }
        }
    }
    s
}

/// Fuzz body `tcp_frame`: bytes 0-1 pick the max payload, 2-3 the chunking seed, the rest is
/// the stream. Chunked parsing must agree with the contiguous oracle, never panic, and report
/// errors with non-empty text.
pub fn tcp_frame(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let max_payload = MIN_MAX_PAYLOAD + u32::from(u16::from_le_bytes([data[0], data[1]]) % 2048);
    let seed = u64::from(u16::from_le_bytes([data[2], data[3]]));
    let stream = &data[4..];
    let want = oracle(stream, max_payload);
    let got = run_chunked(stream, max_payload, seed);
    assert_eq!(coalesce(want.0), got.0);
    assert_eq!(want.1, got.1);
    if let Some(e) = got.1 {
        assert!(!e.to_string().is_empty());
    }
}

/// Fuzz body `tcp_handshake`: decoding never panics; a decoded message re-encodes to one that
/// decodes equal; every shorter prefix of it is `Incomplete`; the parser agrees when fed in two
/// pieces.
pub fn tcp_handshake(data: &[u8]) {
    let res = decode_handshake(data);
    match res {
        Ok((h, n)) => {
            assert!((16..=data.len()).contains(&n) && n <= Handshake::MAX_LEN);
            for i in 0..n {
                match decode_handshake(&data[..i]) {
                    Err(WireError::Incomplete(k)) => assert!(k > i && k <= n, "prefix {i}: needs {k}"),
                    other => panic!("prefix {i} of a valid message: {other:?}"),
                }
            }
            let mut out = [0u8; Handshake::MAX_LEN];
            let m = h.encode(&mut out).expect("fits MAX_LEN");
            assert_eq!(decode_handshake(&out[..m]), Ok((h, m)));
        }
        Err(WireError::Incomplete(k)) => assert!(k > data.len() && k <= Handshake::MAX_LEN),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    let mut p = RxParser::new(MIN_MAX_PAYLOAD);
    let cut = data.len() / 2;
    p.feed(&data[..cut]);
    let early = p.next_handshake();
    p.feed(&data[cut..]);
    let full = match early {
        Some(r) => Some(r),
        None => p.next_handshake(),
    };
    let expect = match res {
        Ok((h, _)) => Some(Ok(h)),
        Err(WireError::Incomplete(_)) => None,
        Err(e) => Some(Err(e)),
    };
    if data.len() <= p.capacity() {
        match (&full, &expect) {
            // An early bad magic names only the bytes seen by then.
            (Some(Err(WireError::BadMagic { .. })), Some(Err(WireError::BadMagic { .. }))) => {}
            _ => assert_eq!(full, expect),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ConnAck, ConnReject, ConnReq, ConnectMode, RejectReason};

    /// Random bytes, or a valid input with a few flipped bytes and maybe a cut.
    fn mutate(rng: &mut XorShift, valid: &[u8], max_len: usize) -> Vec<u8> {
        let mut v = if rng.below(4) == 0 {
            (0..rng.below(max_len)).map(|_| rng.next_u64() as u8).collect()
        } else {
            valid.to_vec()
        };
        for _ in 0..rng.below(4) {
            if !v.is_empty() {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
        }
        if rng.below(3) == 0 {
            let keep = rng.below(v.len() + 1);
            v.truncate(keep);
        }
        v
    }

    #[test]
    fn fuzz_body_tcp_frame_seeded() {
        let valid = sample_stream(2, 300);
        let mut rng = XorShift::new(0xf00d);
        for _ in 0..3000 {
            let mut input = vec![
                rng.next_u64() as u8,
                rng.next_u64() as u8 & 1,
                rng.next_u64() as u8,
                rng.next_u64() as u8,
            ];
            input.extend(mutate(&mut rng, &valid, 400));
            tcp_frame(&input);
        }
    }

    #[test]
    fn fuzz_body_tcp_handshake_seeded() {
        let req = ConnReq {
            conn_sn: 1,
            src_ep_key: 2,
            mode: ConnectMode::ToIface,
            listen_addr: "10.0.0.1:13337".parse().unwrap(),
            max_payload: 8192,
        };
        let valid: [Vec<u8>; 3] = [
            req.encode().to_vec(),
            ConnAck {
                conn_sn: 1,
                ep_key: 3,
                max_payload: 65536,
                version: 1,
            }
            .encode()
            .to_vec(),
            ConnReject {
                conn_sn: 1,
                reason: RejectReason::UnknownEp,
            }
            .encode()
            .to_vec(),
        ];
        let mut rng = XorShift::new(0xbeef);
        for i in 0..3000 {
            tcp_handshake(&mutate(&mut rng, &valid[i % 3], 128));
        }
    }
}
