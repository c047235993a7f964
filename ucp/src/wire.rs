//! UCP's messages on the transports' active-message lanes (docs/wire-ucp.md): which uct AM ids
//! UCP uses, the headers of active messages (single and fragmented) and of wireup messages.
//! All little-endian; every decoder checks lengths and ranges and returns an error for bytes a
//! peer may have garbled, never panics.

use ucs::{Error, Result, Status};

/// uct AM ids UCP installs on every interface.
pub mod am_id {
    /// Wireup: endpoint requests, replies and acknowledgements.
    pub const WIREUP: u8 = 1;
    /// An active message in one transport message.
    pub const SINGLE: u8 = 2;
    /// The first fragment of a larger active message.
    pub const FIRST: u8 = 3;
    /// A later fragment.
    pub const MIDDLE: u8 = 4;
    /// Rendezvous: ready-to-send (sender → receiver).
    pub const RTS: u8 = 5;
    /// Rendezvous: the receiver is done with the sender's buffer.
    pub const ATS: u8 = 6;
    /// Rendezvous: ready-to-receive, send the data in DATA messages.
    pub const RTR: u8 = 7;
    /// Rendezvous: a piece of the data (pipeline).
    pub const DATA: u8 = 8;
    /// Tag matching: an eager message, plain and synchronous.
    pub const TAG_EAGER: u8 = 9;
    pub const TAG_SYNC: u8 = 10;
    /// Tag matching: the first fragment of a longer message, and a later one.
    pub const TAG_FIRST: u8 = 11;
    pub const TAG_MIDDLE: u8 = 12;
    /// Tag matching: a synchronous send matched (receiver → sender).
    pub const TAG_SYNC_ACK: u8 = 13;
    /// Tag matching: a rendezvous announcement.
    pub const TAG_RTS: u8 = 14;
    /// Stream bytes.
    pub const STREAM: u8 = 15;
}

/// The first `N` bytes of `m` (all of it when shorter) and how many there are: enough to
/// decode a prefix without copying the data behind it out of shared memory.
#[inline]
pub(crate) fn head<const N: usize>(m: &uct::AmMessage<'_>) -> ([u8; N], usize) {
    let mut h = [0u8; N];
    let n = m.copy_to(0, &mut h);
    (h, n)
}

/// Version of UCP's messages; a worker address carries it, so peers agree before any message.
pub const PROTOCOL_VERSION: u8 = 1;

/// A message a peer garbled (or forged): dropped, with a rate-limited line for the operator.
pub(crate) fn violation(what: &str, e: &Error) {
    ucs::warn_limited!("ucp: {what} dropped: {e}");
}

/// The sender asks for a reply endpoint: its worker id and endpoint id follow the header.
pub const FLAG_REPLY: u8 = 1;

fn short(what: &str, need: usize, have: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ucp: {what}: {have} bytes, at least {need} needed"),
    )
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The header word of a received message: unknown flags or a non-zero reserved byte mean a
/// peer speaking another revision (or corrupt input), refused rather than half-understood.
fn read_header(b: &[u8]) -> Result<AmHeader> {
    let w = get_u64(b, 0);
    let hdr = AmHeader::from_word(w);
    if hdr.flags & !FLAG_REPLY != 0 || (w >> 24) as u8 != 0 {
        return Err(Error::new(
            Status::InvalidParam,
            format!("ucp: active message header {w:#018x}: unknown flags or reserved bits set"),
        ));
    }
    Ok(hdr)
}

/// Who sent a message, for a reply: the sender's worker id and its endpoint id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo {
    pub worker: u64,
    pub ep: u64,
}

/// The 8 bytes every UCP active message starts with (the uct `am_short` header word):
/// the application's AM id, flags, and the length of the application's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmHeader {
    pub id: u16,
    pub flags: u8,
    pub user_hdr_len: u32,
}

impl AmHeader {
    pub const LEN: usize = 8;

    /// As the little-endian word `am_short` takes.
    pub fn word(&self) -> u64 {
        u64::from(self.id) | (u64::from(self.flags) << 16) | (u64::from(self.user_hdr_len) << 32)
    }

    pub fn from_word(w: u64) -> AmHeader {
        AmHeader {
            id: w as u16,
            flags: (w >> 16) as u8,
            user_hdr_len: (w >> 32) as u32,
        }
    }
}

