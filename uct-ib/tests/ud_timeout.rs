//! ud_verbs peer failure: a peer that stops answering (its interface destroyed, or never
//! progressed, or never there) is declared dead after `RUCX_UD_TIMEOUT` (1 s here): the error
//! handler gets `EndpointTimeout` for the endpoint, its flush completes with that error, and
//! later operations fail with it. Skipped ("skipped: no RDMA device") without a device; run
//! in the Soft-RoCE VM:  testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1

mod ud_common;

use std::sync::Once;
use std::time::{Duration, Instant};

use uct::*;
use ud_common::*;

static ENV: Once = Once::new();

/// Every interface of this test binary uses a 1 s peer timeout.
fn ctx() -> Option<(Context, String)> {
    ENV.call_once(|| std::env::set_var("RUCX_UD_TIMEOUT", "1s"));
    context()
}

/// Sends on `ep` (ignoring NoResource) and progresses `a` until its error handler fires;
/// returns how long that took.
fn until_error(a: &Side, ep: &Ep) -> Duration {
    let t = Instant::now();
    let mut i = 0u64;
    while a.errors.borrow().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(20), "peer never declared dead");
        let _ = ep.am_short(1, i, b"anyone?");
        i += 1;
        a.worker.progress();
    }
    t.elapsed()
}

fn check_failed(a: &Side, ep: &Ep) {
    let errs = a.errors.borrow().clone();
    assert_eq!(
        errs,
        vec![(ep.key(), Status::EndpointTimeout)],
        "one report, for this endpoint"
    );
    assert_eq!(
        ep.am_short(1, 0, b"late"),
        Err(Status::EndpointTimeout),
        "later sends fail"
    );
    assert_eq!(ep.am_bcopy(1, |_| 1), Err(Status::EndpointTimeout));
    assert_eq!(ep.flush(FlushFlags::LOCAL, None), Err(Status::EndpointTimeout));
    match ep.pending_add(PendingRequest::new(|| Status::Ok)) {
        Err((Status::EndpointTimeout, _)) => {}
        other => panic!("pending_add on a failed endpoint: {:?}", other.map_err(|e| e.0)),
    }
}

#[test]
fn destroyed_peer_times_out() {
    let Some((ctx, dev)) = ctx() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, ba) = connect_ep(&a, &b);
    let rec = record(&b, 1);
    let s = [&a, &b];
    retry(&s, "first", || ab.am_short(1, 0, b"hi")).unwrap();
    flush(&s, &ab);
    assert_eq!(rec.borrow().len(), 1);
    drop(ba);
    drop(b);
    // a zcopy and a flush outstanding when the peer dies complete with the error
    retry(&[&a], "send", || ab.am_short(1, 1, b"lost")).unwrap();
    let mem = Mem::alloc(&a.md, 256, MemAccess::ALL).unwrap();
    let zc = Completion::counter();
    let iov = [mem.iov(0, 200).unwrap()];
    assert_eq!(
        retry(&[&a], "zcopy", || ab.am_zcopy(1, b"hdr", &iov, Some(&zc))),
        Ok(Status::InProgress)
    );
    let c = Completion::counter();
    assert_eq!(ab.flush(FlushFlags::LOCAL, Some(&c)), Ok(Status::InProgress));
    let took = until_error(&a, &ab);
    println!("declared dead after {took:?}");
    assert!(took >= Duration::from_millis(900), "too early: {took:?}");
    assert_eq!((c.fired(), c.last_status()), (1, Status::EndpointTimeout));
    wait(&[&a], "zcopy completion", || zc.fired() == 1);
    assert_eq!(zc.last_status(), Status::EndpointTimeout);
    check_failed(&a, &ab);
    // other endpoints of the interface are not affected
    let c2 = side(&ctx, &dev);
    let (ac, _ca) = connect_ep(&a, &c2);
    let rec2 = record(&c2, 1);
    retry(&[&a, &c2], "healthy", || ac.am_short(1, 5, b"ok")).unwrap();
    wait(&[&a, &c2], "healthy delivery", || rec2.borrow().len() == 1);
    assert_eq!(a.errors.borrow().len(), 1);
}

#[test]
fn peer_that_stops_progressing_times_out() {
    let Some((ctx, dev)) = ctx() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, _ba) = connect_ep(&a, &b);
    record(&b, 1);
    retry(&[&a, &b], "first", || ab.am_short(1, 0, b"hi")).unwrap();
    flush(&[&a, &b], &ab);
    // b is alive but never progresses again
    until_error(&a, &ab);
    check_failed(&a, &ab);
}

#[test]
fn connection_request_to_nobody_times_out() {
    let Some((ctx, dev)) = ctx() else { return };
    let a = side(&ctx, &dev);
    let (dev_addr, iface_addr) = {
        let gone = side(&ctx, &dev);
        (
            gone.iface.device_address().unwrap(),
            gone.iface.address().unwrap(),
        )
    };
    let ep = a.iface.ep_create_connected(&dev_addr, &iface_addr).unwrap();
    until_error(&a, &ep);
    check_failed(&a, &ep);
}
