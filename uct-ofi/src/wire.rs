//! The AM header every message carries, 8 bytes: `[u8 am id][u8 magic][u16 reserved = 0]
//! [u32 reserved = 0]`, then what the AM handler gets (for am_short, its 8-byte header and
//! payload). Anything else that arrives (too short, wrong magic, id out of range) is dropped with
//! one log line: it came from the network, so it is never trusted.

use uct_transport::types::AM_ID_MAX;

/// Bytes of the transport header.
pub const HDR_LEN: usize = 8;
const MAGIC: u8 = 0xf1;

/// The header of a message for AM `id`.
#[inline]
pub fn header(id: u8) -> [u8; HDR_LEN] {
    [id, MAGIC, 0, 0, 0, 0, 0, 0]
}

/// Why a received message was dropped.
#[derive(Debug, PartialEq, Eq)]
pub enum Bad {
    Short(usize),
    Magic(u8),
    Id(u8),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Short(n) => write!(f, "{n} bytes, shorter than the {HDR_LEN}-byte header"),
            Bad::Magic(m) => write!(f, "bad header magic {m:#x} (not an ofi AM)"),
            Bad::Id(id) => write!(f, "AM id {id} out of range 0..{}", AM_ID_MAX - 1),
        }
    }
}

/// Splits a received message into its AM id and the data for the handler.
#[inline]
pub fn parse(msg: &[u8]) -> Result<(u8, &[u8]), Bad> {
    if msg.len() < HDR_LEN {
        return Err(Bad::Short(msg.len()));
    }
    if msg[1] != MAGIC {
        return Err(Bad::Magic(msg[1]));
    }
    if msg[0] >= AM_ID_MAX {
        return Err(Bad::Id(msg[0]));
    }
    Ok((msg[0], &msg[HDR_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let mut m = header(5).to_vec();
        m.extend_from_slice(b"abc");
        assert_eq!(parse(&m), Ok((5, &b"abc"[..])));
        assert_eq!(parse(&m[..3]), Err(Bad::Short(3)));
        m[1] = 0;
        assert_eq!(parse(&m), Err(Bad::Magic(0)));
        let mut big = header(AM_ID_MAX).to_vec();
        big.push(1);
        assert_eq!(parse(&big), Err(Bad::Id(AM_ID_MAX)));
        assert_eq!(parse(&header(0)), Ok((0, &[][..])));
    }
}
