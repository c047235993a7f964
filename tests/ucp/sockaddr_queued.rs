//! `Worker::connect_sockaddr` returns its endpoint at once, before the server's address came:
//! operations issued on it meanwhile wait and are issued in order once it is connected (active
//! messages of every protocol, tag, stream both ways, flush); the error handler set meanwhile
//! is the endpoint's after; closing it while it connects cancels (`Force`) or delivers
//! (`Flush`) what waits.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucp::{AmFlags, AmProto, CloseMode, EpParams, Features, Issued, ListenerParams, Request, Status};

use crate::harness::{pattern, Setup};
use crate::sockaddr::{inbox, Sides};
use crate::ucp_test;

fn pending<T>(what: &str, i: ucp::Result<Issued<T>>) -> Request<T> {
    match i.unwrap_or_else(|e| panic!("{what}: {e}")) {
        Issued::Pending(r) => r,
        Issued::Done(_) => panic!("{what} finished before the endpoint was connected"),
    }
}

/// The value of `i`, progressing until it is there.
fn finish<T>(w: &Sides, i: Issued<T>) -> T {
    match i {
        Issued::Done(v) => v,
        Issued::Pending(mut r) => {
            w.wait_for("a request", || r.is_done());
            r.take().unwrap().unwrap_or_else(|e| panic!("[{}] {e}", w.name))
        }
    }
}

/// Everything issued before the server accepted arrives, in order, once it did.
fn sockaddr_queued_in_order(s: &Setup) {
    let f = Features::AM | Features::TAG | Features::STREAM;
    let Some(w) = Sides::with_features(s, f) else {
        return;
    };
    let l = w.listen(ListenerParams::new());
    let got = inbox(&w.server, 1);
    let c = w
        .client
        .connect_sockaddr(l.local_addr(), EpParams::new())
        .unwrap();
    // Nothing of the server is known yet.
    assert!(!c.is_connected());
    assert_eq!(c.remote_id(), 0);
    assert_eq!(c.am_protocol(0, 8, AmFlags::default(), false), AmProto::Queued);
    assert!(c.describe_lanes().is_empty());
    assert!(format!("{c:?}").contains("connecting to"), "{c:?}");
    assert_eq!(
        c.rkey_unpack(&[0; 16]).unwrap_err().status(),
        Status::NotConnected
    );

    let sizes = [8usize, 70_000, 1 << 20];
    let mut sends = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        sends.push(pending(
            "am_send",
            c.am_send(1, b"h", &pattern(n, i), AmFlags::default()),
        ));
    }
    let owned = pending(
        "am_send_owned",
        c.am_send_owned(1, b"o", pattern(5000, 9), AmFlags::default()),
    );
    let tagged = pending("tag_send", c.tag_send(0x77, b"tagged"));
    let streamed = pending("stream_send", c.stream_send(b"stream bytes"));
    let flushed = pending("flush", c.flush());
    let from_server = pending("stream_recv", c.stream_recv(vec![0; 6], true));
    let handler_calls = Rc::new(Cell::new(0));
    let h = handler_calls.clone();
    c.set_error_handler(move |ep, e| {
        assert_eq!(e.status(), Status::ConnectionReset, "{e}");
        assert!(!ep.is_connected());
        h.set(h.get() + 1);
    });

    let req = w.next_request(&l);
    assert!(!c.is_connected());
    let srv = req.accept(EpParams::new()).unwrap();
    let tag_recv = w.server.tag_recv(0x77, u64::MAX, vec![0; 64]).unwrap();
    let server_stream = srv.stream_recv(vec![0; 12], true).unwrap();
    let _ = srv.stream_send(b"answer").unwrap();
    w.wait_for("every message", || got.borrow().len() == sizes.len() + 1);
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (b"h".to_vec(), pattern(n, i)))
        .collect();
    want.push((b"o".to_vec(), pattern(5000, 9)));
    // Every message came; those sent eagerly in the order sent (a rendezvous message reaches
    // the handler once its data is fetched, which may be after later eager ones, as always).
    let mut sorted = got.borrow().clone();
    sorted.sort();
    let mut all = want.clone();
    all.sort();
    assert_eq!(sorted, all, "[{}] every queued message", w.name);
    let eager = |m: &(Vec<u8>, Vec<u8>)| {
        c.am_protocol(m.0.len(), m.1.len(), AmFlags::default(), m.0 == b"o") != AmProto::Rndv
    };
    let got_eager: Vec<_> = got.borrow().iter().filter(|m| eager(m)).cloned().collect();
    let want_eager: Vec<_> = want.iter().filter(|m| eager(m)).cloned().collect();
    assert_eq!(got_eager, want_eager, "[{}] the eager messages, in order", w.name);
    let requests: Vec<Request<()>> = sends.into_iter().chain([tagged, streamed, flushed]).collect();
    for mut r in requests {
        w.wait_for("a queued operation", || r.is_done());
        r.take().unwrap().unwrap_or_else(|e| panic!("[{}] {e}", w.name));
    }
    let mut owned = owned;
    w.wait_for("the owned send", || owned.is_done());
    assert_eq!(
        owned.take().unwrap().unwrap(),
        pattern(5000, 9),
        "the buffer comes back"
    );
    let m = tag_recv.wait(&w.server).unwrap();
    assert_eq!((m.tag, &m.data[..]), (0x77, &b"tagged"[..]));
    assert_eq!(finish(&w, server_stream), b"stream bytes");
    let mut from_server = from_server;
    w.wait_for("the server's stream bytes", || from_server.is_done());
    assert_eq!(from_server.take().unwrap().unwrap(), b"answer");
    assert!(c.is_connected());
    assert_eq!(c.remote_id(), w.server.id());
    assert_ne!(c.am_protocol(0, 8, AmFlags::default(), false), AmProto::Queued);
    assert!(!c.describe_lanes().is_empty());

    if !s.t.two_workers {
        return;
    }
    // The handler set while connecting is the endpoint's.
    if let Issued::Pending(r) = srv.close(CloseMode::Flush) {
        w.wait_for("the server's close", || r.is_done());
    }
    w.wait_for("the client's error handler", || handler_calls.get() == 1);
}

