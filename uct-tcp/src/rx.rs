//! The receive side of a connection: one `recv()` per progress round (so one busy peer cannot
//! starve the others), then every complete handshake message, frame and bulk chunk. One
//! exception: a read that filled its buffer and ended where a put's or get reply's bulk data
//! begins is followed at once by one direct `recv()` of that data (see [`Shared::rx_round`]).
//!
//! Bulk data of a peer's put goes into the checked target range, that of our get into its
//! destination; when nothing else is buffered it is received straight there.

use std::rc::Rc;

use nix::errno::Errno;
use ucs::Status;

use crate::conn::{Conn, Rx, Sink, State};
use crate::iface::Shared;
use crate::ops::{GetDst, Op, OpKind};
use crate::rx_parser::{Frame, RxParser};
use crate::sock;
use crate::wire::{Msg, WireError};

/// Largest direct receive into target memory per round.
const DIRECT_MAX: u64 = 1 << 30;

/// Idle connections' receive states kept for reuse.
const RX_SPARE_KEEP: usize = 8;

enum Got {
    /// Bytes buffered in the parser; `true` when they filled the space offered (more is
    /// probably waiting in the socket).
    Buffered(bool),
    /// Bulk bytes received in place; `true` when the bulk data is complete.
    Direct(bool),
    Eof,
    Again,
    Failed(Status),
}

