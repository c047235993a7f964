//! An independent encoder/decoder of the tcp wire format, written from `docs/wire-tcp.md` (not
//! from `uct_tcp::wire`, so the tests check the document against the implementation), and a
//! raw-socket peer that performs the handshake and exchanges frames with a live interface.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

pub const MAGIC: [u8; 8] = *b"RUCXTCP\0";
pub const VERSION: u16 = 1;
pub const CONN_REQ: u8 = 1;
pub const CONN_ACK: u8 = 2;
pub const CONN_REJECT: u8 = 3;
pub const PREAMBLE_LEN: usize = 16;
pub const REQ_BODY_LEN: usize = 48;
pub const ACK_BODY_LEN: usize = 24;
pub const MAX_BODY: usize = 1024;

pub const PUT_REQ: u8 = 32;
pub const PUT_ACK: u8 = 33;
pub const GET_REQ: u8 = 34;
pub const GET_REP: u8 = 35;
pub const ATOMIC_REQ: u8 = 36;
pub const ATOMIC_REP: u8 = 37;
pub const KEEPALIVE: u8 = 38;
pub const FIN: u8 = 39;

pub const PUT_FLAG_ACK_REQ: u8 = 1;
pub const ATOMIC_FLAG_FETCH: u8 = 1;
pub const ATOMIC_FLAG_ACK_REQ: u8 = 2;

/// The 16-byte handshake preamble.
pub fn preamble(kind: u8, body_len: u16, max_version: u16, min_version: u16) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..8].copy_from_slice(&MAGIC);
    p[8..10].copy_from_slice(&max_version.to_le_bytes());
    p[10..12].copy_from_slice(&min_version.to_le_bytes());
    p[12] = kind;
    p[14..16].copy_from_slice(&body_len.to_le_bytes());
    p
}

/// Fields of a CONN_REQ.
#[derive(Clone, Copy, Debug)]
pub struct ConnReq {
    pub conn_sn: u64,
    pub src_ep_key: u64,
    pub dst_ep_key: u64,
    pub listen: (Ipv4Addr, u16),
    /// 0 connect to iface, 1 connect to ep.
    pub mode: u8,
    pub max_payload: u32,
}

impl ConnReq {
    /// A connect-to-iface request from a peer listening at `listen_port` on 127.0.0.1.
    pub fn to_iface(conn_sn: u64, listen_port: u16, max_payload: u32) -> ConnReq {
        ConnReq {
            conn_sn,
            src_ep_key: conn_sn ^ 0x7777,
            dst_ep_key: 0,
            listen: (Ipv4Addr::LOCALHOST, listen_port),
            mode: 0,
            max_payload,
        }
    }

    /// Preamble + body.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = preamble(CONN_REQ, REQ_BODY_LEN as u16, VERSION, VERSION).to_vec();
        v.extend_from_slice(&self.conn_sn.to_le_bytes());
        v.extend_from_slice(&self.src_ep_key.to_le_bytes());
        v.extend_from_slice(&self.dst_ep_key.to_le_bytes());
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&self.listen.0.octets());
        v.extend_from_slice(&addr);
        v.extend_from_slice(&self.listen.1.to_le_bytes());
        v.push(4); // family: IPv4
        v.push(self.mode);
        v.extend_from_slice(&self.max_payload.to_le_bytes());
        debug_assert_eq!(v.len(), PREAMBLE_LEN + REQ_BODY_LEN);
        v
    }
}

/// What the acceptor answered to a CONN_REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HsReply {
    Ack {
        conn_sn: u64,
        ep_key: u64,
        max_payload: u32,
        version: u16,
    },
    Reject {
        conn_sn: u64,
        reason: u8,
    },
}

/// Parses a handshake reply (preamble + body).
pub fn parse_hs_reply(pre: &[u8; 16], body: &[u8]) -> Result<HsReply, String> {
    if pre[..8] != MAGIC {
        return Err(format!("reply preamble has bad magic {:02x?}", &pre[..8]));
    }
    let u64at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap());
    match pre[12] {
        CONN_ACK if body.len() >= ACK_BODY_LEN => Ok(HsReply::Ack {
            conn_sn: u64at(0),
            ep_key: u64at(8),
            max_payload: u32::from_le_bytes(body[16..20].try_into().unwrap()),
            version: u16::from_le_bytes(body[20..22].try_into().unwrap()),
        }),
        CONN_REJECT if body.len() >= 16 => Ok(HsReply::Reject {
            conn_sn: u64at(0),
            reason: body[8],
        }),
        k => Err(format!(
            "unexpected handshake reply kind {k} with a body of {} bytes",
            body.len()
        )),
    }
}

