//! The tcp transport and interface: device lookup, the listening socket, attributes,
//! addresses, and the registries of connections and endpoints.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::{Rc, Weak};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use slab::Slab;
use ucs::config::Overrides;
use ucs::{Outcome, Result, Status};
use uct_transport::am::AmTable;
use uct_transport::callbacks::{Comp, ErrHandler};
use uct_transport::rma::RegionTable;
use uct_transport::traits::{IfaceOpenParams, Transport, TransportIface};
use uct_transport::types::*;
use uct_transport::worker_ref::WorkerRef;

use crate::addr::{self, DevAddr, EP_ADDR_LEN, IFACE_ADDR_LEN};
use crate::bufs::BufPool;
use crate::config::{self, TcpConfig};
use crate::conn::{Conn, PairKey, Role, Rx, Sink, State, Tx};
use crate::ep::{EpInner, Plan, TcpEp};
use crate::md::TcpMd;
use crate::netif::{self, PerfModel};
use crate::ops::Ops;
use crate::read_tuner::ReadTuner;
use crate::rx_parser::RxParser;
use crate::sock;
use crate::timers::Timers;
use crate::wire::{FRAME_HDR_LEN, MIN_MAX_PAYLOAD};

/// Epoll token of the listening socket.
pub const LISTEN_TOKEN: u64 = u64::MAX;
/// Epoll token of the timer fd.
pub const TIMER_TOKEN: u64 = u64::MAX - 1;
/// Room in the send buffer beyond TX_SEG_SIZE, for frame and request headers.
pub const TX_HDR_ROOM: usize = 64;

pub struct TcpTransport;

impl Transport for TcpTransport {
    type Md = TcpMd;
    type Iface = TcpIface;
    const NAME: &'static CStr = c"tcp";

    fn query_devices(md: &TcpMd) -> Result<Vec<TlResource>> {
        Ok(devices(&md.config)?
            .iter()
            .map(|d| TlResource::new("tcp", &d.name, DeviceType::Net))
            .collect())
    }

    fn iface_open(md: &TcpMd, params: IfaceOpenParams) -> Result<TcpIface> {
        let cfg = TcpConfig::read_with(&params.config)?;
        let Some(dev) = devices(&params.config)?
            .into_iter()
            .find(|d| d.name == params.dev_name)
        else {
            ucs::error!(
                "tcp: no usable network device '{}' (it must be up, have an IP address and pass \
                 RUCX_NET_DEVICES; see rucx-info -d)",
                params.dev_name
            );
            return Err(Status::NoDevice.into());
        };
        // A loopback device uses its loopback address, any other a routable one; IPv4 first.
        let ip = dev
            .addrs
            .iter()
            .copied()
            .find(|a| a.is_loopback() == dev.loopback && !a.is_unspecified());
        let Some(ip) = ip else {
            ucs::error!("tcp: device {} has no usable address ({:?})", dev.name, dev.addrs);
            return Err(Status::NoDevice.into());
        };
        let loopback = ip.is_loopback();
        let cfg = cfg.for_device(loopback);
        let dev_addr = DevAddr {
            ip,
            loopback,
            domain: if loopback { addr::loopback_domain() } else { 0 },
        };
        let listener = sock::listen(ip, dev.ifindex, cfg.port_range)?;
        let listen_addr = listener.local_addr().map_err(|e| {
            ucs::error!("tcp: getsockname of the listening socket failed: {e}");
            Status::IoError
        })?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| {
            ucs::error!("tcp: epoll_create failed: {e}");
            Status::IoError
        })?;
        let timers = Timers::new()?;
        let reg = |fd: &dyn std::os::fd::AsFd, token| {
            epoll
                .add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, token))
                .map_err(|e| {
                    ucs::error!("tcp: epoll_ctl failed: {e}");
                    Status::IoError
                })
        };
        reg(&listener, LISTEN_TOKEN)?;
        reg(&timers.fd, TIMER_TOKEN)?;
        ucs::debug!("tcp: interface on {} listening at {listen_addr}", dev.name);
        let sh = Rc::new_cyclic(|me| Shared {
            perf: dev.perf(),
            dev_name: dev.name.clone(),
            ifindex: dev.ifindex,
            dev: dev_addr,
            listen_addr,
            listener,
            epoll,
            timers,
            worker: params.worker,
            am: params.am,
            err: params.err_handler,
            regions: md.regions.clone(),
            conns: RefCell::new(Slab::new()),
            eps: RefCell::new(Slab::new()),
            next_uid: Cell::new(1),
            next_gen: Cell::new(seed_u32() | 1),
            next_sn: Cell::new(1),
            half_open: RefCell::new(VecDeque::new()),
            iface_eps: RefCell::new(HashMap::new()),
            unexpected: RefCell::new(HashMap::new()),
            peer_sn: RefCell::new(HashMap::new()),
            deferred: Cell::new(0),
            ev_buf: RefCell::new(vec![crate::sys::empty_event(); cfg.max_poll].into_boxed_slice()),
            tick: Cell::new(0),
            tuner: ReadTuner::new(cfg.direct_reads, seed_u32()),
            solo: Cell::new(0),
            tx_bufs: BufPool::new(cfg.tx_seg + TX_HDR_ROOM, 16),
            stage_bufs: BufPool::new(
                crate::coalesce::stage_size(cfg.tx_coalesce, cfg.tx_seg + TX_HDR_ROOM),
                // few idle ones: each is `RUCX_TCP_TX_COALESCE` bytes, and a fan-out burst
                // that needed many leaves them idle for good
                2,
            ),
            staged: RefCell::new(Vec::new()),
            rx_bufs: BufPool::new(RxParser::without_buffer(cfg.rx_seg as u32).capacity(), 4),
            rx_spare: RefCell::new(Vec::new()),
            me: me.clone(),
            cfg,
        });
        Ok(TcpIface { sh })
    }
}

