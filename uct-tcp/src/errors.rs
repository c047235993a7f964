//! Failure handling: closing connections, failing endpoints once, and reporting to the user
//! from progress context.
//!
//! When a connection breaks (reset, EOF, FIN, keepalive or user-timeout expiry, protocol
//! violation) its socket is closed at once; if it belongs to an endpoint, the endpoint is marked
//! failed (every later operation returns the status) and a deferred callback, run by the next
//! worker progress, completes the endpoint's waiting operations with the status and calls the
//! interface's error handler with the endpoint's handle. Failures found inside a user call (a
//! send hitting `EPIPE`) are thereby reported outside it, never re-entering the caller.

use std::rc::{Rc, Weak};

use nix::sys::socket::{shutdown, Shutdown};
use ucs::Status;
use uct_transport::traits::EpHandle;

use crate::conn::{Conn, Role, State};
use crate::ep::EpInner;
use crate::iface::Shared;
use crate::ops::Done;
use crate::timers::Deadline;

/// Backoff before reconnect attempt `n` (1-based): 1 ms doubling, at most 100 ms, so the
/// default 25 retries span about two seconds.
pub fn backoff(n: u32) -> std::time::Duration {
    std::time::Duration::from_millis((1u64 << n.saturating_sub(1).min(10)).min(100))
}

impl Shared {
    /// Closes a connection's socket and forgets it (no report).
    pub fn close_conn(&self, conn: &Conn) {
        let prev = conn.state.replace(State::Closed);
        if prev == State::Closed {
            return;
        }
        self.remove_conn(conn);
        let _ = shutdown(std::os::fd::AsRawFd::as_raw_fd(&conn.sock), Shutdown::Both);
        if prev == State::Accepted {
            let token = conn.token();
            self.half_open.borrow_mut().retain(|&t| t != token);
        }
        if let Some(key) = conn.pair.take() {
            let mut m = self.unexpected.borrow_mut();
            if m.get(&key) == Some(&conn.token()) {
                m.remove(&key);
                ucs::hash::trim(&mut m);
            }
        }
    }

    /// A connection broke with `st`: close it; retry or fail its endpoint.
    pub fn conn_failed(&self, conn: &Conn, st: impl Into<Status>) {
        let st: Status = st.into();
        let prev = conn.state.get();
        if prev == State::Closed {
            return;
        }
        self.close_conn(conn);
        let ep = conn.ep.borrow().upgrade();
        let Some(ep) = ep else {
            ucs::debug!("tcp: connection with {} ({prev:?}) closed: {st}", conn.peer.get());
            return;
        };
        let connecting =
            matches!(prev, State::Connecting | State::WaitAck) && matches!(conn.role, Role::Client { .. });
        if connecting {
            self.connect_failed(&ep, st, conn.peer.get());
        } else {
            ucs::debug!("tcp: connection to {} failed: {st}", conn.peer.get());
            self.ep_failed(&ep, st);
        }
    }

    /// A connection attempt of `ep` failed before its handshake completed: reconnect after a
    /// backoff (the peer's backlog may have overflowed, or it is not listening yet), or give up
    /// with `Unreachable` after `RUCX_TCP_MAX_CONN_RETRIES`.
    pub fn connect_failed(&self, ep: &Rc<EpInner>, st: impl Into<Status>, target: std::net::SocketAddr) {
        let st: Status = st.into();
        if ep.destroyed.get() || ep.failed.get().is_some() {
            return;
        }
        let n = ep.attempts.get();
        let retryable = matches!(
            st,
            Status::Rejected | Status::ConnectionReset | Status::NoMemory | Status::IoError
        );
        if retryable && n <= self.cfg.max_conn_retries {
            ucs::debug!("tcp: connection attempt {n} to {target} failed ({st}); retrying");
            self.timers.add(backoff(n), Deadline::Retry(ep.key));
            return;
        }
        if retryable {
            ucs::error_limited!(
                "tcp: cannot connect to {target}: {st} after {n} attempts; is the peer alive and listening? \
                 If it is overloaded, raise net.core.somaxconn and net.ipv4.tcp_max_syn_backlog, or \
                 RUCX_TCP_MAX_CONN_RETRIES"
            );
        } else {
            ucs::error_limited!("tcp: cannot connect to {target}: {st}");
        }
        self.ep_failed(
            ep,
            if st == Status::EndpointTimeout {
                st
            } else {
                Status::Unreachable
            },
        );
    }

    /// Marks `ep` failed (once) and schedules the report.
    pub fn ep_failed(&self, ep: &Rc<EpInner>, st: Status) {
        if ep.failed.get().is_some() || ep.destroyed.get() {
            return;
        }
        ep.failed.set(Some(st));
        let weak: Weak<EpInner> = Rc::downgrade(ep);
        self.defer(ep.defer_key(), move |sh| sh.report_failure(&weak, st));
    }

