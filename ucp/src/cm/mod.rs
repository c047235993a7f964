//! The connection manager: a client reaches a server by its IP address and port, with no side
//! channel for the worker addresses (UCX's sockaddr connection establishment).
//!
//! A [`Listener`] accepts TCP connections on a thread of its own, which at once writes the
//! server's worker address (ANNOUNCE) and hands the connection to the worker. A client
//! ([`crate::Worker::connect_sockaddr`] or [`crate::Worker::connect_sockaddr_nb`]) connects
//! and reads that address from progress, creates its endpoint from it, and sends its own
//! address (REQUEST). The server's progress reads the REQUEST and gives the application a
//! [`ConnRequest`]; accepting it creates the server's endpoint and answers ACCEPT, upon which
//! the client starts the ordinary wireup exchange over the transports, with a connection
//! number both sides derive from the client's connection id: the client's wireup REQUEST pairs
//! with the server's endpoint, so each side ends with one endpoint. The TCP connection closes
//! after the answer.
//!
//! `connect_sockaddr_nb`'s request completes once the endpoint is connected;
//! `connect_sockaddr` hands out a handle at once that keeps the operations issued before then
//! (`crate::ep::connecting`). A client's handshake is bounded by `RUCX_CM_TIMEOUT` (from the
//! call until the endpoint is wired): past it the endpoint fails with `TimedOut`, through its
//! error handler like any failure; a timer on the async context ticks while a handshake runs,
//! so a sleeping worker notices too.
//!
//! The listener thread announces the server's address even while the server's own thread is
//! not progressing, so a client's handshake does not wait for the server's next `progress`
//! before it can choose its lanes. Everything else runs from the worker's progress, on sockets
//! its async context watches: an idle progress costs one atomic load once the connection
//! manager was used, nothing before.

mod client;
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

use ucs::async_ctx::{AsyncContext, Events, HandlerId};
use ucs::{Error, Result, Status};

pub use listener::{ConnRequest, Listener, ListenerParams};

use client::{announced, connect, connect_nb, tcp_connected, write_some, Start, Watch};

use crate::address::WorkerAddress;
use crate::ep::{EpInner, EpParams, ErrMode, Wired};
use crate::request::{request_on, Completer};
use crate::worker::WorkerInner;
use crate::{Ep, Request, Worker};
use sock::{io_error, Watched};
use wire::{Kind, Msg, Reader, CONN_SN_BIT, FLAG_ERR_PEER};

/// Clients whose REQUEST is still being read, at most; a new one beyond drops the oldest (a
/// client that connects and never speaks holds a socket only until then).
const MAX_INCOMING: usize = 256;

/// A connection in its handshake.
enum Side {
    /// Server: the client's REQUEST is being read.
    Incoming { listener: Weak<listener::Inner> },
    /// Client of `connect_sockaddr_nb`: the TCP connection is being made (until `connected`),
    /// then the server's address (ANNOUNCE) is read.
    Starting { start: Box<Start>, connected: bool },
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
    /// What is still to be written (a client's REQUEST the socket did not take at once).
    out: Vec<u8>,
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
    /// Client endpoints in their handshake.
    watches: RefCell<Vec<Watch>>,
    next_conn: Cell<u64>,
    actx: AsyncContext,
    /// Ticks (sets `any`) while a client handshake runs, for its deadline.
    tick: Cell<Option<HandlerId>>,
    timeout: Duration,
}

impl Drop for Cm {
    fn drop(&mut self) {
        if let Some(id) = self.tick.take() {
            let _ = self.actx.remove_handler(id, false);
        }
    }
}

