//! Connection establishment: connecting, accepting, the handshake, and matching sockets to
//! endpoints, so that each pair of endpoints shares one socket.
//!
//! * Connect to ep: of the two endpoints, the one with the smaller (device address, port, ep
//!   key) connects, naming the other's key in CONN_REQ(to ep); the other attaches the accepted
//!   socket to that endpoint (also if its user has not called `connect_to_ep` yet: the peer is
//!   remembered and checked when it does) and answers CONN_ACK. Only one side ever connects.
//!   The waiting side gives up after `RUCX_TCP_CONN_TIMEOUT`.
//! * Connect to iface (UCX's scheme, made deterministic): the k-th endpoint an interface
//!   creates towards a peer interface pairs with the k-th endpoint the peer creates towards it
//!   (k travels as `conn_sn` with the sender's listening address). An accepted connection with
//!   no matching endpoint yet is kept by the interface (it delivers AMs and serves RMA) and
//!   adopted when that endpoint is created, which then connects no more. If both endpoints
//!   exist and connect at once, the connection started by the side with the smaller listening
//!   address wins: the greater side attaches it to its endpoint and drops its own attempt, the
//!   smaller side refuses the greater one's with CONN_REJECT(simultaneous connect), after which
//!   that side waits (up to `RUCX_TCP_CONN_TIMEOUT`) for the winner. Both sides apply the same
//!   comparison, so exactly one socket remains whatever the timing. Connections to the own
//!   interface are never paired.
//! * Both sides wait for the handshake to finish before sending frames, so each knows the
//!   other's receive limit; sends answer `NoResource` until then.
//! * An attempt refused or reset before the ACK is retried with exponential backoff, up to
//!   `RUCX_TCP_MAX_CONN_RETRIES`; other CONN_REJECTs are final (`Rejected`).
//! * Accepted connections must send their CONN_REQ within `RUCX_TCP_HANDSHAKE_TIMEOUT`, and at
//!   most `RUCX_TCP_MAX_HALF_OPEN` may be in that state (the oldest is dropped beyond it); at
//!   most `RUCX_TCP_MAX_UNPAIRED` connected-to-iface ones may wait for an endpoint to pair
//!   with (further ones are refused with CONN_REJECT(no resource)).

use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;

use ucs::{Result, Status};
use uct_transport::callbacks::Comp;

use crate::addr::{self, DevAddr};
use crate::conn::{pair_key, Conn, Role, Rx, State};
use crate::ep::{EpInner, Plan};
use crate::iface::Shared;
use crate::sock;
use crate::timers::Deadline;
use crate::tx::Lent;
use crate::wire::{
    negotiate_version, ConnAck, ConnReject, ConnReq, ConnectMode, HandshakeMsg, RejectReason, WireError,
};

/// Same peer address? (IPv6 scope ids are local and not compared.)
fn same_addr(a: SocketAddr, b: SocketAddr) -> bool {
    a.ip() == b.ip() && a.port() == b.port()
}

impl Shared {
    /// A connect-to-iface endpoint: adopts the peer's matching connection if it came first,
    /// else connects.
    pub fn create_iface_ep(&self, target: SocketAddr) -> Rc<EpInner> {
        let sn = {
            let mut m = self.peer_sn.borrow_mut();
            let next = m.entry((target.ip(), target.port())).or_insert(0);
            *next += 1;
            *next - 1
        };
        let ep = self.add_ep(Plan::ToIface { target, sn });
        if !same_addr(target, self.listen_addr) {
            let key = pair_key(target, sn);
            self.iface_eps.borrow_mut().insert(key, Rc::downgrade(&ep));
            let token = {
                let mut m = self.unexpected.borrow_mut();
                let t = m.remove(&key);
                ucs::hash::trim(&mut m);
                t
            };
            if let Some(c) = token.and_then(|t| self.conn_by_token(t)) {
                c.pair.set(None);
                let free = c.state.get() == State::Connected
                    && c.ep.borrow().upgrade().is_none()
                    && !c.peer_fin.get();
                if free {
                    ucs::debug!("tcp: endpoint {sn} to {target} adopts the connection the peer made");
                    *c.ep.borrow_mut() = Rc::downgrade(&ep);
                    *ep.conn.borrow_mut() = Some(c);
                    return ep;
                }
            }
        }
        self.start_connect(&ep);
        ep
    }

