//! The send fast paths: active messages, put_short and put_bcopy.
//!
//! `am_short` with nothing queued is: check the id and length, check the connection can send,
//! write the 8-byte frame header and the 8-byte AM header into the connection's (idle) send
//! buffer followed by the payload, and one `send()`. Payloads above `RUCX_TCP_SENDV_THRESH` are
//! gathered by `sendmsg()` from the caller's buffer instead. No allocation, no lock, no logging.
//! If the socket takes only part of the message, the rest stays in (or is copied to) the send
//! buffer and is written by progress; until then copied sends are appended behind it
//! (`coalesce.rs`) and the others answer `NoResource`.

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb};
use uct_transport::iov::Iov;

use crate::conn::{Conn, Tx};
use crate::ep::TcpEp;
use crate::sock;
use crate::tx::{Lent, MAX_PARTS};
use crate::wire::{encode_am_header, encode_frame, Msg, PutReq, AM_ID_MAX, FRAME_HDR_LEN};

/// Size of a PUT_REQ frame (header and payload), in front of the data.
const PUT_HDR: usize = 40;

#[cold]
fn bad_id(id: u8) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("tcp: AM id {id} out of range 0..{}", AM_ID_MAX - 1),
    )
}

#[cold]
fn too_long(what: &str, len: usize, max: usize, var: &str) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("tcp: {what} of {len} bytes exceeds the limit of {max} ({var})"),
    )
}

#[cold]
fn too_many(what: &str, n: usize, max: usize, var: &str) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("tcp: {what} with {n} I/O-vector entries, more than {max} ({var})"),
    )
}

#[cold]
fn peer_limit(conn: &Conn, len: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!(
            "tcp: message of {len} bytes exceeds what {} accepts ({} bytes: its RUCX_TCP_RX_SEG_SIZE; \
             the endpoint's attributes give the peer's limits)",
            conn.peer.get(),
            conn.peer_max.get()
        ),
    )
}

/// Sends the message just written to `tx.buf[base..base + total]`: at once from the start if
/// nothing was waiting (keeping any rest there), else appended behind the staged or unsent
/// bytes, which progress writes (`coalesce.rs`). Inlined into each sender up to the `send()`:
/// the instructions between a reply's arrival and the next send are on the latency path. What
/// a partial send needs is out of line.
#[inline(always)]
fn send_buffered(ep: &TcpEp, conn: &Conn, tx: &mut Tx, base: usize, total: usize) -> Result<()> {
    conn.tx_bytes.set(conn.tx_bytes.get() + total as u64);
    if tx.busy() || conn.staged.get() {
        tx.tail = base + total;
        return Ok(());
    }
    match sock::send(&conn.sock, &tx.buf[..total]) {
        Ok(n) if n == total => Ok(()),
        r => send_rest(ep, conn, tx, total, r),
    }
}

/// The socket took part of a message, or none (EAGAIN), or failed.
#[inline(never)]
fn send_rest(ep: &TcpEp, conn: &Conn, tx: &mut Tx, total: usize, r: nix::Result<usize>) -> Result<()> {
    let sent = match r {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN) => 0,
        Err(e) => return Err(sock::errno_status(e).into()),
    };
    tx.head = sent;
    tx.tail = total;
    ep.sh.update_interest(conn, true);
    Ok(())
}

