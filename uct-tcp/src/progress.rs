//! The interface's progress: one `epoll_wait(0)` over the listening socket, the timer fd and
//! every connection, then the ready ones. With nothing to do that single system call is all.
//!
//! Direct reads: while the interface has exactly one connection, it is connected, has nothing
//! waiting to be written and awaits a reply (since data last arrived, at most
//! [`DIRECT_MAX_SENDS`] user sends, each counting one more per [`DIRECT_UNIT`] bytes) and the
//! read tuner chose direct reads for this wait (`read_tuner.rs`: they lose where the two
//! processes' CPUs share no cache, so `RUCX_TCP_DIRECT_READS=auto` times both ways), progress
//! `recv()`s from it directly instead, and polls epoll (accepts, timers, everything else) only
//! every [`EPOLL_EVERY`]th call. An idle call still costs one system call, but a reply that
//! arrives is read by the next call rather than announced by an `epoll_wait` first: one system
//! call less on each message's critical path. Streams keep epoll (many sends, or large ones,
//! per reply): a side spinning in `recv()` takes the socket lock that the peer's packets and
//! acks need, and slows the other side.

use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::sys::epoll::EpollFlags;
use ucs::{Result, Status};

use crate::conn::{Conn, State};
use crate::ep::Plan;
use crate::iface::{Shared, LISTEN_TOKEN, TIMER_TOKEN};
use crate::sys;
use crate::timers::Deadline;

/// Connections accepted per progress call at most.
const ACCEPT_BURST: usize = 16;

/// While reading a single connection directly, one progress call in this many polls epoll.
pub const EPOLL_EVERY: u32 = 16;

/// Progress reads directly only while this many user sends or fewer went out since data last
/// arrived (a request/reply exchange, not a stream).
pub const DIRECT_MAX_SENDS: u8 = 4;

/// A send counts once more towards [`DIRECT_MAX_SENDS`] per this many bytes (a 64 KiB message
/// counts 5: bandwidth, not latency).
pub const DIRECT_UNIT: u64 = 16 * 1024;