    /// Starts (or restarts) the connection attempt of an endpoint that connects.
    pub fn start_connect(&self, ep: &Rc<EpInner>) {
        let (target, mode, conn_sn) = match ep.plan.get() {
            Plan::ToIface { target, sn } => (target, ConnectMode::ToIface, sn),
            Plan::ToEpActive { target, peer_key } => (
                target,
                ConnectMode::ToEp { ep_key: peer_key },
                self.next_conn_sn(),
            ),
            _ => return,
        };
        ep.attempts.set(ep.attempts.get() + 1);
        let local = SocketAddr::new(self.listen_addr.ip(), 0);
        let started = sock::start_connect(target, Some(local), &self.cfg).and_then(|(s, _)| {
            let role = Role::Client { mode, conn_sn };
            self.add_conn(s, role, State::Connecting, target, Rc::downgrade(ep))
        });
        match started {
            Ok(conn) => {
                // Writability (checked in progress) tells the outcome, even if it connected at once.
                self.timers
                    .add(self.cfg.conn_timeout, Deadline::Attempt(conn.token()));
                *ep.conn.borrow_mut() = Some(conn);
            }
            Err(st) => self.connect_failed(ep, st, target),
        }
    }

    /// `connect_to_ep`: decides which side connects (see the module docs).
    pub fn connect_to_ep(&self, ep: &Rc<EpInner>, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        let (Some(peer_dev), Some((port, peer_key))) = (DevAddr::decode(dev), addr::decode_ep_addr(ep_addr))
        else {
            ucs::error!("tcp: connect_to_ep: malformed device or endpoint address");
            return Err(Status::InvalidParam.into());
        };
        if !self.dev.reaches(&peer_dev) {
            ucs::error!(
                "tcp: {} is not reachable from device {} ({})",
                peer_dev.ip,
                self.dev_name,
                self.dev.ip
            );
            return Err(Status::Unreachable.into());
        }
        if let Some(st) = ep.failed.get() {
            return Err(st.into());
        }
        if ep.plan.get() != Plan::Unconnected {
            ucs::error!("tcp: connect_to_ep called twice on one endpoint (or on a connected one)");
            return Err(Status::InvalidParam.into());
        }
        let target = peer_dev.socket_addr(port, self.ifindex);
        let mine = (self.dev.order_key(), self.listen_addr.port(), ep.key);
        let theirs = (peer_dev.order_key(), port, peer_key);
        if mine == theirs {
            // Connected to itself (UCX perftest's loopback): it connects to its own interface,
            // which serves the socket without attaching it (see `server_handshake`).
            ep.plan.set(Plan::ToEpActive { target, peer_key });
            self.start_connect(ep);
            return Ok(());
        }
        if let Some((from, key)) = ep.accepted_from.get() {
            // The peer got here first; it must be the one the user names.
            if !same_addr(from, target) || key != peer_key {
                ucs::error!(
                    "tcp: connect_to_ep names {target} (ep {peer_key:#x}) but {from} (ep {key:#x}) already \
                     connected to this endpoint"
                );
                return Err(Status::InvalidParam.into());
            }
            ep.plan.set(Plan::ToEpPassive {
                peer: target,
                peer_key,
            });
            return Ok(());
        }
        if mine < theirs {
            ep.plan.set(Plan::ToEpActive { target, peer_key });
            self.start_connect(ep);
        } else {
            ep.plan.set(Plan::ToEpPassive {
                peer: target,
                peer_key,
            });
            self.timers.add(self.cfg.conn_timeout, Deadline::PeerWait(ep.key));
        }
        Ok(())
    }

    /// The connecting socket is writable (or failed): send CONN_REQ.
    pub fn connect_ready(&self, conn: &Rc<Conn>) -> u32 {
        if let Some(e) = sock::so_error(&conn.sock) {
            ucs::debug!("tcp: connect to {} failed: {e}", conn.peer.get());
            self.conn_failed(conn, sock::errno_status(e));
            return 1;
        }
        let Role::Client { mode, conn_sn } = conn.role else {
            return 0;
        };
        let src_ep_key = conn.ep.borrow().upgrade().map_or(0, |e| e.key);
        let req = ConnReq {
            conn_sn,
            src_ep_key,
            mode,
            listen_addr: self.listen_addr,
            max_payload: self.rx_max_payload(),
        };
        let bytes = req.encode();
        conn.state.set(State::WaitAck);
        let r = {
            let mut tx = conn.tx.borrow_mut();
            self.send_parts(conn, &mut tx, &[&bytes], 1, Lent::None, Comp::NONE)
        };
        match r {
            Ok(_) => {
                let busy = conn.tx.borrow().busy();
                self.update_interest(conn, busy);
            }
            Err(st) => self.conn_failed(conn, st),
        }
        1
    }

