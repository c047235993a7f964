//! The connection manager: a client reaches a server by its IP address and port, with no side
//! channel for the worker addresses (UCX's sockaddr connection establishment).
//!
//! A [`Listener`] accepts TCP connections on a thread of its own, which at once writes the
//! server's worker address (ANNOUNCE) and hands the connection to the worker. A client's
//! [`crate::Worker::connect_sockaddr`] reads that address, creates its endpoint from it (so the
//! endpoint is usable at once; its sends wait), and sends its own address (REQUEST). The
//! server's progress reads the REQUEST and gives the application a [`ConnRequest`]; accepting
//! it creates the server's endpoint and answers ACCEPT, upon which the client starts the
//! ordinary wireup exchange over the transports, with a connection number both sides derive
//! from the client's connection id: the client's wireup REQUEST pairs with the server's
//! endpoint, so each side ends with one endpoint. The TCP connection closes after the answer.
//!
//! The listener thread exists because the client needs the server's address before
//! `connect_sockaddr` returns, even while the server's thread is not progressing. Everything
//! else runs from the worker's progress, on sockets its async context watches: an idle
//! progress costs one atomic load once the connection manager was used, nothing before.

mod listener;
mod sock;
pub(crate) mod wire;

use std::cell::{Cell, RefCell};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ucs::async_ctx::Events;
use ucs::{Error, Result, Status};

pub use listener::{ConnRequest, Listener, ListenerParams};

use crate::address::WorkerAddress;
use crate::ep::{EpInner, EpParams, ErrMode, Wired};
use crate::worker::WorkerInner;
use crate::{Ep, Worker};
use sock::{io_error, Watched};
use wire::{Kind, Msg, Reader, CONN_SN_BIT, FLAG_ERR_PEER};

/// Clients whose REQUEST is still being read, at most; a new one beyond drops the oldest (a
/// client that connects and never speaks holds a socket only until then).
const MAX_INCOMING: usize = 256;

/// A connection in its handshake.
enum Side {
    /// Server: the client's REQUEST is being read.
    Incoming { listener: Weak<listener::Inner> },
    /// Client: the server's ACCEPT or REJECT is awaited.
    Outgoing {
        ep: Weak<EpInner>,
        conn_id: u64,
        server: u64,
    },
}

struct Conn {
    sock: Watched<TcpStream>,
    peer: SocketAddr,
    reader: Reader,
    side: Side,
}

/// A connection whose handshake ended (acted on with no borrow of the manager held).
enum Done {
    Msg(Conn, Msg),
    Failed(Conn, Error),
}

/// A worker's connection manager, made on first use.
pub(crate) struct Cm {
    worker: Weak<WorkerInner>,
    /// Set by the sockets' async handlers and the listener threads: something to look at.
    any: Arc<AtomicBool>,
    conns: RefCell<Vec<Conn>>,
    listeners: RefCell<Vec<Weak<listener::Inner>>>,
    next_conn: Cell<u64>,
}

/// The connection manager of `w` (created, with its progress callback, on first use).
fn cm(w: &Rc<WorkerInner>) -> Rc<Cm> {
    if let Some(c) = &*w.cm.borrow() {
        return c.clone();
    }
    let c = Rc::new(Cm {
        worker: Rc::downgrade(w),
        any: Arc::new(AtomicBool::new(false)),
        conns: RefCell::new(Vec::new()),
        listeners: RefCell::new(Vec::new()),
        next_conn: Cell::new(1),
    });
    let weak = Rc::downgrade(&c);
    w.uct
        .progress_register(move || weak.upgrade().map_or(0, |c| c.progress()));
    *w.cm.borrow_mut() = Some(c.clone());
    c
}

impl Cm {
    #[inline]
    fn progress(&self) -> u32 {
        if !self.any.load(Ordering::Acquire) {
            return 0;
        }
        self.any.store(false, Ordering::Relaxed);
        self.progress_slow()
    }

    #[cold]
    fn progress_slow(&self) -> u32 {
        let mut n = 0;
        // Connections the listener threads accepted.
        let listeners: Vec<_> = self.listeners.borrow().iter().filter_map(Weak::upgrade).collect();
        self.listeners.borrow_mut().retain(|l| l.strong_count() > 0);
        for l in &listeners {
            while let Some((stream, peer)) = l.take_accepted() {
                n += 1;
                self.add_conn(
                    stream,
                    peer,
                    Side::Incoming {
                        listener: Rc::downgrade(l),
                    },
                );
            }
        }
        // Sockets with events: read them; act on the finished ones with nothing borrowed.
        let conns = std::mem::take(&mut *self.conns.borrow_mut());
        let mut keep = Vec::with_capacity(conns.len());
        let mut done = Vec::new();
        for mut c in conns {
            if c.sock.take_events().is_empty() {
                keep.push(c);
                continue;
            }
            match read_msg(&mut c) {
                Ok(None) => keep.push(c),
                Ok(Some(m)) => done.push(Done::Msg(c, m)),
                Err(e) => done.push(Done::Failed(c, e)),
            }
        }
        self.conns.borrow_mut().extend(keep);
        for d in done {
            n += 1;
            self.finish(d);
        }
        n
    }

