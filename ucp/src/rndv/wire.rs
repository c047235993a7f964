//! Rendezvous messages (docs/wire-ucp.md, "Rendezvous"): RTS from the sender, ATS and RTR
//! from the receiver, DATA of the active-message pipeline. Little-endian; every decoder checks
//! lengths and returns an error for garbled bytes, never panics.

use ucs::{Error, Result, Status};

use crate::wire::{AmHeader, FLAG_REPLY};

/// Fixed part of an RTS, before the rkey and the application's header.
pub const RTS_LEN: usize = 56;
/// ATS and RTR.
pub const ATS_LEN: usize = 24;
pub const RTR_LEN: usize = 24;
/// Before the bytes of a DATA message.
pub const DATA_PREFIX_LEN: usize = 24;

/// No rkey: the receiver asks for the data with RTR (active-message pipeline).
pub const NO_RESOURCE: u8 = u8::MAX;

fn short(what: &str, need: usize, have: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ucp: {what}: {have} bytes, at least {need} needed"),
    )
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Ready-to-send: the sender's message, announced; its data stays with the sender.
#[derive(Debug, PartialEq, Eq)]
pub struct Rts<'a> {
    /// The AM header word, or the tag of a tag message.
    pub word: u64,
    /// The sender's worker and its endpoint toward the receiver.
    pub worker: u64,
    pub ep: u64,
    /// The sender's id of this transfer (ATS and RTR name it).
    pub rndv_id: u64,
    pub total: u64,
    /// Where the data is in the sender's memory, with the rkey below.
    pub addr: u64,
    /// Index of the sender's resource (worker address entry) the rkey belongs to, or
    /// [`NO_RESOURCE`].
    pub resource: u8,
    pub rkey: &'a [u8],
    pub user_hdr: &'a [u8],
}

impl Rts<'_> {
    /// The encoded message.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RTS_LEN + self.rkey.len() + self.user_hdr.len());
        b.extend_from_slice(&self.word.to_le_bytes());
        for v in [self.worker, self.ep, self.rndv_id, self.total, self.addr] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.rkey.len() as u16).to_le_bytes());
        b.push(self.resource);
        b.extend_from_slice(&[0; 5]);
        b.extend_from_slice(self.rkey);
        b.extend_from_slice(self.user_hdr);
        b
    }
}

/// Decodes an active message's RTS (the header word checked, the user header after the rkey).
pub fn decode_rts(b: &[u8]) -> Result<Rts<'_>> {
    if b.len() < RTS_LEN {
        return Err(short("rendezvous RTS", RTS_LEN, b.len()));
    }
    let hdr = AmHeader::from_word(u64_at(b, 0));
    if hdr.flags & !FLAG_REPLY != 0 || b[3] != 0 {
        return Err(Error::new(
            Status::InvalidParam,
            "ucp: rendezvous RTS: unknown flags or reserved bits in the header word",
        ));
    }
    decode_rts_with(b, hdr.user_hdr_len as usize)
}

/// Decodes a tag message's RTS (the word is the tag; no user header).
pub fn decode_tag_rts(b: &[u8]) -> Result<Rts<'_>> {
    if b.len() < RTS_LEN {
        return Err(short("tag rendezvous RTS", RTS_LEN, b.len()));
    }
    decode_rts_with(b, 0)
}

fn decode_rts_with(b: &[u8], uh: usize) -> Result<Rts<'_>> {
    if b[51..56].iter().any(|&x| x != 0) {
        return Err(Error::new(
            Status::InvalidParam,
            "ucp: rendezvous RTS: reserved bytes set",
        ));
    }
    let rkey_len = u16::from_le_bytes([b[48], b[49]]) as usize;
    if (b.len() - RTS_LEN) as u64 != rkey_len as u64 + uh as u64 {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: rendezvous RTS of {} bytes, {} announced",
                b.len(),
                RTS_LEN as u64 + rkey_len as u64 + uh as u64
            ),
        ));
    }
    let resource = b[50];
    if (resource == NO_RESOURCE) != (rkey_len == 0) {
        return Err(Error::new(
            Status::InvalidParam,
            "ucp: rendezvous RTS: an rkey without its resource, or a resource without rkey",
        ));
    }
    Ok(Rts {
        word: u64_at(b, 0),
        worker: u64_at(b, 8),
        ep: u64_at(b, 16),
        rndv_id: u64_at(b, 24),
        total: u64_at(b, 32),
        addr: u64_at(b, 40),
        resource,
        rkey: &b[RTS_LEN..RTS_LEN + rkey_len],
        user_hdr: &b[RTS_LEN + rkey_len..],
    })
}

/// Acknowledgement: the receiver is done with the sender's buffer (fetched it, or dropped the
/// message), with the status of its fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ats {
    pub rndv_id: u64,
    /// The receiver's worker (the sender checks it is the peer it sent to).
    pub worker: u64,
    pub status: Status,
}

impl Ats {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ATS_LEN);
        b.extend_from_slice(&self.rndv_id.to_le_bytes());
        b.extend_from_slice(&self.worker.to_le_bytes());
        b.extend_from_slice(&(self.status as i8 as i32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b
    }
}

