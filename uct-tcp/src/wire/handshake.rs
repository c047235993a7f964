//! Connection handshake: the first bytes each side sends on a new socket.
//!
//! Every handshake message is a 16-byte preamble (magic, version range, kind, body length) and a
//! body. The preamble, the CONN_REQ body and the CONN_REJECT body are frozen across versions
//! (new fields may only be appended, `body_len` covers them and older receivers skip them); the
//! CONN_ACK body is laid out per negotiated version. That way any two releases can always tell
//! each other which versions they speak, and a stranger (HTTP, SSH banner, garbage) is refused
//! from its first byte that differs from the magic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use super::{
    check_room, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64, WireError, MAGIC, MAX_VERSION,
    MIN_MAX_PAYLOAD, MIN_VERSION,
};

/// Size of the preamble in front of every handshake body.
pub(crate) const PREAMBLE_LEN: usize = 16;
/// Largest body a receiver accepts; bounds the handshake receive buffer.
pub(crate) const MAX_BODY_LEN: usize = 1024;

const KIND_REQ: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_REJECT: u8 = 3;

const REQ_BODY_LEN: usize = 48;
const ACK_BODY_LEN: usize = 24;
const REJECT_BODY_LEN: usize = 16;

const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;
const MODE_TO_IFACE: u8 = 0;
const MODE_TO_EP: u8 = 1;

/// How the connecting side addresses the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectMode {
    /// Connect to the peer's interface; the acceptor creates (or matches) an endpoint and acks.
    ToIface,
    /// Connect to an existing endpoint of the peer, named by the key from its ep address.
    ToEp { ep_key: u64 },
}

/// CONN_REQ: sent by the connecting side right after `connect()` completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnReq {
    /// Connection sequence number / cm id chosen by the sender (matches simultaneous connects
    /// and the ACK to the request).
    pub conn_sn: u64,
    /// The sender's endpoint key (0 if it has none to offer).
    pub src_ep_key: u64,
    pub mode: ConnectMode,
    /// The sender's iface listening address (not the ephemeral source address of the socket).
    /// For IPv6 only the address and port travel; flow info and scope id are local matters.
    pub listen_addr: SocketAddr,
    /// Largest frame payload the sender accepts.
    pub max_payload: u32,
}

/// CONN_ACK: sent by the accepting side when it takes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnAck {
    /// `conn_sn` of the request being acknowledged.
    pub conn_sn: u64,
    /// The acceptor's endpoint key (0 if none).
    pub ep_key: u64,
    /// Largest frame payload the acceptor accepts.
    pub max_payload: u32,
    /// The version both sides speak from now on (see [`negotiate_version`]).
    pub version: u16,
}

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// No common protocol version; the preamble carries the rejecting side's range.
    VersionUnsupported,
    /// CONNECT_TO_EP named an endpoint key the acceptor does not know (destroyed or stale).
    UnknownEp,
    /// The acceptor is out of endpoints/memory.
    NoResource,
    /// The request did not parse.
    Malformed,
    /// The acceptor's interface is closing.
    ShuttingDown,
    /// Connect to iface: both sides connected for the same endpoint pair at once; the acceptor
    /// keeps the connection it started itself, and the refused side uses that one instead.
    SimultaneousConnect,
    /// A reason added by a newer version.
    Other(u8),
}

impl RejectReason {
    fn to_raw(self) -> u8 {
        match self {
            RejectReason::VersionUnsupported => 1,
            RejectReason::UnknownEp => 2,
            RejectReason::NoResource => 3,
            RejectReason::Malformed => 4,
            RejectReason::ShuttingDown => 5,
            RejectReason::SimultaneousConnect => 6,
            RejectReason::Other(r) => r,
        }
    }

    fn from_raw(r: u8) -> RejectReason {
        match r {
            1 => RejectReason::VersionUnsupported,
            2 => RejectReason::UnknownEp,
            3 => RejectReason::NoResource,
            4 => RejectReason::Malformed,
            5 => RejectReason::ShuttingDown,
            6 => RejectReason::SimultaneousConnect,
            r => RejectReason::Other(r),
        }
    }

