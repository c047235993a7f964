//! The ud_verbs wire format (version 1): a 12-byte little-endian header on every UD packet,
//! followed by a kind-specific body. Documented in `docs/ib.md` ("ud_verbs wire format").
//!
//! Every packet carries a cumulative acknowledgement (`ack_psn`), so data flowing back
//! acknowledges for free; AM packets also carry their own sequence number (`psn`).

use super::reliability::Psn;

/// Protocol version written by this release; packets of another version are dropped.
pub const VERSION: u8 = 1;
/// Bytes of the header.
pub const HDR_LEN: usize = 12;
/// `dest_ep_id` of packets addressed to the interface itself (connection requests).
pub const EP_ID_NONE: u32 = 0x00FF_FFFF;
/// Ep ids and QP numbers are 24 bits on the wire.
pub const ID_MASK: u32 = 0x00FF_FFFF;

/// Header flag: the receiver must answer with an acknowledgement now.
pub const FLAG_ACK_REQ: u8 = 1;
/// Header flag: the sender received a duplicate or out-of-order packet since its last
/// acknowledgement, so an unchanged `ack_psn` is a duplicate ACK (a sign of loss).
pub const FLAG_GAP: u8 = 2;

/// Packet kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// An active message: `am_id`, `psn`, body = the message.
    Am = 1,
    /// A pure acknowledgement (no body).
    Ack = 2,
    /// Connection request to an interface: body [`Creq`].
    Creq = 3,
    /// Connection reply: body [`Crep`].
    Crep = 4,
    /// The sender destroyed its endpoint: the receiver may drop the ep it created for it.
    Disc = 5,
}

impl Kind {
    fn from_raw(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Am,
            2 => Kind::Ack,
            3 => Kind::Creq,
            4 => Kind::Crep,
            5 => Kind::Disc,
            _ => return None,
        })
    }
}

/// Why a packet was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    Short,
    Version(u8),
    Kind(u8),
    AmId(u8),
    Body,
}

/// The packet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// AM id (0..31) for [`Kind::Am`], 0 otherwise.
    pub am_id: u8,
    pub flags: u8,
    /// The receiving endpoint (24 bits), or [`EP_ID_NONE`].
    pub dest_ep: u32,
    /// Sequence number of an AM; 0 for control packets (they are not sequenced).
    pub psn: Psn,
    /// Every AM up to and including this PSN from the receiver's peer endpoint arrived.
    pub ack_psn: Psn,
}

impl Header {
    /// Writes the header into the first [`HDR_LEN`] bytes of `out` (which must be that long).
    #[inline]
    pub fn encode(&self, out: &mut [u8]) {
        let o = &mut out[..HDR_LEN];
        o[0] = VERSION;
        o[1] = self.kind as u8;
        o[2] = self.am_id;
        o[3] = self.flags;
        o[4..8].copy_from_slice(&(self.dest_ep & ID_MASK).to_le_bytes());
        o[8..10].copy_from_slice(&self.psn.to_le_bytes());
        o[10..12].copy_from_slice(&self.ack_psn.to_le_bytes());
    }

    /// The encoded header.
    #[inline]
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        self.encode(&mut b);
        b
    }

    /// Parses the header at the start of `pkt`.
    #[inline]
    pub fn decode(pkt: &[u8]) -> Result<Header, WireError> {
        let b: &[u8; HDR_LEN] = pkt
            .get(..HDR_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Short)?;
        if b[0] != VERSION {
            return Err(WireError::Version(b[0]));
        }
        let kind = Kind::from_raw(b[1]).ok_or(WireError::Kind(b[1]))?;
        if kind == Kind::Am && b[2] >= uct_transport::types::AM_ID_MAX {
            return Err(WireError::AmId(b[2]));
        }
        Ok(Header {
            kind,
            am_id: b[2],
            flags: b[3],
            dest_ep: u32::from_le_bytes([b[4], b[5], b[6], b[7]]) & ID_MASK,
            psn: u16::from_le_bytes([b[8], b[9]]),
            ack_psn: u16::from_le_bytes([b[10], b[11]]),
        })
    }

    #[inline]
    pub fn ack_req(&self) -> bool {
        self.flags & FLAG_ACK_REQ != 0
    }

    /// The sender saw a gap: an unchanged `ack_psn` here is a duplicate ACK.
    #[inline]
    pub fn gap(&self) -> bool {
        self.flags & FLAG_GAP != 0
    }
}

/// Rewrites the acknowledgement and flags of an encoded header in place (for resends).
#[inline]
pub fn restamp(hdr: &mut [u8], ack_psn: Psn, flags: u8) {
    hdr[3] = flags;
    hdr[10..12].copy_from_slice(&ack_psn.to_le_bytes());
}

/// Largest device address a connection request carries.
pub const MAX_DEV_ADDR: usize = 64;

/// Body of a connection request: who is asking (an ep address plus the device address, so
/// the receiver can build the path back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Creq<'a> {
    pub src_ep: u32,
    pub src_qpn: u32,
    pub dev_addr: &'a [u8],
}

impl<'a> Creq<'a> {
    /// Encoded length.
    pub fn len(&self) -> usize {
        9 + self.dev_addr.len()
    }