/// Finds the entry and offset of byte `pos` of a get_zcopy destination.
fn locate(iov: &[uct_transport::iov::Iov<'static>], mut pos: usize) -> Option<(usize, usize)> {
    for (i, e) in iov.iter().enumerate() {
        if pos < e.len() {
            return Some((i, pos));
        }
        pos -= e.len();
    }
    None
}

impl Shared {
    /// A connection is readable (the direct-read path's call; epoll's events use
    /// `conn_readable_inline`).
    #[inline(never)]
    pub fn conn_readable(&self, conn: &Rc<Conn>) -> u32 {
        self.conn_readable_inline(conn)
    }

    /// `conn_readable`, inlined into the handling of epoll's events (one call less between a
    /// reply's arrival and its handler).
    #[inline(always)]
    pub(crate) fn conn_readable_inline(&self, conn: &Rc<Conn>) -> u32 {
        if conn.in_pack.get() {
            return 0;
        }
        // Taken while frames are delivered: a handler that re-enters progress skips this
        // connection instead of parsing the same buffer twice.
        let mut rx = match conn.rx.take() {
            Some(rx) => rx,
            None if conn.rx_pooled.replace(false) => self.take_rx(),
            None => return 0,
        };
        let work = self.rx_round(conn, &mut rx);
        // Idle again: the buffer goes back to the interface unless this is its only
        // connection (`bufs.rs`; handshake-phase parsers keep their small one), and so does
        // the receive state when it holds nothing of this stream.
        if conn.state.get() == State::Connected && self.lends_buffers() {
            if let Some(b) = rx.parser.take_buffer() {
                self.rx_bufs.give(b);
            }
            if rx.parser.is_blank() && matches!(rx.sink, Sink::None) && conn.is_open() {
                self.give_rx(rx);
                conn.rx_pooled.set(true);
                return work;
            }
        }
        // Put back even when closed: a failure report still completes a get in the sink.
        conn.rx.set(Some(rx));
        work
    }

    /// A blank receive state for a connected connection that was idle.
    #[cold]
    fn take_rx(&self) -> Box<Rx> {
        self.rx_spare.borrow_mut().pop().unwrap_or_else(|| {
            Box::new(Rx {
                parser: RxParser::without_buffer(self.rx_max_payload()),
                sink: Sink::None,
            })
        })
    }

    /// Keeps an idle connection's blank receive state for the next one that reads (a few).
    #[cold]
    fn give_rx(&self, rx: Box<Rx>) {
        let mut spare = self.rx_spare.borrow_mut();
        if spare.len() < RX_SPARE_KEEP {
            spare.push(rx);
        }
    }

    /// One `recv()` and what it completed; after a full read that leaves a bulk transfer
    /// waiting for data nothing buffered covers (after a large put the next read takes only
    /// its header, `rx_parser::SMALL_READ`), one more, straight into the destination: the data
    /// is usually in the socket already, and would otherwise wait for the next progress call
    /// and its `epoll_wait` (a 64 KiB put's target: one system call less per put).
    #[inline(always)]
    fn rx_round(&self, conn: &Rc<Conn>, rx: &mut Rx) -> u32 {
        let (work, full) = self.rx_step(conn, rx);
        if full && conn.state.get() == State::Connected && rx.parser.bulk_direct_max() > 0 {
            return work + self.rx_step_again(conn, rx);
        }
        work
    }

    /// The second `recv()` of a round (out of line: the first stays inlined in
    /// `conn_readable`).
    #[inline(never)]
    fn rx_step_again(&self, conn: &Rc<Conn>, rx: &mut Rx) -> u32 {
        self.rx_step(conn, rx).0
    }

    /// One `recv()` and its processing: (work, whether it was a full buffered read).
    /// (Inlined with `rx_got`, `recv_once` and `process_frames`: one function from the `recv()`
    /// to the handler, not four, each saving and restoring registers; what only puts, gets and
    /// handshakes need stays out of line. `inline(always)`: left to itself the compiler splits
    /// this path differently from build to build.)
    #[inline(always)]
    fn rx_step(&self, conn: &Rc<Conn>, rx: &mut Rx) -> (u32, bool) {
        let got = self.recv_once(conn, rx);
        if matches!(got, Got::Buffered(_) | Got::Direct(_)) && conn.sent_since_rx.get() != 0 {
            conn.sent_since_rx.set(0);
            self.tuner.reply_arrived();
        }
        let full = matches!(got, Got::Buffered(true));
        (self.rx_got(conn, rx, got), full)
    }

    #[inline(always)]
    fn rx_got(&self, conn: &Rc<Conn>, rx: &mut Rx, got: Got) -> u32 {
        match got {
            Got::Again => return 0,
            Got::Eof => {
                self.peer_closed(conn);
                return 1;
            }
            Got::Failed(st) => {
                self.conn_failed(conn, st);
                return 1;
            }
            Got::Direct(done) => {
                if done {
                    self.bulk_done(conn, &mut rx.sink);
                }
                return 1;
            }
            Got::Buffered(_) => {}
        }
        if conn.state.get() != State::Connected && !self.rx_handshake(conn, rx) {
            return 1;
        }
        1 + self.process_frames(conn, rx)
    }

    /// Bytes for a connection not yet connected: whether frames may follow (the handshake
    /// completed).
    #[inline(never)]
    fn rx_handshake(&self, conn: &Rc<Conn>, rx: &mut Rx) -> bool {
        match conn.state.get() {
            State::Accepted => self.server_handshake(conn, rx),
            State::WaitAck => self.client_handshake(conn, rx),
            State::Connected => true,
            _ => false,
        }
    }

    /// One `recv()`: into the bulk destination when possible, else into the parser.
    #[inline(always)]
    fn recv_once(&self, conn: &Conn, rx: &mut Rx) -> Got {
        let direct = rx.parser.bulk_direct_max().min(DIRECT_MAX);
        if direct > 0 {
            if let Some(got) = self.recv_bulk(conn, rx, direct) {
                return got;
            }
        }
        if rx.parser.needs_buffer() && rx.parser.capacity() == self.rx_bufs.size() {
            rx.parser.give_buffer(self.rx_bufs.take());
        }
        let buf = rx.parser.buf_mut();
        let offered = buf.len();
        match sock::recv(&conn.sock, buf) {
            Ok(0) => Got::Eof,
            Ok(k) => {
                rx.parser.advance(k);
                Got::Buffered(k == offered)
            }
            Err(Errno::EAGAIN) => Got::Again,
            Err(e) => Got::Failed(sock::errno_status(e)),
        }
    }

    /// Up to `direct` bytes of a put's or get reply's bulk data straight into its destination;
    /// `None` when there is none to receive into (the bytes then go through the parser).
    #[inline(never)]
    fn recv_bulk(&self, conn: &Conn, rx: &mut Rx, direct: u64) -> Option<Got> {
        let remaining = rx.parser.bulk_remaining();
        let r = match &mut rx.sink {
            Sink::Put {
                key,
                addr,
                len,
                status: Status::Ok,
                ..
            } => {
                let at = *addr + (*len - remaining);
                let n = direct as usize;
                match self
                    .regions
                    .with_target(*key, at, n, |dst| sock::recv(&conn.sock, dst))
                {
                    Ok(r) => Some(r),
                    Err(st) => {
                        // Deregistered meanwhile: the rest is read and dropped.
                        if let Sink::Put { status, .. } = &mut rx.sink {
                            *status = st.into();
                        }
                        None
                    }
                }
            }
            Sink::Get(Op {
                kind:
                    OpKind::Get {
                        len,
                        dst: GetDst::Zcopy { iov },
                    },
                ..
            }) => {
                let pos = (*len - remaining) as usize;
                locate(iov, pos)
                    .map(|(i, off)| crate::direct::recv_into(&conn.sock, &iov[i], off, direct as usize))
            }
            _ => None,
        };
        r.map(|r| match r {
            Ok(0) => Got::Eof,
            Ok(k) => match rx.parser.bulk_direct_done(k as u64) {
                Ok(done) => Got::Direct(done),
                Err(st) => Got::Failed(st),
            },
            Err(Errno::EAGAIN) => Got::Again,
            Err(e) => Got::Failed(sock::errno_status(e)),
        })
    }

    /// The peer closed its side (EOF).
    fn peer_closed(&self, conn: &Conn) {
        match conn.state.get() {
            State::Accepted => {
                ucs::info!(
                    "tcp: connection from {} closed before its handshake",
                    conn.peer.get()
                );
                self.close_conn(conn);
            }
            _ => self.conn_failed(conn, Status::ConnectionReset),
        }
    }

    /// A protocol violation: log it naming the peer and drop the connection.
    pub fn violation(&self, conn: &Conn, e: &WireError) {
        ucs::warn!("tcp: {}", e.from_peer(conn.peer.get()));
        self.conn_failed(conn, e.status());
    }

    /// Delivers every complete frame and bulk chunk. Stops when the connection closes (a
    /// handler may destroy its endpoint).
    #[inline(always)]
    fn process_frames(&self, conn: &Rc<Conn>, rx: &mut Rx) -> u32 {
        let Rx { parser, sink } = rx;
        let mut work = 0;
        // Nothing buffered is the usual end of a receive: no call to find that out. (A broken
        // stream was reported by the call that broke it; an awaited bulk chunk needs bytes.)
        while parser.buffered() > 0 {
            if let Some((id, payload)) = parser.next_am() {
                work += 1;
                self.on_am(conn, id, payload);
                if conn.state.get() != State::Connected {
                    break;
                }
                continue;
            }
            let Some(item) = parser.next_frame() else { break };
            match item {
                Err(e) => {
                    self.violation(conn, &e);
                    return work;
                }
                Ok(Frame::Bulk { data, offset, last }) => {
                    self.bulk_chunk(sink, data, offset);
                    if last {
                        self.bulk_done(conn, sink);
                    }
                }
                Ok(Frame::Msg(m)) => {
                    work += 1;
                    self.on_msg(conn, sink, m);
                }
            }
            if conn.state.get() != State::Connected {
                break;
            }
        }
        work
    }

    fn on_msg(&self, conn: &Rc<Conn>, sink: &mut Sink, m: Msg<'_>) {
        match m {
            Msg::Am { id, payload } => self.on_am(conn, id, payload),
            Msg::PutReq(r) => self.on_put_req(conn, sink, r),
            Msg::GetReq(r) => self.on_get_req(conn, r),
            Msg::AtomicReq(r) => self.on_atomic_req(conn, r),
            Msg::PutAck(a) => self.on_put_ack(conn, a),
            Msg::GetRep(r) => self.on_get_rep(conn, sink, r),
            Msg::AtomicRep(r) => self.on_atomic_rep(conn, r),
            Msg::Keepalive => {}
            Msg::Fin => {
                // The peer's endpoint on this connection is gone (it starts nothing more). Ours,
                // if any, keeps sending; without one, neither side uses the connection.
                conn.peer_fin.set(true);
                let has_ep = conn.ep.borrow().upgrade().is_some();
                // (With FIN pending, fin_step closes once ours is out.)
                if !has_ep && (!conn.fin_pending.get() || conn.fin_sent.get()) {
                    ucs::debug!(
                        "tcp: {} finished with the connection; closing it",
                        conn.peer.get()
                    );
                    self.close_conn(conn);
                }
            }
        }
    }

    #[inline]
    fn on_am(&self, conn: &Rc<Conn>, id: u8, payload: &[u8]) {
        if let Err(st) = self.am.invoke(id, payload, None) {
            self.am_refused(conn, id, st.into());
        }
    }

    #[cold]
    fn am_refused(&self, conn: &Rc<Conn>, id: u8, st: Status) {
        ucs::warn!(
            "tcp: malformed active message (id {id}) from {}; dropping the connection",
            conn.peer.get()
        );
        self.conn_failed(conn, st);
    }

    /// A piece of bulk data.
    fn bulk_chunk(&self, sink: &mut Sink, data: &[u8], offset: u64) {
        match sink {
            Sink::Put {
                key, addr, status, ..
            } if *status == Status::Ok => {
                if let Err(st) = self.regions.write(*key, *addr + offset, data) {
                    *status = st.into();
                }
            }
            Sink::Get(Op {
                kind: OpKind::Get { dst, .. },
                ..
            }) => match dst {
                GetDst::Zcopy { iov } => {
                    let mut pos = offset as usize;
                    let mut data = data;
                    for e in iov.iter() {
                        if data.is_empty() {
                            break;
                        }
                        if pos >= e.len() {
                            pos -= e.len();
                            continue;
                        }
                        let k = e.write_at(pos, data);
                        data = &data[k..];
                        pos = 0;
                    }
                }
                GetDst::Bcopy { buf, .. } => buf.extend_from_slice(data),
                GetDst::Discard => {}
            },
            _ => {}
        }
    }

    /// The bulk data of the current PUT_REQ / GET_REP is complete.
    fn bulk_done(&self, conn: &Rc<Conn>, sink: &mut Sink) {
        match std::mem::replace(sink, Sink::None) {
            Sink::Put {
                seq, ack_req, status, ..
            } => self.put_done(conn, seq, ack_req, status),
            Sink::Get(op) => self.get_done(conn, op),
            Sink::None => {}
        }
    }
}
