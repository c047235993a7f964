//! Client and server without a side channel: `Worker::listen` and `Worker::connect_sockaddr`
//! (the connection manager), then active messages both ways; rejection; a listener that meets
//! garbage drops that connection only and keeps accepting; the non-blocking connect; a server
//! that never accepts, or is not there, fails the connect within `RUCX_CM_TIMEOUT`
//! (`sockaddr_queued.rs`: what an endpoint still connecting does with operations).

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucp::{
    AmFlags, CloseMode, ConnRequest, Ep, EpParams, Features, Issued, Listener, ListenerParams, Status, Worker,
};
use uct::AsyncMode;

use crate::harness::{context_with, pattern, Setup, DEADLINE};
use crate::ucp_test;

/// A server and a client worker (the same worker on the self target).
pub(crate) struct Sides {
    pub name: &'static str,
    pub server: Worker,
    pub client: Worker,
}

impl Sides {
    pub fn new(s: &Setup) -> Option<Sides> {
        Sides::with_features(s, Features::AM)
    }

    pub fn with_features(s: &Setup, f: Features) -> Option<Sides> {
        let extra: Vec<(&str, &str)> = s.extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let ctx = context_with(s.t, &extra, f)?;
        let server = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
        let client = if s.t.two_workers {
            Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap()
        } else {
            server.clone()
        };
        Some(Sides {
            name: s.t.name,
            server,
            client,
        })
    }

    pub fn progress(&self) {
        self.server.progress();
        if self.server.id() != self.client.id() {
            self.client.progress();
        }
    }

    pub fn wait_for(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < DEADLINE,
                "[{}] timed out waiting for {what}",
                self.name
            );
            self.progress();
        }
    }

    pub fn listen(&self, params: ListenerParams) -> Listener {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let l = self
            .server
            .listen(any, params)
            .unwrap_or_else(|e| panic!("[{}] listen: {e}", self.name));
        assert_ne!(l.local_addr().port(), 0);
        l
    }

    /// The next connection request `l` gets (progressing both sides until then).
    pub fn next_request(&self, l: &Listener) -> ConnRequest {
        let mut req = None;
        self.wait_for("the connection request", || {
            req = l.accept();
            req.is_some()
        });
        req.unwrap()
    }

    /// A client endpoint and the server endpoint its request was accepted into.
    pub fn connect(&self, l: &Listener) -> (Ep, Ep) {
        let c = self
            .client
            .connect_sockaddr(l.local_addr(), EpParams::new())
            .unwrap_or_else(|e| panic!("[{}] connect_sockaddr: {e}", self.name));
        let req = self.next_request(l);
        assert_eq!(req.client_id(), self.client.id());
        assert!(req.client_addr().ip().is_loopback());
        let s = req
            .accept(EpParams::new())
            .unwrap_or_else(|e| panic!("[{}] accept: {e}", self.name));
        (c, s)
    }

    pub fn send(&self, ep: &Ep, id: u16, data: &[u8]) {
        let r = ep
            .am_send(id, b"hdr", data, AmFlags::default())
            .unwrap_or_else(|e| panic!("[{}] am_send of {} bytes: {e}", self.name, data.len()));
        if let Issued::Pending(mut req) = r {
            self.wait_for("a send", || req.is_done());
            req.take()
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] send of {} bytes: {e}", self.name, data.len()));
        }
    }
}

pub(crate) type Inbox = Rc<RefCell<Vec<(Vec<u8>, Vec<u8>)>>>;

/// Records what AM `id` brings to `w` (a rendezvous message once the worker fetched its data).
pub(crate) fn inbox(w: &Worker, id: u16) -> Inbox {
    let i: Inbox = Rc::default();
    let j = i.clone();
    w.set_am_handler(id, move |m| {
        j.borrow_mut().push((m.header().to_vec(), m.data().to_vec()));
    })
    .unwrap();
    i
}

const SIZES: [usize; 6] = [0, 8, 1000, 9000, 70_000, 1 << 20];