    /// The status a connecting endpoint reports for this rejection.
    pub fn status(self) -> ucs::Status {
        match self {
            RejectReason::VersionUnsupported => ucs::Status::Unsupported,
            RejectReason::UnknownEp => ucs::Status::Unreachable,
            RejectReason::NoResource => ucs::Status::NoResource,
            _ => ucs::Status::Rejected,
        }
    }
}

/// CONN_REJECT: sent by the accepting side before it closes the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnReject {
    /// `conn_sn` of the refused request (0 if it could not be read).
    pub conn_sn: u64,
    pub reason: RejectReason,
}

/// The body of a handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeMsg {
    Req(ConnReq),
    Ack(ConnAck),
    Reject(ConnReject),
}

/// A handshake message with the sender's supported version range from the preamble.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handshake {
    pub min_version: u16,
    pub max_version: u16,
    pub msg: HandshakeMsg,
}

impl Handshake {
    /// Largest encoded handshake message a receiver must be able to buffer.
    pub const MAX_LEN: usize = PREAMBLE_LEN + MAX_BODY_LEN;
    /// Encoded size of a CONN_REQ written by this version.
    pub const REQ_LEN: usize = PREAMBLE_LEN + REQ_BODY_LEN;
    /// Encoded size of a CONN_ACK written by this version.
    pub const ACK_LEN: usize = PREAMBLE_LEN + ACK_BODY_LEN;
    /// Encoded size of a CONN_REJECT written by this version.
    pub const REJECT_LEN: usize = PREAMBLE_LEN + REJECT_BODY_LEN;

    /// `msg` with this build's version range.
    pub fn ours(msg: HandshakeMsg) -> Handshake {
        Handshake {
            min_version: MIN_VERSION,
            max_version: MAX_VERSION,
            msg,
        }
    }

    /// Encoded size of this message.
    pub fn encoded_len(&self) -> usize {
        PREAMBLE_LEN
            + match self.msg {
                HandshakeMsg::Req(_) => REQ_BODY_LEN,
                HandshakeMsg::Ack(_) => ACK_BODY_LEN,
                HandshakeMsg::Reject(_) => REJECT_BODY_LEN,
            }
    }

    /// Writes the message into `out`, returning the number of bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let len = self.encoded_len();
        check_room(out, len)?;
        let out = &mut out[..len];
        out.fill(0);
        out[..8].copy_from_slice(&MAGIC);
        put_u16(out, 8, self.max_version);
        put_u16(out, 10, self.min_version);
        put_u16(out, 14, (len - PREAMBLE_LEN) as u16);
        out[12] = match self.msg {
            HandshakeMsg::Req(_) => KIND_REQ,
            HandshakeMsg::Ack(_) => KIND_ACK,
            HandshakeMsg::Reject(_) => KIND_REJECT,
        };
        let body = &mut out[PREAMBLE_LEN..];
        match self.msg {
            HandshakeMsg::Req(r) => {
                put_u64(body, 0, r.conn_sn);
                put_u64(body, 8, r.src_ep_key);
                let (mode, dst) = match r.mode {
                    ConnectMode::ToIface => (MODE_TO_IFACE, 0),
                    ConnectMode::ToEp { ep_key } => (MODE_TO_EP, ep_key),
                };
                put_u64(body, 16, dst);
                let family = match r.listen_addr.ip() {
                    IpAddr::V4(a) => {
                        body[24..28].copy_from_slice(&a.octets());
                        FAMILY_V4
                    }
                    IpAddr::V6(a) => {
                        body[24..40].copy_from_slice(&a.octets());
                        FAMILY_V6
                    }
                };
                put_u16(body, 40, r.listen_addr.port());
                body[42] = family;
                body[43] = mode;
                put_u32(body, 44, r.max_payload);
            }
            HandshakeMsg::Ack(a) => {
                put_u64(body, 0, a.conn_sn);
                put_u64(body, 8, a.ep_key);
                put_u32(body, 16, a.max_payload);
                put_u16(body, 20, a.version);
            }
            HandshakeMsg::Reject(r) => {
                put_u64(body, 0, r.conn_sn);
                body[8] = r.reason.to_raw();
            }
        }
        Ok(len)
    }
}

