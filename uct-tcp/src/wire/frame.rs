//! Frames: everything sent after the handshake.
//!
//! Each frame is an 8-byte [`FrameHeader`] and `len` payload bytes. User AMs carry their payload
//! (for am_short: the u64 AM header, then the data). The reserved types carry a fixed-size
//! payload; PUT_REQ and GET_REP are additionally followed by `length` bytes of *bulk* data that
//! the frame length does not count, so multi-gigabyte transfers need no chunking and the
//! receiver can stream them straight into (checked) target memory.

use ucs::Status;

use super::{check_room, get_u32, get_u64, put_u32, put_u64, MsgType, WireError, AM_ID_MAX, FRAME_HDR_LEN};

/// The 8-byte header in front of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// User AM id (`< AM_ID_MAX`) or a reserved [`MsgType`].
    pub ty: u8,
    /// Payload bytes following the header (bulk data not counted).
    pub len: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HDR_LEN] {
        let mut b = [0u8; FRAME_HDR_LEN];
        b[0] = self.ty;
        put_u32(&mut b, 4, self.len);
        b
    }

    /// Decodes and validates a header against the receiver's `max_payload`.
    #[inline]
    pub fn decode(buf: &[u8], max_payload: u32) -> Result<FrameHeader, WireError> {
        // A valid user AM header, the receive path's usual case, inline; everything else (and
        // every error) is `decode_checked`'s.
        if let Some(b) = buf.first_chunk::<FRAME_HDR_LEN>() {
            let len = get_u32(b, 4);
            if b[0] < AM_ID_MAX && b[1..4] == [0, 0, 0] && len <= max_payload {
                return Ok(FrameHeader { ty: b[0], len });
            }
        }
        Self::decode_checked(buf, max_payload)
    }

    #[inline(never)]
    fn decode_checked(buf: &[u8], max_payload: u32) -> Result<FrameHeader, WireError> {
        if buf.len() < FRAME_HDR_LEN {
            return Err(WireError::Incomplete(FRAME_HDR_LEN));
        }
        let h = FrameHeader {
            ty: buf[0],
            len: get_u32(buf, 4),
        };
        if buf[1] != 0 || buf[2] != 0 || buf[3] != 0 {
            let v = u64::from(get_u32(buf, 0) >> 8);
            return Err(WireError::BadField {
                what: "frame header reserved bytes",
                value: v,
            });
        }
        if h.ty < AM_ID_MAX {
            if h.len > max_payload {
                return Err(WireError::LengthTooLarge {
                    what: "AM frame length",
                    len: h.len.into(),
                    max: max_payload.into(),
                });
            }
        } else {
            let t = MsgType::from_raw(h.ty).ok_or(WireError::UnknownType(h.ty))?;
            if h.len as usize != t.payload_len() {
                return Err(WireError::BadLength {
                    what: type_name(t),
                    len: h.len.into(),
                    expected: t.payload_len() as u64,
                });
            }
        }
        Ok(h)
    }
}

fn type_name(t: MsgType) -> &'static str {
    match t {
        MsgType::PutReq => "PUT_REQ",
        MsgType::PutAck => "PUT_ACK",
        MsgType::GetReq => "GET_REQ",
        MsgType::GetRep => "GET_REP",
        MsgType::AtomicReq => "ATOMIC_REQ",
        MsgType::AtomicRep => "ATOMIC_REP",
        MsgType::Keepalive => "KEEPALIVE",
        MsgType::Fin => "FIN",
    }
}

/// PUT request; `length` bulk bytes follow the frame. The target checks
/// `[remote_addr, remote_addr + length)` against the region of `rkey` before writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PutReq {
    pub remote_addr: u64,
    pub rkey: u64,
    pub length: u64,
    pub seq: u32,
    /// Ask the target for a PUT_ACK once the data is written (flush uses this; errors are
    /// always acked).
    pub ack_req: bool,
}

/// PUT acknowledgement: the put `seq` (and, TCP being ordered, every earlier one) is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PutAck {
    pub seq: u32,
    /// `Ok`, or why put `seq` was not applied (e.g. `InvalidParam` for a bad rkey/bounds).
    pub status: Status,
}

/// GET request: the target answers with a GET_REP carrying `length` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GetReq {
    pub remote_addr: u64,
    pub rkey: u64,
    pub length: u64,
    pub seq: u32,
}

/// GET reply; `length` bulk bytes follow (0 unless `status` is `Ok`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GetRep {
    pub length: u64,
    pub seq: u32,
    pub status: Status,
}

