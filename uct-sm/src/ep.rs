//! The posix/sysv endpoint: maps the peer interface's FIFO and writes messages into it.
//!
//! A send claims an element, fills it and publishes it; it is complete when it returns. A full
//! FIFO answers `NoResource` (pending requests then wait for the receiver to release elements,
//! dispatched from the interface's progress). The peer is checked on a slow timer: its process
//! gone (pidfd) or its interface closed fails the endpoint through the error handler.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb, PendingReq, PendingResult, PurgeCb};
use uct_transport::iov::{gather, total_len, Iov};
use uct_transport::traits::{EpHandle, TransportEp};
use uct_transport::types::{EpAttr, FlushFlags, AM_ID_MAX};

use crate::addr::MmAddr;
use crate::fifo::{Claim, Fifo};
use crate::iface::IfaceInner;
use crate::sys;

pub(crate) struct EpInner {
    iface: Rc<IfaceInner>,
    peer: Fifo,
    peer_pid: u32,
    /// The peer's exit turns this readable (`None` for a peer in this process).
    pidfd: Option<OwnedFd>,
    wake: SocketAddr,
    cached_tail: Cell<u64>,
    pending: RefCell<VecDeque<PendingReq>>,
    /// A pending request is running: its own sends may pass the queue.
    dispatching: Cell<bool>,
    failed: Cell<Option<Status>>,
    handle: Cell<usize>,
}

pub struct MmEp {
    pub(crate) inner: Rc<EpInner>,
}

#[cold]
fn bad_id(name: &str, id: u8) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("{name}: AM id {id} out of range 0..{}", AM_ID_MAX - 1),
    )
}

#[cold]
fn too_long(name: &str, len: usize, max: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!(
            "{name}: message of {len} bytes exceeds the peer's {max}-byte FIFO elements (RUCX_MM_SEG_SIZE)"
        ),
    )
}

impl EpInner {
    pub(crate) fn connect(iface: &Rc<IfaceInner>, addr: MmAddr) -> Result<Rc<EpInner>> {
        let name = iface.name;
        let len = usize::try_from(addr.seg_len).map_err(|_| Status::InvalidAddr)?;
        let map = (iface.attach)(addr.pid, addr.seg_id, len, addr.proc_link)
            .map_err(|e| e.context_with(format!("{name}: connecting to process {}", addr.pid)))?;
        let peer = Fifo::open(map, addr.nonce)
            .map_err(|e| e.context_with(format!("{name}: connecting to process {}", addr.pid)))?;
        let pidfd = if addr.pid == std::process::id() {
            None
        } else {
            match sys::pidfd_open(addr.pid) {
                Ok(fd) => Some(fd),
                Err(libc::ESRCH) => {
                    return Err(Error::new(
                        Status::Unreachable,
                        format!("{name}: process {} is gone", addr.pid),
                    ))
                }
                Err(_) => None,
            }
        };
        let wake = SocketAddr::from_abstract_name(addr.socket_name().as_bytes())
            .map_err(|e| Error::new(Status::InvalidAddr, format!("{name}: {e}")))?;
        Ok(Rc::new(EpInner {
            iface: iface.clone(),
            peer,
            peer_pid: addr.pid,
            pidfd,
            wake,
            cached_tail: Cell::new(0),
            pending: RefCell::new(VecDeque::new()),
            dispatching: Cell::new(false),
            failed: Cell::new(None),
            handle: Cell::new(0),
        }))
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    /// Claims an element for a message of `len` bytes, or says why not.
    #[inline]
    fn claim(&self, id: u8, len: usize) -> Result<Claim> {
        if let Some(st) = self.failed.get() {
            return Err(st.into());
        }
        if id >= AM_ID_MAX {
            return Err(bad_id(self.iface.name, id));
        }
        let cap = self.peer.payload_cap();
        if len > cap {
            return Err(too_long(self.iface.name, len, cap));
        }
        if !self.dispatching.get() && self.has_pending() {
            return Err(Status::NoResource.into());
        }
        self.peer
            .claim(&self.cached_tail)
            .ok_or_else(|| Status::NoResource.into())
    }

    #[inline]
    fn publish(&self, c: Claim, msg: Option<(u8, usize)>) {
        let armed = c.armed;
        self.peer.publish(c, msg);
        if armed {
            // The receiver sleeps on its socket; a lost wakeup datagram (full socket buffer)
            // means an earlier one is still unread there, which wakes it as well.
            let _ = self.iface.tx_sock.send_to_addr(&[0], &self.wake);
        }
    }

    /// Runs queued requests while the peer's FIFO has room; returns how many completed.
    pub(crate) fn dispatch(&self) -> u32 {
        let mut done = 0;
        while self.failed.get().is_none() && self.peer.has_room(&self.cached_tail) {
            let Some(req) = self.pending.borrow_mut().pop_front() else {
                break;
            };
            self.dispatching.set(true);
            let r = req.dispatch();
            self.dispatching.set(false);
            match r {
                PendingResult::Done => done += 1,
                PendingResult::InProgress | PendingResult::Stop => {
                    self.pending.borrow_mut().push_front(req);
                    break;
                }
            }
        }
        done
    }

    /// The peer's process exited or its interface closed (and this is not reported yet).
    pub(crate) fn peer_gone(&self) -> bool {
        self.failed.get().is_none()
            && (self.peer.is_closed()
                || match &self.pidfd {
                    Some(fd) => sys::pidfd_exited(fd),
                    None => self.peer_pid != std::process::id() && !sys::pid_alive(self.peer_pid),
                })
    }

    /// Fails the endpoint when its peer went away.
    pub(crate) fn check_peer(&self) {
        if self.peer_gone() {
            self.failed.set(Some(Status::ConnectionReset));
            ucs::debug!(
                "{}: peer process {} or its interface is gone",
                self.iface.name,
                self.peer_pid
            );
            self.iface.report(self.handle.get(), Status::ConnectionReset);
        }
    }
}

impl TransportEp for MmEp {
    fn on_created(&self, handle: EpHandle) {
        self.inner.handle.set(handle.0);
    }