    /// Client side: waits for CONN_ACK. True when connected (frames may follow).
    pub fn client_handshake(&self, conn: &Rc<Conn>, rx: &mut Rx) -> bool {
        let Some(r) = rx.parser.next_handshake() else {
            return false;
        };
        let Role::Client { conn_sn, .. } = conn.role else {
            return false;
        };
        let peer = conn.peer.get();
        let h = match r {
            Ok(h) => h,
            Err(e) => {
                ucs::warn_limited!("tcp: connecting to {peer}: {}", e.from_peer(peer));
                let ep = conn.ep.borrow().upgrade();
                self.close_conn(conn);
                if let Some(ep) = ep {
                    self.ep_failed(
                        &ep,
                        if matches!(e, WireError::BadMagic { .. }) {
                            Status::Unreachable
                        } else {
                            e.status()
                        },
                    );
                }
                return false;
            }
        };
        match h.msg {
            HandshakeMsg::Ack(a) if a.conn_sn == conn_sn => {
                conn.peer_max.set(a.max_payload);
                self.grow_buffers(conn, rx);
                conn.state.set(State::Connected);
                let busy = conn.tx.borrow().busy();
                self.update_interest(conn, busy);
                let ep = conn.ep.borrow().upgrade();
                if let Some(ep) = ep {
                    ep.attempts.set(0);
                    ucs::debug!("tcp: connected to {peer} (protocol version {})", a.version);
                    self.dispatch_pending(&ep);
                }
                conn.state.get() == State::Connected
            }
            HandshakeMsg::Reject(r) if r.reason == RejectReason::SimultaneousConnect => {
                // The peer keeps the connection it started to us for this endpoint pair: wait
                // for it (we accept it and attach it to the endpoint).
                ucs::debug!("tcp: {peer} connected to us at the same time; using its connection");
                let ep = conn.ep.borrow().upgrade();
                self.close_conn(conn);
                if let Some(ep) = ep {
                    let mine = ep.conn.borrow().as_ref().is_some_and(|c| Rc::ptr_eq(c, conn));
                    if mine {
                        *ep.conn.borrow_mut() = None;
                        self.timers.add(self.cfg.conn_timeout, Deadline::PeerWait(ep.key));
                    }
                }
                false
            }
            HandshakeMsg::Reject(r) => {
                ucs::error_limited!(
                    "tcp: {peer} rejected the connection: {:?} (it speaks protocol versions {}..={})",
                    r.reason,
                    h.min_version,
                    h.max_version
                );
                let ep = conn.ep.borrow().upgrade();
                self.close_conn(conn);
                if let Some(ep) = ep {
                    self.ep_failed(&ep, Status::Rejected);
                }
                false
            }
            _ => {
                self.violation(
                    conn,
                    &WireError::BadField {
                        what: "handshake answer (not the ACK of our request)",
                        value: 0,
                    },
                );
                false
            }
        }
    }

    /// A freshly accepted socket.
    pub fn on_accept(&self, sock: TcpStream, from: SocketAddr) {
        if let Err(st) = sock::configure(&sock, &self.cfg) {
            ucs::warn_limited!("tcp: dropping connection from {from}: {st}");
            return;
        }
        loop {
            if self.half_open.borrow().len() < self.cfg.max_half_open {
                break;
            }
            let Some(old) = self.half_open.borrow_mut().pop_front() else {
                break;
            };
            if let Some(c) = self.conn_by_token(old) {
                ucs::warn_limited!(
                    "tcp: {} connections in handshake (RUCX_TCP_MAX_HALF_OPEN); dropping the oldest, from {}",
                    self.cfg.max_half_open,
                    c.peer.get()
                );
                self.close_conn(&c);
            }
        }
        match self.add_conn(sock, Role::Server, State::Accepted, from, std::rc::Weak::new()) {
            Ok(conn) => {
                self.half_open.borrow_mut().push_back(conn.token());
                self.timers
                    .add(self.cfg.handshake_timeout, Deadline::Handshake(conn.token()));
            }
            Err(st) => ucs::warn_limited!("tcp: dropping connection from {from}: {st}"),
        }
    }

