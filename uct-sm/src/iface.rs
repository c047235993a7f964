//! The posix/sysv interface: owns the receive FIFO and its wakeup socket, delivers messages
//! from progress, dispatches endpoints' pending queues, and checks peers on a slow timer.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::rc::{Rc, Weak};
use std::time::Instant;

use ucs::config::Overrides;
use ucs::{Error, Outcome, Result, Status};
use uct_transport::am::AmTable;
use uct_transport::callbacks::{Comp, ErrHandler};
use uct_transport::traits::{EpHandle, IfaceOpenParams, TransportIface};
use uct_transport::types::*;

use crate::addr::{random_u64, same_host, write_device_address, MmAddr, DEV_ADDR_LEN, MM_ADDR_LEN};
use crate::config::MmSettings;
use crate::ep::{EpInner, MmEp};
use crate::fifo::{elem_size_for, seg_len, Fifo, Peek};
use crate::mm::{Mapper, OwnSeg};
use crate::rxbuf::RxPool;

/// Progress calls between two reads of the clock for peer checks.
const CHECK_EVERY: u32 = 256;

/// What the interface's endpoints share with it.
pub(crate) struct IfaceInner {
    pub(crate) name: &'static str,
    pub(crate) settings: MmSettings,
    am: Rc<AmTable>,
    pub(crate) err: ErrHandler,
    fifo: Fifo,
    /// The posix name to unlink at close (only without proc link).
    seg_name: Option<String>,
    /// Keeps a posix segment's fd open: peers map it through /proc/<pid>/fd.
    _seg_fd: Option<std::os::fd::OwnedFd>,
    addr: MmAddr,
    read_index: Cell<u64>,
    rx: RxPool,
    /// Bound to the abstract name of `addr`: senders signal it when we armed.
    sock: UnixDatagram,
    /// Unbound: sends wakeups to peers.
    pub(crate) tx_sock: UnixDatagram,
    /// Every endpoint (for peer checks and iface flush).
    pub(crate) eps: RefCell<Vec<Weak<EpInner>>>,
    /// Endpoints that queued pending requests.
    pub(crate) pending_eps: RefCell<Vec<Weak<EpInner>>>,
    /// Corrupt elements seen (the first is logged).
    corrupt: Cell<u64>,
    /// Progress calls until the clock is read for the next peer check.
    check_countdown: Cell<u32>,
    /// When endpoints next check their peers.
    next_check: Cell<Instant>,
    /// Attach a peer's segment through this mapper.
    pub(crate) attach: fn(u32, u64, usize, bool) -> Result<crate::sys::Mapping>,
}

pub struct MmIface {
    inner: Rc<IfaceInner>,
}

impl MmIface {
    pub(crate) fn open<M: Mapper>(params: IfaceOpenParams, config: &Overrides) -> Result<MmIface> {
        let settings = MmSettings::read(config)?;
        let elem = elem_size_for(settings.seg_size);
        let len = seg_len(settings.fifo_size, elem);
        let seg = M::create(len, config).map_err(|e| {
            let e = e.context_with(format!(
                "{}: creating the {len}-byte receive FIFO (RUCX_MM_FIFO_SIZE x RUCX_MM_SEG_SIZE)",
                M::STR
            ));
            ucs::error!("{e}");
            e
        })?;
        let nonce = random_u64();
        let OwnSeg {
            map,
            id,
            proc_link,
            name,
            _fd,
        } = seg;
        let fifo = Fifo::init(map, settings.fifo_size, elem, nonce)?;
        let addr = MmAddr {
            pid: std::process::id(),
            seg_id: id,
            seg_len: len as u64,
            nonce,
            proc_link,
        };
        let sock_addr = SocketAddr::from_abstract_name(addr.socket_name().as_bytes())
            .map_err(|e| Error::new(Status::IoError, format!("{}: event socket name: {e}", M::STR)))?;
        let sock = UnixDatagram::bind_addr(&sock_addr)
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .map_err(|e| Error::new(Status::IoError, format!("{}: event socket: {e}", M::STR)))?;
        let tx_sock = UnixDatagram::unbound()
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .map_err(|e| Error::new(Status::IoError, format!("{}: wakeup socket: {e}", M::STR)))?;
        let cap = fifo.payload_cap();
        let inner = Rc::new(IfaceInner {
            name: M::STR,
            settings,
            am: params.am,
            err: params.err_handler,
            fifo,
            seg_name: name,
            _seg_fd: _fd,
            addr,
            read_index: Cell::new(0),
            rx: RxPool::new(cap),
            sock,
            tx_sock,
            eps: RefCell::new(Vec::new()),
            pending_eps: RefCell::new(Vec::new()),
            corrupt: Cell::new(0),
            check_countdown: Cell::new(CHECK_EVERY),
            next_check: Cell::new(Instant::now() + settings.peer_check),
            attach: M::attach,
        });
        Ok(MmIface { inner })
    }
}