/// A frame header followed by `payload`.
pub fn frame(ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + payload.len());
    v.push(ty);
    v.extend_from_slice(&[0, 0, 0]);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// A bare frame header announcing `len` payload bytes (for forging oversized frames).
pub fn header(ty: u8, len: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0] = ty;
    h[4..].copy_from_slice(&len.to_le_bytes());
    h
}

/// PUT_REQ frame (without its bulk data).
pub fn put_req(remote_addr: u64, rkey: u64, length: u64, seq: u32, flags: u8) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&remote_addr.to_le_bytes());
    p.extend_from_slice(&rkey.to_le_bytes());
    p.extend_from_slice(&length.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&[flags, 0, 0, 0]);
    frame(PUT_REQ, &p)
}

/// GET_REQ frame.
pub fn get_req(remote_addr: u64, rkey: u64, length: u64, seq: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&remote_addr.to_le_bytes());
    p.extend_from_slice(&rkey.to_le_bytes());
    p.extend_from_slice(&length.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&[0; 4]);
    frame(GET_REQ, &p)
}

/// ATOMIC_REQ frame.
#[allow(clippy::too_many_arguments)]
pub fn atomic_req(
    remote_addr: u64,
    rkey: u64,
    operand: u64,
    compare: u64,
    seq: u32,
    op: u8,
    size: u8,
    flags: u8,
) -> Vec<u8> {
    let mut p = Vec::with_capacity(40);
    p.extend_from_slice(&remote_addr.to_le_bytes());
    p.extend_from_slice(&rkey.to_le_bytes());
    p.extend_from_slice(&operand.to_le_bytes());
    p.extend_from_slice(&compare.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&[op, size, flags, 0]);
    frame(ATOMIC_REQ, &p)
}

/// A frame received from the interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RxFrame {
    Am { id: u8, data: Vec<u8> },
    PutAck { seq: u32, status: i8 },
    GetRep { seq: u32, status: i8, data: Vec<u8> },
    AtomicRep { value: u64, seq: u32, status: i8 },
    Fin,
    Other { ty: u8, payload: Vec<u8> },
}

/// How reading from the interface ended without a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RxEnd {
    /// Orderly close (read returned 0) or reset: the interface dropped the connection.
    Closed(String),
    /// Nothing arrived within the deadline.
    Timeout,
    /// The bytes do not follow the format.
    Garbled(String),
}

/// Reads exactly `buf.len()` bytes before `deadline`.
pub fn read_full(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), RxEnd> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RxEnd::Timeout);
        }
        s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).ok();
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(RxEnd::Closed(format!("EOF after {got} of {} bytes", buf.len()))),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(RxEnd::Closed(format!("read error: {e}"))),
        }
    }
    Ok(())
}

/// Waits until the peer closes the connection (EOF or reset), discarding what it sends.
pub fn wait_closed(s: &mut TcpStream, limit: Duration) -> Result<String, RxEnd> {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RxEnd::Timeout);
        }
        s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).ok();
        match s.read(&mut buf) {
            Ok(0) => return Ok("EOF".into()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Ok(format!("{e}")),
        }
    }
}

/// A raw connection to an interface that completed the handshake.
pub struct RawConn {
    pub stream: TcpStream,
    /// Stands for our "interface" (its port goes into CONN_REQ); never accepted from.
    pub listener: TcpListener,
    pub ack_max_payload: u32,
    pub ack_ep_key: u64,
}

/// Connects to 127.0.0.1:`port` (TCP_NODELAY on, so small writes leave as separate segments).
pub fn connect(port: u16) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(10),
    )?;
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(Duration::from_secs(20)))?;
    Ok(s)
}