impl ConnReq {
    /// Encodes with this build's version range.
    pub fn encode(&self) -> [u8; Handshake::REQ_LEN] {
        let mut out = [0u8; Handshake::REQ_LEN];
        let _ = Handshake::ours(HandshakeMsg::Req(*self)).encode(&mut out);
        out
    }
}

impl ConnAck {
    /// Encodes with this build's version range.
    pub fn encode(&self) -> [u8; Handshake::ACK_LEN] {
        let mut out = [0u8; Handshake::ACK_LEN];
        let _ = Handshake::ours(HandshakeMsg::Ack(*self)).encode(&mut out);
        out
    }
}

impl ConnReject {
    /// Encodes with this build's version range (a version rejection thereby tells the peer
    /// which versions we speak).
    pub fn encode(&self) -> [u8; Handshake::REJECT_LEN] {
        let mut out = [0u8; Handshake::REJECT_LEN];
        let _ = Handshake::ours(HandshakeMsg::Reject(*self)).encode(&mut out);
        out
    }
}

/// The version to speak with a peer announcing `peer_min..=peer_max`: the highest one both
/// sides support.
pub fn negotiate_version(peer_min: u16, peer_max: u16) -> Result<u16, WireError> {
    let v = peer_max.min(MAX_VERSION);
    if peer_min > peer_max || v < peer_min.max(MIN_VERSION) {
        return Err(WireError::BadVersion { peer_min, peer_max });
    }
    Ok(v)
}

/// Decodes one handshake message from the start of `buf`.
///
/// A wrong magic is reported as soon as the first differing byte arrives. A CONN_REQ or CONN_ACK
/// whose version range does not overlap ours is `BadVersion` (the acceptor should answer with a
/// [`ConnReject`] of [`RejectReason::VersionUnsupported`] before closing); a CONN_REJECT decodes
/// whatever the version. Trailing body bytes beyond the fields known here are skipped and
/// reserved fields are ignored.
pub fn decode_handshake(buf: &[u8]) -> Result<(Handshake, usize), WireError> {
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        let mut seen = [0u8; 8];
        seen[..n].copy_from_slice(&buf[..n]);
        return Err(WireError::BadMagic { seen, len: n as u8 });
    }
    if buf.len() < PREAMBLE_LEN {
        return Err(WireError::Incomplete(PREAMBLE_LEN));
    }
    let max_version = get_u16(buf, 8);
    let min_version = get_u16(buf, 10);
    let kind = buf[12];
    let body_len = usize::from(get_u16(buf, 14));
    if kind != KIND_REJECT {
        negotiate_version(min_version, max_version)?;
    }
    let fixed = match kind {
        KIND_REQ => REQ_BODY_LEN,
        KIND_ACK => ACK_BODY_LEN,
        KIND_REJECT => REJECT_BODY_LEN,
        k => return Err(WireError::UnknownHandshake(k)),
    };
    if body_len > MAX_BODY_LEN {
        return Err(WireError::LengthTooLarge {
            what: "handshake body length",
            len: body_len as u64,
            max: MAX_BODY_LEN as u64,
        });
    }
    if body_len < fixed {
        return Err(WireError::BadLength {
            what: "handshake body",
            len: body_len as u64,
            expected: fixed as u64,
        });
    }
    let total = PREAMBLE_LEN + body_len;
    if buf.len() < total {
        return Err(WireError::Incomplete(total));
    }
    let body = &buf[PREAMBLE_LEN..total];
    let msg = match kind {
        KIND_REQ => HandshakeMsg::Req(decode_req(body)?),
        KIND_ACK => {
            let a = ConnAck {
                conn_sn: get_u64(body, 0),
                ep_key: get_u64(body, 8),
                max_payload: get_u32(body, 16),
                version: get_u16(body, 20),
            };
            check_max_payload(a.max_payload)?;
            if !(MIN_VERSION..=MAX_VERSION).contains(&a.version) {
                return Err(WireError::BadVersion {
                    peer_min: a.version,
                    peer_max: a.version,
                });
            }
            if !(min_version..=max_version).contains(&a.version) {
                return Err(WireError::BadField {
                    what: "negotiated version (outside the sender's own range)",
                    value: a.version.into(),
                });
            }
            HandshakeMsg::Ack(a)
        }
        _ => HandshakeMsg::Reject(ConnReject {
            conn_sn: get_u64(body, 0),
            reason: RejectReason::from_raw(body[8]),
        }),
    };
    Ok((
        Handshake {
            min_version,
            max_version,
            msg,
        },
        total,
    ))
}