/// Atomic operations, executed by the target's progress: the transport API's own enum, whose
/// discriminants (0 add .. 5 cswap) are the wire codes.
pub use uct_transport::types::AtomicOp;

/// Width of the target word of an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicSize {
    Bits32,
    Bits64,
}

impl AtomicSize {
    /// Size in bytes (the target address must be aligned to it).
    pub const fn bytes(self) -> u8 {
        match self {
            AtomicSize::Bits32 => 4,
            AtomicSize::Bits64 => 8,
        }
    }
}

const ATOMIC_FETCH: u8 = 1;
const ATOMIC_ACK_REQ: u8 = 2;
const PUT_ACK_REQ: u8 = 1;

/// Atomic request on the word at `remote_addr` (region of `rkey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicReq {
    pub remote_addr: u64,
    pub rkey: u64,
    /// Value to add/and/or/xor/swap in (for 32-bit ops the upper half is zero).
    pub operand: u64,
    /// Expected value for `CSwap`, zero otherwise.
    pub compare: u64,
    pub seq: u32,
    pub op: AtomicOp,
    pub size: AtomicSize,
    /// Reply with the old value (required for Swap/CSwap).
    pub fetch: bool,
    /// Reply even without fetch, once executed (flush uses this; errors are always replied).
    pub ack_req: bool,
}

/// Atomic reply: the old value for fetching ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicRep {
    pub value: u64,
    pub seq: u32,
    pub status: Status,
}

/// A decoded frame. `Am::payload` borrows from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Msg<'a> {
    Am {
        id: u8,
        payload: &'a [u8],
    },
    PutReq(PutReq),
    PutAck(PutAck),
    GetReq(GetReq),
    GetRep(GetRep),
    AtomicReq(AtomicReq),
    AtomicRep(AtomicRep),
    /// Liveness probe; ignored by the receiver.
    Keepalive,
    /// Graceful close: the sender sends nothing more on this connection.
    Fin,
}

impl Msg<'_> {
    /// Bytes of bulk data that follow this frame on the wire.
    pub fn bulk_len(&self) -> u64 {
        match self {
            Msg::PutReq(p) => p.length,
            Msg::GetRep(g) => g.length,
            _ => 0,
        }
    }

    /// The frame type byte.
    pub fn ty(&self) -> u8 {
        match self {
            Msg::Am { id, .. } => *id,
            Msg::PutReq(_) => MsgType::PutReq as u8,
            Msg::PutAck(_) => MsgType::PutAck as u8,
            Msg::GetReq(_) => MsgType::GetReq as u8,
            Msg::GetRep(_) => MsgType::GetRep as u8,
            Msg::AtomicReq(_) => MsgType::AtomicReq as u8,
            Msg::AtomicRep(_) => MsgType::AtomicRep as u8,
            Msg::Keepalive => MsgType::Keepalive as u8,
            Msg::Fin => MsgType::Fin as u8,
        }
    }

    /// Header plus payload size (bulk data not counted).
    pub fn encoded_len(&self) -> usize {
        FRAME_HDR_LEN
            + match self {
                Msg::Am { payload, .. } => payload.len(),
                m => MsgType::from_raw(m.ty()).map_or(0, MsgType::payload_len),
            }
    }
}

fn status_raw(s: Status) -> u8 {
    s.as_raw() as u8
}

/// Reply status: `Ok` or an error whose code round-trips.
fn decode_status(raw: u8) -> Result<Status, WireError> {
    let s = Status::from_raw(raw as i8);
    if s.as_raw() != raw as i8 || s == Status::InProgress {
        return Err(WireError::BadField {
            what: "reply status",
            value: raw.into(),
        });
    }
    Ok(s)
}

fn check_reserved(p: &[u8], what: &'static str) -> Result<(), WireError> {
    if p.iter().any(|&b| b != 0) {
        return Err(WireError::BadField {
            what,
            value: p.iter().fold(0, |a, &b| a << 8 | u64::from(b)),
        });
    }
    Ok(())
}