    /// Refuses a connection: CONN_REJECT (best effort), then close.
    fn reject(&self, conn: &Conn, conn_sn: u64, reason: RejectReason) {
        let _ = sock::send(&conn.sock, &ConnReject { conn_sn, reason }.encode());
        self.close_conn(conn);
    }

    /// Server side: reads CONN_REQ. True when connected (frames may follow).
    pub fn server_handshake(&self, conn: &Rc<Conn>, rx: &mut Rx) -> bool {
        let Some(r) = rx.parser.next_handshake() else {
            return false;
        };
        let peer = conn.peer.get();
        let h = match r {
            Ok(h) => h,
            Err(e) => {
                ucs::warn_limited!("tcp: refusing connection: {}", e.from_peer(peer));
                match e {
                    WireError::BadMagic { .. } => self.close_conn(conn),
                    WireError::BadVersion { .. } => self.reject(conn, 0, RejectReason::VersionUnsupported),
                    _ => self.reject(conn, 0, RejectReason::Malformed),
                }
                return false;
            }
        };
        let HandshakeMsg::Req(req) = h.msg else {
            ucs::warn_limited!(
                "tcp: refusing connection from {peer}: it sent a handshake answer instead of a CONN_REQ"
            );
            self.close_conn(conn);
            return false;
        };
        let version = match negotiate_version(h.min_version, h.max_version) {
            Ok(v) => v,
            Err(e) => {
                ucs::warn_limited!("tcp: refusing connection: {}", e.from_peer(peer));
                self.reject(conn, req.conn_sn, RejectReason::VersionUnsupported);
                return false;
            }
        };
        let mut ack_key = 0;
        if req.mode == ConnectMode::ToIface {
            match self.pair_iface_conn(conn, &req) {
                Ok(key) => ack_key = key,
                Err(reason) => {
                    self.reject(conn, req.conn_sn, reason);
                    return false;
                }
            }
        }
        let self_loop = req.src_ep_key
            == match req.mode {
                ConnectMode::ToEp { ep_key } => ep_key,
                ConnectMode::ToIface => 0,
            }
            && same_addr(req.listen_addr, self.listen_addr);
        if let (ConnectMode::ToEp { ep_key }, true) = (req.mode, self_loop) {
            ack_key = ep_key; // an endpoint connected to itself: this side stays the interface's
        } else if let ConnectMode::ToEp { ep_key } = req.mode {
            match self.attach_to_ep(conn, &req, ep_key) {
                Ok(key) => ack_key = key,
                Err(why) => {
                    ucs::warn_limited!(
                        "tcp: refusing connection from {} (ep {:#x}) to endpoint {ep_key:#x}: {why}",
                        req.listen_addr,
                        req.src_ep_key
                    );
                    self.reject(conn, req.conn_sn, RejectReason::UnknownEp);
                    return false;
                }
            }
        }
        let token = conn.token();
        self.half_open.borrow_mut().retain(|&t| t != token);
        conn.peer.set(req.listen_addr);
        conn.peer_max.set(req.max_payload);
        self.grow_buffers(conn, rx);
        conn.state.set(State::Connected);
        let ack = ConnAck {
            conn_sn: req.conn_sn,
            ep_key: ack_key,
            max_payload: self.rx_max_payload(),
            version,
        };
        let bytes = ack.encode();
        let r = {
            let mut tx = conn.tx.borrow_mut();
            self.send_parts(conn, &mut tx, &[&bytes], 1, Lent::None, Comp::NONE)
        };
        if let Err(st) = r {
            self.conn_failed(conn, st);
            return false;
        }
        ucs::debug!(
            "tcp: accepted connection from {} ({:?})",
            req.listen_addr,
            req.mode
        );
        let ep = conn.ep.borrow().upgrade();
        if let Some(ep) = ep {
            self.dispatch_pending(&ep);
        }
        conn.state.get() == State::Connected
    }