fn decode_req(body: &[u8]) -> Result<ConnReq, WireError> {
    let dst = get_u64(body, 16);
    let addr = &body[24..40];
    let port = get_u16(body, 40);
    let ip = match body[42] {
        FAMILY_V4 => {
            if addr[4..].iter().any(|&b| b != 0) {
                return Err(WireError::BadField {
                    what: "IPv4 listen address padding",
                    value: get_u64(addr, 8),
                });
            }
            IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
        }
        FAMILY_V6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(addr);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        f => {
            return Err(WireError::BadField {
                what: "address family",
                value: f.into(),
            })
        }
    };
    if port == 0 {
        return Err(WireError::BadField {
            what: "listen port",
            value: 0,
        });
    }
    let mode = match body[43] {
        MODE_TO_IFACE if dst == 0 => ConnectMode::ToIface,
        MODE_TO_IFACE => {
            return Err(WireError::BadField {
                what: "target ep key of a connect-to-iface",
                value: dst,
            })
        }
        MODE_TO_EP => ConnectMode::ToEp { ep_key: dst },
        m => {
            return Err(WireError::BadField {
                what: "connect mode",
                value: m.into(),
            })
        }
    };
    let max_payload = get_u32(body, 44);
    check_max_payload(max_payload)?;
    let listen_addr = match ip {
        IpAddr::V4(a) => SocketAddr::new(IpAddr::V4(a), port),
        IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, port, 0, 0)),
    };
    Ok(ConnReq {
        conn_sn: get_u64(body, 0),
        src_ep_key: get_u64(body, 8),
        mode,
        listen_addr,
        max_payload,
    })
}

