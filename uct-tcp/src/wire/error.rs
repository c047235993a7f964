//! Errors found while decoding (or encoding) the tcp wire format.
//!
//! `Incomplete` is the only soft outcome: more bytes are needed. Every other variant means the
//! peer broke the protocol (or, for `BufferTooSmall`, the caller passed a short buffer) and the
//! connection must be dropped; `Display` names what was seen and what to do about it.

use std::fmt;
use std::net::SocketAddr;

use ucs::Status;

use super::{MAX_VERSION, MIN_VERSION};

/// A decode/encode failure. See the module docs for which ones are fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Not an error: at least `needed` bytes in total (counted from the start of the slice that
    /// was given to the decoder) are required before the message can be decoded.
    Incomplete(usize),
    /// The first bytes of a connection are not the rucx magic. `seen[..len]` are the bytes that
    /// were received (fewer than 8 when the mismatch showed up early).
    BadMagic { seen: [u8; 8], len: u8 },
    /// The peer's supported protocol versions `peer_min..=peer_max` do not overlap ours.
    BadVersion { peer_min: u16, peer_max: u16 },
    /// Unknown handshake message kind.
    UnknownHandshake(u8),
    /// Unknown frame type (not a user AM id and not a reserved id of this version).
    UnknownType(u8),
    /// A length field exceeds the configured limit.
    LengthTooLarge { what: &'static str, len: u64, max: u64 },
    /// A fixed-size message carries the wrong length.
    BadLength {
        what: &'static str,
        len: u64,
        expected: u64,
    },
    /// A field holds a value this version does not allow (reserved bits set, unknown atomic op...).
    BadField { what: &'static str, value: u64 },
    /// Encoding: the output buffer is too small.
    BufferTooSmall { needed: usize, have: usize },
}

impl WireError {
    /// True only for [`WireError::Incomplete`]: wait for more bytes and retry.
    #[inline]
    pub fn is_incomplete(&self) -> bool {
        matches!(self, WireError::Incomplete(_))
    }

    /// The UCX status a transport reports for this error.
    pub fn status(&self) -> Status {
        match self {
            WireError::Incomplete(_) => Status::NoResource,
            WireError::BadMagic { .. } => Status::Unreachable,
            WireError::BadVersion { .. } => Status::Unsupported,
            WireError::LengthTooLarge { .. } => Status::ExceedsLimit,
            WireError::BufferTooSmall { .. } => Status::BufferTooSmall,
            WireError::UnknownHandshake(_)
            | WireError::UnknownType(_)
            | WireError::BadLength { .. }
            | WireError::BadField { .. } => Status::IoError,
        }
    }

    /// Display adapter naming the peer, e.g.
    /// `bad magic 0x474554202f204854 ("GET / HT") from 127.0.0.1:5555: not a rucx peer; ...`.
    pub fn from_peer(&self, peer: SocketAddr) -> FromPeer<'_> {
        FromPeer { err: self, peer }
    }

    fn fmt_with(&self, f: &mut fmt::Formatter<'_>, peer: Option<SocketAddr>) -> fmt::Result {
        // The cause comes first, then the peer, then the hint.
        match *self {
            WireError::Incomplete(n) => write!(f, "incomplete message, {n} bytes needed")?,
            WireError::BadMagic { seen, len } => {
                let seen = &seen[..usize::from(len).min(8)];
                f.write_str("bad magic 0x")?;
                for b in seen {
                    write!(f, "{b:02x}")?;
                }
                write!(f, " (\"{}\")", seen.escape_ascii())?;
            }
            WireError::BadVersion { peer_min, peer_max } => {
                if peer_min == peer_max {
                    write!(f, "protocol version {peer_max}")?;
                } else {
                    write!(f, "protocol versions {peer_min}..={peer_max}")?;
                }
                write!(
                    f,
                    " not supported (we speak {})",
                    Versions(MIN_VERSION, MAX_VERSION)
                )?;
            }
            WireError::UnknownHandshake(k) => write!(f, "unknown handshake message kind {k}")?,
            WireError::UnknownType(t) => write!(f, "unknown frame type {t}")?,
            WireError::LengthTooLarge { what, len, max } => {
                write!(f, "{what} {len} exceeds the limit {max}")?
            }
            WireError::BadLength { what, len, expected } => {
                write!(f, "{what} has length {len}, expected {expected}")?
            }
            WireError::BadField { what, value } => write!(f, "invalid {what} {value:#x}")?,
            WireError::BufferTooSmall { needed, have } => {
                write!(f, "output buffer too small: {needed} bytes needed, {have} given")?
            }
        }
        if let Some(p) = peer {
            write!(f, " from {p}")?;
        }
        f.write_str(match self {
            WireError::Incomplete(_) => "",
            WireError::BadMagic { .. } => {
                ": not a rucx peer; check that the address and port belong to a rucx tcp interface"
            }
            WireError::BadVersion { .. } => ": upgrade the older side so both run the same rucx release",
            WireError::LengthTooLarge { .. } => {
                ": the peer ignored the negotiated segment size (a bug or not a rucx peer); \
                 the connection is dropped"
            }
            WireError::BufferTooSmall { .. } => ": pass a buffer of at least the needed size",
            _ => {
                ": the peer broke the rucx tcp protocol (a bug or not a rucx peer); the connection is dropped"
            }
        })
    }
}

/// Formats `lo..=hi` or a single version.
struct Versions(u16, u16);

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == self.1 {
            write!(f, "{}", self.0)
        } else {
            write!(f, "{}..={}", self.0, self.1)
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_with(f, None)
    }
}

impl std::error::Error for WireError {}

/// [`WireError`] together with the peer it came from; see [`WireError::from_peer`].
pub struct FromPeer<'a> {
    err: &'a WireError,
    peer: SocketAddr,
}

impl fmt::Display for FromPeer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.err.fmt_with(f, Some(self.peer))
    }
}

impl From<WireError> for Status {
    fn from(e: WireError) -> Status {
        e.status()
    }
}
