//! Tag messages on the wire (docs/wire-ucp.md, "Tag matching"): eager single messages (plain
//! and synchronous), first fragments, synchronous-send acknowledgements. Later fragments use
//! the active messages' layout ([`crate::wire::decode_middle`]) and rendezvous announcements
//! the RTS layout with the tag as header word ([`crate::rndv::wire::decode_tag_rts`]).

use ucs::{Error, Result, Status};

/// Before the data of an eager single message: the tag.
pub const EAGER_LEN: usize = 8;
/// Before the data of a synchronous single message: tag, worker, endpoint, request.
pub const SYNC_LEN: usize = 32;
/// Before the data of a first fragment.
pub const FIRST_LEN: usize = 48;
pub const ACK_LEN: usize = 16;

fn short(what: &str, need: usize, have: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ucp: {what}: {have} bytes, at least {need} needed"),
    )
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Who waits for a synchronous send's acknowledgement: the sender's worker, its endpoint
/// toward the receiver, its request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncFrom {
    pub worker: u64,
    pub ep: u64,
    pub req: u64,
}

/// An eager single message.
pub fn decode_eager(b: &[u8]) -> Result<(u64, &[u8])> {
    if b.len() < EAGER_LEN {
        return Err(short("tag message", EAGER_LEN, b.len()));
    }
    Ok((u64_at(b, 0), &b[EAGER_LEN..]))
}

pub fn put_sync_prefix(out: &mut [u8], tag: u64, from: SyncFrom) {
    for (i, v) in [tag, from.worker, from.ep, from.req].into_iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// A synchronous single message.
pub fn decode_sync(b: &[u8]) -> Result<(u64, SyncFrom, &[u8])> {
    if b.len() < SYNC_LEN {
        return Err(short("synchronous tag message", SYNC_LEN, b.len()));
    }
    let from = SyncFrom {
        worker: u64_at(b, 8),
        ep: u64_at(b, 16),
        req: u64_at(b, 24),
    };
    Ok((u64_at(b, 0), from, &b[SYNC_LEN..]))
}

/// The first fragment of a tag message.
#[derive(Debug, PartialEq, Eq)]
pub struct First<'a> {
    pub tag: u64,
    pub worker: u64,
    pub msg_id: u64,
    pub total: u64,
    /// The synchronous send's request (0: not synchronous) and the sender's endpoint.
    pub req: u64,
    pub ep: u64,
    pub data: &'a [u8],
}

impl First<'_> {
    pub fn prefix(&self) -> [u8; FIRST_LEN] {
        let mut p = [0u8; FIRST_LEN];
        for (i, v) in [self.tag, self.worker, self.msg_id, self.total, self.req, self.ep]
            .into_iter()
            .enumerate()
        {
            p[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        p
    }

    /// The sender waiting for an acknowledgement, for a synchronous send.
    pub fn sync_from(&self) -> Option<SyncFrom> {
        (self.req != 0).then_some(SyncFrom {
            worker: self.worker,
            ep: self.ep,
            req: self.req,
        })
    }
}

/// Decodes a `len`-byte first fragment from its first bytes `head` ([`FIRST_LEN`] or more):
/// `data` is the part of the data `head` holds.
pub fn decode_first_head(head: &[u8], len: usize) -> Result<First<'_>> {
    if len < FIRST_LEN || head.len() < FIRST_LEN {
        return Err(short("tag first fragment", FIRST_LEN, len.min(head.len())));
    }
    let b = head;
    let f = First {
        tag: u64_at(b, 0),
        worker: u64_at(b, 8),
        msg_id: u64_at(b, 16),
        total: u64_at(b, 24),
        req: u64_at(b, 32),
        ep: u64_at(b, 40),
        data: &b[FIRST_LEN..],
    };
    if (len - FIRST_LEN) as u64 > f.total {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: tag first fragment carries {} bytes of a {}-byte message",
                len - FIRST_LEN,
                f.total
            ),
        ));
    }
    Ok(f)
}

/// A synchronous send's acknowledgement: its request, the receiver's worker.
pub fn encode_ack(req: u64, worker: u64) -> Vec<u8> {
    [req.to_le_bytes(), worker.to_le_bytes()].concat()
}

pub fn decode_ack(b: &[u8]) -> Result<(u64, u64)> {
    if b.len() != ACK_LEN {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: tag sync acknowledgement of {} bytes, {ACK_LEN} expected",
                b.len()
            ),
        ));
    }
    Ok((u64_at(b, 0), u64_at(b, 8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_truncation() {
        let from = SyncFrom {
            worker: 1,
            ep: 2,
            req: 3,
        };
        let mut b = vec![0u8; SYNC_LEN];
        put_sync_prefix(&mut b, 0xfeed, from);
        b.extend_from_slice(b"data");
        assert_eq!(decode_sync(&b).unwrap(), (0xfeed, from, &b"data"[..]));
        assert!(decode_sync(&b[..31]).is_err());
        assert_eq!(decode_eager(&b).unwrap().0, 0xfeed);
        assert!(decode_eager(&b[..7]).is_err());
        let f = First {
            tag: 9,
            worker: 8,
            msg_id: 7,
            total: 6,
            req: 5,
            ep: 4,
            data: b"abc",
        };
        let bytes = [&f.prefix()[..], f.data].concat();
        assert_eq!(decode_first_head(&bytes, bytes.len()).unwrap(), f);
        let head = decode_first_head(&bytes[..FIRST_LEN], bytes.len()).unwrap();
        assert_eq!((head.tag, head.total, head.data), (9, 6, &b""[..]));
        assert_eq!(
            f.sync_from(),
            Some(SyncFrom {
                worker: 8,
                ep: 4,
                req: 5
            })
        );
        let mut lie = bytes.clone();
        lie[24..32].copy_from_slice(&2u64.to_le_bytes());
        assert!(decode_first_head(&lie, lie.len()).is_err());
        assert!(decode_first_head(&lie[..FIRST_LEN], lie.len()).is_err());
        assert!(decode_first_head(&bytes[..47], 47).is_err());
        assert_eq!(decode_ack(&encode_ack(3, 4)).unwrap(), (3, 4));
        assert!(decode_ack(&[0; 15]).is_err());
    }
}