thread_local! {
    static LAST_ACCEPT_WARN: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

impl Shared {
    #[inline] // into the worker's progress callback, with `TcpIface::progress`
    pub fn progress(&self) -> u32 {
        // Staged sends go first, and those that handlers stage go at the end (`coalesce.rs`).
        let mut work = 0;
        if self.any_staged() {
            work += self.flush_staged();
        }
        work += self.poll();
        if self.any_staged() {
            work += self.flush_staged();
        }
        work
    }

    #[inline]
    fn poll(&self) -> u32 {
        // (The tick also tells sends in one progress round apart, `coalesce.rs`.)
        let t = self.tick.get().wrapping_add(1);
        self.tick.set(t);
        if self.tuner.direct() && !t.is_multiple_of(EPOLL_EVERY) {
            if let Some(conn) = self.direct_conn() {
                return self.conn_readable(&conn);
            }
        }
        // The event array is kept in the interface; a handler that re-enters progress gets a
        // small one on the stack.
        match self.ev_buf.try_borrow_mut() {
            Ok(mut buf) => self.poll_into(&mut buf),
            Err(_) => self.poll_into(&mut [sys::empty_event(); 4]),
        }
    }

    /// The connection to read without asking epoll (see the module docs), if any this call;
    /// asked only while the tuner chose direct reads.
    #[inline]
    fn direct_conn(&self) -> Option<Rc<Conn>> {
        let conns = self.conns.borrow();
        if conns.len() != 1 {
            return None;
        }
        let tok = self.solo.get();
        let conn = match conns.get((tok & 0xffff_ffff) as usize) {
            Some(c) if c.token() == tok => c,
            // The connection changed since the last call (rare): find the only one.
            _ => {
                let (_, c) = conns.iter().next()?;
                self.solo.set(c.token());
                c
            }
        };
        // Writes pending (EPOLLOUT armed), a handshake in progress, no reply awaited (nothing
        // sent, or a stream): epoll knows best.
        let sent = conn.sent_since_rx.get();
        if conn.state.get() != State::Connected
            || conn.out_armed.get()
            || sent == 0
            || sent > DIRECT_MAX_SENDS
        {
            return None;
        }
        Some(conn.clone())
    }

    /// One `epoll_wait(0)`; the events it returns are handled out of line, so that a call
    /// with nothing to do stays short (it is the loop a waiting caller spins in).
    #[inline]
    fn poll_into(&self, evs: &mut [sys::Event]) -> u32 {
        match sys::epoll_wait(&self.epoll, evs, 0) {
            Ok(0) | Err(_) => 0, // Err: EINTR; anything else would repeat on the next call
            Ok(n) => self.handle_events(&evs[..n]),
        }
    }

    /// What `epoll_wait` reported: accepts, timers, connections' reads and writes.
    #[inline(never)]
    fn handle_events(&self, evs: &[sys::Event]) -> u32 {
        let mut work = 0;
        for ev in evs {
            work += match sys::ev_token(ev) {
                LISTEN_TOKEN => self.accept_some(),
                TIMER_TOKEN => self.run_timers(),
                token => match self.conn_by_token(token) {
                    Some(conn) => self.conn_event(&conn, sys::ev_flags(ev)),
                    None => 0,
                },
            };
        }
        work
    }

    #[inline(always)]
    fn conn_event(&self, conn: &Rc<Conn>, ev: EpollFlags) -> u32 {
        if conn.state.get() == State::Connecting {
            return self.connect_ready(conn);
        }
        let mut work = 0;
        if ev.intersects(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR | EpollFlags::EPOLLRDHUP,
        ) {
            work += self.conn_readable_inline(conn);
        }
        if conn.is_open() && ev.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR) {
            work += self.conn_writable(conn);
        }
        work
    }

    /// The socket can take more: finish the partial message, then queued replies, then the
    /// endpoint's pending requests.
    pub(crate) fn conn_writable(&self, conn: &Rc<Conn>) -> u32 {
        if conn.in_pack.get() {
            return 0;
        }
        let drained = {
            let mut tx = conn.tx.borrow_mut();
            match self.drain_tx(conn, &mut tx) {
                Ok(true) => {
                    self.release_tx_buf(&mut tx);
                    Ok(Some(tx.reset()))
                }
                Ok(false) => Ok(None),
                Err(st) => Err(st),
            }
        };
        let comp = match drained {
            Err(st) => {
                self.conn_failed(conn, st);
                return 1;
            }
            Ok(None) => return 0,
            Ok(Some(c)) => c,
        };
        if !comp.is_none() {
            comp.complete(Status::Ok);
        }
        if !conn.is_open() {
            return 1;
        }
        // Replies the target side queued.
        loop {
            let Some(ctl) = conn.ctl.borrow_mut().pop_front() else {
                break;
            };
            let r = {
                let mut tx = conn.tx.borrow_mut();
                self.send_ctl(conn, &mut tx, &ctl)
            };
            match r {
                Ok(crate::tx::Sent::All) => {}
                Ok(crate::tx::Sent::Stashed) => return 1,
                Err(st) => {
                    self.conn_failed(conn, st);
                    return 1;
                }
            }
        }
        self.fin_step(conn);
        if !conn.is_open() {
            return 1;
        }
        let busy = conn.tx.borrow().busy();
        self.update_interest(conn, busy);
        let ep = conn.ep.borrow().upgrade();
        if let Some(ep) = ep {
            self.dispatch_pending(&ep);
        }
        1
    }

    #[inline(never)]
    fn accept_some(&self) -> u32 {
        let mut work = 0;
        for _ in 0..ACCEPT_BURST {
            match self.listener.accept() {
                Ok((s, from)) => {
                    self.on_accept(s, from);
                    work += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // Out of fds (a flood?): free the oldest half-open one, and say so at most
                    // once a second.
                    let now = Instant::now();
                    let quiet =
                        LAST_ACCEPT_WARN.with(|l| l.get().is_some_and(|t| now - t < Duration::from_secs(1)));
                    if !quiet {
                        LAST_ACCEPT_WARN.with(|l| l.set(Some(now)));
                        ucs::warn!("tcp: accept on {} failed: {e}", self.listen_addr);
                    }
                    let old = self.half_open.borrow_mut().pop_front();
                    if let Some(c) = old.and_then(|t| self.conn_by_token(t)) {
                        self.close_conn(&c);
                    }
                    break;
                }
            }
        }
        work
    }

    #[inline(never)]
    fn run_timers(&self) -> u32 {
        let due = self.timers.expired();
        let n = due.len() as u32;
        for d in due {
            match d {
                Deadline::Handshake(t) => {
                    if let Some(c) = self.conn_by_token(t).filter(|c| c.state.get() == State::Accepted) {
                        ucs::warn!(
                            "tcp: {} sent no handshake within {:?} (RUCX_TCP_HANDSHAKE_TIMEOUT); dropped",
                            c.peer.get(),
                            self.cfg.handshake_timeout
                        );
                        self.close_conn(&c);
                    }
                }
                Deadline::Attempt(t) => {
                    let c = self
                        .conn_by_token(t)
                        .filter(|c| matches!(c.state.get(), State::Connecting | State::WaitAck));
                    if let Some(c) = c {
                        ucs::error!(
                            "tcp: connecting to {} timed out after {:?} (RUCX_TCP_CONN_TIMEOUT)",
                            c.peer.get(),
                            self.cfg.conn_timeout
                        );
                        let ep = c.ep.borrow().upgrade();
                        self.close_conn(&c);
                        if let Some(ep) = ep {
                            self.ep_failed(&ep, Status::Unreachable);
                        }
                    }
                }
                Deadline::Retry(key) => {
                    if let Some(ep) = self.ep_by_key(key) {
                        if ep.failed.get().is_none() && !ep.destroyed.get() {
                            let old = ep.conn.borrow_mut().take();
                            if let Some(old) = old {
                                self.close_conn(&old);
                            }
                            self.start_connect(&ep);
                        }
                    }
                }
                Deadline::PeerWait(key) => {
                    if let Some(ep) = self.ep_by_key(key) {
                        let connected = ep.conn.borrow().as_ref().is_some_and(|c| c.is_open());
                        if !connected && ep.failed.get().is_none() {
                            let peer = match ep.plan.get() {
                                Plan::ToEpPassive { peer, .. } | Plan::ToIface { target: peer, .. } => {
                                    peer.to_string()
                                }
                                _ => "the peer".into(),
                            };
                            ucs::error!(
                                "tcp: the peer endpoint at {peer} did not connect within {:?} \
                                 (RUCX_TCP_CONN_TIMEOUT); did it call connect_to_ep, is it alive?",
                                self.cfg.conn_timeout
                            );
                            self.ep_failed(&ep, Status::Unreachable);
                        }
                    }
                }
            }
        }
        n
    }

    /// `Err(Busy)` when progress has work now (ready sockets, due timers, deferred reports,
    /// staged sends).
    pub fn event_arm(&self) -> Result<()> {
        if self.deferred.get() > 0 || self.any_staged() {
            return Err(Status::Busy.into());
        }
        let mut ev = [sys::empty_event(); 1];
        match sys::epoll_wait(&self.epoll, &mut ev, 0) {
            Ok(0) => Ok(()),
            _ => Err(Status::Busy.into()),
        }
    }
}
