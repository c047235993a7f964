//! The rucx tcp wire format: a versioned handshake, then a stream of framed messages.
//!
//! Everything is little-endian with fixed-width fields; docs/wire-tcp.md has the byte tables.
//! Encoders write into caller-provided buffers or return fixed arrays (no allocation); decoders
//! borrow from the input and return `(message, bytes consumed)` or a [`WireError`], of which only
//! [`WireError::Incomplete`] is not fatal for the connection.

mod error;
mod frame;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
mod handshake;

pub use error::{FromPeer, WireError};
pub use frame::{
    decode_frame, encode_am_header, encode_am_short, encode_frame, AtomicOp, AtomicRep, AtomicReq,
    AtomicSize, FrameHeader, GetRep, GetReq, Msg, PutAck, PutReq,
};
pub use handshake::{
    decode_handshake, negotiate_version, ConnAck, ConnReject, ConnReq, ConnectMode, Handshake, HandshakeMsg,
    RejectReason,
};

/// First 8 bytes of every handshake message: `b"RUCXTCP\0"`.
pub const MAGIC: [u8; 8] = *b"RUCXTCP\0";
/// [`MAGIC`] read as a little-endian u64.
pub const MAGIC_U64: u64 = u64::from_le_bytes(MAGIC);
/// Newest protocol version this build speaks.
pub const MAX_VERSION: u16 = 1;
/// Oldest protocol version this build still speaks.
pub const MIN_VERSION: u16 = 1;

/// User AM ids are `0..AM_ID_MAX`; frame types from `AM_ID_MAX` up are reserved.
pub const AM_ID_MAX: u8 = 32;
/// Size of the header in front of every frame.
pub const FRAME_HDR_LEN: usize = 8;
/// Smallest `max_payload` a peer may announce: room for an am_short header plus some data.
pub const MIN_MAX_PAYLOAD: u32 = 64;

/// Reserved frame types (the `type` byte of the frame header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    PutReq = 32,
    PutAck = 33,
    GetReq = 34,
    GetRep = 35,
    AtomicReq = 36,
    AtomicRep = 37,
    Keepalive = 38,
    Fin = 39,
}

impl MsgType {
    /// The reserved type for `raw`, or `None` (user AM id or unknown).
    pub fn from_raw(raw: u8) -> Option<MsgType> {
        Some(match raw {
            32 => MsgType::PutReq,
            33 => MsgType::PutAck,
            34 => MsgType::GetReq,
            35 => MsgType::GetRep,
            36 => MsgType::AtomicReq,
            37 => MsgType::AtomicRep,
            38 => MsgType::Keepalive,
            39 => MsgType::Fin,
            _ => return None,
        })
    }

    /// Exact payload length of this fixed-size message (bulk data not counted).
    pub const fn payload_len(self) -> usize {
        match self {
            MsgType::PutReq | MsgType::GetReq => 32,
            MsgType::PutAck => 8,
            MsgType::GetRep | MsgType::AtomicRep => 16,
            MsgType::AtomicReq => 40,
            MsgType::Keepalive | MsgType::Fin => 0,
        }
    }

    /// Largest payload of any fixed-size message.
    pub const MAX_FIXED_PAYLOAD: usize = 40;
}

// Little-endian field access on slices whose length the caller has checked.
#[inline]
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

#[inline]
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Checks that `out` can take `needed` bytes.
#[inline]
pub(crate) fn check_room(out: &[u8], needed: usize) -> Result<(), WireError> {
    if out.len() < needed {
        return Err(WireError::BufferTooSmall {
            needed,
            have: out.len(),
        });
    }
    Ok(())
}