/// Writes `msg` (header and payload) into `out`; returns the bytes written. Bulk data is not
/// written: the caller sends `msg.bulk_len()` bytes after it.
pub fn encode_frame(msg: &Msg<'_>, out: &mut [u8]) -> Result<usize, WireError> {
    let total = msg.encoded_len();
    if let Msg::Am { id, payload } = msg {
        if *id >= AM_ID_MAX {
            return Err(WireError::BadField {
                what: "AM id (user ids are 0..32)",
                value: (*id).into(),
            });
        }
        if payload.len() > u32::MAX as usize {
            return Err(WireError::LengthTooLarge {
                what: "AM payload",
                len: payload.len() as u64,
                max: u32::MAX.into(),
            });
        }
    }
    check_room(out, total)?;
    let out = &mut out[..total];
    out[..FRAME_HDR_LEN].copy_from_slice(
        &FrameHeader {
            ty: msg.ty(),
            len: (total - FRAME_HDR_LEN) as u32,
        }
        .encode(),
    );
    let p = &mut out[FRAME_HDR_LEN..];
    p.fill(0);
    match *msg {
        Msg::Am { payload, .. } => p.copy_from_slice(payload),
        Msg::PutReq(r) => {
            put_u64(p, 0, r.remote_addr);
            put_u64(p, 8, r.rkey);
            put_u64(p, 16, r.length);
            put_u32(p, 24, r.seq);
            p[28] = if r.ack_req { PUT_ACK_REQ } else { 0 };
        }
        Msg::PutAck(a) => {
            put_u32(p, 0, a.seq);
            p[4] = status_raw(a.status);
        }
        Msg::GetReq(r) => {
            put_u64(p, 0, r.remote_addr);
            put_u64(p, 8, r.rkey);
            put_u64(p, 16, r.length);
            put_u32(p, 24, r.seq);
        }
        Msg::GetRep(r) => {
            put_u64(p, 0, r.length);
            put_u32(p, 8, r.seq);
            p[12] = status_raw(r.status);
        }
        Msg::AtomicReq(r) => {
            put_u64(p, 0, r.remote_addr);
            put_u64(p, 8, r.rkey);
            put_u64(p, 16, r.operand);
            put_u64(p, 24, r.compare);
            put_u32(p, 32, r.seq);
            p[36] = r.op as u8;
            p[37] = r.size.bytes();
            p[38] = (u8::from(r.fetch) * ATOMIC_FETCH) | (u8::from(r.ack_req) * ATOMIC_ACK_REQ);
        }
        Msg::AtomicRep(r) => {
            put_u64(p, 0, r.value);
            put_u32(p, 8, r.seq);
            p[12] = status_raw(r.status);
        }
        Msg::Keepalive | Msg::Fin => {}
    }
    Ok(total)
}

/// The 8-byte header of a user AM with `payload_len` payload bytes (for am_short that count
/// includes the u64 AM header). The sender then writes the payload.
pub fn encode_am_header(id: u8, payload_len: usize) -> Result<[u8; FRAME_HDR_LEN], WireError> {
    if id >= AM_ID_MAX {
        return Err(WireError::BadField {
            what: "AM id (user ids are 0..32)",
            value: id.into(),
        });
    }
    let len = u32::try_from(payload_len).map_err(|_| WireError::LengthTooLarge {
        what: "AM payload",
        len: payload_len as u64,
        max: u32::MAX.into(),
    })?;
    Ok(FrameHeader { ty: id, len }.encode())
}

/// Writes a complete am_short frame (header, u64 `am_hdr`, `data`) into `out`.
pub fn encode_am_short(id: u8, am_hdr: u64, data: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
    let total = FRAME_HDR_LEN + 8 + data.len();
    let h = encode_am_header(id, 8 + data.len())?;
    check_room(out, total)?;
    out[..FRAME_HDR_LEN].copy_from_slice(&h);
    put_u64(out, FRAME_HDR_LEN, am_hdr);
    out[FRAME_HDR_LEN + 8..total].copy_from_slice(data);
    Ok(total)
}