/// The devices tcp may use (up, with an address, selected by `RUCX_NET_DEVICES`).
fn devices(code: &Overrides) -> Result<Vec<netif::NetDevice>> {
    let (list, deny) = config::net_devices(code)?;
    Ok(netif::filter_devices(netif::enumerate()?, &list, deny))
}

fn seed_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

/// Everything an interface's endpoints and connections share.
pub struct Shared {
    pub cfg: TcpConfig,
    pub dev_name: String,
    pub dev: DevAddr,
    /// The device's interface index (scope of IPv6 link-local addresses).
    pub ifindex: u32,
    pub perf: PerfModel,
    /// Where this interface listens (the device's IP and the port).
    pub listen_addr: SocketAddr,
    pub listener: TcpListener,
    pub epoll: Epoll,
    pub timers: Timers,
    pub worker: WorkerRef,
    pub am: Rc<AmTable>,
    pub err: ErrHandler,
    pub regions: Rc<RegionTable>,
    pub conns: RefCell<Slab<Rc<Conn>>>,
    pub eps: RefCell<Slab<Weak<EpInner>>>,
    next_uid: Cell<u32>,
    next_gen: Cell<u32>,
    next_sn: Cell<u64>,
    /// Tokens of accepted connections still in their handshake, oldest first.
    pub half_open: RefCell<VecDeque<u64>>,
    /// Connect-to-iface endpoints by pairing key.
    pub iface_eps: RefCell<HashMap<PairKey, Weak<EpInner>>>,
    /// Accepted connect-to-iface connections no endpoint of ours has adopted yet, by pairing key.
    pub unexpected: RefCell<HashMap<PairKey, u64>>,
    /// Connect-to-iface endpoints created per peer interface (the next sequence number).
    pub peer_sn: RefCell<HashMap<(std::net::IpAddr, u16), u64>>,
    /// Deferred callbacks (error reports, pending re-dispatch) not yet run.
    pub deferred: Cell<usize>,
    /// Events of one progress call (`RUCX_TCP_MAX_POLL` entries); borrowed while in use.
    pub ev_buf: RefCell<Box<[crate::sys::Event]>>,
    /// Progress calls so far (every `progress::EPOLL_EVERY`th one polls epoll).
    pub tick: Cell<u32>,
    /// Whether progress reads the lone connection directly while a reply is awaited.
    pub tuner: ReadTuner,
    /// Token of the only connection, last time there was exactly one (see `progress.rs`).
    pub solo: Cell<u64>,
    /// Send buffers (`tx_seg` + header room) lent to connections while they use them.
    pub tx_bufs: BufPool,
    /// Larger send buffers for connections that coalesce sends (`coalesce.rs`).
    pub stage_bufs: BufPool,
    /// Connections holding staged sends for the next progress call (`coalesce.rs`).
    pub staged: RefCell<Vec<Rc<Conn>>>,
    /// Receive buffers of connected connections' parsers, lent likewise.
    pub rx_bufs: BufPool,
    /// Receive states of idle connections (`rx.rs`): blank, so any connection can take one.
    /// Boxed as the connections hold them: they move without being copied or reallocated.
    #[allow(clippy::vec_box)]
    pub rx_spare: RefCell<Vec<Box<Rx>>>,
    pub me: Weak<Shared>,
}