impl Drop for MmIface {
    fn drop(&mut self) {
        // Endpoints of peers see this at their next check and fail.
        self.inner.fifo.close();
        self.inner.am.clear();
        if let Some(n) = &self.inner.seg_name {
            crate::sys::posix_unlink(n);
        }
    }
}

impl IfaceInner {
    /// Delivers up to `max_poll` messages; returns how many elements were consumed.
    #[inline]
    fn poll_fifo(&self) -> u32 {
        let mut n = 0;
        while n < self.settings.max_poll {
            let idx = self.read_index.get();
            match self.fifo.peek(idx) {
                Peek::Empty => break,
                Peek::Msg { id, len } if self.am.takes_shared(id) => {
                    // The handler copies what it needs straight from the element (one copy);
                    // the element goes back to the senders after it returned.
                    self.read_index.set(idx + 1);
                    self.fifo.invoke_in_place(idx, len, &self.am, id);
                    self.fifo.release(idx + 1);
                }
                Peek::Msg { id, len } => {
                    self.read_index.set(idx + 1);
                    self.rx.deliver(&self.am, id, len, |b| {
                        self.fifo.copy_out(idx, b);
                        self.fifo.release(idx + 1);
                    });
                }
                Peek::Skip => {
                    self.read_index.set(idx + 1);
                    self.fifo.release(idx + 1);
                }
                Peek::Corrupt(why) => {
                    self.read_index.set(idx + 1);
                    self.fifo.release(idx + 1);
                    self.corrupted(idx, &why);
                }
            }
            n += 1;
        }
        n
    }

    #[cold]
    fn corrupted(&self, idx: u64, why: &str) {
        let n = self.corrupt.get() + 1;
        self.corrupt.set(n);
        if n == 1 {
            ucs::error!(
                "{}: a process on this host corrupted the receive FIFO (element {idx}: {why}): element dropped; later corruptions are counted, not logged",
                self.name
            );
        }
    }

    /// Runs the pending queues of endpoints whose peer FIFO has room.
    fn dispatch_pending(&self) -> u32 {
        let eps: Vec<Rc<EpInner>> = self
            .pending_eps
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut done = 0;
        for ep in &eps {
            done += ep.dispatch();
        }
        self.pending_eps
            .borrow_mut()
            .retain(|w| w.upgrade().is_some_and(|e| e.has_pending()));
        done
    }

    /// Checks peers when the interval has passed (the clock is read every [`CHECK_EVERY`]
    /// progress calls only). A timer would keep a poll-mode worker from ever sleeping.
    #[inline]
    fn maybe_check_peers(&self) {
        let n = self.check_countdown.get() - 1;
        if n > 0 {
            self.check_countdown.set(n);
            return;
        }
        self.check_countdown.set(CHECK_EVERY);
        let now = Instant::now();
        if now >= self.next_check.get() {
            self.next_check.set(now + self.settings.peer_check);
            self.check_peers();
        }
    }

    /// Fails endpoints whose peer process exited or whose peer interface closed.
    fn check_peers(&self) {
        let eps: Vec<Rc<EpInner>> = self.eps.borrow().iter().filter_map(Weak::upgrade).collect();
        self.eps.borrow_mut().retain(|w| w.strong_count() > 0);
        for ep in eps {
            ep.check_peer();
        }
    }