/// A single-message AM as received: `AmHeader`, optional [`ReplyTo`], user header, data.
#[derive(Debug, PartialEq, Eq)]
pub struct Single<'a> {
    pub hdr: AmHeader,
    pub reply: Option<ReplyTo>,
    pub user_hdr: &'a [u8],
    pub data: &'a [u8],
}

/// Bytes before the user header of a single AM.
pub fn single_prefix_len(reply: bool) -> usize {
    AmHeader::LEN + if reply { 16 } else { 0 }
}

/// Writes the prefix of a single AM (header word and reply fields) into `out`; returns its
/// length.
pub fn put_single_prefix(out: &mut [u8], hdr: AmHeader, reply: Option<ReplyTo>) -> usize {
    out[..8].copy_from_slice(&hdr.word().to_le_bytes());
    match reply {
        Some(r) => {
            out[8..16].copy_from_slice(&r.worker.to_le_bytes());
            out[16..24].copy_from_slice(&r.ep.to_le_bytes());
            24
        }
        None => 8,
    }
}

/// Decodes a single AM.
#[inline(always)]
pub fn decode_single(b: &[u8]) -> Result<Single<'_>> {
    if b.len() < AmHeader::LEN {
        return Err(short("active message", AmHeader::LEN, b.len()));
    }
    let hdr = read_header(b)?;
    let reply_flag = hdr.flags & FLAG_REPLY != 0;
    let mut at = AmHeader::LEN;
    let reply = if reply_flag {
        if b.len() < at + 16 {
            return Err(short("active message with reply fields", at + 16, b.len()));
        }
        let r = ReplyTo {
            worker: get_u64(b, at),
            ep: get_u64(b, at + 8),
        };
        at += 16;
        Some(r)
    } else {
        None
    };
    let uh = hdr.user_hdr_len as usize;
    if b.len() - at < uh {
        return Err(short("active message header", at + uh, b.len()));
    }
    Ok(Single {
        hdr,
        reply,
        user_hdr: &b[at..at + uh],
        data: &b[at + uh..],
    })
}

/// The first fragment: header word, sender worker, message id, total data length, optional
/// reply endpoint id, user header, first part of the data. Its fields, as read from its first
/// bytes: the user header follows at `user_hdr_at` (`hdr.user_hdr_len` bytes), the data at
/// `data_at`, to the message's end.
#[derive(Debug, PartialEq, Eq)]
pub struct FirstHead {
    pub hdr: AmHeader,
    pub worker: u64,
    pub msg_id: u64,
    pub total: u64,
    pub reply_ep: Option<u64>,
    pub user_hdr_at: usize,
    pub data_at: usize,
}

/// Bytes before the user header of a first fragment.
pub fn first_prefix_len(reply: bool) -> usize {
    32 + if reply { 8 } else { 0 }
}

/// Writes a first fragment's prefix; returns its length.
pub fn put_first_prefix(
    out: &mut [u8],
    hdr: AmHeader,
    worker: u64,
    msg_id: u64,
    total: u64,
    reply_ep: Option<u64>,
) -> usize {
    out[..8].copy_from_slice(&hdr.word().to_le_bytes());
    out[8..16].copy_from_slice(&worker.to_le_bytes());
    out[16..24].copy_from_slice(&msg_id.to_le_bytes());
    out[24..32].copy_from_slice(&total.to_le_bytes());
    match reply_ep {
        Some(e) => {
            out[32..40].copy_from_slice(&e.to_le_bytes());
            40
        }
        None => 32,
    }
}

/// The bytes of a first fragment [`decode_first_head`] reads (fewer when it is shorter).
pub const FIRST_HEAD_LEN: usize = 40;

/// Decodes a `len`-byte first fragment from `head`, its first [`FIRST_HEAD_LEN`] bytes (or all
/// of it), without reading the user header or the data.
pub fn decode_first_head(head: &[u8], len: usize) -> Result<FirstHead> {
    if len < 32 {
        return Err(short("first fragment", 32, len));
    }
    if head.len() < len.min(FIRST_HEAD_LEN) {
        return Err(short(
            "first fragment's head",
            len.min(FIRST_HEAD_LEN),
            head.len(),
        ));
    }
    let b = head;
    let hdr = read_header(b)?;
    let (worker, msg_id, total) = (get_u64(b, 8), get_u64(b, 16), get_u64(b, 24));
    let mut at = 32;
    let reply_ep = if hdr.flags & FLAG_REPLY != 0 {
        if len < 40 {
            return Err(short("first fragment with reply field", 40, len));
        }
        at = 40;
        Some(get_u64(b, 32))
    } else {
        None
    };
    let uh = hdr.user_hdr_len as usize;
    if len - at < uh {
        return Err(short("first fragment header", at + uh, len));
    }
    let data_len = len - at - uh;
    if data_len as u64 > total {
        return Err(Error::new(
            Status::InvalidParam,
            format!("ucp: first fragment carries {data_len} bytes of a {total}-byte message"),
        ));
    }
    Ok(FirstHead {
        hdr,
        worker,
        msg_id,
        total,
        reply_ep,
        user_hdr_at: at,
        data_at: at + uh,
    })
}