/// Makes the next progress look at `w`'s connection manager (an endpoint it watches was
/// wired or failed).
pub(crate) fn poke(w: &WorkerInner) {
    if let Ok(c) = w.cm.try_borrow() {
        if let Some(c) = &*c {
            c.any.store(true, Ordering::Release);
        }
    }
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
        watches: RefCell::new(Vec::new()),
        next_conn: Cell::new(1),
        actx: w.uct.async_context().clone(),
        tick: Cell::new(None),
        timeout: w.ctx.inner.cfg.cm_timeout,
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
        let now = Instant::now();
        for mut c in conns {
            if let Side::Starting { start, connected } = &c.side {
                if now >= start.deadline {
                    let what = if *connected {
                        "no worker address from the server"
                    } else {
                        "no TCP connection (the host does not answer)"
                    };
                    let e = Error::new(
                        Status::TimedOut,
                        format!(
                            "ucp: connect to {}: {what} in {:?} (RUCX_CM_TIMEOUT)",
                            c.peer, self.timeout
                        ),
                    );
                    done.push(Done::Failed(c, e));
                    continue;
                }
            }
            // A client whose endpoint failed (timed out, closed) or went: the connection ends.
            if let Side::Outgoing { ep, .. } = &c.side {
                if ep
                    .upgrade()
                    .is_none_or(|e| !matches!(e.wired.get(), Wired::WaitingForPeer))
                {
                    continue;
                }
            }
            if c.sock.take_events().is_empty() {
                keep.push(c);
                continue;
            }
            if let Side::Starting { connected, .. } = &mut c.side {
                if !*connected {
                    match tcp_connected(&c.sock, c.peer) {
                        Ok(false) => {
                            keep.push(c);
                            continue;
                        }
                        Ok(true) => *connected = true,
                        Err(e) => {
                            done.push(Done::Failed(c, e));
                            continue;
                        }
                    }
                }
            }
            if !c.out.is_empty() {
                match write_some(&c.sock.sock, c.peer, &c.out) {
                    Ok(n) => {
                        c.out.drain(..n);
                        if c.out.is_empty() {
                            c.out = Vec::new();
                            if let Err(e) = c.sock.set_interest(Events::READ) {
                                done.push(Done::Failed(c, e));
                                continue;
                            }
                        }
                    }
                    Err(e) => {
                        done.push(Done::Failed(c, e));
                        continue;
                    }
                }
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
        n += self.check_watches(now);
        self.update_tick();
        n
    }

    /// Adds a handshake connection; what it already received is read on the next progress.
    fn add_conn(&self, stream: TcpStream, peer: SocketAddr, side: Side) {
        if let Err(e) = self.try_add_conn(stream, peer, side) {
            ucs::warn!("{e}: connection dropped");
        }
    }

    fn try_add_conn(&self, stream: TcpStream, peer: SocketAddr, side: Side) -> Result<()> {
        let interest = match &side {
            Side::Starting { connected: false, .. } => Events::WRITE,
            _ => Events::READ,
        };
        stream
            .set_nonblocking(true)
            .map_err(|e| io_error(peer, "connection manager:", &e))?;
        let sock = Watched::new(&self.actx, stream, interest, &self.any)?;
        // Borrowed in a block: update_tick looks at the connections too.
        {
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
                out: Vec::new(),
            });
        }
        self.update_tick();
        Ok(())
    }

    fn finish(&self, d: Done) {
        match d {
            Done::Failed(c, e) => match c.side {
                Side::Incoming { .. } => {
                    ucs::warn_limited!(
                        "ucp: connection manager: client {}: {e}: connection dropped",
                        c.peer
                    )
                }
                Side::Starting { start, .. } => start.done.complete(Err(e)),
                Side::Outgoing { ep, .. } => {
                    if let Some(ep) = ep.upgrade() {
                        ep.fail(e.context_with(format_args!(
                            "ucp: connect to {}: before the server accepted",
                            c.peer
                        )));
                    }
                }
            },
            Done::Msg(
                Conn {
                    sock,
                    peer,
                    side: Side::Starting { start, .. },
                    ..
                },
                m,
            ) => {
                let Start {
                    params,
                    done,
                    deadline,
                } = *start;
                let mut out = Vec::new();
                let r = self.worker.upgrade().map_or_else(
                    || {
                        Err(Error::new(
                            Status::NotConnected,
                            "ucp: connect: the worker is gone",
                        ))
                    },
                    |w| {
                        let remote = announced(peer, &m)?;
                        let (ep, conn_id, req) = self.client_ep(&w, remote, params)?;
                        let sent = write_some(&sock.sock, peer, &req)?;
                        if sent < req.len() {
                            out = req[sent..].to_vec();
                            sock.set_interest(Events::READ | Events::WRITE)?;
                        }
                        Ok((ep, conn_id))
                    },
                );
                match r {
                    Ok((ep, conn_id)) => {
                        self.conns.borrow_mut().push(Conn {
                            sock,
                            peer,
                            reader: Reader::default(),
                            side: Side::Outgoing {
                                ep: Rc::downgrade(&ep),
                                conn_id,
                                server: m.worker,
                            },
                            out,
                        });
                        self.watch(&ep, peer, Some(done), deadline);
                    }
                    Err(e) => done.complete(Err(e)),
                }
            }
            Done::Msg(c, m) => match &c.side {
                Side::Incoming { listener } => match self.conn_request(&c, m) {
                    Ok(req) => match listener.upgrade() {
                        Some(l) => l.deliver(req),
                        // The listener is gone: the request drops, which rejects it.
                        None => drop(req),
                    },
                    Err(e) => ucs::warn_limited!(
                        "ucp: connection manager: client {}: {e}: connection dropped",
                        c.peer
                    ),
                },
                // Taken by the arm above.
                Side::Starting { .. } => {}
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
    /// exchanged out of band; returns at once (as UCX's `ucp_ep_create` with a socket
    /// address). The TCP connection, the server's address, its acceptance and the wireup
    /// advance from `progress`. Operations issued before the endpoint is connected wait, in
    /// order, and run once it is (sends, `stream_recv`, `flush`, `close`); until then
    /// [`Ep::is_connected`] is false, [`Ep::remote_id`] 0, and what needs the lanes now
    /// ([`Ep::rkey_unpack`], put/get/atomics) fails with `NotConnected`.
    ///
    /// Errors at once only for what fails in the call (no socket); later, from `progress`, the
    /// endpoint fails (its error handler runs, the waiting operations complete with the error)
    /// with `Unreachable` when nothing listens at `addr`, `Rejected` when the server rejects
    /// it, `TimedOut` when it is not connected within `RUCX_CM_TIMEOUT` (10 s by default) of
    /// the call. [`Worker::connect_sockaddr_nb`] is the awaitable form.
    ///
    /// ```
    /// use ucp::{AmFlags, Context, EpParams, Issued, ListenerParams, Worker};
    ///
    /// let uct = uct::Context::builder().builtin(uct_tcp::module()).plugins(false).build();
    /// let ctx = Context::builder(uct).config("NET_DEVICES", "lo").build()?;
    /// let (server, client) = (Worker::new(&ctx)?, Worker::new(&ctx)?);
    /// let listener = server.listen("127.0.0.1:0".parse().unwrap(), ListenerParams::new())?;
    /// let ep = client.connect_sockaddr(listener.local_addr(), EpParams::new())?;
    /// // Not connected yet: the send waits in the endpoint.
    /// let Issued::Pending(mut sent) = ep.am_send(1, &[], b"early", AmFlags::default())? else {
    ///     unreachable!("the server has not accepted")
    /// };
    /// let _server_ep = loop {
    ///     client.progress();
    ///     server.progress();
    ///     if let Some(req) = listener.accept() {
    ///         break req.accept(EpParams::new())?;
    ///     }
    /// };
    /// while !sent.is_done() {
    ///     client.progress();
    ///     server.progress();
    /// }
    /// sent.take().unwrap()?;
    /// assert!(ep.is_connected());
    /// # Ok::<(), ucp::Error>(())
    /// ```
    pub fn connect_sockaddr(&self, addr: SocketAddr, params: EpParams) -> Result<Ep> {
        connect(&self.inner, addr, params)
    }

    /// [`Worker::connect_sockaddr`] without blocking: returns at once, the TCP connection and
    /// the whole handshake advance from `progress`, and the request completes with the
    /// endpoint once it is connected (the server accepted, the lanes are wired), or with the
    /// error: `Unreachable` (refused), `Rejected`, `TimedOut` (not connected within
    /// `RUCX_CM_TIMEOUT`), `ConnectionReset`... The error handler in `params` runs too for a
    /// failure after the server's address arrived. The request is a future (an async task
    /// awaits it while `ucp::tokio::AsyncWorker::run` or a loop of `progress` drives the
    /// worker); `wait(&worker)` blocks until it completes.
    ///
    /// ```no_run
    /// # fn f(worker: &ucp::Worker, addr: std::net::SocketAddr) -> ucp::Result<()> {
    /// let ep = worker.connect_sockaddr_nb(addr, ucp::EpParams::new())?.wait(worker)?;
    /// assert!(ep.is_connected());
    /// # Ok(()) }
    /// ```
    pub fn connect_sockaddr_nb(&self, addr: SocketAddr, params: EpParams) -> Result<Request<Ep>> {
        connect_nb(&self.inner, addr, params)
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