    pub(crate) fn report(&self, handle: usize, st: Status) {
        if !self.err.report(EpHandle(handle), st) {
            ucs::error!(
                "{}: endpoint to a peer failed: {st} (no error handler took it)",
                self.name
            );
        }
    }

    fn drain_socket(&self) {
        let mut b = [0u8; 16];
        while self.sock.recv(&mut b).is_ok() {}
    }
}

impl TransportIface for MmIface {
    type Ep = MmEp;

    fn query(&self) -> IfaceAttr {
        let cap = self.inner.fifo.payload_cap();
        IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::PENDING
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::CB_SYNC
                | IfaceFlags::ERRHANDLE_PEER_FAILURE
                | IfaceFlags::ERRHANDLE_AM_ID
                | IfaceFlags::ERRHANDLE_BCOPY_LEN
                | IfaceFlags::ERRHANDLE_SHORT_BUF
                | IfaceFlags::ERRHANDLE_BCOPY_BUF,
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::FD,
            am: OpCaps {
                max_short: cap,
                max_bcopy: cap,
                max_hdr: 0,
                max_iov: MAX_IOV,
                ..Default::default()
            },
            device_addr_len: DEV_ADDR_LEN,
            iface_addr_len: MM_ADDR_LEN,
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 10e-9,
            bandwidth: Bandwidth {
                dedicated: 12179.0 * 1024.0 * 1024.0,
                shared: 0.0,
            },
            latency: LinearFunc { c: 80e-9, m: 0.0 },
            priority: 0,
            ..Default::default()
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        write_device_address(buf)
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        self.inner.addr.pack(buf).ok_or(Status::BufferTooSmall)?;
        Ok(())
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        same_host(dev) && MmAddr::unpack(iface).is_some()
    }

    #[inline]
    fn progress(&self) -> u32 {
        let i = &*self.inner;
        let mut n = i.poll_fifo();
        if !i.pending_eps.borrow().is_empty() {
            n += i.dispatch_pending();
        }
        i.maybe_check_peers();
        n
    }

    fn flush(&self, _flags: FlushFlags, _comp: Comp) -> Result<Outcome> {
        // A send is complete once it is in the peer's FIFO; only pending requests wait.
        let busy = self
            .inner
            .pending_eps
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .any(|e| e.has_pending());
        if busy {
            return Err(Status::NoResource.into());
        }
        Ok(Outcome::Done)
    }

    fn event_fd(&self) -> Result<RawFd> {
        Ok(self.inner.sock.as_raw_fd())
    }

    fn event_arm(&self, events: ArmEvents) -> Result<()> {
        let i = &*self.inner;
        // Before sleeping: a peer that died is reported by the next progress, not missed.
        if i.eps
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .any(|e| e.peer_gone())
        {
            i.check_countdown.set(1);
            i.next_check.set(Instant::now());
            return Err(Status::Busy.into());
        }
        if events.contains(ArmEvents::SEND_COMP)
            && i.pending_eps
                .borrow()
                .iter()
                .filter_map(Weak::upgrade)
                .any(|e| e.has_pending())
        {
            return Err(Status::Busy.into());
        }
        if events.intersects(ArmEvents::RECV | ArmEvents::RECV_SIG) {
            i.drain_socket();
            if !i.fifo.arm(i.read_index.get()) {
                return Err(Status::Busy.into());
            }
        }
        Ok(())
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<MmEp> {
        let name = self.inner.name;
        if !same_host(dev) {
            let msg = format!(
                "{name}: the peer is on another host (or in other namespaces): shared memory cannot reach it"
            );
            ucs::error!("{msg}");
            return Err(Error::new(Status::Unreachable, msg));
        }
        let Some(addr) = MmAddr::unpack(iface) else {
            let msg = format!("{name}: malformed interface address ({} bytes)", iface.len());
            ucs::error!("{msg}");
            return Err(Error::new(Status::InvalidAddr, msg));
        };
        let ep = EpInner::connect(&self.inner, addr).inspect_err(|e| ucs::error!("{e}"))?;
        self.inner.eps.borrow_mut().push(Rc::downgrade(&ep));
        Ok(MmEp { inner: ep })
    }
}