impl Shared {
    /// The frame payload this side accepts (announced in handshakes).
    pub fn rx_max_payload(&self) -> u32 {
        self.cfg.rx_seg as u32
    }

    pub fn next_conn_sn(&self) -> u64 {
        let s = self.next_sn.get();
        self.next_sn.set(s + 1);
        s
    }

    /// Creates a connection over `sock` and adds it to the epoll set.
    pub fn add_conn(
        &self,
        sock: TcpStream,
        role: Role,
        state: State,
        peer: SocketAddr,
        ep: Weak<EpInner>,
    ) -> Result<Rc<Conn>> {
        let uid = self.next_uid.get();
        self.next_uid.set(uid.wrapping_add(1).max(1));
        let mut conns = self.conns.borrow_mut();
        let entry = conns.vacant_entry();
        let idx = entry.key();
        let conn = Rc::new(Conn {
            idx,
            uid,
            sock,
            role,
            state: Cell::new(state),
            peer: Cell::new(peer),
            peer_max: Cell::new(MIN_MAX_PAYLOAD),
            ep: RefCell::new(ep),
            // No send buffer until one is needed (`bufs.rs`).
            tx: RefCell::new(Tx::new(0)),
            rx_pooled: Cell::new(false),
            rx: Cell::new(Some(Box::new(Rx {
                parser: RxParser::new(MIN_MAX_PAYLOAD),
                sink: Sink::None,
            }))),
            ops: RefCell::new(Ops::default()),
            ctl: RefCell::new(VecDeque::new()),
            out_armed: Cell::new(state == State::Connecting),
            in_pack: Cell::new(false),
            sent_since_rx: Cell::new(0),
            tx_bytes: Cell::new(0),
            staged: Cell::new(false),
            tx_tick: Cell::new(self.tick.get().wrapping_sub(1)),
            fin_pending: Cell::new(false),
            fin_sent: Cell::new(false),
            peer_fin: Cell::new(false),
            pair: Cell::new(None),
        });
        let mut flags = EpollFlags::EPOLLIN;
        if state == State::Connecting {
            flags |= EpollFlags::EPOLLOUT;
        }
        self.epoll
            .add(&conn.sock, EpollEvent::new(flags, conn.token()))
            .map_err(|e| {
                ucs::error!("tcp: epoll_ctl(ADD) failed: {e}");
                Status::IoError
            })?;
        entry.insert(conn.clone());
        Ok(conn)
    }

    /// Gives a connection's parser the full frame size once its handshake is done (its buffer
    /// then comes from `rx_bufs`; send buffers always do).
    pub fn grow_buffers(&self, _conn: &Conn, rx: &mut Rx) {
        rx.parser.set_max_payload(self.rx_max_payload());
    }

