//! The connection manager's messages (docs/wire-ucp.md, "Connection manager"): what a client
//! and a listener say over their TCP connection before any transport is wired. The listener
//! announces its worker address (ANNOUNCE) as soon as it accepts the connection; the client
//! answers with its own (REQUEST); the server's application accepts (ACCEPT, with the server's
//! endpoint id) or refuses (REJECT). Little-endian, versioned, every length bounded; the
//! [`Reader`] takes a message from a byte stream in pieces and refuses a bad header before the
//! body arrives.

use ucs::{Error, Result, Status};

/// The first bytes of every message.
pub const MAGIC: [u8; 4] = *b"RXCM";
/// The format version this reader speaks.
pub const VERSION: u8 = 1;
/// Magic, version, type, flags, reserved, body length.
pub const HEADER_LEN: usize = 4 + 1 + 1 + 1 + 1 + 4;
/// Worker id, connection id, endpoint id, address length.
pub const BODY_FIXED: usize = 8 + 8 + 8 + 4;
/// Largest worker address a message carries (a packed address is at most about 141 KiB).
pub const MAX_ADDRESS_LEN: usize = 256 * 1024;
/// Largest body.
pub const MAX_BODY: usize = BODY_FIXED + MAX_ADDRESS_LEN;
/// Connection ids are below this; the wireup connection number of the endpoint pair is the id
/// with this bit set, a range `Worker::connect`'s own numbers never reach.
pub const CONN_SN_BIT: u64 = 1 << 63;
/// REQUEST flag: the client's endpoint uses `ErrMode::Peer` (both sides select lanes with it).
pub const FLAG_ERR_PEER: u8 = 1;

/// The message types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Server → client, first: the server's worker address.
    Announce = 1,
    /// Client → server: asks for an endpoint pair; the client's address and endpoint.
    Request = 2,
    /// Server → client: accepted; the server's endpoint.
    Accept = 3,
    /// Server → client: refused.
    Reject = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Announce),
            2 => Some(Kind::Request),
            3 => Some(Kind::Accept),
            4 => Some(Kind::Reject),
            _ => None,
        }
    }
}

/// A connection-manager message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub kind: Kind,
    /// `FLAG_*` bits (REQUEST only).
    pub flags: u8,
    /// The sender's worker id.
    pub worker: u64,
    /// The client's id of this connection (REQUEST, echoed in ACCEPT and REJECT; 0 in
    /// ANNOUNCE), below [`CONN_SN_BIT`].
    pub conn_id: u64,
    /// The sender's endpoint id (REQUEST, ACCEPT; 0 otherwise).
    pub ep: u64,
    /// The sender's packed worker address (ANNOUNCE, REQUEST; empty otherwise).
    pub address: Vec<u8>,
}

fn bad(why: String) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ucp: connection manager message: {why}"),
    )
}

/// Checks a header: its type, flags and body length.
pub fn decode_header(h: &[u8]) -> Result<(Kind, u8, usize)> {
    if h.len() < HEADER_LEN {
        return Err(bad(format!("{} bytes, a header is {HEADER_LEN}", h.len())));
    }
    if h[..4] != MAGIC {
        return Err(bad(format!(
            "magic {:02x?} is not {MAGIC:02x?} (\"RXCM\"): not a rucx client",
            &h[..4]
        )));
    }
    if h[4] != VERSION {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "ucp: connection manager message version {} (this worker speaks {VERSION}): \
                 the peer runs an incompatible rucx release",
                h[4]
            ),
        ));
    }
    let kind = Kind::from_u8(h[5]).ok_or_else(|| bad(format!("unknown type {}", h[5])))?;
    let flags = h[6];
    if flags & !FLAG_ERR_PEER != 0 || (flags != 0 && kind != Kind::Request) {
        return Err(bad(format!("flags {flags:#04x} in {kind:?}")));
    }
    if h[7] != 0 {
        return Err(bad(format!("reserved byte {:#04x} is not 0", h[7])));
    }
    let len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
    if !(BODY_FIXED..=MAX_BODY).contains(&len) {
        return Err(bad(format!(
            "body of {len} bytes (from {BODY_FIXED} to {MAX_BODY})"
        )));
    }
    Ok((kind, flags, len))
}

