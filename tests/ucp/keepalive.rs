//! Peer failure the transports alone may not see: a peer that stops answering (keepalive
//! fails its endpoint with `EndpointTimeout`, other endpoints unharmed) and a peer that goes
//! away in the middle of a rendezvous (the sender's request fails, the handler runs once).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use ucp::{AmDataDesc, AmFlags, EpParams, ErrMode, Issued, Status, Worker};
use uct::AsyncMode;

use crate::harness::{context, pattern, Setup, DEADLINE};
use crate::ucp_test;

type Errors = Rc<RefCell<Vec<(u64, Status)>>>;

fn peer_params(errors: &Errors) -> EpParams {
    let e2 = errors.clone();
    EpParams::new()
        .err_mode(ErrMode::Peer)
        .on_error(move |ep, e| e2.borrow_mut().push((ep.remote_id(), e.status())))
}

/// Three workers on one context: `a` talks to `b` (the one that goes quiet) and `c`.
fn trio(s: &Setup) -> Option<(Worker, Worker, Worker)> {
    if !s.t.two_workers {
        return None;
    }
    let ctx = context(s.t, &[("KEEPALIVE_INTERVAL", "100ms")])?;
    let w = || Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    Some((w(), w(), w()))
}

/// `b` stops progressing (a stopped process: its connections stay up): keepalive fails the
/// endpoint to it; the endpoint to `c` keeps working.
fn silent_peer(s: &Setup) {
    let Some((a, b, c)) = trio(s) else { return };
    let errors: Errors = Rc::default();
    let ab = a.connect_with(b.address(), peer_params(&errors)).unwrap();
    let ac = a.connect_with(c.address(), peer_params(&errors)).unwrap();
    let got = Rc::new(RefCell::new(0usize));
    let g = got.clone();
    c.set_am_handler(1, move |_| *g.borrow_mut() += 1).unwrap();
    b.set_am_handler(1, |_| {}).unwrap();
    let _ = ab.am_send(1, &[], b"hello", AmFlags::default()).unwrap();
    let _ = ac.am_send(1, &[], b"hello", AmFlags::default()).unwrap();
    // Both wired and probed a few times while everyone answers.
    let start = Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(500) || *got.borrow() == 0 {
        assert!(start.elapsed() < DEADLINE, "[{}] wireup", s.t.name);
        a.progress();
        b.progress();
        c.progress();
    }
    assert!(
        errors.borrow().is_empty(),
        "[{}] {:?} while all answer",
        s.t.name,
        errors.borrow()
    );
    // b goes quiet.
    let start = Instant::now();
    while errors.borrow().is_empty() {
        assert!(
            start.elapsed() < DEADLINE,
            "[{}] the silent peer went unnoticed",
            s.t.name
        );
        a.progress();
        c.progress();
    }
    let errs = errors.borrow().clone();
    assert_eq!(errs, vec![(b.id(), Status::EndpointTimeout)], "[{}]", s.t.name);
    assert!(ab.am_send(1, &[], b"x", AmFlags::default()).is_err());
    let before = *got.borrow();
    let _ = ac.am_send(1, &[], b"still", AmFlags::default()).unwrap();
    let start = Instant::now();
    while *got.borrow() == before {
        assert!(start.elapsed() < DEADLINE, "[{}] the other endpoint", s.t.name);
        a.progress();
        c.progress();
    }
    assert_eq!(errors.borrow().len(), 1, "[{}]", s.t.name);
}

/// The receiver took a rendezvous descriptor and went away before fetching: the sender's
/// request fails and the error handler runs once.
fn peer_gone_mid_rndv(s: &Setup) {
    let Some((a, b, _c)) = trio(s) else { return };
    let errors: Errors = Rc::default();
    let ab = a.connect_with(b.address(), peer_params(&errors)).unwrap();
    let kept: Rc<RefCell<Vec<AmDataDesc>>> = Rc::default();
    let k = kept.clone();
    b.set_am_handler_with(1, ucp::AmHandlerFlags::RNDV_DESC, move |m| {
        k.borrow_mut().extend(m.take_data_desc())
    })
    .unwrap();
    let Issued::Pending(mut sent) = ab.am_send(1, &[], &pattern(1 << 20, 1), AmFlags::RNDV).unwrap() else {
        panic!("[{}] a rendezvous send waits for the receiver", s.t.name)
    };
    let start = Instant::now();
    while kept.borrow().is_empty() {
        assert!(start.elapsed() < DEADLINE, "[{}] the announcement", s.t.name);
        a.progress();
        b.progress();
    }
    let b_id = b.id();
    drop(kept);
    drop(b);
    while !sent.is_done() {
        assert!(
            start.elapsed() < DEADLINE * 2,
            "[{}] the send never failed",
            s.t.name
        );
        a.progress();
    }
    let e = sent.take().unwrap().unwrap_err();
    assert!(e.status().is_err(), "[{}] {e}", s.t.name);
    for _ in 0..1000 {
        a.progress();
    }
    let errs = errors.borrow().clone();
    assert_eq!(errs.len(), 1, "[{}] {errs:?}", s.t.name);
    assert_eq!(errs[0].0, b_id);
}

ucp_test!(silent_peer, peer_gone_mid_rndv);