pub fn decode_ats(b: &[u8]) -> Result<Ats> {
    if b.len() != ATS_LEN {
        return Err(Error::new(
            Status::InvalidParam,
            format!("ucp: rendezvous ATS of {} bytes, {ATS_LEN} expected", b.len()),
        ));
    }
    let code = i32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    // Ok or an error; a code outside UCX's table is an error all the same (`from_raw`).
    let status = i8::try_from(code).ok().filter(|&c| c <= 0).map(Status::from_raw);
    let Some(status) = status.filter(|_| b[20..24] == [0; 4]) else {
        return Err(Error::new(
            Status::InvalidParam,
            format!("ucp: rendezvous ATS with status {code} or reserved bytes set"),
        ));
    };
    Ok(Ats {
        rndv_id: u64_at(b, 0),
        worker: u64_at(b, 8),
        status,
    })
}

/// Ready-to-receive: the receiver asks for the data in DATA messages, naming its own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rtr {
    pub rndv_id: u64,
    pub recv_id: u64,
    /// The receiver's worker.
    pub worker: u64,
}

impl Rtr {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RTR_LEN);
        b.extend_from_slice(&self.rndv_id.to_le_bytes());
        b.extend_from_slice(&self.recv_id.to_le_bytes());
        b.extend_from_slice(&self.worker.to_le_bytes());
        b
    }
}

pub fn decode_rtr(b: &[u8]) -> Result<Rtr> {
    if b.len() != RTR_LEN {
        return Err(Error::new(
            Status::InvalidParam,
            format!("ucp: rendezvous RTR of {} bytes, {RTR_LEN} expected", b.len()),
        ));
    }
    Ok(Rtr {
        rndv_id: u64_at(b, 0),
        recv_id: u64_at(b, 8),
        worker: u64_at(b, 16),
    })
}

/// A piece of a pipelined rendezvous: the receiver's id, the sender's worker, the offset.
#[derive(Debug, PartialEq, Eq)]
pub struct Data<'a> {
    pub recv_id: u64,
    pub worker: u64,
    pub offset: u64,
    pub data: &'a [u8],
}

pub fn put_data_prefix(out: &mut [u8], recv_id: u64, worker: u64, offset: u64) {
    out[..8].copy_from_slice(&recv_id.to_le_bytes());
    out[8..16].copy_from_slice(&worker.to_le_bytes());
    out[16..24].copy_from_slice(&offset.to_le_bytes());
}

pub fn decode_data(b: &[u8]) -> Result<Data<'_>> {
    if b.len() < DATA_PREFIX_LEN {
        return Err(short("rendezvous DATA", DATA_PREFIX_LEN, b.len()));
    }
    Ok(Data {
        recv_id: u64_at(b, 0),
        worker: u64_at(b, 8),
        offset: u64_at(b, 16),
        data: &b[DATA_PREFIX_LEN..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rts() -> Vec<u8> {
        Rts {
            word: AmHeader {
                id: 7,
                flags: FLAG_REPLY,
                user_hdr_len: 3,
            }
            .word(),
            worker: 1,
            ep: 2,
            rndv_id: 3,
            total: 1 << 30,
            addr: 0xdead_0000,
            resource: 1,
            rkey: b"rkey",
            user_hdr: b"hdr",
        }
        .encode()
    }

    #[test]
    fn rts_round_trip_and_truncation() {
        let b = rts();
        let r = decode_rts(&b).unwrap();
        assert_eq!((r.worker, r.ep, r.rndv_id, r.total), (1, 2, 3, 1 << 30));
        assert_eq!((r.rkey, r.user_hdr, r.resource), (&b"rkey"[..], &b"hdr"[..], 1));
        for cut in 0..b.len() {
            assert!(decode_rts(&b[..cut]).is_err(), "cut {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode_rts(&long).is_err());
        // as a tag RTS the same bytes carry 3 bytes too many
        assert!(decode_tag_rts(&b).is_err());
        let tag = Rts {
            word: u64::MAX,
            user_hdr: b"",
            ..decode_rts(&b).unwrap()
        }
        .encode();
        assert_eq!(decode_tag_rts(&tag).unwrap().word, u64::MAX);
    }

    #[test]
    fn rts_rejects_reserved_and_mismatched_rkey() {
        let mut b = rts();
        b[53] = 1;
        assert!(decode_rts(&b).is_err());
        let mut b = rts();
        b[50] = NO_RESOURCE;
        assert!(decode_rts(&b).is_err());
    }

    #[test]
    fn ats_rtr_data() {
        let a = Ats {
            rndv_id: 9,
            worker: 8,
            status: Status::IoError,
        };
        assert_eq!(decode_ats(&a.encode()).unwrap(), a);
        let mut bad = a.encode();
        bad[16] = 1;
        assert!(decode_ats(&bad).is_err());
        let r = Rtr {
            rndv_id: 4,
            recv_id: 5,
            worker: 6,
        };
        assert_eq!(decode_rtr(&r.encode()).unwrap(), r);
        assert!(decode_rtr(&r.encode()[..23]).is_err());
        let mut d = vec![0u8; DATA_PREFIX_LEN];
        put_data_prefix(&mut d, 1, 2, 3);
        d.extend_from_slice(b"xy");
        let x = decode_data(&d).unwrap();
        assert_eq!((x.recv_id, x.worker, x.offset, x.data), (1, 2, 3, &b"xy"[..]));
        assert!(decode_data(&d[..23]).is_err());
    }
}