/// Decodes one frame from the start of `buf`, enforcing `max_payload` on AM frames. Returns the
/// message and the bytes consumed (header + payload; any bulk data follows and is not consumed).
pub fn decode_frame(buf: &[u8], max_payload: u32) -> Result<(Msg<'_>, usize), WireError> {
    let h = FrameHeader::decode(buf, max_payload)?;
    let total = FRAME_HDR_LEN + h.len as usize;
    if buf.len() < total {
        return Err(WireError::Incomplete(total));
    }
    let p = &buf[FRAME_HDR_LEN..total];
    if h.ty < AM_ID_MAX {
        return Ok((Msg::Am { id: h.ty, payload: p }, total));
    }
    // FrameHeader::decode checked the type and the exact length.
    let msg = match MsgType::from_raw(h.ty).ok_or(WireError::UnknownType(h.ty))? {
        MsgType::PutReq => {
            if p[28] & !PUT_ACK_REQ != 0 {
                return Err(WireError::BadField {
                    what: "PUT_REQ flags",
                    value: p[28].into(),
                });
            }
            check_reserved(&p[29..32], "PUT_REQ reserved bytes")?;
            Msg::PutReq(PutReq {
                remote_addr: get_u64(p, 0),
                rkey: get_u64(p, 8),
                length: get_u64(p, 16),
                seq: get_u32(p, 24),
                ack_req: p[28] & PUT_ACK_REQ != 0,
            })
        }
        MsgType::PutAck => {
            check_reserved(&p[5..8], "PUT_ACK reserved bytes")?;
            Msg::PutAck(PutAck {
                seq: get_u32(p, 0),
                status: decode_status(p[4])?,
            })
        }
        MsgType::GetReq => {
            check_reserved(&p[28..32], "GET_REQ reserved bytes")?;
            Msg::GetReq(GetReq {
                remote_addr: get_u64(p, 0),
                rkey: get_u64(p, 8),
                length: get_u64(p, 16),
                seq: get_u32(p, 24),
            })
        }
        MsgType::GetRep => {
            check_reserved(&p[13..16], "GET_REP reserved bytes")?;
            let r = GetRep {
                length: get_u64(p, 0),
                seq: get_u32(p, 8),
                status: decode_status(p[12])?,
            };
            if r.status != Status::Ok && r.length != 0 {
                return Err(WireError::BadField {
                    what: "GET_REP length of a failed get",
                    value: r.length,
                });
            }
            Msg::GetRep(r)
        }
        MsgType::AtomicReq => Msg::AtomicReq(decode_atomic(p)?),
        MsgType::AtomicRep => {
            check_reserved(&p[13..16], "ATOMIC_REP reserved bytes")?;
            Msg::AtomicRep(AtomicRep {
                value: get_u64(p, 0),
                seq: get_u32(p, 8),
                status: decode_status(p[12])?,
            })
        }
        MsgType::Keepalive => Msg::Keepalive,
        MsgType::Fin => Msg::Fin,
    };
    Ok((msg, total))
}

