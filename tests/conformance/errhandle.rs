//! The interface error handler (UCX `test_peer_failure`): never called during healthy traffic;
//! for transports with `ERRHANDLE_PEER_FAILURE`, called with the endpoint's key once the peer is
//! gone, after which the endpoint refuses operations.

use std::time::Instant;

use rucx_testkit::{Setup, DEADLINE};
use ucs::Outcome;
use uct::{FlushFlags, IfaceFlags, MemIov, PendingRequest, PendingResult, Status};

use crate::flush::{check_order, FireLog, Ops, FLUSH};

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
        p.skip("peer failure: no ERRHANDLE_PEER_FAILURE (the transport cannot detect a dead peer)");
        return;
    }
    if !f.intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY) {
        p.skip("peer failure: no am_short/am_bcopy to provoke it");
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
    let n = p.name();
    let (tx, ep) = p.into_sender();
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
        matches!(&r, Err(e) if *e != Status::NoResource),
        "[{n}] send on a failed endpoint: {r:?}"
    );
    if f.contains(IfaceFlags::PENDING) {
        if let Ok(()) = ep.pending_add(PendingRequest::new(|_| PendingResult::Done)) {
            let mut k = 0;
            ep.pending_purge(|_| k += 1);
            assert_eq!(k, 1, "[{n}] purge on a failed endpoint");
        }
    }
    drop(ep);
    drop(tx);
}

/// The receiver goes away while am_zcopy operations and an endpoint flush are outstanding:
/// every operation's completion fires once (with whatever status: some may have left before
/// the peer went), the error handler is called, and the flush completes after the operations
/// it covers (a user freeing buffers in its callback must find them all released).
fn peer_failure_completes_outstanding(s: &Setup) {
    let p = s.pair();
    let f = p.attr().flags;
    if !f.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE) || !f.contains(IfaceFlags::AM_ZCOPY) {
        p.skip("peer failure with outstanding zcopys: needs ERRHANDLE_PEER_FAILURE and AM_ZCOPY");
        return;
    }
    p.record_am(ID);
    // No completion: done or not, the flush below covers it.
    let _ = p
        .retry("first am_zcopy", || p.ep().am_zcopy(ID, &[], &[], None))
        .unwrap();
    p.flush_ep();
    let src = p.local_mem(4096, 7);
    let len = p.attr().am.max_zcopy.min(4096);
    // issued while the peer is there, with no progress after them: they are still
    // outstanding when it goes
    let log = FireLog::default();
    let mut ops: Ops = Vec::new();
    for i in 0..8 {
        let c = log.completion(ops.len());
        let iov: [MemIov; 1] = [src.iov(0, len).unwrap()];
        match p.ep().am_zcopy(ID, &[], &iov, Some(&c)) {
            Ok(st) => ops.push((format!("am_zcopy #{i}"), c, st)),
            Err(e) if e == Status::NoResource => break,
            Err(e) => panic!("[{}] am_zcopy #{i} with the peer there: {e}", p.name()),
        }
    }
    let fc = log.completion(FLUSH);
    let first_flush = p.ep().flush(FlushFlags::LOCAL, Some(&fc));
    let n = p.name();
    let (tx, ep) = p.into_sender();
    let flush = match first_flush {
        Err(e) if e == Status::NoResource => {
            let start = Instant::now();
            loop {
                match ep.flush(FlushFlags::LOCAL, Some(&fc)) {
                    Err(e) if e == Status::NoResource => {
                        assert!(
                            start.elapsed() < DEADLINE,
                            "[{n}] flush: NoResource for {DEADLINE:?}"
                        );
                        tx.worker.progress();
                    }
                    r => break r,
                }
            }
        }
        r => r,
    };
    let start = Instant::now();
    let settled = || {
        ops.iter()
            .all(|(_, c, st)| *st != Outcome::InProgress || c.fired() > 0)
            && (flush != Ok(Outcome::InProgress) || fc.fired() > 0)
    };
    while !settled() || tx.errors.borrow().is_empty() {
        if settled() {
            // everything went out before the peer did: a send makes the failure show
            let _ = ep.am_zcopy(ID, &[], &[], None);
        }
        assert!(
            start.elapsed() < DEADLINE,
            "[{n}] peer gone for {DEADLINE:?}: errors {:?}, completions fired {:?}, flush {flush:?} fired {}",
            tx.errors.borrow(),
            log.order(),
            fc.fired()
        );
        tx.worker.progress();
    }
    for (what, c, st) in &ops {
        let want = u64::from(*st == Outcome::InProgress);
        assert_eq!(
            c.fired(),
            want,
            "[{n}] {what} (returned {st:?}) fired {} times",
            c.fired()
        );
    }
    if flush == Ok(Outcome::InProgress) {
        assert_eq!(fc.fired(), 1, "[{n}] flush fired {} times", fc.fired());
        check_order(n, &ops, &log, "ep flush");
    }
    drop(ep);
    drop(src);
    drop(tx);
}

conformance_test!(
    err_handler_quiet_when_healthy,
    peer_failure_reported,
    peer_failure_completes_outstanding
);