impl Msg {
    /// The per-type rules (what `decode` accepts and `encode` expects).
    fn check(&self) -> Result<()> {
        if self.conn_id >= CONN_SN_BIT {
            return Err(bad(format!("connection id {:#x} has bit 63 set", self.conn_id)));
        }
        if self.address.len() > MAX_ADDRESS_LEN {
            return Err(bad(format!(
                "address of {} bytes (at most {MAX_ADDRESS_LEN})",
                self.address.len()
            )));
        }
        if self.flags & !FLAG_ERR_PEER != 0 || (self.flags != 0 && self.kind != Kind::Request) {
            return Err(bad(format!("flags {:#04x} in {:?}", self.flags, self.kind)));
        }
        if self.kind == Kind::Announce && self.conn_id != 0 {
            return Err(bad(format!("Announce with connection id {:#x}", self.conn_id)));
        }
        let (ep_ok, addr_ok) = match self.kind {
            Kind::Announce => (self.ep == 0, !self.address.is_empty()),
            Kind::Request => (self.ep != 0, !self.address.is_empty()),
            Kind::Accept => (self.ep != 0, self.address.is_empty()),
            Kind::Reject => (self.ep == 0, self.address.is_empty()),
        };
        if !ep_ok {
            return Err(bad(format!("{:?} with endpoint id {:#x}", self.kind, self.ep)));
        }
        if !addr_ok {
            return Err(bad(format!(
                "{:?} with an address of {} bytes",
                self.kind,
                self.address.len()
            )));
        }
        Ok(())
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(self.check().is_ok(), "{:?}", self.check());
        let body = BODY_FIXED + self.address.len();
        let mut b = Vec::with_capacity(HEADER_LEN + body);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(self.kind as u8);
        b.push(self.flags);
        b.push(0);
        b.extend_from_slice(&(body as u32).to_le_bytes());
        for v in [self.worker, self.conn_id, self.ep] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.address.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.address);
        b
    }

    /// Reads one whole message: `b` must be exactly one.
    pub fn decode(b: &[u8]) -> Result<Msg> {
        let (kind, flags, len) = decode_header(b)?;
        let body = &b[HEADER_LEN..];
        if body.len() != len {
            return Err(bad(format!(
                "body of {} bytes, the header says {len}",
                body.len()
            )));
        }
        let u = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let addr_len = u32::from_le_bytes(body[24..28].try_into().expect("4 bytes")) as usize;
        if addr_len != len - BODY_FIXED {
            return Err(bad(format!(
                "address of {addr_len} bytes in a body of {len} (needs {})",
                BODY_FIXED + addr_len
            )));
        }
        let m = Msg {
            kind,
            flags,
            worker: u(0),
            conn_id: u(8),
            ep: u(16),
            address: body[BODY_FIXED..].to_vec(),
        };
        m.check()?;
        Ok(m)
    }
}

/// Takes one message from a byte stream, in pieces of any size: read at most
/// [`Reader::want`] bytes at a time and [`Reader::push`] them. The buffer grows with the bytes
/// received, whatever length a header claims.
#[derive(Default)]
pub struct Reader {
    buf: Vec<u8>,
    /// The body length, once the header has been read and checked.
    body: Option<usize>,
}

impl Reader {
    /// Bytes still missing from the message (0 once it is complete).
    pub fn want(&self) -> usize {
        match self.body {
            None => HEADER_LEN - self.buf.len(),
            Some(len) => HEADER_LEN + len - self.buf.len(),
        }
    }

    /// Bytes received so far.
    pub fn received(&self) -> usize {
        self.buf.len()
    }

    /// Adds `data` (at most [`Reader::want`] bytes): the message once it is complete, an error
    /// as soon as the header or the message is bad.
    pub fn push(&mut self, data: &[u8]) -> Result<Option<Msg>> {
        if data.len() > self.want() {
            return Err(bad(format!(
                "{} bytes pushed, {} wanted",
                data.len(),
                self.want()
            )));
        }
        self.buf.extend_from_slice(data);
        if self.body.is_none() && self.buf.len() == HEADER_LEN {
            self.body = Some(decode_header(&self.buf)?.2);
        }
        if self.body.is_some() && self.want() == 0 {
            return Msg::decode(&self.buf).map(Some);
        }
        Ok(None)
    }
}

