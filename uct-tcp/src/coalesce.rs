//! Coalescing copied sends (`RUCX_TCP_TX_COALESCE`): one `send()` for many messages.
//!
//! A message costs the sender one system call, and on loopback that call also runs the
//! receiver's TCP input: an 8000-byte am_bcopy stream spends its time there, not in copies.
//! Copied sends (am_short up to SENDV_THRESH, am_bcopy, put_short, put_bcopy) therefore share
//! a `send()` in two cases, and keep their frames and order on the wire:
//!
//! - **Bursts.** The first copied send on a connection after a progress call goes out at once
//!   (a lone message, a request awaiting its reply: latency is untouched). Further ones before
//!   the next progress call are *staged*: appended to the send buffer, which the next progress
//!   call writes with one `send()` before anything else (also when the buffer is full, and
//!   before a send that cannot join, such as a zcopy). `event_arm` answers `Busy` while
//!   anything is staged, so a process about to sleep progresses first; `flush` waits for it
//!   like for any unsent bytes. A burst's tail is thus on the wire after the next progress
//!   call, which a UCT user makes anyway to see completions and replies.
//! - **A full socket.** After a short write the socket is full until epoll reports EPOLLOUT;
//!   copied sends meanwhile are appended behind the unsent bytes instead of answering
//!   `NoResource` (as libfabric's tcp provider stages sends, FI_TCP_STAGING_SBUF_SIZE).
//!
//! Either way at most `RUCX_TCP_TX_COALESCE` bytes wait: in the connection's send buffer while
//! they fit, then in a staging buffer of that size (both lent while in use). Sends
//! that reference user memory (zcopy, sendmsg-gathered am_short) never wait behind staged bytes
//! (those are written first), and nothing is appended while the unsent part references memory
//! itself, while target-side replies or a FIN wait, or while the endpoint has pending requests
//! (`with_tx` answers `NoResource` then, keeping their order).

use std::rc::Rc;

use ucs::Result;

use crate::conn::{Conn, State, Tx, ZcTail};
use crate::iface::Shared;

impl Shared {
    /// For a copied send of up to `need` bytes that finds `conn` idle: stages the connection
    /// when this is its second copied send since the last progress call.
    #[inline]
    pub fn stage_if_burst(&self, conn: &Rc<Conn>, tx: &mut Tx, need: usize) {
        let t = self.tick.get();
        if conn.tx_tick.replace(t) != t || self.cfg.tx_coalesce == 0 || conn.staged.get() {
            return;
        }
        self.stage(conn, tx, need);
    }

    #[cold]
    fn stage(&self, conn: &Rc<Conn>, tx: &mut Tx, need: usize) {
        // Small messages stay in the send buffer (a fan-out of short bursts needs no big
        // buffers); when a second message like this one would not fit, start in a staging
        // buffer rather than copy into one later (`make_room`).
        if 2 * need > tx.buf.len() && tx.buf.len() < self.stage_bufs.size() {
            self.grow(tx);
        }
        conn.staged.set(true);
        self.staged.borrow_mut().push(conn.clone());
    }

    /// Writes every staged connection's bytes (start and end of a progress call).
    pub fn flush_staged(&self) -> u32 {
        let n = self.staged.borrow().len();
        let mut work = 0;
        for _ in 0..n {
            let next = self.staged.borrow_mut().pop();
            let Some(conn) = next else { break };
            if conn.in_pack.get() {
                // A pack callback on it re-entered progress (its send buffer is in use): keep
                // it for a later call. At the front, so this loop does not meet it again.
                self.staged.borrow_mut().insert(0, conn);
                continue;
            }
            conn.staged.set(false);
            if !conn.is_open() {
                continue;
            }
            work += self.conn_writable(&conn);
            // A short write: the rest goes on EPOLLOUT like any other.
            if conn.is_open() && conn.tx.borrow().busy() {
                self.update_interest(&conn, true);
            }
        }
        work
    }

    /// True while sends are staged (event_arm reports Busy).
    #[inline]
    pub fn any_staged(&self) -> bool {
        !self.staged.borrow().is_empty()
    }

    /// For a send on a busy connection: makes room for `need` more bytes at `tx.tail` behind
    /// the unsent ones (`need` 0: a send that cannot be appended), writing staged bytes first
    /// when the send cannot join them. `Ok(true)`: go ahead (appending if `tx` is still busy);
    /// `Ok(false)`: the send has to wait; `Err`: the socket failed.
    pub fn make_room(&self, conn: &Conn, tx: &mut Tx, need: usize) -> Result<bool> {
        if conn.state.get() != State::Connected {
            return Ok(false);
        }
        let joinable = need > 0
            && self.cfg.tx_coalesce > 0
            && matches!(tx.zc, ZcTail::None)
            && tx.comp.is_none()
            && !conn.fin_pending.get()
            && conn.ctl.borrow().is_empty();
        if joinable && tx.buf.len() - tx.tail >= need {
            return Ok(true);
        }
        let cap = self.stage_bufs.size();
        let unsent = tx.tail - tx.head;
        if joinable && tx.buf.len() < cap && unsent + need <= cap {
            // Grow into a staging buffer before writing anything.
            self.grow(tx);
            return Ok(true);
        }
        if conn.staged.get() && !conn.out_armed.get() {
            if self.drain_tx(conn, tx)? {
                // Queued replies go out from progress first.
                return Ok(conn.ctl.borrow().is_empty());
            }
            // The socket is full now: the rest goes on EPOLLOUT.
            self.update_interest(conn, true);
        }
        // The socket is full (or just filled): move what is unsent to the front if that makes
        // room. (A drain above may have changed `head`.)
        let unsent = tx.tail - tx.head;
        if !joinable || tx.buf.len() < cap || unsent + need > cap {
            return Ok(false);
        }
        tx.buf.copy_within(tx.head..tx.tail, 0);
        tx.head = 0;
        tx.tail = unsent;
        Ok(true)
    }

    /// Moves the unsent bytes to the front of a staging buffer; the send buffer goes back to
    /// its pool.
    fn grow(&self, tx: &mut Tx) {
        let unsent = tx.tail - tx.head;
        let mut big = self.stage_bufs.take();
        big[..unsent].copy_from_slice(&tx.buf[tx.head..tx.tail]);
        let small = std::mem::replace(&mut tx.buf, big);
        self.give_tx_buf(small);
        tx.head = 0;
        tx.tail = unsent;
    }

    /// The send buffer of a connection with nothing left to send: back to its pool, unless the
    /// connection is the interface's only one ([`lends_buffers`](Self::lends_buffers)).
    #[inline]
    pub fn release_tx_buf(&self, tx: &mut Tx) {
        if self.lends_buffers() {
            self.give_tx_buf(std::mem::take(&mut tx.buf));
        }
    }

    /// Returns an idle connection's send buffer to the pool it came from.
    #[inline]
    pub fn give_tx_buf(&self, b: Box<[u8]>) {
        if b.len() == self.tx_bufs.size() {
            self.tx_bufs.give(b);
        } else {
            self.stage_bufs.give(b);
        }
    }
}

/// Size of the staging buffers: room for `coalesce` unsent bytes, and at least a send buffer.
pub fn stage_size(coalesce: usize, tx_buf: usize) -> usize {
    coalesce.max(tx_buf)
}