    /// Adds a handshake connection; what it already received is read on the next progress.
    fn add_conn(&self, stream: TcpStream, peer: SocketAddr, side: Side) {
        let Some(w) = self.worker.upgrade() else { return };
        if let Err(e) = stream.set_nonblocking(true) {
            ucs::warn!("ucp: connection manager: {peer}: {e}: connection dropped");
            return;
        }
        match Watched::new(w.uct.async_context(), stream, Events::READ, &self.any) {
            Ok(sock) => {
                sock.poke();
                self.any.store(true, Ordering::Release);
                let mut conns = self.conns.borrow_mut();
                let incoming = |c: &Conn| incoming_side(&c.side);
                if incoming_side(&side) && conns.iter().filter(|c| incoming(c)).count() >= MAX_INCOMING {
                    if let Some(i) = conns.iter().position(incoming) {
                        let old = conns.remove(i);
                        ucs::warn!(
                            "ucp: connection manager: client {}: no REQUEST while {MAX_INCOMING} \
                             others waited: connection dropped",
                            old.peer
                        );
                    }
                }
                conns.push(Conn {
                    sock,
                    peer,
                    reader: Reader::default(),
                    side,
                });
            }
            Err(e) => ucs::warn!("ucp: connection manager: {peer}: {e}: connection dropped"),
        }
    }

    fn finish(&self, d: Done) {
        match d {
            Done::Failed(c, e) => match c.side {
                Side::Incoming { .. } => {
                    ucs::warn!(
                        "ucp: connection manager: client {}: {e}: connection dropped",
                        c.peer
                    )
                }
                Side::Outgoing { ep, .. } => {
                    if let Some(ep) = ep.upgrade() {
                        ep.fail(e.context_with(format_args!(
                            "ucp: connect to {}: before the server accepted",
                            c.peer
                        )));
                    }
                }
            },
            Done::Msg(c, m) => match &c.side {
                Side::Incoming { listener } => match self.conn_request(&c, m) {
                    Ok(req) => match listener.upgrade() {
                        Some(l) => l.deliver(req),
                        // The listener is gone: the request drops, which rejects it.
                        None => drop(req),
                    },
                    Err(e) => ucs::warn!(
                        "ucp: connection manager: client {}: {e}: connection dropped",
                        c.peer
                    ),
                },
                Side::Outgoing { ep, conn_id, server } => {
                    let Some(ep) = ep.upgrade() else { return };
                    let r = match m.kind {
                        _ if m.conn_id != *conn_id || m.worker != *server => Err(Error::new(
                            Status::InvalidParam,
                            format!(
                                "ucp: connect to {}: the answer names connection {:#x} of worker {:#x}, \
                                 not ours ({conn_id:#x} to {server:#x})",
                                c.peer, m.conn_id, m.worker
                            ),
                        )),
                        Kind::Accept => crate::wireup::send_request(&ep),
                        Kind::Reject => Err(Error::new(
                            Status::Rejected,
                            format!("ucp: connect to {}: the server rejected the connection", c.peer),
                        )),
                        k => Err(Error::new(
                            Status::InvalidParam,
                            format!("ucp: connect to {}: {k:?} where ACCEPT or REJECT was due", c.peer),
                        )),
                    };
                    if let Err(e) = r {
                        if e.status() != Status::Rejected {
                            ucs::warn!("{e}");
                        }
                        ep.fail(e);
                    }
                }
            },
        }
    }

    /// The application's view of a client's REQUEST.
    fn conn_request(&self, c: &Conn, m: Msg) -> Result<ConnRequest> {
        if m.kind != Kind::Request {
            return Err(Error::new(
                Status::InvalidParam,
                format!("ucp: connection manager: {:?} where a REQUEST was due", m.kind),
            ));
        }
        let remote = WorkerAddress::unpack(&m.address)
            .map_err(|e| e.context_with("ucp: connection manager: the client's address"))?;
        if remote.uuid != m.worker {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: connection manager: the REQUEST of worker {:#x} carries the address of worker {:#x}",
                    m.worker, remote.uuid
                ),
            ));
        }
        let stream = c
            .sock
            .sock
            .try_clone()
            .map_err(|e| io_error(c.peer, "connection manager: keeping the connection with", &e))?;
        Ok(ConnRequest::new(
            self.worker.clone(),
            stream,
            c.peer,
            remote,
            m.conn_id,
            m.ep,
            m.flags,
        ))
    }
}

