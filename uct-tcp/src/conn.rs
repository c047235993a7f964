//! A connection: one socket and everything that travels on it.
//!
//! State machine:
//! ```text
//! client: Connecting --(connected, CONN_REQ sent)--> WaitAck --(CONN_ACK)--> Connected
//! server: Accepted --(CONN_REQ, CONN_ACK sent)--> Connected
//! any --(error, EOF, reject, timeout, both sides' FIN)--> Closed
//! ```
//! A connection carries at most one endpoint on each side (`ep`); a side without one (the
//! acceptor of a connect-to-iface connection, or after its endpoint was destroyed) still
//! delivers AMs to its interface and answers requests. FIN is a half-close: "my endpoint on
//! this connection is gone, I start nothing more". The connection closes once neither side has
//! an endpoint on it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::rc::Weak;

use uct_transport::callbacks::Comp;
use uct_transport::iov::Iov;

use crate::ep::EpInner;
use crate::ops::Ops;
use crate::rx_parser::RxParser;
use crate::wire::ConnectMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Connecting,
    WaitAck,
    Accepted,
    Connected,
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client { mode: ConnectMode, conn_sn: u64 },
    Server,
}

/// The unsent part of the message being sent (at most one per connection): copied bytes in
/// `buf[head..tail]`, then bytes still referenced in place (`zc`).
pub struct Tx {
    pub buf: Box<[u8]>,
    pub head: usize,
    pub tail: usize,
    pub zc: ZcTail,
    /// Completed (Ok) once the whole message is written (am_zcopy).
    pub comp: Comp,
    /// The entry array of the last `ZcTail::Iov`, kept for the next one: allocated on a
    /// connection's first partly sent zcopy, not with every connection (it is ~400 bytes).
    pub iov_spare: Option<IovArray>,
}

