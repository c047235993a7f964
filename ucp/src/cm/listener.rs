//! The server side: a [`Listener`] (its accepting thread) and the [`ConnRequest`]s it yields.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use ucs::{Error, Result, Status};

use super::sock::io_error;
use super::wire::{Kind, Msg, CONN_SN_BIT, FLAG_ERR_PEER};
use crate::address::WorkerAddress;
use crate::ep::{EpParams, ErrMode};
use crate::worker::WorkerInner;
use crate::Ep;

/// How long the accepting thread waits to hand a client the server's address.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(2);

type ConnHandler = Box<dyn FnMut(ConnRequest)>;

/// Parameters of [`crate::Worker::listen`].
#[derive(Default)]
pub struct ListenerParams {
    handler: Option<ConnHandler>,
}

impl ListenerParams {
    /// Parameters without a connection handler: clients' requests wait for
    /// [`Listener::accept`] (add one with [`ListenerParams::on_conn_request`]).
    pub fn new() -> ListenerParams {
        ListenerParams::default()
    }

    /// Called from `progress` with each client's request (to accept or reject); without one,
    /// requests wait for [`Listener::accept`] or [`Listener::next_request`].
    pub fn on_conn_request(mut self, f: impl FnMut(ConnRequest) + 'static) -> ListenerParams {
        self.handler = Some(Box::new(f));
        self
    }
}

impl std::fmt::Debug for ListenerParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ListenerParams(handler: {})", self.handler.is_some())
    }
}

pub(crate) struct Inner {
    addr: SocketAddr,
    accepted: mpsc::Receiver<(TcpStream, SocketAddr)>,
    handler: RefCell<Option<ConnHandler>>,
    queue: RefCell<VecDeque<ConnRequest>>,
    /// Tasks awaiting [`Listener::next_request`].
    wakers: RefCell<Vec<Waker>>,
    stop: Arc<AtomicBool>,
    thread: RefCell<Option<JoinHandle<()>>>,
}

impl Inner {
    /// A connection the thread accepted, if any (no system call).
    pub fn take_accepted(&self) -> Option<(TcpStream, SocketAddr)> {
        self.accepted.try_recv().ok()
    }

    /// Hands a client's request to the application.
    pub fn deliver(&self, req: ConnRequest) {
        let h = self.handler.borrow_mut().take();
        match h {
            Some(mut h) => {
                h(req);
                let mut slot = self.handler.borrow_mut();
                if slot.is_none() {
                    *slot = Some(h);
                }
            }
            None => {
                self.queue.borrow_mut().push_back(req);
                let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
                for w in wakers {
                    w.wake();
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let Some(t) = self.thread.borrow_mut().take() else {
            return;
        };
        // Wakes the thread from accept(); when that fails it ends at its next connection.
        let wake = match self.addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => SocketAddr::from((Ipv4Addr::LOCALHOST, a.port())),
            SocketAddr::V6(a) if a.ip().is_unspecified() => SocketAddr::from((Ipv6Addr::LOCALHOST, a.port())),
            a => a,
        };
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            let _ = t.join();
        }
    }
}

/// A socket address clients reach this worker at ([`crate::Worker::listen`]). Dropping it
/// stops listening; requests not yet accepted are rejected.
///
/// Clients call [`Worker::connect_sockaddr`](crate::Worker::connect_sockaddr): no worker
/// address travels out of band. Each client's [`ConnRequest`] reaches the server from its
/// `progress`, in the handler of [`ListenerParams::on_conn_request`] or from
/// [`Listener::accept`]; accepting gives the server's endpoint to that client, rejecting fails
/// the client's endpoint with `Rejected`.
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// use ucp::{AmFlags, Context, EpParams, ListenerParams, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_tcp::module()).plugins(false).build();
/// let ctx = ucp::Context::builder(uct).config("NET_DEVICES", "lo").build()?;
/// let (server, client) = (Worker::new(&ctx)?, Worker::new(&ctx)?);
///
/// // Accept every client, keeping its endpoint.
/// let clients = Rc::new(RefCell::new(Vec::new()));
/// let c = clients.clone();
/// let params = ListenerParams::new().on_conn_request(move |req| {
///     assert!(req.client_addr().ip().is_loopback());
///     c.borrow_mut().push(req.accept(EpParams::new()).expect("accepted"));
/// });
/// // Port 0: the system picks one; clients learn it from the application.
/// let listener = server.listen("127.0.0.1:0".parse().unwrap(), params)?;
///
/// let got = Rc::new(RefCell::new(None));
/// let g = got.clone();
/// server.set_am_handler(1, move |m| *g.borrow_mut() = Some(m.data().to_vec()))?;
/// let ep = client.connect_sockaddr(listener.local_addr(), EpParams::new())?;
/// let _sent = ep.am_send(1, &[], b"over a socket address", AmFlags::default())?;
/// while got.borrow().is_none() {
///     client.progress();
///     server.progress();
/// }
/// assert_eq!(clients.borrow().len(), 1);
/// # Ok::<(), ucp::Error>(())
/// ```
pub struct Listener {
    pub(crate) inner: Rc<Inner>,
}

impl Listener {
    /// The address it listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The next client's request, if one arrived (from `progress`) and no handler was given.
    pub fn accept(&self) -> Option<ConnRequest> {
        self.inner.queue.borrow_mut().pop_front()
    }