/// Sends made before the exchange finished wait and arrive; then messages of every size go
/// both ways; the endpoints pair with each other (a graceful close reaches the accepted one).
fn sockaddr_am_both_ways(s: &Setup) {
    let Some(w) = Sides::new(s) else { return };
    let l = w.listen(ListenerParams::new());
    let to_server = inbox(&w.server, 1);
    let to_client = inbox(&w.client, 2);
    let c = w
        .client
        .connect_sockaddr(l.local_addr(), EpParams::new())
        .unwrap();
    // At once: it waits for the server's acceptance.
    let early = c.am_send(1, b"hdr", b"early", AmFlags::default()).unwrap();
    assert!(
        matches!(early, Issued::Pending(_)),
        "[{}] sent before the exchange",
        w.name
    );
    let server_ep = w.next_request(&l).accept(EpParams::new()).unwrap();
    w.wait_for("the early message", || to_server.borrow().len() == 1);
    assert_eq!(to_server.borrow()[0].1, b"early");
    w.wait_for("both sides wired", || {
        c.is_connected() && server_ep.is_connected()
    });
    assert_eq!(c.remote_id(), w.server.id());
    assert_eq!(server_ep.remote_id(), w.client.id());
    for (i, &n) in SIZES.iter().enumerate() {
        w.send(&c, 1, &pattern(n, i));
        w.send(&server_ep, 2, &pattern(n, i + 100));
    }
    w.wait_for("every message", || {
        to_server.borrow().len() == 1 + SIZES.len() && to_client.borrow().len() == SIZES.len()
    });
    for (i, &n) in SIZES.iter().enumerate() {
        assert_eq!(
            to_server.borrow()[1 + i],
            (b"hdr".to_vec(), pattern(n, i)),
            "[{}] {n} bytes",
            w.name
        );
        assert_eq!(
            to_client.borrow()[i],
            (b"hdr".to_vec(), pattern(n, i + 100)),
            "[{}] {n} bytes",
            w.name
        );
    }
    if !s.t.two_workers {
        return;
    }
    // One endpoint each: the client's CLOSE reaches the endpoint the server accepted.
    let closed = Rc::new(Cell::new(0));
    let k = closed.clone();
    server_ep.set_error_handler(move |_, e| {
        assert_eq!(e.status(), Status::ConnectionReset);
        k.set(k.get() + 1);
    });
    if let Issued::Pending(r) = c.close(CloseMode::Flush) {
        w.wait_for("the close", || r.is_done());
    }
    w.wait_for("the accepted endpoint to learn of the close", || {
        closed.get() == 1
    });
}

/// A rejected client's endpoint fails with `Rejected` from progress; what it queued fails too.
fn sockaddr_reject(s: &Setup) {
    let Some(w) = Sides::new(s) else { return };
    let seen = Rc::new(Cell::new(0));
    let k = seen.clone();
    let l = w.listen(ListenerParams::new().on_conn_request(move |r| {
        k.set(k.get() + 1);
        r.reject();
    }));
    let errors = Rc::new(RefCell::new(Vec::new()));
    let e2 = errors.clone();
    let c = w
        .client
        .connect_sockaddr(
            l.local_addr(),
            EpParams::new().on_error(move |_, e| e2.borrow_mut().push(e.status())),
        )
        .unwrap();
    let Issued::Pending(mut queued) = c.am_send(1, &[], b"never", AmFlags::default()).unwrap() else {
        panic!("[{}] sent before the exchange", w.name);
    };
    w.wait_for("the rejection", || !errors.borrow().is_empty());
    assert_eq!(*errors.borrow(), [Status::Rejected]);
    assert_eq!(seen.get(), 1);
    w.wait_for("the queued send to fail", || queued.is_done());
    assert!(queued.take().unwrap().is_err());
    assert!(c.am_send(1, &[], b"x", AmFlags::default()).is_err());
    // Dropping an unanswered request rejects it too.
    let l2 = w.listen(ListenerParams::new());
    let errors2 = Rc::new(RefCell::new(Vec::new()));
    let e3 = errors2.clone();
    let _c2 = w
        .client
        .connect_sockaddr(
            l2.local_addr(),
            EpParams::new().on_error(move |_, e| e3.borrow_mut().push(e.status())),
        )
        .unwrap();
    let mut req = None;
    w.wait_for("the second request", || {
        req = l2.accept();
        req.is_some()
    });
    drop(req);
    w.wait_for("the second rejection", || !errors2.borrow().is_empty());
    assert_eq!(*errors2.borrow(), [Status::Rejected]);
}

