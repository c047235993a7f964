//! Writing messages to a connection's socket.
//!
//! A message is a list of parts: the first `n_copy` (frame headers, short payloads) are copied
//! into the connection's send buffer if the socket does not take them at once; the others
//! (zcopy iovs, registered memory read by a get) stay where they are and are referenced until
//! written. Either way the call returns at once: at most one message per connection is partly
//! sent (copied ones may queue behind it, `coalesce.rs`), and other user sends answer
//! `NoResource` until progress has written the rest.

use std::io::IoSlice;

use nix::errno::Errno;
use ucs::{Error, Result, Status};
use uct_transport::callbacks::Comp;
use uct_transport::iov::Iov;

use crate::conn::{Conn, Ctl, Tx, ZcTail, MAX_TX_IOV};
use crate::iface::Shared;
use crate::sock;
use crate::wire::{encode_frame, GetRep, Msg};

/// Most parts of one message: frame header, AM header, up to MAX_IOV user entries.
pub const MAX_PARTS: usize = uct_transport::types::MAX_IOV + 2;

/// Where the parts after the copied ones live.
#[derive(Clone, Copy)]
pub enum Lent<'a> {
    None,
    /// The parts are these entries' bytes, in order.
    Iov(&'a [Iov<'a>]),
    /// The one part is `[addr, +len)` of the region of `key`.
    Region {
        key: u64,
        addr: u64,
    },
}

/// How a send went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Everything is in the socket.
    All,
    /// The rest waits in the connection's send buffer for progress.
    Stashed,
}

/// An entry pointing nowhere (fills unused array slots).
fn iov_empty() -> Iov<'static> {
    raw_iov(std::ptr::null_mut(), 0)
}

fn raw_iov(buffer: *mut u8, length: usize) -> Iov<'static> {
    Iov::from_raw(uct_transport::abi::RawIov {
        buffer,
        length,
        memh: std::ptr::null_mut(),
    })
}

/// Records the unsent remainder (everything after `sent` bytes) in `tx`.
fn stash(
    tx: &mut Tx,
    parts: &[&[u8]],
    n_copy: usize,
    lent: Lent<'_>,
    mut sent: usize,
    comp: Comp,
) -> Result<()> {
    tx.head = 0;
    tx.tail = 0;
    for p in &parts[..n_copy] {
        if sent >= p.len() {
            sent -= p.len();
            continue;
        }
        let rest = &p[sent..];
        sent = 0;
        let Some(dst) = tx.buf.get_mut(tx.tail..tx.tail + rest.len()) else {
            ucs::error!("tcp: message header larger than the send buffer (internal error)");
            return Err(Status::IoError.into());
        };
        dst.copy_from_slice(rest);
        tx.tail += rest.len();
    }
    match lent {
        Lent::None => {}
        Lent::Iov(iov) => {
            let mut idx = 0;
            while idx < iov.len() && sent >= iov[idx].len() {
                sent -= iov[idx].len();
                idx += 1;
            }
            if idx < iov.len() {
                let mut arr = tx
                    .iov_spare
                    .take()
                    .unwrap_or_else(|| Box::new([iov_empty(); MAX_TX_IOV]));
                for (a, e) in arr.iter_mut().zip(iov) {
                    *a = e.detach();
                }
                tx.zc = ZcTail::Iov {
                    iov: arr,
                    n: iov.len(),
                    idx,
                    off: sent,
                };
            }
        }
        Lent::Region { key, addr } => {
            let total = parts.get(n_copy).map_or(0, |p| p.len());
            if sent < total {
                tx.zc = ZcTail::Region {
                    key,
                    addr: addr + sent as u64,
                    left: (total - sent) as u64,
                };
            }
        }
    }
    tx.comp = comp;
    Ok(())
}

/// Consumes `n` written bytes of the remainder.
fn advance(tx: &mut Tx, mut n: usize) {
    let k = n.min(tx.tail - tx.head);
    tx.head += k;
    n -= k;
    if tx.head == tx.tail {
        tx.head = 0;
        tx.tail = 0;
    }
    match &mut tx.zc {
        ZcTail::None => {}
        ZcTail::Iov {
            iov,
            n: count,
            idx,
            off,
        } => {
            while *idx < *count {
                let rem = iov[*idx].len() - *off;
                if n >= rem {
                    n -= rem;
                    *idx += 1;
                    *off = 0;
                } else {
                    *off += n;
                    break;
                }
            }
            if *idx >= *count {
                tx.end_zc();
            }
        }
        ZcTail::Region { addr, left, .. } => {
            *addr += n as u64;
            *left -= n as u64;
            if *left == 0 {
                tx.zc = ZcTail::None;
            }
        }
    }
}