impl RawConn {
    /// Connects and completes a connect-to-iface handshake. `write` sends the CONN_REQ bytes
    /// (so a test can split them).
    pub fn open_with(
        port: u16,
        conn_sn: u64,
        write: impl FnOnce(&mut TcpStream, &[u8]) -> std::io::Result<()>,
    ) -> Result<RawConn, String> {
        let listener = super::bind_listener().map_err(|e| e.to_string())?;
        let lport = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mut stream = connect(port).map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
        let req = ConnReq::to_iface(conn_sn, lport, 1 << 20);
        write(&mut stream, &req.encode()).map_err(|e| format!("sending CONN_REQ: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut pre = [0u8; 16];
        read_full(&mut stream, &mut pre, deadline)
            .map_err(|e| format!("reading the CONN_ACK preamble: {e:?}"))?;
        let blen = u16::from_le_bytes([pre[14], pre[15]]) as usize;
        if blen > MAX_BODY {
            return Err(format!("reply body_len {blen} exceeds {MAX_BODY}"));
        }
        let mut body = vec![0u8; blen];
        read_full(&mut stream, &mut body, deadline)
            .map_err(|e| format!("reading the CONN_ACK body: {e:?}"))?;
        match parse_hs_reply(&pre, &body)? {
            HsReply::Ack {
                conn_sn: sn,
                ep_key,
                max_payload,
                version,
            } => {
                if sn != conn_sn {
                    return Err(format!("CONN_ACK echoes conn_sn {sn:#x}, we sent {conn_sn:#x}"));
                }
                if version != VERSION {
                    return Err(format!(
                        "CONN_ACK negotiated version {version}, expected {VERSION}"
                    ));
                }
                if max_payload < 64 {
                    return Err(format!("CONN_ACK max_payload {max_payload} < 64"));
                }
                Ok(RawConn {
                    stream,
                    listener,
                    ack_max_payload: max_payload,
                    ack_ep_key: ep_key,
                })
            }
            r => Err(format!("the interface refused a valid CONN_REQ: {r:?}")),
        }
    }

    /// Connects and completes a connect-to-iface handshake in one write.
    pub fn open(port: u16, conn_sn: u64) -> Result<RawConn, String> {
        Self::open_with(port, conn_sn, |s, b| s.write_all(b))
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next frame other than KEEPALIVE, within `limit`.
    pub fn recv_frame(&mut self, limit: Duration) -> Result<RxFrame, RxEnd> {
        let deadline = Instant::now() + limit;
        loop {
            let mut h = [0u8; 8];
            read_full(&mut self.stream, &mut h, deadline)?;
            if h[1..4] != [0, 0, 0] {
                return Err(RxEnd::Garbled(format!(
                    "frame header with reserved bytes {:02x?}",
                    &h[1..4]
                )));
            }
            let ty = h[0];
            let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
            if len > (1 << 24) {
                return Err(RxEnd::Garbled(format!("frame type {ty} announces {len} bytes")));
            }
            let mut p = vec![0u8; len];
            read_full(&mut self.stream, &mut p, deadline)?;
            let st = |o: usize| p[o] as i8;
            return Ok(match ty {
                0..=31 => RxFrame::Am { id: ty, data: p },
                PUT_ACK if len == 8 => RxFrame::PutAck {
                    seq: u32::from_le_bytes(p[0..4].try_into().unwrap()),
                    status: st(4),
                },
                GET_REP if len == 16 => {
                    let blen = u64::from_le_bytes(p[0..8].try_into().unwrap()) as usize;
                    if blen > (1 << 24) {
                        return Err(RxEnd::Garbled(format!("GET_REP announces {blen} bulk bytes")));
                    }
                    let mut data = vec![0u8; blen];
                    read_full(&mut self.stream, &mut data, deadline)?;
                    RxFrame::GetRep {
                        seq: u32::from_le_bytes(p[8..12].try_into().unwrap()),
                        status: st(12),
                        data,
                    }
                }
                ATOMIC_REP if len == 16 => RxFrame::AtomicRep {
                    value: u64::from_le_bytes(p[0..8].try_into().unwrap()),
                    seq: u32::from_le_bytes(p[8..12].try_into().unwrap()),
                    status: st(12),
                },
                KEEPALIVE => continue,
                FIN => RxFrame::Fin,
                _ => RxFrame::Other { ty, payload: p },
            });
        }
    }

    /// Closes our sending direction (the interface sees EOF).
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_documented_sizes_and_fields() {
        let r = ConnReq::to_iface(5, 4000, 4096).encode();
        assert_eq!(r.len(), 64);
        assert_eq!(&r[..8], b"RUCXTCP\0");
        assert_eq!(
            u64::from_le_bytes(r[..8].try_into().unwrap()),
            0x0050_4354_5843_5552
        );
        assert_eq!(r[12], CONN_REQ);
        assert_eq!(&r[16 + 24..16 + 28], &[127, 0, 0, 1]);
        assert_eq!(u16::from_le_bytes([r[56], r[57]]), 4000);
        assert_eq!((r[58], r[59]), (4, 0));
        assert_eq!(put_req(1, 2, 3, 4, 1).len(), 8 + 32);
        assert_eq!(get_req(1, 2, 3, 4).len(), 8 + 32);
        assert_eq!(atomic_req(1, 2, 3, 0, 4, 0, 8, 1).len(), 8 + 40);
        assert_eq!(frame(7, b"abc"), vec![7, 0, 0, 0, 3, 0, 0, 0, b'a', b'b', b'c']);
    }
}