    /// Deferred part of a failure: complete what was waiting, then call the error handler.
    fn report_failure(&self, weak: &Weak<EpInner>, st: Status) {
        let Some(ep) = weak.upgrade() else { return };
        if ep.destroyed.get() {
            return;
        }
        let conn = ep.conn.borrow().clone();
        let mut peer = None;
        let mut dones: Vec<Done> = Vec::new();
        if let Some(conn) = &conn {
            peer = Some(conn.peer.get());
            dones = self.cancel_ops(conn);
            if !conn.is_open() && !conn.in_pack.get() {
                dones.push(Done::Comp(conn.tx.borrow_mut().reset()));
            }
        }
        for d in dones {
            d.complete(st);
        }
        if ep.destroyed.get() {
            return;
        }
        let handled = self.err.report(EpHandle(ep.handle.get()), st);
        if !handled {
            let to = peer.map_or_else(|| "its peer".to_string(), |p| p.to_string());
            ucs::error_limited!(
                "tcp: endpoint to {to} failed: {st} (no error handler took it; install one with \
                 IfaceOpenParams::err_handler to handle peer failures)"
            );
        }
    }

    /// Detaches every operation waiting on `conn` from its user and returns what to complete.
    /// The operations stay queued, so that replies still on their way are absorbed if the
    /// connection lives on (for a peer endpoint sharing it).
    pub fn cancel_ops(&self, conn: &Conn) -> Vec<Done> {
        let mut dones: Vec<Done> = {
            let mut ops = conn.ops.borrow_mut();
            ops.need_barrier = false;
            let d = ops.q.iter_mut().map(|o| o.cancel()).collect();
            ops.q.retain(|o| !matches!(o.kind, crate::ops::OpKind::Marker));
            d
        };
        if let Some(mut rx) = conn.rx.take() {
            if let crate::conn::Sink::Get(op) = &mut rx.sink {
                dones.push(op.cancel());
            }
            conn.rx.set(Some(rx));
        }
        dones
    }

    /// An endpoint is destroyed: its connection sends FIN once what was accepted for sending is
    /// written, and stays with the interface (delivering AMs, answering requests) until the peer
    /// has no endpoint on it either. If the unsent part of a message uses the user's memory,
    /// which is released now, the connection is dropped at once instead.
    pub fn retire_conn(&self, conn: &Rc<Conn>, dones: &mut Vec<Done>) {
        match conn.state.get() {
            State::Closed => {}
            State::Connected if !conn.in_pack.get() => {
                let lent = conn.tx.borrow().holds_user_memory();
                if lent {
                    dones.push(Done::Comp(conn.tx.borrow_mut().reset()));
                    self.close_conn(conn);
                    return;
                }
                self.detach_ep(conn);
            }
            _ => self.close_conn(conn),
        }
    }

    /// The connection's endpoint is gone (destroyed, or failed on its own): tell the peer
    /// (FIN) and keep serving it while it has an endpoint on the connection.
    pub fn detach_ep(&self, conn: &Conn) {
        *conn.ep.borrow_mut() = Weak::new();
        conn.fin_pending.set(true);
        self.fin_step(conn);
    }

    /// Sends the pending FIN once the send buffer is empty; closes the connection when the
    /// peer has sent its FIN too.
    pub fn fin_step(&self, conn: &Conn) {
        if !conn.fin_pending.get() || conn.fin_sent.get() || !conn.is_open() {
            return;
        }
        let sent = {
            let mut tx = conn.tx.borrow_mut();
            if tx.busy() {
                return;
            }
            let fin = crate::tx::small_ctl(&crate::wire::Msg::Fin);
            self.send_ctl(conn, &mut tx, &fin)
        };
        match sent {
            Ok(_) => {
                conn.fin_sent.set(true);
                if conn.peer_fin.get() {
                    self.close_conn(conn);
                }
            }
            Err(_) => self.close_conn(conn),
        }
    }

    /// The interface closes: FIN to every peer that can take it now, then every socket closes.
    pub fn shutdown(&self) {
        let conns: Vec<Rc<Conn>> = self.conns.borrow().iter().map(|(_, c)| c.clone()).collect();
        for c in conns {
            if c.state.get() == State::Connected && !c.in_pack.get() {
                let mut tx = c.tx.borrow_mut();
                if c.staged.get() {
                    // Best effort, as for the FIN: staged sends were accepted.
                    let _ = self.drain_tx(&c, &mut tx);
                }
                if !tx.busy() {
                    let fin = crate::tx::small_ctl(&crate::wire::Msg::Fin);
                    let _ = self.send_ctl(&c, &mut tx, &fin);
                }
            }
            self.close_conn(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1).as_millis(), 1);
        assert_eq!(backoff(2).as_millis(), 2);
        assert_eq!(backoff(5).as_millis(), 16);
        assert_eq!(backoff(25).as_millis(), 100);
        let total: u128 = (1..=25).map(|n| backoff(n).as_millis()).sum();
        assert!(total < 3000, "{total}");
    }
}
