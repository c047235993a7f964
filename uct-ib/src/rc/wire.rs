//! rc_verbs wire formats (little-endian, versioned; see docs/ib.md).
//!
//! Every SEND carries one header byte before the AM data: bits 0-4 the AM id, bits 5-7
//! flow-control flags ([`FC_SOFT_REQ`], [`FC_HARD_REQ`], [`FC_GRANT`]; all three together mark a
//! pure grant, which carries no AM). am_short data is then the 8-byte LE header and the
//! payload; am_bcopy/zcopy data is what the sender packed.
//!
//! Endpoint address, 4 bytes: `[u8 version = 1][u24 QP number, LE]`.

use ucs::{Error, Result, Status};

/// Bytes of the AM header.
pub const AM_HDR_LEN: usize = 1;
/// Peer asks for a grant, to be piggybacked on the next AM back.
pub const FC_SOFT_REQ: u8 = 1 << 5;
/// Peer asks for a grant now (a pure grant message).
pub const FC_HARD_REQ: u8 = 1 << 6;
/// The window is restored.
pub const FC_GRANT: u8 = 1 << 7;
/// A grant with no AM.
pub const FC_PURE_GRANT: u8 = FC_SOFT_REQ | FC_HARD_REQ | FC_GRANT;
const ID_MASK: u8 = 0x1f;

/// The header byte of an AM with `id` and flow-control `flags`.
#[inline]
pub fn am_hdr(id: u8, flags: u8) -> u8 {
    (id & ID_MASK) | flags
}

/// Splits a header byte into the AM id and the flow-control flags.
#[inline]
pub fn parse_am_hdr(b: u8) -> (u8, u8) {
    (b & ID_MASK, b & !ID_MASK)
}

/// Length of a packed endpoint address.
pub const EP_ADDR_LEN: usize = 4;
const EP_ADDR_VERSION: u8 = 1;

/// Packs the QP number into an endpoint address.
pub fn pack_ep_addr(qp_num: u32, buf: &mut [u8]) -> Result<()> {
    let out = buf.get_mut(..EP_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
    out[0] = EP_ADDR_VERSION;
    out[1..4].copy_from_slice(&qp_num.to_le_bytes()[..3]);
    Ok(())
}

/// The QP number of an endpoint address.
pub fn unpack_ep_addr(buf: &[u8]) -> Result<u32> {
    if buf.len() < EP_ADDR_LEN || buf[0] != EP_ADDR_VERSION {
        return Err(Error::new(
            Status::InvalidAddr,
            format!(
                "rc_verbs: not an rc_verbs endpoint address ({} bytes; expected {EP_ADDR_LEN} bytes, \
                 version {EP_ADDR_VERSION})",
                buf.len()
            ),
        ));
    }
    Ok(u32::from_le_bytes([buf[1], buf[2], buf[3], 0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_byte() {
        assert_eq!(am_hdr(31, 0), 31);
        assert_eq!(am_hdr(5, FC_GRANT), 0x85);
        assert_eq!(parse_am_hdr(0x85), (5, FC_GRANT));
        assert_eq!(parse_am_hdr(am_hdr(0, FC_PURE_GRANT)), (0, 0xe0));
        assert_eq!(parse_am_hdr(am_hdr(7, FC_SOFT_REQ)), (7, FC_SOFT_REQ));
    }

    #[test]
    fn ep_address() {
        let mut b = [0u8; 4];
        pack_ep_addr(0x00ab_cdef, &mut b).unwrap();
        assert_eq!(b, [1, 0xef, 0xcd, 0xab]);
        assert_eq!(unpack_ep_addr(&b), Ok(0xab_cdef));
        assert_eq!(unpack_ep_addr(&b[..3]), Err(Status::InvalidAddr.into()));
        assert_eq!(unpack_ep_addr(&[2, 0, 0, 0]), Err(Status::InvalidAddr.into()));
        assert_eq!(pack_ep_addr(1, &mut [0u8; 2]), Err(Status::BufferTooSmall.into()));
    }
}