fn check_max_payload(v: u32) -> Result<(), WireError> {
    if v < MIN_MAX_PAYLOAD {
        return Err(WireError::BadField {
            what: "announced max payload (below 64)",
            value: v.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ConnReq {
        ConnReq {
            conn_sn: 7,
            src_ep_key: 0x1122_3344_5566_7788,
            mode: ConnectMode::ToEp { ep_key: 42 },
            listen_addr: "127.0.0.1:5555".parse().unwrap(),
            max_payload: 65536,
        }
    }

    #[test]
    fn req_roundtrip_v4_v6() {
        let mut r = req();
        let b = r.encode();
        assert_eq!(&b[..8], b"RUCXTCP\0");
        let (h, n) = decode_handshake(&b).unwrap();
        assert_eq!(n, b.len());
        assert_eq!(h, Handshake::ours(HandshakeMsg::Req(r)));
        r.listen_addr = "[fe80::1]:6000".parse().unwrap();
        r.mode = ConnectMode::ToIface;
        let (h, _) = decode_handshake(&r.encode()).unwrap();
        assert_eq!(h.msg, HandshakeMsg::Req(r));
    }

    #[test]
    fn every_prefix_is_incomplete() {
        let b = req().encode();
        for i in 0..b.len() {
            match decode_handshake(&b[..i]) {
                Err(WireError::Incomplete(n)) => assert!(n > i && n <= b.len()),
                other => panic!("prefix {i}: {other:?}"),
            }
        }
    }

    #[test]
    fn http_is_refused_early_with_readable_text() {
        let e = decode_handshake(b"GET / HTTP/1.1\r\n").unwrap_err();
        let msg = e.from_peer("127.0.0.1:5555".parse().unwrap()).to_string();
        assert!(
            msg.starts_with("bad magic 0x474554202f204854 (\"GET / HT\") from 127.0.0.1:5555"),
            "{msg}"
        );
        assert!(msg.contains("not a rucx peer"));
        // Detected from the very first byte.
        assert!(matches!(
            decode_handshake(b"G"),
            Err(WireError::BadMagic { len: 1, .. })
        ));
        assert!(decode_handshake(b"SSH-2.0-OpenSSH")
            .unwrap_err()
            .to_string()
            .contains("SSH-2.0-"));
    }

    #[test]
    fn version_mismatch_is_named() {
        let mut b = req().encode();
        b[8..10].copy_from_slice(&3u16.to_le_bytes());
        b[10..12].copy_from_slice(&3u16.to_le_bytes());
        let e = decode_handshake(&b[..16]).unwrap_err();
        assert_eq!(
            e,
            WireError::BadVersion {
                peer_min: 3,
                peer_max: 3
            }
        );
        assert!(
            e.to_string()
                .starts_with("protocol version 3 not supported (we speak 1)"),
            "{e}"
        );
        // A newer peer that still speaks 1 is fine, and its appended body fields are skipped.
        b[10..12].copy_from_slice(&1u16.to_le_bytes());
        let mut longer = b.to_vec();
        longer.extend_from_slice(&[0xee; 8]);
        longer[14..16].copy_from_slice(&56u16.to_le_bytes());
        let (h, n) = decode_handshake(&longer).unwrap();
        assert_eq!((h.min_version, h.max_version, n), (1, 3, longer.len()));
        assert_eq!(negotiate_version(1, 3), Ok(1));
        assert!(negotiate_version(2, 1).is_err());
    }

    #[test]
    fn reject_decodes_across_versions() {
        let mut b = ConnReject {
            conn_sn: 9,
            reason: RejectReason::VersionUnsupported,
        }
        .encode();
        b[8..10].copy_from_slice(&9u16.to_le_bytes());
        b[10..12].copy_from_slice(&9u16.to_le_bytes());
        let (h, _) = decode_handshake(&b).unwrap();
        assert_eq!(h.max_version, 9);
        assert!(matches!(
            h.msg,
            HandshakeMsg::Reject(ConnReject { conn_sn: 9, .. })
        ));
    }

    #[test]
    fn ack_roundtrip_and_checks() {
        let a = ConnAck {
            conn_sn: 1,
            ep_key: 2,
            max_payload: 8192,
            version: 1,
        };
        let b = a.encode();
        assert_eq!(decode_handshake(&b).unwrap().0.msg, HandshakeMsg::Ack(a));
        let mut bad = b;
        bad[PREAMBLE_LEN + 20] = 2; // version 2: not ours
        assert!(matches!(
            decode_handshake(&bad),
            Err(WireError::BadVersion { .. })
        ));
        let mut small = b;
        small[PREAMBLE_LEN + 16..PREAMBLE_LEN + 20].copy_from_slice(&10u32.to_le_bytes());
        assert!(matches!(
            decode_handshake(&small),
            Err(WireError::BadField { .. })
        ));
    }

    #[test]
    fn malformed_fields_rejected() {
        let b = req().encode();
        let cases: &[(usize, u8)] = &[
            (12, 9),
            (PREAMBLE_LEN + 42, 5),
            (PREAMBLE_LEN + 43, 2),
            (PREAMBLE_LEN + 30, 1),
        ];
        for &(off, v) in cases {
            let mut m = b;
            m[off] = v;
            let e = decode_handshake(&m).unwrap_err();
            assert!(!e.is_incomplete(), "offset {off}");
        }
        let mut m = b;
        m[14..16].copy_from_slice(&4000u16.to_le_bytes());
        assert!(matches!(
            decode_handshake(&m),
            Err(WireError::LengthTooLarge { .. })
        ));
        m[14..16].copy_from_slice(&4u16.to_le_bytes());
        assert!(matches!(decode_handshake(&m), Err(WireError::BadLength { .. })));
        let mut small = [0u8; 4];
        assert!(matches!(
            req_handshake().encode(&mut small),
            Err(WireError::BufferTooSmall { .. })
        ));
    }

    fn req_handshake() -> Handshake {
        Handshake::ours(HandshakeMsg::Req(req()))
    }
}