    fn query(&self) -> EpAttr {
        EpAttr {
            peer_am_max: self.inner.peer.payload_cap(),
            connected: true,
        }
    }

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        let e = &*self.inner;
        let len = 8 + payload.len();
        let mut c = e.claim(id, len)?;
        let buf = e.peer.payload(&mut c);
        buf[..8].copy_from_slice(&header.to_le_bytes());
        buf[8..len].copy_from_slice(payload);
        e.publish(c, Some((id, len)));
        Ok(())
    }

    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        let e = &*self.inner;
        let len = total_len(iov);
        let mut c = e.claim(id, len)?;
        let n = gather(e.peer.payload(&mut c), iov);
        e.publish(c, Some((id, n)));
        Ok(())
    }

    #[inline]
    fn am_bcopy(&self, id: u8, pack: PackCb, _flags: u32) -> Result<usize> {
        let e = &*self.inner;
        let mut c = e.claim(id, 0)?;
        match pack.pack(e.peer.payload(&mut c)) {
            Ok(n) => {
                e.publish(c, Some((id, n)));
                Ok(n)
            }
            Err(err) => {
                // The element was claimed: publish it empty so the receiver moves past it.
                e.publish(c, None);
                Err(err)
            }
        }
    }

    fn pending_add(&self, req: PendingReq, _flags: u32) -> Result<()> {
        let e = &*self.inner;
        if let Some(st) = e.failed.get() {
            return Err(st.into());
        }
        if !e.has_pending() && e.peer.has_room(&e.cached_tail) {
            return Err(Status::Busy.into());
        }
        let first = !e.has_pending();
        e.pending.borrow_mut().push_back(req);
        if first {
            e.iface.pending_eps.borrow_mut().push(Rc::downgrade(&self.inner));
        }
        Ok(())
    }

    fn pending_purge(&self, purge: PurgeCb) {
        loop {
            let req = self.inner.pending.borrow_mut().pop_front();
            match req {
                Some(r) => purge.purge(r),
                None => break,
            }
        }
    }

    fn flush(&self, _flags: FlushFlags, _comp: Comp) -> Result<Outcome> {
        let e = &*self.inner;
        if let Some(st) = e.failed.get() {
            return Err(st.into());
        }
        if e.has_pending() {
            return Err(Status::NoResource.into());
        }
        Ok(Outcome::Done)
    }
}
