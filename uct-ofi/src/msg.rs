//! Connection management of connected (`FI_EP_MSG`) devices: the passive endpoint peers connect
//! to (its address is the interface address), the EQ connection events arrive on, the endpoints
//! accepted from peers' requests (receive-only: the peer's uct endpoint sends on its side), and
//! the connecting/connected state of our own endpoints.
//!
//! The EQ is read when its wait fd is signalled (an fd handler on the worker's async context)
//! and, while one of our endpoints is connecting, every [`POLL_EVERY`] progress calls. Reading
//! an EQ is a system call on some providers (verbs reads the rdma_cm channel), so the progress
//! of an interface whose endpoints are connected never does it.
//!
//! A lost connection (`FI_SHUTDOWN`, or an error event) fails our endpoint through the error
//! handler; an accepted one is closed.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};
use uct_transport::worker_ref::{fd_events, AsyncId, WorkerRef};

use crate::ep::EpState;
use crate::ffi::{self, Cq, Endpoint, Eq, EqEvent, Info, PassiveEp};
use crate::iface::Shared;
use crate::md::MdInner;

/// Progress calls (a power of two) between EQ reads while an endpoint is connecting (or
/// always, when the EQ has no wait fd).
const POLL_EVERY: u32 = 8;
/// Events handled per EQ poll.
const EVENTS_PER_POLL: u32 = 64;

pub(crate) struct Msg {
    eq: Rc<Eq>,
    /// Closed before the accepted endpoints (field order): no new requests meanwhile.
    _pep: PassiveEp,
    accepted: RefCell<Vec<Endpoint>>,
    /// Our endpoints by fid (as EQ events name them).
    conns: RefCell<Vec<(usize, Weak<EpState>)>>,
    /// Our endpoints still connecting.
    connecting: Cell<usize>,
    /// The EQ has no wait fd (or it could not be watched): polled from progress all the time.
    always: Cell<bool>,
    tick: Cell<u32>,
    worker: WorkerRef,
    handler: Cell<Option<AsyncId>>,
    dev: String,
}

fn ioerr(dev: &str, what: &str, e: i32) -> Error {
    Error::new(
        Status::IoError,
        format!("ofi {dev}: {what} failed: {}", ffi::strerror(e as i64)),
    )
}

/// The status an endpoint fails with for an EQ error (positive libfabric error number).
fn status_of(err: i32) -> Status {
    match err {
        111 | 113 => Status::Unreachable, // ECONNREFUSED, EHOSTUNREACH
        110 => Status::EndpointTimeout,   // ETIMEDOUT
        _ => Status::ConnectionReset,
    }
}

impl Msg {
    /// The EQ, the shared receive context (on `cq`) and the listening passive endpoint; returns
    /// them with the address peers connect to.
    pub(crate) fn open(
        md: &Rc<MdInner>,
        cq: &Rc<Cq>,
        worker: WorkerRef,
    ) -> Result<(Msg, Rc<Endpoint>, Vec<u8>)> {
        let dev = md.name.as_str();
        let fabric = &md.domain.fabric;
        let eq = Eq::open(fabric, true)
            .or_else(|_| Eq::open(fabric, false))
            .map_err(|e| ioerr(dev, "fi_eq_open", e))?;
        let srx = Endpoint::srx(&md.domain, &md.info, cq).map_err(|e| {
            Error::new(
                Status::Unsupported,
                format!(
                    "ofi {dev}: no shared receive context (fi_srx_context: {}), which rucx's connected endpoints need: use the provider's RDM device",
                    ffi::strerror(e as i64)
                ),
            )
        })?;
        let pep =
            PassiveEp::listen(fabric, &md.info, &eq).map_err(|e| ioerr(dev, "fi_passive_ep/fi_listen", e))?;
        let name = pep.name().map_err(|e| ioerr(dev, "fi_getname", e))?;
        let msg = Msg {
            eq,
            _pep: pep,
            accepted: RefCell::new(Vec::new()),
            conns: RefCell::new(Vec::new()),
            connecting: Cell::new(0),
            always: Cell::new(false),
            tick: Cell::new(0),
            worker,
            handler: Cell::new(None),
            dev: dev.to_owned(),
        };
        Ok((msg, srx, name))
    }

    /// Reads the EQ whenever its wait fd is signalled (or from every few progress calls when it
    /// has none).
    pub(crate) fn watch(&self, s: &Rc<Shared>) {
        let Some(fd) = self.eq.wait_fd() else {
            ucs::debug!("ofi {}: the EQ has no wait fd: polled from progress", self.dev);
            self.always.set(true);
            return;
        };
        let weak = Rc::downgrade(s);
        let r = self.worker.fd_add(fd, fd_events::READ, move |_| {
            if let Some(s) = weak.upgrade() {
                if let Some(m) = &s.msg {
                    m.poll_armed(&s);
                }
            }
        });
        match r {
            Ok(id) => self.handler.set(Some(id)),
            Err(e) => {
                ucs::debug!(
                    "ofi {}: watching the EQ's fd failed ({e}): polled from progress",
                    self.dev
                );
                self.always.set(true);
            }
        }
    }