    /// Never empty (the fixed part alone is 9 bytes); for clippy.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the body into `out` (at least [`Creq::len`] bytes); returns the length.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&(self.src_ep & ID_MASK).to_le_bytes());
        out[4..8].copy_from_slice(&(self.src_qpn & ID_MASK).to_le_bytes());
        out[8] = self.dev_addr.len() as u8;
        out[9..9 + self.dev_addr.len()].copy_from_slice(self.dev_addr);
        self.len()
    }

    pub fn decode(body: &'a [u8]) -> Result<Creq<'a>, WireError> {
        if body.len() < 9 {
            return Err(WireError::Body);
        }
        let n = body[8] as usize;
        if n > MAX_DEV_ADDR || body.len() < 9 + n {
            return Err(WireError::Body);
        }
        Ok(Creq {
            src_ep: u32::from_le_bytes([body[0], body[1], body[2], body[3]]) & ID_MASK,
            src_qpn: u32::from_le_bytes([body[4], body[5], body[6], body[7]]) & ID_MASK,
            dev_addr: &body[9..9 + n],
        })
    }
}

/// Body of a connection reply: the endpoint the replier created for the requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crep {
    pub src_ep: u32,
}

impl Crep {
    pub const LEN: usize = 4;

    pub fn to_bytes(&self) -> [u8; 4] {
        (self.src_ep & ID_MASK).to_le_bytes()
    }

    pub fn decode(body: &[u8]) -> Result<Crep, WireError> {
        let b: [u8; 4] = body
            .get(..4)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Body)?;
        Ok(Crep {
            src_ep: u32::from_le_bytes(b) & ID_MASK,
        })
    }
}

/// Interface address: the QP number, 3 bytes little-endian.
pub const IFACE_ADDR_LEN: usize = 3;
/// Endpoint address: the iface address, then the ep id (3 bytes little-endian).
pub const EP_ADDR_LEN: usize = 6;

pub fn put_u24(out: &mut [u8], v: u32) {
    out[..3].copy_from_slice(&(v & ID_MASK).to_le_bytes()[..3]);
}

pub fn get_u24(b: &[u8]) -> Option<u32> {
    let b = b.get(..3)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], 0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_little_endian_and_round_trips() {
        let h = Header {
            kind: Kind::Am,
            am_id: 7,
            flags: FLAG_ACK_REQ,
            dest_ep: 0x12_3456,
            psn: 0xBEEF,
            ack_psn: 0x0102,
        };
        let b = h.to_bytes();
        assert_eq!(b, [1, 1, 7, 1, 0x56, 0x34, 0x12, 0, 0xEF, 0xBE, 0x02, 0x01]);
        assert_eq!(Header::decode(&b), Ok(h));
        assert!(h.ack_req());
        // ids are 24 bits: the top byte never goes out
        let wide = Header {
            dest_ep: 0xFF12_3456,
            ..h
        };
        assert_eq!(Header::decode(&wide.to_bytes()).unwrap().dest_ep, 0x12_3456);
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut b = Header {
            kind: Kind::Ack,
            am_id: 0,
            flags: 0,
            dest_ep: 1,
            psn: 0,
            ack_psn: 5,
        }
        .to_bytes();
        assert_eq!(Header::decode(&b[..11]), Err(WireError::Short));
        b[0] = 2;
        assert_eq!(Header::decode(&b), Err(WireError::Version(2)));
        b[0] = VERSION;
        b[1] = 9;
        assert_eq!(Header::decode(&b), Err(WireError::Kind(9)));
        b[1] = Kind::Am as u8;
        b[2] = 32;
        assert_eq!(Header::decode(&b), Err(WireError::AmId(32)));
    }

    #[test]
    fn restamp_changes_only_ack_and_flags() {
        let h = Header {
            kind: Kind::Am,
            am_id: 3,
            flags: 0,
            dest_ep: 9,
            psn: 77,
            ack_psn: 1,
        };
        let mut b = h.to_bytes();
        restamp(&mut b, 500, FLAG_ACK_REQ);
        assert_eq!(
            Header::decode(&b),
            Ok(Header {
                flags: FLAG_ACK_REQ,
                ack_psn: 500,
                ..h
            })
        );
    }

    #[test]
    fn creq_and_crep_bodies() {
        let dev = [9u8; 18];
        let c = Creq {
            src_ep: 0x01_0203,
            src_qpn: 0xAB_CDEF,
            dev_addr: &dev,
        };
        let mut buf = [0u8; 64];
        let n = c.encode(&mut buf);
        assert_eq!(n, 27);
        assert_eq!(&buf[..9], &[3, 2, 1, 0, 0xEF, 0xCD, 0xAB, 0, 18]);
        assert_eq!(Creq::decode(&buf[..n]), Ok(c));
        assert_eq!(Creq::decode(&buf[..n - 1]), Err(WireError::Body));
        buf[8] = 200;
        assert_eq!(Creq::decode(&buf), Err(WireError::Body));
        let r = Crep { src_ep: 0x44_5566 };
        assert_eq!(Crep::decode(&r.to_bytes()), Ok(r));
        assert_eq!(Crep::decode(&[1, 2]), Err(WireError::Body));
    }

    #[test]
    fn u24_helpers() {
        let mut b = [0u8; 3];
        put_u24(&mut b, 0xFF12_3456);
        assert_eq!(b, [0x56, 0x34, 0x12]);
        assert_eq!(get_u24(&b), Some(0x12_3456));
        assert_eq!(get_u24(&b[..2]), None);
    }
}