impl Shared {
    /// Sends one message (see the module docs). `Err` is a socket error (the caller fails the
    /// connection) or an internal one.
    pub fn send_parts(
        &self,
        conn: &Conn,
        tx: &mut Tx,
        parts: &[&[u8]],
        n_copy: usize,
        lent: Lent<'_>,
        comp: Comp,
    ) -> Result<Sent> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        conn.tx_bytes.set(conn.tx_bytes.get() + total as u64);
        let r = if parts.len() == 1 {
            sock::send(&conn.sock, parts[0])
        } else {
            let mut sl = [IoSlice::new(&[]); MAX_PARTS + 1];
            let k = parts.len().min(sl.len());
            for (s, p) in sl.iter_mut().zip(parts) {
                *s = IoSlice::new(p);
            }
            sock::sendv(&conn.sock, &sl[..k])
        };
        let sent = match r {
            Ok(n) if n >= total => return Ok(Sent::All),
            Ok(n) => n,
            Err(Errno::EAGAIN) => 0,
            Err(e) => return Err(sock::errno_status(e).into()),
        };
        if tx.buf.is_empty() {
            tx.buf = self.tx_bufs.take();
        }
        stash(tx, parts, n_copy, lent, sent, comp)?;
        self.update_interest(conn, true);
        Ok(Sent::Stashed)
    }

    /// Writes what is left of the current message. `Ok(true)` when it is all written (the
    /// caller completes `tx.comp`), `Ok(false)` while the socket is full.
    pub fn drain_tx(&self, conn: &Conn, tx: &mut Tx) -> Result<bool> {
        while tx.busy() {
            let r = {
                let head = &tx.buf[tx.head..tx.tail];
                match &tx.zc {
                    ZcTail::None => sock::send(&conn.sock, head),
                    ZcTail::Iov { iov, n, idx, off } => {
                        let mut sl = [IoSlice::new(&[]); MAX_TX_IOV + 1];
                        sl[0] = IoSlice::new(head);
                        let mut k = 1;
                        for (i, e) in iov[*idx..*n].iter().enumerate() {
                            let b = e.bytes();
                            sl[k] = IoSlice::new(if i == 0 { &b[*off..] } else { b });
                            k += 1;
                        }
                        sock::sendv(&conn.sock, &sl[..k])
                    }
                    ZcTail::Region { key, addr, left } => {
                        let len = usize::try_from(*left).unwrap_or(usize::MAX);
                        let r = self.regions.with_source(*key, *addr, len, |src| {
                            sock::sendv(&conn.sock, &[IoSlice::new(head), IoSlice::new(src)])
                        });
                        match r {
                            Ok(r) => r,
                            Err(_) => {
                                ucs::error!(
                                    "tcp: memory read by {}'s get was deregistered while being sent; \
                                     dropping the connection",
                                    conn.peer.get()
                                );
                                return Err(Status::IoError.into());
                            }
                        }
                    }
                }
            };
            match r {
                // Every call offers all that is left, so a short write means the socket is
                // full: wait for EPOLLOUT rather than spend a call on EAGAIN.
                Ok(n) => {
                    advance(tx, n);
                    if tx.busy() {
                        return Ok(false);
                    }
                }
                Err(Errno::EAGAIN) => return Ok(false),
                Err(e) => return Err(sock::errno_status(e).into()),
            }
        }
        Ok(true)
    }

    /// Sends a target-side reply (the send buffer must be idle).
    pub fn send_ctl(&self, conn: &Conn, tx: &mut Tx, ctl: &Ctl) -> Result<Sent> {
        match *ctl {
            Ctl::Small { b, n } => self.send_parts(conn, tx, &[&b[..n as usize]], 1, Lent::None, Comp::NONE),
            Ctl::GetRep { seq, key, addr, len } => {
                let ulen = usize::try_from(len).map_err(|_| Error::from(Status::InvalidParam));
                let r = ulen.and_then(|ulen| {
                    self.regions.with_source(key, addr, ulen, |src| {
                        let mut hdr = [0u8; 24];
                        let m = Msg::GetRep(GetRep {
                            length: len,
                            seq,
                            status: Status::Ok,
                        });
                        let h = encode_frame(&m, &mut hdr).map_err(Status::from)?;
                        self.send_parts(
                            conn,
                            tx,
                            &[&hdr[..h], src],
                            1,
                            Lent::Region { key, addr },
                            Comp::NONE,
                        )
                    })
                });
                match r {
                    Ok(r) => r,
                    Err(st) => {
                        ucs::warn!(
                            "tcp: get of [{addr:#x}, +{len}) by {} refused at reply time (memory deregistered?)",
                            conn.peer.get()
                        );
                        let c = small_ctl(&Msg::GetRep(GetRep {
                            length: 0,
                            seq,
                            status: st.status(),
                        }));
                        self.send_ctl(conn, tx, &c)
                    }
                }
            }
        }
    }
}

/// Encodes a small reply frame.
pub fn small_ctl(m: &Msg<'_>) -> Ctl {
    let mut b = [0u8; 24];
    let n = encode_frame(m, &mut b).unwrap_or(0);
    Ctl::Small { b, n: n as u8 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stash_and_advance_track_the_remainder() {
        let mut tx = Tx::new(64);
        let a = [1u8; 8];
        let data = [2u8; 10];
        let data2 = [3u8; 5];
        let iov = [
            raw_iov(data.as_ptr() as *mut u8, 10),
            raw_iov(data2.as_ptr() as *mut u8, 5),
        ];
        stash(&mut tx, &[&a, &data, &data2], 1, Lent::Iov(&iov), 3, Comp::NONE).unwrap();
        assert_eq!((tx.head, tx.tail), (0, 5));
        assert!(matches!(
            tx.zc,
            ZcTail::Iov {
                idx: 0,
                off: 0,
                n: 2,
                ..
            }
        ));
        advance(&mut tx, 7);
        assert_eq!((tx.head, tx.tail), (0, 0));
        assert!(matches!(tx.zc, ZcTail::Iov { idx: 0, off: 2, .. }));
        advance(&mut tx, 9);
        assert!(matches!(tx.zc, ZcTail::Iov { idx: 1, off: 1, .. }));
        advance(&mut tx, 4);
        assert!(!tx.busy());
        // Everything sent except part of the lent region.
        stash(
            &mut tx,
            &[&a, &data],
            1,
            Lent::Region { key: 1, addr: 100 },
            12,
            Comp::NONE,
        )
        .unwrap();
        assert!(matches!(
            tx.zc,
            ZcTail::Region {
                addr: 104,
                left: 6,
                ..
            }
        ));
        assert_eq!(tx.tail, 0);
    }
}