    /// Connect-to-iface, accepting side: attaches `conn` to our matching endpoint, keeps it for a
    /// later one, or refuses it in favour of our own connection (see the module docs). Returns
    /// the key for the ACK (0: no endpoint yet).
    fn pair_iface_conn(&self, conn: &Rc<Conn>, req: &ConnReq) -> std::result::Result<u64, RejectReason> {
        if same_addr(req.listen_addr, self.listen_addr) {
            return Ok(0); // our own interface: never paired
        }
        let key = pair_key(req.listen_addr, req.conn_sn);
        let ep = self.iface_eps.borrow().get(&key).and_then(std::rc::Weak::upgrade);
        let ep = ep.filter(|e| e.failed.get().is_none() && !e.destroyed.get());
        let Some(ep) = ep else {
            let unpaired = self.unexpected.borrow().len();
            if unpaired >= self.cfg.max_unpaired && !self.unexpected.borrow().contains_key(&key) {
                ucs::warn_limited!(
                    "tcp: refusing connection from {}: {unpaired} connections wait for an \
                     endpoint of ours to pair with (RUCX_TCP_MAX_UNPAIRED={}; raise it for more \
                     peers connecting at once)",
                    req.listen_addr,
                    self.cfg.max_unpaired
                );
                return Err(RejectReason::NoResource);
            }
            let stale = self.unexpected.borrow_mut().insert(key, conn.token());
            if let Some(old) = stale.and_then(|t| self.conn_by_token(t)) {
                old.pair.set(None);
            }
            conn.pair.set(Some(key));
            return Ok(0);
        };
        let ours = (self.dev.order_key(), self.listen_addr.port());
        let theirs = (addr::order_key(req.listen_addr.ip()), req.listen_addr.port());
        let current = ep.conn.borrow().clone().filter(|c| c.is_open());
        if let Some(c) = &current {
            let attached = c.role == Role::Server || c.state.get() == State::Connected;
            if attached || ours < theirs {
                // We keep the connection we have (ours wins, or one is already up).
                ucs::debug!(
                    "tcp: simultaneous connect with {} (endpoint pair {}): keeping our connection",
                    req.listen_addr,
                    req.conn_sn
                );
                return Err(RejectReason::SimultaneousConnect);
            }
            // Theirs wins: drop our attempt (the peer refuses it anyway).
            self.close_conn(c);
        } else if ours < theirs && matches!(ep.plan.get(), Plan::ToIface { .. }) && ep.attempts.get() > 0 {
            // Between our attempts (backoff): ours still wins; the peer waits for it.
            return Err(RejectReason::SimultaneousConnect);
        }
        *conn.ep.borrow_mut() = Rc::downgrade(&ep);
        *ep.conn.borrow_mut() = Some(conn.clone());
        Ok(ep.key)
    }

    /// Connect-to-ep, accepting side: attaches `conn` to endpoint `key` if the request comes
    /// from the peer it expects. Returns the key for the ACK, or why not.
    fn attach_to_ep(
        &self,
        conn: &Rc<Conn>,
        req: &ConnReq,
        key: u64,
    ) -> std::result::Result<u64, &'static str> {
        let ep = self
            .ep_by_key(key)
            .ok_or("no such endpoint (destroyed, or an address from an earlier run)")?;
        if ep.failed.get().is_some() {
            return Err("the endpoint has failed");
        }
        let from = (req.listen_addr, req.src_ep_key);
        match ep.plan.get() {
            Plan::ToEpPassive { peer, peer_key } => {
                if !same_addr(peer, req.listen_addr) || peer_key != req.src_ep_key {
                    return Err("the endpoint was connected to another peer");
                }
            }
            Plan::Unconnected => match ep.accepted_from.get() {
                Some(f) if !same_addr(f.0, from.0) || f.1 != from.1 => {
                    return Err("another peer connected first")
                }
                _ => ep.accepted_from.set(Some(from)),
            },
            Plan::ToEpActive { .. } => {
                return Err("this side connects to that peer itself (it has the smaller address)")
            }
            Plan::ToIface { .. } => return Err("the endpoint connects to an interface"),
        }
        if ep.conn.borrow().as_ref().is_some_and(|c| c.is_open()) {
            return Err("the endpoint is already connected");
        }
        *conn.ep.borrow_mut() = Rc::downgrade(&ep);
        *ep.conn.borrow_mut() = Some(conn.clone());
        Ok(ep.key)
    }
}