    /// The next client's request, awaited: the asynchronous [`Listener::accept`], woken from
    /// the worker's `progress` (a task such as `ucp::tokio::AsyncWorker::run` must drive
    /// it). Waits for as long as no client comes; `InvalidParam` when the listener has an
    /// [`ListenerParams::on_conn_request`] handler (that gets every request instead).
    ///
    /// ```no_run
    /// # async fn serve(worker: ucp::Worker) -> ucp::Result<()> {
    /// let listener = worker.listen("0.0.0.0:13337".parse().unwrap(), ucp::ListenerParams::new())?;
    /// let mut clients = Vec::new();
    /// loop {
    ///     let req = listener.next_request().await?;
    ///     let mode = req.err_mode();
    ///     clients.push(req.accept(ucp::EpParams::new().err_mode(mode))?);
    /// }
    /// # }
    /// ```
    pub async fn next_request(&self) -> Result<ConnRequest> {
        std::future::poll_fn(|cx| {
            if let Some(r) = self.accept() {
                return Poll::Ready(Ok(r));
            }
            if self.inner.handler.borrow().is_some() {
                return Poll::Ready(Err(Error::new(
                    Status::InvalidParam,
                    format!(
                        "ucp: listener on {}: next_request with an on_conn_request handler \
                         (the handler gets every request)",
                        self.inner.addr
                    ),
                )));
            }
            let mut wakers = self.inner.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ucp::Listener({})", self.inner.addr)
    }
}

/// Binds `addr` and starts the thread that accepts and announces the worker's address.
pub(crate) fn start(
    w: &Rc<WorkerInner>,
    addr: SocketAddr,
    params: ListenerParams,
    any: &Arc<AtomicBool>,
) -> Result<Listener> {
    let l = TcpListener::bind(addr).map_err(|e| {
        let mut err = io_error(addr, "listen on", &e);
        if e.kind() == std::io::ErrorKind::AddrInUse {
            err = Error::new(
                Status::Busy,
                format!("ucp: listen on {addr}: the address is in use"),
            );
        }
        err
    })?;
    let local = l.local_addr().map_err(|e| io_error(addr, "listen on", &e))?;
    let announce = Msg {
        kind: Kind::Announce,
        flags: 0,
        worker: w.uuid,
        conn_id: 0,
        ep: 0,
        address: w.address.clone(),
    }
    .encode();
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let (st, any) = (stop.clone(), any.clone());
    // Wakes a worker sleeping on its event fd (Features::WAKEUP) for a new client.
    let waker = crate::Worker { inner: w.clone() }.waker().ok();
    let thread = std::thread::Builder::new()
        .name(format!("ucp-listen-{}", local.port()))
        .spawn(move || accept_loop(l, &announce, &tx, &st, &any, waker.as_ref()))
        .map_err(|e| {
            Error::new(
                Status::NoResource,
                format!("ucp: listen on {addr}: a thread: {e}"),
            )
        })?;
    ucs::debug!("ucp: listening on {local}");
    Ok(Listener {
        inner: Rc::new(Inner {
            addr: local,
            accepted: rx,
            handler: RefCell::new(params.handler),
            queue: RefCell::new(VecDeque::new()),
            wakers: RefCell::new(Vec::new()),
            stop,
            thread: RefCell::new(Some(thread)),
        }),
    })
}

fn accept_loop(
    l: TcpListener,
    announce: &[u8],
    tx: &mpsc::Sender<(TcpStream, SocketAddr)>,
    stop: &AtomicBool,
    any: &AtomicBool,
    waker: Option<&crate::WorkerWaker>,
) {
    loop {
        let r = l.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        match r {
            Ok((mut s, peer)) => {
                let _ = s.set_nodelay(true);
                let sent = s
                    .set_write_timeout(Some(ANNOUNCE_TIMEOUT))
                    .and_then(|()| s.write_all(announce));
                if let Err(e) = sent {
                    ucs::debug!("ucp: connection manager: client {peer}: announcing: {e}");
                    continue;
                }
                if tx.send((s, peer)).is_err() {
                    return;
                }
                any.store(true, Ordering::Release);
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Err(e) => {
                ucs::warn!("ucp: connection manager: accept: {e}");
                // Out of file descriptors, for one: give the others time to close some.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A client's request for an endpoint pair: accept it into an [`Ep`] or reject it (dropping
/// it rejects it too).
pub struct ConnRequest {
    worker: Weak<WorkerInner>,
    stream: Option<TcpStream>,
    peer: SocketAddr,
    remote: WorkerAddress,
    conn_id: u64,
    client_ep: u64,
    flags: u8,
}

impl ConnRequest {
    pub(crate) fn new(
        worker: Weak<WorkerInner>,
        stream: TcpStream,
        peer: SocketAddr,
        remote: WorkerAddress,
        conn_id: u64,
        client_ep: u64,
        flags: u8,
    ) -> ConnRequest {
        ConnRequest {
            worker,
            stream: Some(stream),
            peer,
            remote,
            conn_id,
            client_ep,
            flags,
        }
    }

    /// The client's IP address and port.
    pub fn client_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The client worker's id.
    pub fn client_id(&self) -> u64 {
        self.remote.uuid
    }

    /// The client worker's name (host and process).
    pub fn client_name(&self) -> &str {
        &self.remote.name
    }

    /// The error-handling mode the client asked for; the endpoint uses it (both sides select
    /// lanes with the same mode).
    pub fn err_mode(&self) -> ErrMode {
        if self.flags & FLAG_ERR_PEER != 0 {
            ErrMode::Peer
        } else {
            ErrMode::None
        }
    }

    /// Accepts: the endpoint to the client, usable at once (its sends wait for the lanes).
    /// `params`' error handler is installed; its mode must be the client's
    /// ([`ConnRequest::err_mode`]) or the default. A client whose wireup does not follow
    /// within `RUCX_CM_TIMEOUT` fails the endpoint with `TimedOut`.
    pub fn accept(mut self, params: EpParams) -> Result<Ep> {
        let w = self
            .worker
            .upgrade()
            .ok_or_else(|| Error::new(Status::NotConnected, "ucp: accept: the worker is gone"))?;
        let mode = self.err_mode();
        if params.err_mode != mode && params.err_mode != ErrMode::None {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: accept: the client at {} asked for {mode:?} error handling, not {:?}",
                    self.peer, params.err_mode
                ),
            ));
        }
        let sn = self.conn_id | CONN_SN_BIT;
        let key = (self.remote.uuid, sn);
        {
            let t = w.eps.borrow();
            if t.unmatched.contains_key(&key) || t.passive.contains_key(&key) {
                return Err(Error::new(
                    Status::InvalidParam,
                    format!(
                        "ucp: accept: worker {:#x} already has connection {:#x} here",
                        self.remote.uuid, self.conn_id
                    ),
                ));
            }
        }
        let ep = crate::ep::create(&w, self.remote.clone(), sn, Some(self.client_ep), mode)?;
        *ep.err_handler.borrow_mut() = params.on_error;
        {
            let mut t = w.eps.borrow_mut();
            t.unmatched.insert(key, ep.clone());
            t.link_remote(ep.id.get(), self.remote.uuid, None, self.client_ep);
        }
        let accept = Msg {
            kind: Kind::Accept,
            flags: 0,
            worker: w.uuid,
            conn_id: self.conn_id,
            ep: ep.id.get(),
            address: Vec::new(),
        };
        if let Err(e) = self.answer(&accept) {
            w.eps.borrow_mut().take_unmatched(&key);
            return Err(e);
        }
        super::cm(&w).watch_accepted(&ep, self.peer);
        Ok(Ep::from_inner(ep))
    }

    /// Rejects: the client's endpoint fails with `Rejected`.
    pub fn reject(mut self) {
        self.send_reject();
    }

    fn send_reject(&mut self) {
        let Some(w) = self.worker.upgrade() else { return };
        let m = Msg {
            kind: Kind::Reject,
            flags: 0,
            worker: w.uuid,
            conn_id: self.conn_id,
            ep: 0,
            address: Vec::new(),
        };
        if let Err(e) = self.answer(&m) {
            ucs::debug!("{e}");
        }
    }

    /// Writes the answer (a few bytes into an empty socket buffer: it goes at once) and closes.
    fn answer(&mut self, m: &Msg) -> Result<()> {
        let Some(mut s) = self.stream.take() else {
            return Ok(());
        };
        s.write_all(&m.encode())
            .map_err(|e| io_error(self.peer, "connection manager: answering", &e))
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if self.stream.is_some() {
            self.send_reject();
        }
    }
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ucp::ConnRequest(from {} worker {:#x})",
            self.peer, self.remote.uuid
        )
    }
}