/// Reads until the server closes the connection (its announcement first); false on deadline.
fn closed_by_server(w: &Sides, s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < DEADLINE {
        w.progress();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Ok(_) | Err(_) => std::thread::sleep(Duration::from_micros(100)),
        }
    }
    false
}

/// Garbage, a huge claimed length, a wrong message type and a connection closed mid-message:
/// the listener drops each of those connections and still accepts a real client.
fn sockaddr_garbage_dropped(s: &Setup) {
    let Some(w) = Sides::new(s) else { return };
    let l = w.listen(ListenerParams::new());
    let mut huge = b"RXCM\x01\x02\x00\x00".to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut wrong_type = b"RXCM\x01\x03\x00\x00".to_vec();
    wrong_type.extend_from_slice(&28u32.to_le_bytes());
    wrong_type.extend_from_slice(&[0; 8]);
    wrong_type.extend_from_slice(&[0; 8]);
    wrong_type.extend_from_slice(&[1; 8]);
    wrong_type.extend_from_slice(&[0; 4]);
    let inputs: [&[u8]; 3] = [b"GET / HTTP/1.0\r\n\r\n", &huge, &wrong_type];
    let mut kept = Vec::new();
    for bad in inputs {
        let mut t = TcpStream::connect(l.local_addr()).unwrap();
        t.write_all(bad).unwrap();
        assert!(closed_by_server(&w, &mut t), "[{}] {bad:?} not dropped", w.name);
        kept.push(t);
    }
    // Half a header, then the client goes away.
    let mut t = TcpStream::connect(l.local_addr()).unwrap();
    t.write_all(b"RXCM\x01").unwrap();
    drop(t);
    for _ in 0..100 {
        w.progress();
    }
    assert!(l.accept().is_none(), "[{}] garbage became a request", w.name);
    let (c, srv) = w.connect(&l);
    let got = inbox(&w.server, 3);
    w.send(&c, 3, b"after the garbage");
    w.wait_for("the message", || got.borrow().len() == 1);
    assert_eq!(got.borrow()[0].1, b"after the garbage");
    drop(srv);
}

/// `connect_sockaddr_nb` returns at once; its request completes with the connected endpoint
/// once the server accepted, and messages go both ways.
fn sockaddr_nonblocking(s: &Setup) {
    let Some(w) = Sides::new(s) else { return };
    let l = w.listen(ListenerParams::new());
    let to_server = inbox(&w.server, 7);
    let mut req = w
        .client
        .connect_sockaddr_nb(l.local_addr(), EpParams::new())
        .unwrap_or_else(|e| panic!("[{}] connect_sockaddr_nb: {e}", w.name));
    let conn = w.next_request(&l);
    assert!(
        !req.is_done(),
        "[{}] connected before the server accepted",
        w.name
    );
    let srv = conn.accept(EpParams::new()).unwrap();
    w.wait_for("the connect to complete", || req.is_done());
    let c = req
        .take()
        .unwrap()
        .unwrap_or_else(|e| panic!("[{}] connect: {e}", w.name));
    assert!(c.is_connected());
    assert_eq!(c.remote_id(), w.server.id());
    w.send(&c, 7, b"to the server");
    w.wait_for("the message", || to_server.borrow().len() == 1);
    assert_eq!(to_server.borrow()[0].1, b"to the server");
    let to_client = inbox(&w.client, 8);
    w.send(&srv, 8, &pattern(70_000, 3));
    w.wait_for("the answer", || to_client.borrow().len() == 1);
    assert_eq!(to_client.borrow()[0].1, pattern(70_000, 3));
}

/// How long the timeout tests give the handshake.
const CM_TIMEOUT: Duration = Duration::from_millis(300);