/// `close(Force)` while connecting: what waits completes with `Canceled` at once, later
/// operations fail, and the connect's own failure calls no error handler. `close(Flush)`:
/// what waits is still delivered, then the endpoint closes.
fn sockaddr_close_while_connecting(s: &Setup) {
    let Some(w) = Sides::new(&s.with("CM_TIMEOUT", "300ms")) else {
        return;
    };
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let calls = Rc::new(Cell::new(0));
    let k = calls.clone();
    let c = w
        .client
        .connect_sockaddr(
            silent.local_addr().unwrap(),
            EpParams::new().on_error(move |_, _| k.set(k.get() + 1)),
        )
        .unwrap();
    let mut queued = pending("am_send", c.am_send(1, &[], b"never", AmFlags::default()));
    assert!(c.close(CloseMode::Force).is_done());
    assert_eq!(queued.take().unwrap().unwrap_err().status(), Status::Canceled);
    assert_eq!(
        c.am_send(1, &[], b"x", AmFlags::default()).unwrap_err().status(),
        Status::NotConnected
    );
    // Past the connect's deadline: it failed quietly.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        w.progress();
    }
    assert_eq!(calls.get(), 0, "[{}] no handler for a closed endpoint", w.name);
    assert!(c.error().is_some());

    // Flush: delivered, then closed.
    let l = w.listen(ListenerParams::new());
    let got = inbox(&w.server, 2);
    let c = w
        .client
        .connect_sockaddr(l.local_addr(), EpParams::new())
        .unwrap();
    let sent = pending(
        "am_send",
        c.am_send(2, b"h", b"before the close", AmFlags::default()),
    );
    let closed = pending("close", Ok(c.close(CloseMode::Flush)));
    assert_eq!(
        c.am_send(2, &[], b"x", AmFlags::default()).unwrap_err().status(),
        Status::NotConnected
    );
    let _srv = w.next_request(&l).accept(EpParams::new()).unwrap();
    w.wait_for("the message", || got.borrow().len() == 1);
    assert_eq!(got.borrow()[0].1, b"before the close");
    let mut sent = sent;
    w.wait_for("the send", || sent.is_done());
    sent.take().unwrap().unwrap();
    let mut closed = closed;
    w.wait_for("the close", || closed.is_done());
    closed.take().unwrap().unwrap();
    assert_eq!(c.error().unwrap().status(), Status::NotConnected);
}

ucp_test!(sockaddr_queued_in_order, sockaddr_close_while_connecting);