/// [`Worker::connect_sockaddr`]: the server's address is read here (bounded by
/// `RUCX_CM_TIMEOUT`); the rest of the handshake runs from progress.
fn connect(w: &Rc<WorkerInner>, to: SocketAddr, params: EpParams) -> Result<Ep> {
    let timeout = w.ctx.inner.cfg.cm_timeout;
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&to, timeout).map_err(|e| io_error(to, "connect to", &e))?;
    let _ = s.set_nodelay(true);
    let mut r = Reader::default();
    let mut buf = vec![0u8; 64 * 1024];
    let announce = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(
                Status::TimedOut,
                format!(
                    "ucp: connect to {to}: no worker address from the server in {timeout:?} \
                     (RUCX_CM_TIMEOUT)"
                ),
            ));
        }
        s.set_read_timeout(Some(left))
            .map_err(|e| io_error(to, "connect to", &e))?;
        let want = r.want().min(buf.len());
        match s.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(Error::new(
                    Status::ConnectionReset,
                    format!(
                        "ucp: connect to {to}: the server closed the connection after {} bytes \
                         (is it a rucx listener?)",
                        r.received()
                    ),
                ))
            }
            Ok(n) => {
                if let Some(m) = r
                    .push(&buf[..n])
                    .map_err(|e| e.context_with(format_args!("ucp: connect to {to}")))?
                {
                    break m;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(to, "connect to", &e)),
        }
    };
    let bad = |why: String| Error::new(Status::InvalidParam, format!("ucp: connect to {to}: {why}"));
    if announce.kind != Kind::Announce {
        return Err(bad(format!(
            "{:?} where the server's address was due",
            announce.kind
        )));
    }
    let remote = WorkerAddress::unpack(&announce.address)
        .map_err(|e| e.context_with(format_args!("ucp: connect to {to}: the server's address")))?;
    if remote.uuid != announce.worker {
        return Err(bad(format!(
            "worker {:#x} announced the address of worker {:#x}",
            announce.worker, remote.uuid
        )));
    }
    let cm = cm(w);
    let conn_id = cm.next_conn.get();
    cm.next_conn.set(conn_id + 1);
    let server = remote.uuid;
    let ep = crate::ep::create(w, remote, conn_id | CONN_SN_BIT, None, params.err_mode)?;
    *ep.err_handler.borrow_mut() = params.on_error;
    // Sends wait for the server's ACCEPT and the wireup that follows it.
    ep.wired.set(Wired::WaitingForPeer);
    let req = Msg {
        kind: Kind::Request,
        flags: if params.err_mode == ErrMode::Peer {
            FLAG_ERR_PEER
        } else {
            0
        },
        worker: w.uuid,
        conn_id,
        ep: ep.id.get(),
        address: w.address.clone(),
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))
        .and_then(|()| s.write_all(&req.encode()))
        .map_err(|e| io_error(to, "connect to", &e))?;
    cm.add_conn(
        s,
        to,
        Side::Outgoing {
            ep: Rc::downgrade(&ep),
            conn_id,
            server,
        },
    );
    Ok(Ep { inner: ep })
}

impl Worker {
    /// Listens for [`Worker::connect_sockaddr`] clients on `addr` (port 0: one the system
    /// picks; see [`Listener::local_addr`]). Each client's connection request reaches the
    /// application from `progress`, through the handler in `params` or [`Listener::accept`].
    pub fn listen(&self, addr: SocketAddr, params: ListenerParams) -> Result<Listener> {
        let c = cm(&self.inner);
        let l = listener::start(&self.inner, addr, params, &c.any)?;
        c.listeners.borrow_mut().push(Rc::downgrade(&l.inner));
        Ok(l)
    }

    /// An endpoint to the worker listening at `addr` ([`Worker::listen`]), with no address
    /// exchanged out of band. Connects and reads the server's worker address (waiting at most
    /// 10 seconds), then returns: the endpoint is usable at once, its sends wait until the
    /// server accepted and the lanes are wired. A rejection fails the endpoint with
    /// `Rejected` (its error handler runs from `progress`).
    pub fn connect_sockaddr(&self, addr: SocketAddr, params: EpParams) -> Result<Ep> {
        connect(&self.inner, addr, params)
    }
}

fn incoming_side(s: &Side) -> bool {
    matches!(s, Side::Incoming { .. })
}

/// Reads what `c` has: its message once complete.
fn read_msg(c: &mut Conn) -> Result<Option<Msg>> {
    let mut buf = [0u8; 4096];
    loop {
        let want = c.reader.want().min(buf.len());
        match c.sock.sock.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(Error::new(
                    Status::ConnectionReset,
                    format!(
                        "ucp: connection manager: {} closed the connection after {} bytes of a message",
                        c.peer,
                        c.reader.received()
                    ),
                ))
            }
            Ok(n) => {
                if let Some(m) = c.reader.push(&buf[..n])? {
                    return Ok(Some(m));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(c.peer, "connection manager: reading from", &e)),
        }
    }
}