    /// The live connection with epoll token `token`.
    pub fn conn_by_token(&self, token: u64) -> Option<Rc<Conn>> {
        let idx = (token & 0xffff_ffff) as usize;
        self.conns
            .borrow()
            .get(idx)
            .filter(|c| c.token() == token)
            .cloned()
    }

    /// Removes a connection from the epoll set and the registry (its socket closes when the
    /// last reference goes).
    pub fn remove_conn(&self, conn: &Conn) {
        let _ = self.epoll.delete(&conn.sock);
        let mut conns = self.conns.borrow_mut();
        if conns.get(conn.idx).is_some_and(|c| c.uid == conn.uid) {
            conns.remove(conn.idx);
        }
    }

    /// Sets EPOLLOUT interest when the connection has something to write (or is connecting).
    pub fn update_interest(&self, conn: &Conn, tx_busy: bool) {
        if !conn.is_open() {
            return;
        }
        let want = conn.state.get() == State::Connecting || tx_busy || !conn.ctl.borrow().is_empty();
        if want == conn.out_armed.get() {
            return;
        }
        let mut flags = EpollFlags::EPOLLIN;
        if want {
            flags |= EpollFlags::EPOLLOUT;
        }
        let mut ev = EpollEvent::new(flags, conn.token());
        match self.epoll.modify(&conn.sock, &mut ev) {
            Ok(()) => conn.out_armed.set(want),
            Err(e) => ucs::error!("tcp: epoll_ctl(MOD) failed: {e}"),
        }
    }

    /// Registers a new endpoint.
    pub fn add_ep(&self, plan: Plan) -> Rc<EpInner> {
        let gen = self.next_gen.get();
        self.next_gen.set(gen.wrapping_add(2) | 1);
        let mut eps = self.eps.borrow_mut();
        let entry = eps.vacant_entry();
        let key = (u64::from(gen) << 32) | entry.key() as u64;
        let ep = Rc::new(EpInner::new(key, plan));
        entry.insert(Rc::downgrade(&ep));
        ep
    }

    /// The live endpoint with `key`.
    pub fn ep_by_key(&self, key: u64) -> Option<Rc<EpInner>> {
        let idx = (key & 0xffff_ffff) as usize;
        self.eps
            .borrow()
            .get(idx)
            .and_then(Weak::upgrade)
            .filter(|e| e.key == key)
    }

    pub fn remove_ep(&self, key: u64) {
        let idx = (key & 0xffff_ffff) as usize;
        let mut eps = self.eps.borrow_mut();
        if eps
            .get(idx)
            .is_some_and(|w| w.upgrade().is_none_or(|e| e.key == key))
        {
            eps.remove(idx);
        }
    }

    /// Every live endpoint.
    pub fn all_eps(&self) -> Vec<Rc<EpInner>> {
        self.eps
            .borrow()
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Schedules `f` for the next worker progress (counted, so event_arm reports Busy).
    pub fn defer(&self, key: u64, f: impl FnOnce(&Rc<Shared>) + 'static) {
        self.deferred.set(self.deferred.get() + 1);
        let me = self.me.clone();
        self.worker.oneshot_add(key, move || {
            if let Some(sh) = me.upgrade() {
                sh.deferred.set(sh.deferred.get().saturating_sub(1));
                f(&sh);
            }
        });
    }
}

/// The interface the host holds.
pub struct TcpIface {
    pub(crate) sh: Rc<Shared>,
}

impl Drop for TcpIface {
    fn drop(&mut self) {
        self.sh.shutdown();
    }
}

impl TransportIface for TcpIface {
    type Ep = TcpEp;