/// A listener whose application never accepts: the `connect_sockaddr` endpoint fails with
/// `TimedOut` (its error handler runs, its queued send fails), and so does the non-blocking
/// connect's request, both after about `RUCX_CM_TIMEOUT`.
fn sockaddr_never_accepted(s: &Setup) {
    let Some(w) = Sides::new(&s.with("CM_TIMEOUT", "300ms")) else {
        return;
    };
    let l = w.listen(ListenerParams::new());
    let errors = Rc::new(RefCell::new(Vec::new()));
    let e2 = errors.clone();
    let start = Instant::now();
    let c = w
        .client
        .connect_sockaddr(
            l.local_addr(),
            EpParams::new().on_error(move |_, e| e2.borrow_mut().push(e.clone())),
        )
        .unwrap();
    let Issued::Pending(mut queued) = c.am_send(1, &[], b"never", AmFlags::default()).unwrap() else {
        panic!("[{}] sent before the exchange", w.name);
    };
    let mut nb = w
        .client
        .connect_sockaddr_nb(l.local_addr(), EpParams::new())
        .unwrap();
    w.wait_for("the timeout", || !errors.borrow().is_empty());
    assert!(start.elapsed() >= CM_TIMEOUT, "[{}] failed early", w.name);
    let e = errors.borrow()[0].clone();
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    assert!(e.to_string().contains("RUCX_CM_TIMEOUT"), "{e}");
    w.wait_for("the queued send to fail", || queued.is_done());
    assert_eq!(queued.take().unwrap().unwrap_err().status(), Status::TimedOut);
    assert!(c.error().is_some());
    w.wait_for("the non-blocking connect to fail", || nb.is_done());
    let e = nb.take().unwrap().unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    // Both requests still wait in the listener; the clients are gone.
    assert!(l.accept().is_some());
}

/// A plain TCP listener that never accepts (the kernel completes the connection, nobody
/// speaks): both connects fail with `TimedOut`. A port nobody listens on: `Unreachable`.
fn sockaddr_silent_or_absent(s: &Setup) {
    let Some(w) = Sides::new(&s.with("CM_TIMEOUT", "300ms")) else {
        return;
    };
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap();
    let start = Instant::now();
    let e = failed_connect(&w, to);
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    assert!(e.to_string().contains("RUCX_CM_TIMEOUT"), "{e}");
    assert!(start.elapsed() >= CM_TIMEOUT);
    let mut nb = w.client.connect_sockaddr_nb(to, EpParams::new()).unwrap();
    w.wait_for("the non-blocking connect to time out", || nb.is_done());
    let e = nb.take().unwrap().unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    assert!(e.to_string().contains("RUCX_CM_TIMEOUT"), "{e}");

    // A listener whose accept queue is full: the kernel drops the SYN, the TCP connection is
    // never made (a host that does not answer).
    let (full, _filler) = full_listener();
    let to = full.local_addr().unwrap();
    let e = failed_connect(&w, to);
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    assert!(e.to_string().contains("no TCP connection"), "{e}");
    let mut nb = w.client.connect_sockaddr_nb(to, EpParams::new()).unwrap();
    w.wait_for("the unanswered connect to time out", || nb.is_done());
    let e = nb.take().unwrap().unwrap_err();
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    assert!(e.to_string().contains("no TCP connection"), "{e}");

    let absent = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = failed_connect(&w, absent);
    assert_eq!(e.status(), Status::Unreachable, "[{}] {e}", w.name);
    let e = match w.client.connect_sockaddr_nb(absent, EpParams::new()) {
        Err(e) => e,
        Ok(mut r) => {
            w.wait_for("the refusal", || r.is_done());
            r.take().unwrap().unwrap_err()
        }
    };
    assert_eq!(e.status(), Status::Unreachable, "[{}] {e}", w.name);
    assert!(e.to_string().contains("refused"), "{e}");
}