impl TcpEp {
    #[inline]
    pub(crate) fn send_am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        let len = 8 + payload.len();
        let cfg = &self.sh.cfg;
        if id >= AM_ID_MAX {
            return Err(bad_id(id));
        }
        if len > cfg.tx_seg {
            return Err(too_long(
                "am_short",
                len,
                cfg.tx_seg,
                "am.max_short, RUCX_TCP_TX_SEG_SIZE",
            ));
        }
        let copied = payload.len() <= cfg.sendv_thresh;
        let total = FRAME_HDR_LEN + len;
        self.with_tx(if copied { total } else { 0 }, |conn, tx| {
            if len > conn.peer_max.get() as usize {
                return Err(peer_limit(conn, len));
            }
            let fh = encode_am_header(id, len).map_err(Status::from)?;
            if copied {
                let b = tx.tail;
                let out = &mut tx.buf[b..b + total];
                out[..FRAME_HDR_LEN].copy_from_slice(&fh);
                out[FRAME_HDR_LEN..FRAME_HDR_LEN + 8].copy_from_slice(&header.to_le_bytes());
                out[FRAME_HDR_LEN + 8..].copy_from_slice(payload);
                send_buffered(self, conn, tx, b, total)
            } else {
                let mut hdr = [0u8; FRAME_HDR_LEN + 8];
                hdr[..FRAME_HDR_LEN].copy_from_slice(&fh);
                hdr[FRAME_HDR_LEN..].copy_from_slice(&header.to_le_bytes());
                self.sh
                    .send_parts(conn, tx, &[&hdr, payload], 2, Lent::None, Comp::NONE)
                    .map(|_| ())
            }
        })
    }

    pub(crate) fn send_am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        if id >= AM_ID_MAX {
            return Err(bad_id(id));
        }
        if iov.len() > uct_transport::types::MAX_IOV {
            return Err(too_many(
                "am_short_iov",
                iov.len(),
                uct_transport::types::MAX_IOV,
                "MAX_IOV",
            ));
        }
        let len: usize = iov.iter().map(|e| e.len()).sum();
        if len > self.sh.cfg.tx_seg {
            return Err(too_long(
                "am_short_iov",
                len,
                self.sh.cfg.tx_seg,
                "am.max_short, RUCX_TCP_TX_SEG_SIZE",
            ));
        }
        self.with_tx(0, |conn, tx| {
            if len > conn.peer_max.get() as usize {
                return Err(peer_limit(conn, len));
            }
            let fh = encode_am_header(id, len).map_err(Status::from)?;
            let mut parts: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
            parts[0] = &fh;
            for (p, e) in parts[1..].iter_mut().zip(iov) {
                *p = e.bytes();
            }
            let n = 1 + iov.len();
            self.sh
                .send_parts(conn, tx, &parts[..n], n, Lent::None, Comp::NONE)
                .map(|_| ())
        })
    }

    pub(crate) fn send_am_bcopy(&self, id: u8, pack: PackCb) -> Result<usize> {
        if id >= AM_ID_MAX {
            return Err(bad_id(id));
        }
        let max = self.sh.cfg.tx_seg;
        self.with_tx(FRAME_HDR_LEN + max, |conn, tx| {
            let b = tx.tail;
            conn.in_pack.set(true);
            let r = pack.pack(&mut tx.buf[b + FRAME_HDR_LEN..b + FRAME_HDR_LEN + max]);
            conn.in_pack.set(false);
            let n = r?;
            if n > conn.peer_max.get() as usize {
                return Err(peer_limit(conn, n));
            }
            let fh = encode_am_header(id, n).map_err(Status::from)?;
            tx.buf[b..b + FRAME_HDR_LEN].copy_from_slice(&fh);
            send_buffered(self, conn, tx, b, FRAME_HDR_LEN + n).map(|_| n)
        })
    }

    pub(crate) fn send_am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], comp: Comp) -> Result<Outcome> {
        let cfg = &self.sh.cfg;
        if id >= AM_ID_MAX {
            return Err(bad_id(id));
        }
        if iov.len() > cfg.max_iov {
            return Err(too_many(
                "am_zcopy",
                iov.len(),
                cfg.max_iov,
                "am.max_iov, RUCX_TCP_MAX_IOV",
            ));
        }
        if header.len() > cfg.tx_seg - FRAME_HDR_LEN {
            return Err(too_long(
                "am_zcopy header",
                header.len(),
                cfg.tx_seg - FRAME_HDR_LEN,
                "am.max_hdr",
            ));
        }
        let len = header.len() + iov.iter().map(|e| e.len()).sum::<usize>();
        if len > cfg.rx_seg {
            return Err(too_long(
                "am_zcopy",
                len,
                cfg.rx_seg,
                "am.max_zcopy, RUCX_TCP_RX_SEG_SIZE",
            ));
        }
        self.with_tx(0, |conn, tx| {
            if len > conn.peer_max.get() as usize {
                return Err(peer_limit(conn, len));
            }
            let fh = encode_am_header(id, len).map_err(Status::from)?;
            let mut parts: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
            parts[0] = &fh;
            parts[1] = header;
            for (p, e) in parts[2..].iter_mut().zip(iov) {
                *p = e.bytes();
            }
            match self
                .sh
                .send_parts(conn, tx, &parts[..2 + iov.len()], 2, Lent::Iov(iov), comp)?
            {
                crate::tx::Sent::All => Ok(Outcome::Done),
                crate::tx::Sent::Stashed => Ok(Outcome::InProgress),
            }
        })
    }

    /// Fills the PUT_REQ frame in front of `len` data bytes; takes its sequence number.
    fn put_header(conn: &Conn, out: &mut [u8], raddr: u64, rkey: u64, len: usize) -> Result<()> {
        let mut ops = conn.ops.borrow_mut();
        let put = PutReq {
            remote_addr: raddr,
            rkey,
            length: len as u64,
            seq: ops.take_seq(),
            ack_req: false,
        };
        // Posted: a flush must send a barrier to learn it is done.
        ops.need_barrier = true;
        encode_frame(&Msg::PutReq(put), out)
            .map(|_| ())
            .map_err(|e| Status::from(e).into())
    }

    pub(crate) fn send_put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        let max = self.sh.cfg.tx_seg;
        if data.len() > max {
            return Err(too_long(
                "put_short",
                data.len(),
                max,
                "put.max_short, RUCX_TCP_TX_SEG_SIZE",
            ));
        }
        let total = PUT_HDR + data.len();
        self.with_tx(total, |conn, tx| {
            let b = tx.tail;
            let out = &mut tx.buf[b..b + total];
            Self::put_header(conn, &mut out[..PUT_HDR], raddr, rkey, data.len())?;
            out[PUT_HDR..].copy_from_slice(data);
            send_buffered(self, conn, tx, b, total)
        })
    }

    pub(crate) fn send_put_bcopy(&self, pack: PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        let max = self.sh.cfg.tx_seg;
        self.with_tx(PUT_HDR + max, |conn, tx| {
            let b = tx.tail;
            conn.in_pack.set(true);
            let r = pack.pack(&mut tx.buf[b + PUT_HDR..b + PUT_HDR + max]);
            conn.in_pack.set(false);
            let n = r?;
            Self::put_header(conn, &mut tx.buf[b..b + PUT_HDR], raddr, rkey, n)?;
            send_buffered(self, conn, tx, b, PUT_HDR + n).map(|_| n)
        })
    }
}
