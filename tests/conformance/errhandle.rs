//! The interface error handler (UCX `test_peer_failure`): never called during healthy traffic;
//! for transports with `ERRHANDLE_PEER_FAILURE`, called with the endpoint's key once the peer is
//! gone, after which the endpoint refuses operations.

use std::time::Instant;

use uct::{IfaceFlags, PendingRequest, Status};

use crate::fixture::{skip, Setup, DEADLINE};

const ID: u8 = 15;

/// Healthy traffic both ways never reaches the error handler.
fn err_handler_quiet_when_healthy(s: &Setup) {
    let p = s.pair();
    let (ep, n, f) = (p.ep(), p.name(), p.attr().flags);
    let rec = p.record_am(ID);
    for i in 0..100u64 {
        if f.contains(IfaceFlags::AM_SHORT) {
            p.retry("am_short", || ep.am_short(ID, i, b"healthy")).unwrap();
        } else if f.contains(IfaceFlags::AM_BCOPY) {
            p.retry("am_bcopy", || ep.am_bcopy(ID, |_| 0)).unwrap();
        }
    }
    if f.intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY) {
        p.wait_msgs(&rec, 100, "healthy");
    }
    p.flush_ep();
    assert_eq!(
        p.errors(),
        vec![],
        "[{n}] error handler called during healthy traffic"
    );
}

/// The receiver goes away: the sender's error handler reports the endpoint, which then fails
/// every operation; its pending queue can still be purged and it can be destroyed.
fn peer_failure_reported(s: &Setup) {
    let p = s.pair();
    let f = p.attr().flags;
    if !f.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE) {
        skip(
            p.target,
            "peer failure: no ERRHANDLE_PEER_FAILURE (the transport cannot detect a dead peer)",
        );
        return;
    }
    if !f.intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY) {
        skip(p.target, "peer failure: no am_short/am_bcopy to provoke it");
        return;
    }
    p.record_am(ID);
    let send = |ep: &uct::Ep| {
        if f.contains(IfaceFlags::AM_SHORT) {
            ep.am_short(ID, 1, b"anyone?")
        } else {
            ep.am_bcopy(ID, |_| 0).map(|_| ())
        }
    };
    p.retry("first send", || send(p.ep())).unwrap();
    p.flush_ep();
    let (tx, ep, target) = p.into_sender();
    let n = target.name;
    let start = Instant::now();
    while tx.errors.borrow().is_empty() {
        assert!(
            start.elapsed() < DEADLINE,
            "[{n}] peer gone for {DEADLINE:?}, error handler not called"
        );
        let _ = send(&ep);
        tx.worker.progress();
    }
    let errors = tx.errors.borrow().clone();
    assert_eq!(
        errors[0].0,
        ep.key(),
        "[{n}] error handler got another endpoint's key"
    );
    assert!(
        errors[0].1.is_err(),
        "[{n}] error handler got status {}",
        errors[0].1
    );
    assert!(
        errors.iter().all(|e| e.0 == ep.key()),
        "[{n}] errors for unknown endpoints: {errors:?}"
    );
    let r = send(&ep);
    assert!(
        matches!(r, Err(e) if e != Status::NoResource),
        "[{n}] send on a failed endpoint: {r:?}"
    );
    if f.contains(IfaceFlags::PENDING) {
        if let Ok(()) = ep.pending_add(PendingRequest::new(|| Status::Ok)) {
            let mut k = 0;
            ep.pending_purge(|_| k += 1);
            assert_eq!(k, 1, "[{n}] purge on a failed endpoint");
        }
    }
    drop(ep);
    drop(tx);
}

conformance_test!(err_handler_quiet_when_healthy, peer_failure_reported);