/// `connect_sockaddr` to `to`, which fails: at once (a refusal the kernel reports in the
/// call), or from progress, where the endpoint's error handler gets the error, the send
/// issued meanwhile fails with it, and so does any later operation.
fn failed_connect(w: &Sides, to: SocketAddr) -> ucp::Error {
    let errors = Rc::new(RefCell::new(Vec::new()));
    let e2 = errors.clone();
    let params = EpParams::new().on_error(move |ep, e| e2.borrow_mut().push((ep.is_connected(), e.clone())));
    let c = match w.client.connect_sockaddr(to, params) {
        Ok(c) => c,
        Err(e) => return e,
    };
    assert!(!c.is_connected());
    let Issued::Pending(mut queued) = c.am_send(1, &[], b"never", AmFlags::default()).unwrap() else {
        panic!("[{}] sent before connecting", w.name);
    };
    w.wait_for("the connect to fail", || !errors.borrow().is_empty());
    let (connected, e) = errors.borrow()[0].clone();
    assert!(!connected);
    assert_eq!(errors.borrow().len(), 1, "[{}] one error handler call", w.name);
    w.wait_for("the queued send to fail", || queued.is_done());
    assert_eq!(queued.take().unwrap().unwrap_err().status(), e.status());
    assert_eq!(c.error().map(|x| x.status()), Some(e.status()));
    assert_eq!(
        c.am_send(1, &[], b"x", AmFlags::default()).unwrap_err().status(),
        e.status()
    );
    e
}

/// A loopback listener with a backlog of 0 and the one connection it queues: further SYNs are
/// dropped while nobody accepts.
fn full_listener() -> (std::net::TcpListener, TcpStream) {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
    listen(&fd, Backlog::new(0).unwrap()).unwrap();
    let l = std::net::TcpListener::from(fd);
    let filler = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (l, filler)
}

/// A client that is accepted and then goes silent (its worker never progresses again, so its
/// wireup never starts): the server's endpoint fails with `TimedOut` within
/// `RUCX_CM_TIMEOUT` of the accept, in error mode None too, and the server accepts others.
fn accepted_client_silent_times_out(s: &Setup) {
    if !s.t.two_workers {
        return; // one worker: the client progresses whenever the server does
    }
    let Some(w) = Sides::new(&s.with("CM_TIMEOUT", "300ms")) else {
        return;
    };
    let l = w.listen(ListenerParams::new());
    let _c = w
        .client
        .connect_sockaddr(l.local_addr(), EpParams::new())
        .unwrap();
    let req = w.next_request(&l);
    let errors = Rc::new(RefCell::new(Vec::new()));
    let e2 = errors.clone();
    let accepted = Instant::now();
    let ep = req
        .accept(EpParams::new().on_error(move |_, e| e2.borrow_mut().push(e.clone())))
        .unwrap();
    // Only the server progresses from here.
    while errors.borrow().is_empty() {
        assert!(
            accepted.elapsed() < DEADLINE,
            "[{}] the accepted endpoint never failed",
            w.name
        );
        w.server.progress();
    }
    assert!(accepted.elapsed() >= CM_TIMEOUT, "[{}] failed early", w.name);
    let e = errors.borrow()[0].clone();
    assert_eq!(e.status(), Status::TimedOut, "[{}] {e}", w.name);
    assert!(e.to_string().contains("RUCX_CM_TIMEOUT"), "[{}] {e}", w.name);
    assert!(ep.error().is_some());
    // Another client is served.
    let other =
        Worker::with_async_mode(&context_with(s.t, &[], Features::AM).unwrap(), AsyncMode::Poll).unwrap();
    let c2 = other.connect_sockaddr(l.local_addr(), EpParams::new()).unwrap();
    let start = Instant::now();
    let mut req2 = None;
    while req2.is_none() {
        assert!(start.elapsed() < DEADLINE, "[{}] the second request", w.name);
        other.progress();
        w.server.progress();
        req2 = l.accept();
    }
    let s2 = req2.unwrap().accept(EpParams::new()).unwrap();
    let got = inbox(&w.server, 3);
    let _ = c2.am_send(3, b"h", b"second", AmFlags::default()).unwrap();
    while got.borrow().is_empty() {
        assert!(
            start.elapsed() < DEADLINE,
            "[{}] the second client's message",
            w.name
        );
        other.progress();
        w.server.progress();
    }
    assert!(s2.error().is_none());
}

ucp_test!(
    accepted_client_silent_times_out,
    sockaddr_am_both_ways,
    sockaddr_reject,
    sockaddr_garbage_dropped,
    sockaddr_nonblocking,
    sockaddr_never_accepted,
    sockaddr_silent_or_absent
);