/// Fuzz body `ucp_cm`: a message read whole and the same bytes streamed through a [`Reader`]
/// in pieces agree; decoding never panics; errors carry a message; what decodes re-encodes to
/// the same bytes. The first byte picks the piece sizes, the rest is the input.
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub fn fuzz_cm(data: &[u8]) {
    let Some((&step, data)) = data.split_first() else {
        return;
    };
    let check_err = |e: &Error| {
        assert!(
            matches!(e.status(), Status::InvalidParam | Status::Unsupported),
            "unexpected status {e}"
        );
        assert!(
            e.context().is_some_and(|c| !c.is_empty()),
            "an error without a message"
        );
    };
    let whole = Msg::decode(data);
    match &whole {
        Ok(m) => assert_eq!(m.encode(), data, "re-encoding changed the bytes"),
        Err(e) => check_err(e),
    }
    let mut r = Reader::default();
    let mut at = 0;
    let mut piece = 1 + (step as usize % 7);
    loop {
        let n = piece.min(r.want()).min(data.len() - at);
        match r.push(&data[at..at + n]) {
            Ok(Some(m)) => {
                at += n;
                assert_eq!(Msg::decode(&data[..at]).as_ref(), Ok(&m));
                if at == data.len() {
                    assert_eq!(whole.as_ref(), Ok(&m));
                } else {
                    assert!(whole.is_err(), "a whole decode accepted trailing bytes");
                }
                return;
            }
            Ok(None) if at + n == data.len() => {
                assert!(whole.is_err(), "a whole decode accepted a truncated message");
                return;
            }
            Ok(None) => at += n,
            Err(e) => {
                check_err(&e);
                assert!(
                    whole.is_err(),
                    "the stream refused what a whole decode accepted: {e}"
                );
                return;
            }
        }
        piece = piece * 3 % 1000 + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Msg {
        Msg {
            kind: Kind::Request,
            flags: FLAG_ERR_PEER,
            worker: 0x1122_3344_5566_7788,
            conn_id: 5,
            ep: 0x1_0000_0002,
            address: b"RXWA-address".to_vec(),
        }
    }

    fn others() -> [Msg; 3] {
        [
            Msg {
                kind: Kind::Announce,
                flags: 0,
                conn_id: 0,
                ep: 0,
                ..request()
            },
            Msg {
                kind: Kind::Accept,
                flags: 0,
                ep: 0x1_0000_0003,
                address: Vec::new(),
                ..request()
            },
            Msg {
                kind: Kind::Reject,
                flags: 0,
                ep: 0,
                address: Vec::new(),
                ..request()
            },
        ]
    }

    #[test]
    fn golden_layout() {
        let b = request().encode();
        let mut want = b"RXCM".to_vec();
        want.extend_from_slice(&[1, 2, 1, 0, 40, 0, 0, 0]);
        want.extend_from_slice(&[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        want.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0]);
        want.extend_from_slice(&[12, 0, 0, 0]);
        want.extend_from_slice(b"RXWA-address");
        assert_eq!(b, want);
        assert_eq!(Msg::decode(&b).unwrap(), request());
    }

    #[test]
    fn every_kind_round_trips_and_every_cut_is_refused() {
        let [a, b, c] = others();
        for m in [request(), a, b, c] {
            let b = m.encode();
            assert_eq!(Msg::decode(&b).unwrap(), m);
            for cut in 0..b.len() {
                assert!(Msg::decode(&b[..cut]).is_err(), "{:?} cut at {cut}", m.kind);
            }
            let mut long = b.clone();
            long.push(0);
            assert!(Msg::decode(&long).is_err());
        }
    }

    #[test]
    fn refusals() {
        let b = request().encode();
        let refused = |f: &dyn Fn(&mut Vec<u8>), status: Status, what: &str| {
            let mut v = b.clone();
            f(&mut v);
            let e = Msg::decode(&v).unwrap_err();
            assert_eq!(e.status(), status, "{what}: {e}");
            assert!(e.context().unwrap().contains("connection manager"), "{e}");
        };
        refused(&|v| v[0] = b'X', Status::InvalidParam, "magic");
        refused(&|v| v[4] = 2, Status::Unsupported, "version");
        refused(&|v| v[5] = 9, Status::InvalidParam, "type");
        refused(&|v| v[5] = 4, Status::InvalidParam, "reject with flags");
        refused(&|v| v[6] = 2, Status::InvalidParam, "unknown flag");
        refused(&|v| v[7] = 1, Status::InvalidParam, "reserved byte");
        refused(&|v| v[27] = 0x80, Status::InvalidParam, "conn id bit 63");
        refused(
            &|v| v[28..36].fill(0),
            Status::InvalidParam,
            "request without an endpoint id",
        );
        refused(&|v| v[36] = 13, Status::InvalidParam, "address length");
        // A huge claimed body is refused at the header, before any of it is read.
        let mut h = b[..HEADER_LEN].to_vec();
        h[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = Reader::default();
        assert!(r.push(&h).is_err());
    }

    #[test]
    fn reader_takes_pieces() {
        let b = request().encode();
        for piece in 1..=b.len() {
            let mut r = Reader::default();
            let mut at = 0;
            let got = loop {
                let n = piece.min(r.want());
                let m = r.push(&b[at..at + n]).unwrap();
                at += n;
                if let Some(m) = m {
                    break m;
                }
            };
            assert_eq!(got, request());
            assert_eq!(at, b.len());
            assert_eq!(r.want(), 0);
        }
        let mut r = Reader::default();
        assert!(r.push(&b).is_err(), "more than wanted");
    }

    /// xorshift64, so the seeded inputs never change.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn fuzz_seeds_and_mutations() {
        let [a, b, c] = others();
        let seeds = [request().encode(), a.encode(), b.encode(), c.encode()];
        let mut r = rng(0x243f_6a88_85a3_08d3);
        for s in seeds {
            for step in 0..8u8 {
                fuzz_cm(&[&[step][..], &s].concat());
            }
            for _ in 0..3000 {
                let mut m = s.clone();
                match r() % 3 {
                    0 => {
                        let i = (r() as usize) % m.len();
                        m[i] ^= 1 << (r() % 8);
                    }
                    1 => m.truncate((r() as usize) % m.len()),
                    _ => m.extend((0..r() % 16).map(|_| r() as u8)),
                }
                fuzz_cm(&[&[r() as u8][..], &m].concat());
            }
        }
        fuzz_cm(&[]);
        fuzz_cm(&[0]);
    }
}