    fn query(&self) -> IfaceAttr {
        let c = &self.sh.cfg;
        let ops = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        let fops = ops | AtomicOps::SWAP | AtomicOps::CSWAP;
        let p = &self.sh.perf;
        IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::AM_ZCOPY
                | IfaceFlags::PUT_SHORT
                | IfaceFlags::PUT_BCOPY
                | IfaceFlags::PUT_ZCOPY
                | IfaceFlags::GET_BCOPY
                | IfaceFlags::GET_ZCOPY
                | IfaceFlags::PENDING
                | IfaceFlags::ATOMIC_CPU
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::CONNECT_TO_EP
                | IfaceFlags::CB_SYNC
                | IfaceFlags::ERRHANDLE_PEER_FAILURE
                | IfaceFlags::ERRHANDLE_AM_ID
                | IfaceFlags::ERRHANDLE_REMOTE_MEM
                | IfaceFlags::ERRHANDLE_BCOPY_LEN
                | IfaceFlags::INTER_NODE
                | if c.keepalive.is_some() {
                    IfaceFlags::EP_KEEPALIVE
                } else {
                    IfaceFlags::EMPTY
                },
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::FD,
            am: OpCaps {
                max_short: c.tx_seg,
                max_bcopy: c.tx_seg,
                min_zcopy: 0,
                max_zcopy: c.rx_seg,
                max_hdr: c.tx_seg - FRAME_HDR_LEN,
                max_iov: c.max_iov,
                ..Default::default()
            },
            put: OpCaps {
                max_short: c.tx_seg,
                max_bcopy: c.tx_seg,
                min_zcopy: 0,
                max_zcopy: usize::MAX,
                max_iov: c.max_iov,
                ..Default::default()
            },
            get: OpCaps {
                max_bcopy: c.rx_seg,
                min_zcopy: 0,
                max_zcopy: usize::MAX,
                max_iov: c.max_iov,
                ..Default::default()
            },
            atomic32: AtomicCaps {
                op_flags: ops,
                fop_flags: fops,
            },
            atomic64: AtomicCaps {
                op_flags: ops,
                fop_flags: fops,
            },
            device_addr_len: self.sh.dev.len(),
            iface_addr_len: IFACE_ADDR_LEN,
            ep_addr_len: EP_ADDR_LEN,
            max_num_eps: usize::MAX,
            overhead: p.overhead,
            bandwidth: Bandwidth {
                dedicated: p.bw_dedicated,
                shared: p.bw_shared,
            },
            latency: LinearFunc {
                c: p.latency_c,
                m: p.latency_m,
            },
            priority: p.priority,
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        self.sh.dev.encode(buf)
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        addr::encode_iface_addr(self.sh.listen_addr.port(), buf)
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        let Some(peer) = DevAddr::decode(dev) else {
            return false;
        };
        addr::decode_iface_addr(iface).is_some() && self.sh.dev.reaches(&peer)
    }

    #[inline] // into the worker's progress callback (`uct_transport::abi::export`): one call less per poll
    fn progress(&self) -> u32 {
        self.sh.progress()
    }

    fn flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        self.sh.iface_flush(flags, comp)
    }

    fn event_fd(&self) -> Result<RawFd> {
        Ok(self.sh.epoll.0.as_raw_fd())
    }

    fn event_arm(&self, _events: ArmEvents) -> Result<()> {
        self.sh.event_arm()
    }

    fn ep_create(&self) -> Result<TcpEp> {
        Ok(TcpEp::new(self.sh.clone(), self.sh.add_ep(Plan::Unconnected)))
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<TcpEp> {
        let (Some(peer), Some(port)) = (DevAddr::decode(dev), addr::decode_iface_addr(iface)) else {
            ucs::error!("tcp: ep_create_connected: malformed device or interface address");
            return Err(Status::InvalidParam.into());
        };
        if !self.sh.dev.reaches(&peer) {
            ucs::error!(
                "tcp: {} is not reachable from device {} ({})",
                peer.ip,
                self.sh.dev_name,
                self.sh.dev.ip
            );
            return Err(Status::Unreachable.into());
        }
        let target = peer.socket_addr(port, self.sh.ifindex);
        Ok(TcpEp::new(self.sh.clone(), self.sh.create_iface_ep(target)))
    }
}