    /// Stops watching the EQ's fd (before the interface closes).
    pub(crate) fn unwatch(&self) {
        if let Some(id) = self.handler.take() {
            self.worker.handler_remove(id);
        }
    }

    /// Whether this progress call reads the EQ.
    #[inline]
    pub(crate) fn due(&self) -> bool {
        if self.connecting.get() == 0 && !self.always.get() {
            return false;
        }
        let t = self.tick.get().wrapping_add(1);
        self.tick.set(t);
        t & (POLL_EVERY - 1) == 0
    }

    /// Handles the events waiting on the EQ; returns how many.
    pub(crate) fn poll(&self, s: &Shared) -> u32 {
        let mut n = 0;
        while n < EVENTS_PER_POLL {
            let Some(ev) = self.eq.read() else { break };
            n += 1;
            match ev {
                EqEvent::ConnReq { info } => self.accept(s, info),
                EqEvent::Connected { fid } => {
                    if let Some(st) = self.conn(fid) {
                        self.connected(&st);
                    }
                }
                EqEvent::Shutdown { fid } => self.lost(s, fid, Status::ConnectionReset, "closed by the peer"),
                EqEvent::Error { fid, err, message } => self.lost(s, fid, status_of(err), &message),
                EqEvent::Other(_) => {}
            }
        }
        n
    }

    /// Handles the events waiting on the EQ, then re-arms its fd (`fi_trywait`, which some
    /// providers need to clear their signal) unless more wait.
    fn poll_armed(&self, s: &Shared) {
        for _ in 0..4 {
            self.poll(s);
            if s.md.domain.fabric.trywait_eq(&self.eq).is_ok() {
                return;
            }
        }
    }

    /// A peer's connection request: an endpoint from the request's info, on the interface's CQ
    /// and receive context, accepted. Anyone may connect (as to an RDM endpoint).
    fn accept(&self, s: &Shared, mut info: Info) {
        info.set_shared_rx();
        let r = Endpoint::open_msg(&s.md.domain, &info, &s.cq, &s.rx, &self.eq).and_then(|mut ep| {
            ep.accept()?;
            Ok(ep)
        });
        match r {
            Ok(ep) => self.accepted.borrow_mut().push(ep),
            Err(e) => ucs::warn!(
                "ofi {}: accepting a connection failed: {}",
                self.dev,
                ffi::strerror(e as i64)
            ),
        }
    }

    fn conn(&self, fid: usize) -> Option<Rc<EpState>> {
        self.conns
            .borrow()
            .iter()
            .find(|(f, _)| *f == fid)
            .and_then(|(_, w)| w.upgrade())
    }

    fn connected(&self, st: &EpState) {
        if st.connecting.replace(false) {
            self.connecting.set(self.connecting.get() - 1);
        }
    }

    /// The connection of endpoint `fid` is gone: an accepted one is closed, one of ours fails.
    fn lost(&self, s: &Shared, fid: usize, status: Status, why: &str) {
        let gone = {
            let mut a = self.accepted.borrow_mut();
            a.iter().position(|e| e.fid() == fid).map(|i| a.swap_remove(i))
        };
        if gone.is_some() {
            ucs::debug!("ofi {}: accepted connection closed ({why})", self.dev);
            return;
        }
        let Some(st) = self.conn(fid) else { return };
        self.connected(&st);
        ucs::debug!("ofi {}: connection lost ({why})", self.dev);
        st.fail(s, status);
    }

    /// Forgets a destroyed endpoint.
    pub(crate) fn forget(&self, st: &Rc<EpState>) {
        let me = Rc::downgrade(st);
        self.conns
            .borrow_mut()
            .retain(|(_, w)| w.strong_count() > 0 && !w.ptr_eq(&me));
        self.connected(st);
    }

    /// Closes the accepted endpoints (the interface is closing).
    pub(crate) fn close_all(&self) {
        self.accepted.borrow_mut().clear();
        self.conns.borrow_mut().clear();
    }
}

/// Opens an endpoint and starts connecting it to the passive endpoint at `iface`.
pub(crate) fn connect(s: &Rc<Shared>, iface: &[u8]) -> Result<Rc<EpState>> {
    let m = s
        .msg
        .as_ref()
        .expect("a connected device has connection management");
    let unreachable = |what: &str, e: i32| {
        Error::new(
            Status::Unreachable,
            format!(
                "ofi {}: {what} to the peer failed: {}",
                m.dev,
                ffi::strerror(e as i64)
            ),
        )
    };
    let info =
        s.md.info
            .for_connect(iface)
            .map_err(|e| unreachable("fi_dupinfo", e))?;
    let mut ep = Endpoint::open_msg(&s.md.domain, &info, &s.cq, &s.rx, &m.eq)
        .map_err(|e| unreachable("fi_endpoint", e))?;
    ep.connect(iface).map_err(|e| unreachable("fi_connect", e))?;
    let fid = ep.fid();
    let st = Rc::new(EpState::new(Rc::new(ep), ffi::ADDR_UNSPEC, true));
    m.conns.borrow_mut().push((fid, Rc::downgrade(&st)));
    m.connecting.set(m.connecting.get() + 1);
    Ok(st)
}
