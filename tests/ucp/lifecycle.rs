//! An endpoint's end: flush, close (graceful and forced), and a peer's failure reaching the
//! error handler once, from progress, with other endpoints unharmed.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use ucp::{AmFlags, CloseMode, EpParams, ErrMode, Issued, Status, Worker};
use uct::AsyncMode;

use crate::harness::{context, pattern, Setup, DEADLINE};
use crate::ucp_test;

/// A flush completes after the sends before it; on the receiver they have all arrived once
/// it has progressed them.
fn flush_after_sends(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let inbox = p.inbox(5);
    let sizes = [8usize, 5000, 100_000];
    for (i, &n) in sizes.iter().enumerate() {
        let _ = p.ep.am_send(5, &[], &pattern(n, i), AmFlags::default()).unwrap();
    }
    match p.ep.flush().unwrap() {
        Issued::Done(()) => {}
        Issued::Pending(mut r) => {
            p.wait_for("the flush", || r.is_done());
            r.take()
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] flush: {e}", p.name));
        }
    }
    p.wait_for("the flushed messages", || inbox.borrow().len() == sizes.len());
}

/// `close(Flush)` delivers what was queued, then the peer's endpoint fails with
/// `ConnectionReset` (its error handler runs once); the closed endpoint refuses new sends.
fn close_flush_tells_peer(s: &Setup) {
    if !s.t.two_workers {
        return;
    }
    // Eager sends only: the handler reads every message's data.
    let Some(p) = s.with("RNDV_THRESH", "inf").pair() else {
        return;
    };
    let got = Rc::new(RefCell::new(Vec::new()));
    let peer_err = Rc::new(RefCell::new(Vec::new()));
    let (g, pe) = (got.clone(), peer_err.clone());
    p.b.set_am_handler(6, move |m| {
        g.borrow_mut().push(m.data().len());
        let pe = pe.clone();
        m.reply_ep()
            .expect("reply endpoint")
            .set_error_handler(move |_, e| pe.borrow_mut().push(e.status()));
    })
    .unwrap();
    for n in [10usize, 20_000, 300_000] {
        let _ = p.ep.am_send(6, &[], &pattern(n, n), AmFlags::REPLY).unwrap();
    }
    if let Issued::Pending(mut r) = p.ep.close(CloseMode::Flush) {
        p.wait_for("the close", || r.is_done());
        r.take()
            .unwrap()
            .unwrap_or_else(|e| panic!("[{}] close: {e}", p.name));
    }
    p.wait_for("the peer's error handler", || !peer_err.borrow().is_empty());
    assert_eq!(
        *got.borrow(),
        [10, 20_000, 300_000],
        "[{}] data before the close",
        p.name
    );
    assert_eq!(*peer_err.borrow(), [Status::ConnectionReset], "[{}]", p.name);
    let e = p.ep.am_send(6, &[], b"late", AmFlags::default()).unwrap_err();
    assert_eq!(e, Status::NotConnected, "[{}] {e}", p.name);
    for _ in 0..100 {
        p.progress();
    }
    assert_eq!(peer_err.borrow().len(), 1, "[{}] the handler runs once", p.name);
}

/// `close(Force)` completes every queued send at once (`Canceled` for those not sent), and
/// nothing waits forever.
fn close_force_cancels(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let _inbox = p.inbox(7);
    let mut reqs = Vec::new();
    for i in 0..20 {
        if let Issued::Pending(r) =
            p.ep.am_send(7, &[], &pattern(1 << 20, i), AmFlags::default())
                .unwrap()
        {
            reqs.push(r);
        }
    }
    assert!(matches!(p.ep.close(CloseMode::Force), Issued::Done(())));
    for mut r in reqs {
        match r.take() {
            Some(Ok(())) => {}
            Some(Err(e)) => assert_eq!(e, Status::Canceled, "[{}] {e}", p.name),
            None => panic!("[{}] a send still pending after a forced close", p.name),
        }
    }
    assert_eq!(
        p.ep.am_send(7, &[], b"x", AmFlags::default()).unwrap_err(),
        Status::NotConnected
    );
    assert!(p.ep.flush().is_err());
    for _ in 0..100 {
        p.progress();
    }
}

/// The peer's worker goes away (as when its process dies): the endpoint in `ErrMode::Peer`
/// fails, its handler runs once from progress, its queued sends fail, and an endpoint to
/// another worker keeps working.
fn peer_failure(s: &Setup) {
    if !s.t.two_workers {
        return;
    }
    // Short transport timeouts so rc/ud notice the silent peer quickly.
    let ib: &[(&str, &str)] = &[
        ("IB_TIMEOUT", "100ms"),
        ("IB_RETRY_COUNT", "1"),
        ("UD_TIMEOUT", "1s"),
    ];
    let Some(ctx) = context(s.t, if s.t.rdma { ib } else { &[] }) else {
        return;
    };
    let a = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let b = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let c = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let errors = Rc::new(RefCell::new(Vec::new()));
    let e2 = errors.clone();
    let params = EpParams::new()
        .err_mode(ErrMode::Peer)
        .on_error(move |ep, e| e2.borrow_mut().push((ep.remote_id(), e.status())));
    let ab = a.connect_with(b.address(), params).unwrap();
    let ac = a.connect(c.address()).unwrap();
    assert_eq!(ab.err_mode(), ErrMode::Peer);
    let got_b = Rc::new(Cell::new(0));
    let got_c = Rc::new(Cell::new(0));
    let (gb, gc) = (got_b.clone(), got_c.clone());
    b.set_am_handler(1, move |_| gb.set(gb.get() + 1)).unwrap();
    c.set_am_handler(1, move |_| gc.set(gc.get() + 1)).unwrap();
    let _ = ab.am_send(1, &[], b"hello b", AmFlags::default()).unwrap();
    let start = Instant::now();
    while got_b.get() == 0 || !ab.is_connected() {
        assert!(start.elapsed() < DEADLINE, "[{}] first message", s.t.name);
        a.progress();
        b.progress();
    }
    let b_id = b.id();
    drop(b);
    // Keep sending: transports without a connection to watch notice the loss on traffic.
    let mut last = None;
    while errors.borrow().is_empty() {
        assert!(
            start.elapsed() < DEADLINE * 2,
            "[{}] the peer's failure was not reported",
            s.t.name
        );
        if let Ok(Issued::Pending(r)) = ab.am_send(1, &[], &[0; 4000], AmFlags::default()) {
            last = Some(r);
        }
        a.progress();
        c.progress();
    }
    for _ in 0..1000 {
        a.progress();
    }
    let errs = errors.borrow().clone();
    assert_eq!(errs.len(), 1, "[{}] the handler runs once: {errs:?}", s.t.name);
    assert_eq!(errs[0].0, b_id);
    assert!(
        ab.error().is_some(),
        "[{}] the endpoint knows its error",
        s.t.name
    );
    assert!(ab.am_send(1, &[], b"after", AmFlags::default()).is_err());
    if let Some(mut r) = last {
        assert!(r.take().is_some(), "[{}] a queued send left pending", s.t.name);
    }
    // The other endpoint is unharmed.
    let _ = ac.am_send(1, &[], b"hello c", AmFlags::default()).unwrap();
    while got_c.get() == 0 {
        assert!(
            start.elapsed() < DEADLINE * 2,
            "[{}] the other endpoint",
            s.t.name
        );
        a.progress();
        c.progress();
    }
}

ucp_test!(
    flush_after_sends,
    close_flush_tells_peer,
    close_force_cancels,
    peer_failure
);