fn decode_atomic(p: &[u8]) -> Result<AtomicReq, WireError> {
    let op = AtomicOp::from_raw(p[36]).ok_or(WireError::BadField {
        what: "atomic op",
        value: p[36].into(),
    })?;
    let size = match p[37] {
        4 => AtomicSize::Bits32,
        8 => AtomicSize::Bits64,
        s => {
            return Err(WireError::BadField {
                what: "atomic size (4 or 8)",
                value: s.into(),
            })
        }
    };
    let flags = p[38];
    if flags & !(ATOMIC_FETCH | ATOMIC_ACK_REQ) != 0 {
        return Err(WireError::BadField {
            what: "ATOMIC_REQ flags",
            value: flags.into(),
        });
    }
    check_reserved(&p[39..40], "ATOMIC_REQ reserved byte")?;
    let r = AtomicReq {
        remote_addr: get_u64(p, 0),
        rkey: get_u64(p, 8),
        operand: get_u64(p, 16),
        compare: get_u64(p, 24),
        seq: get_u32(p, 32),
        op,
        size,
        fetch: flags & ATOMIC_FETCH != 0,
        ack_req: flags & ATOMIC_ACK_REQ != 0,
    };
    if matches!(op, AtomicOp::Swap | AtomicOp::Cswap) && !r.fetch {
        return Err(WireError::BadField {
            what: "atomic swap without fetch flag",
            value: flags.into(),
        });
    }
    if op != AtomicOp::Cswap && r.compare != 0 {
        return Err(WireError::BadField {
            what: "atomic compare value of a non-cswap op",
            value: r.compare,
        });
    }
    if size == AtomicSize::Bits32 && (r.operand | r.compare) >> 32 != 0 {
        return Err(WireError::BadField {
            what: "32-bit atomic operand upper half",
            value: r.operand,
        });
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn samples() -> Vec<Msg<'static>> {
        vec![
            Msg::Am { id: 0, payload: b"" },
            Msg::Am {
                id: 31,
                payload: b"hello world",
            },
            Msg::PutReq(PutReq {
                remote_addr: 0x1000,
                rkey: 5,
                length: 3,
                seq: 1,
                ack_req: true,
            }),
            Msg::PutAck(PutAck {
                seq: 1,
                status: Status::InvalidParam,
            }),
            Msg::GetReq(GetReq {
                remote_addr: 0x2000,
                rkey: 6,
                length: 1 << 40,
                seq: 2,
            }),
            Msg::GetRep(GetRep {
                length: 4,
                seq: 2,
                status: Status::Ok,
            }),
            Msg::AtomicReq(AtomicReq {
                remote_addr: 8,
                rkey: 1,
                operand: 3,
                compare: 2,
                seq: 3,
                op: AtomicOp::Cswap,
                size: AtomicSize::Bits32,
                fetch: true,
                ack_req: false,
            }),
            Msg::AtomicRep(AtomicRep {
                value: u64::MAX,
                seq: 3,
                status: Status::Ok,
            }),
            Msg::Keepalive,
            Msg::Fin,
        ]
    }

    #[test]
    fn roundtrip_every_type_and_prefix() {
        for m in samples() {
            let mut b = [0u8; 64];
            let n = encode_frame(&m, &mut b).unwrap();
            assert_eq!(n, m.encoded_len());
            assert_eq!(decode_frame(&b[..n], 64), Ok((m, n)));
            for i in 0..n {
                assert!(
                    matches!(decode_frame(&b[..i], 64), Err(WireError::Incomplete(k)) if k > i && k <= n)
                );
            }
        }
    }

    #[test]
    fn am_short_layout() {
        let mut b = [0u8; 32];
        let n = encode_am_short(3, 0xaabb, b"xyz", &mut b).unwrap();
        assert_eq!(
            &b[..n],
            &[3, 0, 0, 0, 11, 0, 0, 0, 0xbb, 0xaa, 0, 0, 0, 0, 0, 0, b'x', b'y', b'z']
        );
        assert!(encode_am_header(32, 0).is_err());
        assert!(matches!(
            encode_am_short(1, 0, &[0; 30], &mut b),
            Err(WireError::BufferTooSmall { .. })
        ));
    }

    /// The inline AM case of `FrameHeader::decode` answers exactly as the full check does:
    /// every type byte, a nonzero byte in each reserved position, lengths around the limit,
    /// short buffers.
    #[test]
    fn decode_fast_path_agrees_with_the_full_check() {
        let max = 64;
        for ty in 0..=255u8 {
            for len in [0, 1, 40, 63, 64, 65, u32::MAX] {
                let good = FrameHeader { ty, len }.encode();
                let mut bufs = vec![good.to_vec()];
                for r in 1..4 {
                    let mut b = good;
                    b[r] = 1;
                    bufs.push(b.to_vec());
                }
                bufs.push(good[..FRAME_HDR_LEN - 1].to_vec());
                for b in &bufs {
                    assert_eq!(
                        FrameHeader::decode(b, max),
                        FrameHeader::decode_checked(b, max),
                        "{b:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn hard_errors() {
        let mut b = FrameHeader { ty: 1, len: 65 }.encode();
        let e = decode_frame(&b, 64).unwrap_err();
        assert_eq!(
            e,
            WireError::LengthTooLarge {
                what: "AM frame length",
                len: 65,
                max: 64
            }
        );
        assert!(e.to_string().contains("exceeds the limit 64"));
        b[0] = 200;
        assert_eq!(decode_frame(&b, 64), Err(WireError::UnknownType(200)));
        let b = FrameHeader {
            ty: MsgType::PutAck as u8,
            len: 9,
        }
        .encode();
        assert!(matches!(decode_frame(&b, 64), Err(WireError::BadLength { .. })));
        let mut b = FrameHeader { ty: 0, len: 0 }.encode();
        b[2] = 1;
        assert!(matches!(decode_frame(&b, 64), Err(WireError::BadField { .. })));
    }

    #[test]
    fn atomic_validation_and_apply() {
        let mut b = [0u8; 48];
        let m = samples()[6];
        encode_frame(&m, &mut b).unwrap();
        for (off, v) in [(8 + 36, 9u8), (8 + 37, 2), (8 + 38, 0), (8 + 38, 4), (8 + 20, 1)] {
            let mut c = b;
            c[off] = v;
            assert!(
                matches!(decode_frame(&c, 64), Err(WireError::BadField { .. })),
                "offset {off}"
            );
        }
    }

    #[test]
    fn status_fields_validated() {
        let mut b = [0u8; 16];
        encode_frame(
            &Msg::PutAck(PutAck {
                seq: 1,
                status: Status::Ok,
            }),
            &mut b,
        )
        .unwrap();
        b[8 + 4] = 1; // InProgress is not a reply status
        assert!(decode_frame(&b, 64).is_err());
        let mut b = [0u8; 24];
        encode_frame(
            &Msg::GetRep(GetRep {
                length: 0,
                seq: 1,
                status: Status::IoError,
            }),
            &mut b,
        )
        .unwrap();
        b[8] = 1; // data length on a failed get
        assert!(decode_frame(&b, 64).is_err());
    }
}