/// The lent entries of one message.
pub type IovArray = Box<[Iov<'static>; MAX_TX_IOV]>;

/// Bytes of the current message that are sent from where they live.
pub enum ZcTail {
    None,
    /// User memory (am_zcopy, put_zcopy): entries `idx..n`, the first from offset `off`.
    Iov {
        iov: IovArray,
        n: usize,
        idx: usize,
        off: usize,
    },
    /// Registered memory read by a peer's get: `left` bytes at `addr` (re-checked each send).
    Region {
        key: u64,
        addr: u64,
        left: u64,
    },
}

/// Most lent entries of one message.
pub const MAX_TX_IOV: usize = uct_transport::types::MAX_IOV;

impl Tx {
    pub fn new(cap: usize) -> Tx {
        Tx {
            buf: vec![0u8; cap].into_boxed_slice(),
            head: 0,
            tail: 0,
            zc: ZcTail::None,
            comp: Comp::NONE,
            iov_spare: None,
        }
    }

    /// Ends the in-place part of the message, keeping an entry array for the next one.
    pub fn end_zc(&mut self) {
        if let ZcTail::Iov { iov, .. } = std::mem::replace(&mut self.zc, ZcTail::None) {
            self.iov_spare = Some(iov);
        }
    }

    /// True while a message is partly sent.
    #[inline]
    pub fn busy(&self) -> bool {
        self.head != self.tail || !matches!(self.zc, ZcTail::None)
    }

    /// True when the unsent part references memory the user lent (not copied).
    pub fn holds_user_memory(&self) -> bool {
        matches!(self.zc, ZcTail::Iov { .. }) || !self.comp.is_none()
    }

    pub fn reset(&mut self) -> Comp {
        self.head = 0;
        self.tail = 0;
        self.end_zc();
        std::mem::replace(&mut self.comp, Comp::NONE)
    }
}

/// A reply the target side still has to send.
pub enum Ctl {
    /// A small frame (PUT_ACK, ATOMIC_REP, GET_REP of a refused get), encoded.
    Small { b: [u8; 24], n: u8 },
    /// A GET_REP with `len` bytes of registered memory.
    GetRep { seq: u32, key: u64, addr: u64, len: u64 },
}

/// Where the bulk data after the current PUT_REQ / GET_REP goes.
pub enum Sink {
    None,
    /// A peer's put: `status` is Ok while the target range is valid.
    Put {
        key: u64,
        addr: u64,
        len: u64,
        seq: u32,
        ack_req: bool,
        status: ucs::Status,
    },
    /// Our get's reply.
    Get(crate::ops::Op),
}

/// The receive side: the stream parser and the bulk destination.
pub struct Rx {
    pub parser: RxParser,
    pub sink: Sink,
}

pub struct Conn {
    /// Slab index in the interface (low half of the epoll token).
    pub idx: usize,
    /// Unique per interface (high half of the epoll token), so stale events are recognized.
    pub uid: u32,
    pub sock: TcpStream,
    pub role: Role,
    pub state: Cell<State>,
    /// The peer's address for logs: the target (client), the accepted address, then the peer's
    /// listening address once its CONN_REQ is read (server).
    pub peer: Cell<SocketAddr>,
    /// Largest AM payload the peer accepts.
    pub peer_max: Cell<u32>,
    pub ep: RefCell<Weak<EpInner>>,
    pub tx: RefCell<Tx>,
    /// Taken out while frames are processed (user handlers may re-enter progress), and
    /// while `rx_pooled`.
    pub rx: Cell<Option<Box<Rx>>>,
    /// Idle: its blank receive state went to the interface's `rx_spare` (`rx.rs`).
    pub rx_pooled: Cell<bool>,
    pub ops: RefCell<Ops>,
    pub ctl: RefCell<VecDeque<Ctl>>,
    /// EPOLLOUT is in the interest set.
    pub out_armed: Cell<bool>,
    /// A bcopy pack callback is running: sends on this connection return NoResource.
    pub in_pack: Cell<bool>,
    /// User sends since data last arrived, weighted by size (one per send plus one per
    /// `DIRECT_UNIT` bytes; saturating): a few small ones mean a reply is awaited, which makes
    /// progress read the socket directly (see `progress.rs`).
    pub sent_since_rx: Cell<u8>,
    /// Bytes handed to `send`/`sendmsg` so far (sizes the sends counted above).
    pub tx_bytes: Cell<u64>,
    /// Copied sends wait in the send buffer for the next progress call (`coalesce.rs`).
    pub staged: Cell<bool>,
    /// The interface's progress count at the last copied send that found the connection idle.
    pub tx_tick: Cell<u32>,
    /// Our endpoint is gone: FIN goes out once the send buffer is empty.
    pub fin_pending: Cell<bool>,
    /// The FIN frame went out.
    pub fin_sent: Cell<bool>,
    /// The peer sent FIN (its endpoint on this connection is gone).
    pub peer_fin: Cell<bool>,
    /// Connect-to-iface pairing key (peer, sequence number) while registered as unexpected.
    pub pair: Cell<Option<PairKey>>,
}

/// Identifies a connect-to-iface endpoint pair: the peer interface's listening address and the
/// sequence number of the endpoint among those its side created towards ours.
pub type PairKey = (std::net::IpAddr, u16, u64);

/// The pairing key of sequence number `sn` with the interface listening at `peer`.
pub fn pair_key(peer: SocketAddr, sn: u64) -> PairKey {
    (peer.ip(), peer.port(), sn)
}

impl Conn {
    pub fn token(&self) -> u64 {
        (u64::from(self.uid) << 32) | self.idx as u64
    }

    /// True when a user send may go ahead now.
    #[inline]
    pub fn can_send(&self, tx: &Tx) -> bool {
        self.can_send_idle(!tx.busy())
    }

    /// `can_send` for a caller that has `idle` (`!tx.busy()`) at hand already.
    #[inline]
    pub fn can_send_idle(&self, idle: bool) -> bool {
        self.state.get() == State::Connected && idle && !self.in_pack.get()
    }

    pub fn is_open(&self) -> bool {
        !matches!(self.state.get(), State::Closed)
    }
}