/// A later fragment: sender worker, message id, offset of its data.
#[derive(Debug, PartialEq, Eq)]
pub struct Middle<'a> {
    pub worker: u64,
    pub msg_id: u64,
    pub offset: u64,
    pub data: &'a [u8],
}

pub const MIDDLE_PREFIX_LEN: usize = 24;

pub fn put_middle_prefix(out: &mut [u8], worker: u64, msg_id: u64, offset: u64) -> usize {
    out[..8].copy_from_slice(&worker.to_le_bytes());
    out[8..16].copy_from_slice(&msg_id.to_le_bytes());
    out[16..24].copy_from_slice(&offset.to_le_bytes());
    MIDDLE_PREFIX_LEN
}

/// Decodes a later fragment (from its first [`MIDDLE_PREFIX_LEN`] bytes, the fields alone:
/// `data` is what follows them in `b`).
pub fn decode_middle(b: &[u8]) -> Result<Middle<'_>> {
    if b.len() < MIDDLE_PREFIX_LEN {
        return Err(short("fragment", MIDDLE_PREFIX_LEN, b.len()));
    }
    Ok(Middle {
        worker: get_u64(b, 0),
        msg_id: get_u64(b, 8),
        offset: get_u64(b, 16),
        data: &b[MIDDLE_PREFIX_LEN..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_round_trip_and_truncation() {
        let hdr = AmHeader {
            id: 513,
            flags: FLAG_REPLY,
            user_hdr_len: 3,
        };
        let mut b = vec![0u8; 64];
        let n = put_single_prefix(&mut b, hdr, Some(ReplyTo { worker: 7, ep: 9 }));
        assert_eq!(n, single_prefix_len(true));
        b.truncate(n);
        b.extend_from_slice(b"abc");
        b.extend_from_slice(b"payload");
        let s = decode_single(&b).unwrap();
        assert_eq!(s.hdr, hdr);
        assert_eq!(s.reply, Some(ReplyTo { worker: 7, ep: 9 }));
        assert_eq!((s.user_hdr, s.data), (&b"abc"[..], &b"payload"[..]));
        for cut in 0..n + 3 {
            assert!(decode_single(&b[..cut]).is_err(), "cut {cut}");
        }
    }

    #[test]
    fn fragments_round_trip_and_reject_lies() {
        let hdr = AmHeader {
            id: 1,
            flags: 0,
            user_hdr_len: 2,
        };
        let mut b = vec![0u8; 64];
        let n = put_first_prefix(&mut b, hdr, 5, 6, 10, None);
        b.truncate(n);
        b.extend_from_slice(b"hh0123");
        let f = decode_first_head(&b, b.len()).unwrap();
        assert_eq!((f.worker, f.msg_id, f.total), (5, 6, 10));
        assert_eq!(
            (&b[f.user_hdr_at..f.data_at], &b[f.data_at..]),
            (&b"hh"[..], &b"0123"[..])
        );
        // From its head alone, the same.
        assert_eq!(
            decode_first_head(&b[..FIRST_HEAD_LEN.min(b.len())], b.len()).unwrap(),
            f
        );
        assert!(decode_first_head(&b[..20], b.len()).is_err());
        // More data than the total it announces.
        let mut lie = b.clone();
        lie[24..32].copy_from_slice(&3u64.to_le_bytes());
        assert!(decode_first_head(&lie, lie.len()).is_err());
        let mut m = vec![0u8; 24];
        put_middle_prefix(&mut m, 5, 6, 4);
        m.extend_from_slice(b"456789");
        let d = decode_middle(&m).unwrap();
        assert_eq!((d.offset, d.data), (4, &b"456789"[..]));
        assert!(decode_middle(&m[..23]).is_err());
    }
}
