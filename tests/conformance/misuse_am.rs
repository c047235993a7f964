//! Bad input on the active-message path and in I/O vectors (UCX `test_p2p_err` and the param
//! checks): every misuse returns an error instead of crashing, sends nothing, and the endpoint
//! keeps working.

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::{Pair, Recorder, Setup};
use uct::{IfaceFlags, MemIov, Status};

const ID: u8 = 5;

/// Sends one valid message and waits for it (connects lazily-connecting transports, and proves
/// the endpoint still works after misuse).
pub fn valid_send(p: &Pair, rec: &Recorder, expect_total: usize) {
    let (ep, a) = (p.ep(), p.attr());
    let r = if a.flags.contains(IfaceFlags::AM_SHORT) {
        p.retry("valid am_short", || ep.am_short(ID, 42, b"ok"))
    } else if a.flags.contains(IfaceFlags::AM_BCOPY) {
        p.retry("valid am_bcopy", || {
            ep.am_bcopy(ID, |b| {
                b[..2].copy_from_slice(b"ok");
                2
            })
        })
        .map(|_| ())
    } else {
        return;
    };
    r.unwrap_or_else(|e| panic!("[{}] valid send after misuse: {e}", p.name()));
    p.wait_msgs(rec, expect_total, "valid");
}

/// An error, and not `NoResource` (retrying could never succeed).
#[track_caller]
pub fn refused<T: std::fmt::Debug>(p: &Pair, what: &str, r: uct::Result<T>) {
    match &r {
        Err(e) if *e != Status::NoResource => {}
        _ => panic!("[{}] {what}: {r:?} (must be refused with an error)", p.name()),
    }
}

fn am_bad_id(s: &Setup) {
    let p = s.pair();
    let (ep, n, f) = (p.ep(), p.name(), p.attr().flags);
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    let m = p.local_mem(16, 1);
    for id in [32u8, 33, 64, 255] {
        let bad = Err(Status::InvalidParam.into());
        if f.contains(IfaceFlags::AM_SHORT) {
            assert_eq!(
                p.retry("am_short", || ep.am_short(id, 0, b"x")),
                bad,
                "[{n}] am_short id {id}"
            );
            assert_eq!(
                p.retry("am_short_iov", || ep.am_short_iov(id, &[b"x"])),
                bad,
                "[{n}] am_short_iov id {id}"
            );
        }
        if f.contains(IfaceFlags::AM_BCOPY) {
            let r = p.retry("am_bcopy", || ep.am_bcopy(id, |_| 1));
            assert_eq!(r, Err(Status::InvalidParam.into()), "[{n}] am_bcopy id {id}");
        }
        if f.contains(IfaceFlags::AM_ZCOPY) {
            let iov = [m.iov(0, 8).unwrap()];
            let r = p.retry("am_zcopy", || ep.am_zcopy(id, &[], &iov, None));
            assert_eq!(r, Err(Status::InvalidParam.into()), "[{n}] am_zcopy id {id}");
        }
        assert_eq!(
            p.rx.iface.set_am_handler(id, p.am_flags(), |_| {}),
            bad,
            "[{n}] set_am_handler id {id}"
        );
        assert_eq!(
            p.rx.iface.clear_am_handler(id),
            bad,
            "[{n}] clear_am_handler id {id}"
        );
    }
    valid_send(&p, &rec, 2);
}

fn am_oversized(s: &Setup) {
    let p = s.pair();
    let (ep, n, a) = (p.ep(), p.name(), *p.attr());
    if !a
        .flags
        .intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY | IfaceFlags::AM_ZCOPY)
    {
        p.skip("oversized AMs: no active messages");
        return;
    }
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    if a.flags.contains(IfaceFlags::AM_SHORT) {
        let big = vec![7u8; a.am.max_short - 8 + 1];
        refused(
            &p,
            "am_short of max_short+1",
            p.retry("am_short", || ep.am_short(ID, 0, &big)),
        );
        let big = vec![7u8; a.am.max_short + 1];
        let parts = [&big[..1], &big[1..]];
        refused(
            &p,
            "am_short_iov of max_short+1",
            p.retry("am_short_iov", || ep.am_short_iov(ID, &parts)),
        );
    }
    if a.flags.contains(IfaceFlags::AM_BCOPY) {
        let r = p.retry("am_bcopy", || ep.am_bcopy(ID, |b| b.len() + 1));
        assert_eq!(
            r,
            Err(Status::MessageTruncated.into()),
            "[{n}] am_bcopy whose pack claims more than the buffer"
        );
        let r = p.retry("am_bcopy", || {
            ep.am_bcopy(ID, |_| panic!("pack callback panics (expected by the test)"))
        });
        refused(&p, "am_bcopy whose pack panics", r);
    }
    if a.flags.contains(IfaceFlags::AM_ZCOPY) && a.am.max_zcopy < 1 << 20 && a.am.max_hdr < 1 << 20 {
        let m = p.local_mem(a.am.max_zcopy + 1, 1);
        let iov = [m.iov(0, a.am.max_zcopy + 1).unwrap()];
        refused(
            &p,
            "am_zcopy of max_zcopy+1",
            p.retry("am_zcopy", || ep.am_zcopy(ID, &[], &iov, None)),
        );
        if a.am.max_hdr >= 1 {
            // The header counts towards max_zcopy (see am::am_zcopy_layouts).
            let iov = [m.iov(0, a.am.max_zcopy).unwrap()];
            refused(
                &p,
                "am_zcopy of a 1-byte header and max_zcopy bytes",
                p.retry("am_zcopy", || ep.am_zcopy(ID, b"h", &iov, None)),
            );
        }
        let hdr = vec![1u8; a.am.max_hdr + 1];
        let iov = [m.iov(0, 1.max(a.am.min_zcopy)).unwrap()];
        refused(
            &p,
            "am_zcopy with max_hdr+1 header",
            p.retry("am_zcopy", || ep.am_zcopy(ID, &hdr, &iov, None)),
        );
    }
    valid_send(&p, &rec, 2);
    assert_eq!(
        rec.borrow()[1],
        if a.flags.contains(IfaceFlags::AM_SHORT) {
            let mut v = 42u64.to_le_bytes().to_vec();
            v.extend(b"ok");
            v
        } else {
            b"ok".to_vec()
        },
        "[{n}] a refused message was delivered"
    );
}

fn too_many_iov(s: &Setup) {
    let p = s.pair();
    let (ep, n, a) = (p.ep(), p.name(), *p.attr());
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    let m = p.local_mem(64, 1);
    let r = p.remote_mem(64, 0);
    for count in [uct::MAX_IOV + 1, 2 * uct::MAX_IOV] {
        let iov: Vec<MemIov> = (0..count).map(|i| m.iov(i % 64, 1).unwrap()).collect();
        let parts: Vec<&[u8]> = (0..count).map(|_| &b"x"[..]).collect();
        let bad = Err(Status::InvalidParam.into());
        assert_eq!(
            ep.am_short_iov(ID, &parts),
            bad,
            "[{n}] am_short_iov with {count} parts"
        );
        assert_eq!(
            ep.am_zcopy(ID, &[], &iov, None).map(|_| ()),
            bad,
            "[{n}] am_zcopy with {count} entries"
        );
        assert_eq!(
            ep.put_zcopy(&iov, r.addr(0), &r.rkey, None).map(|_| ()),
            bad,
            "[{n}] put_zcopy with {count} entries"
        );
        assert_eq!(
            ep.get_zcopy(&iov, r.addr(0), &r.rkey, None).map(|_| ()),
            bad,
            "[{n}] get_zcopy with {count} entries"
        );
    }
    // Beyond what the transport advertises (when that is below the API's limit).
    let over = |max_iov: usize| {
        (max_iov < uct::MAX_IOV).then(|| (0..max_iov + 1).map(|i| m.iov(i, 1).unwrap()).collect::<Vec<_>>())
    };
    if a.flags.contains(IfaceFlags::AM_ZCOPY) {
        if let Some(iov) = over(a.am.max_iov) {
            refused(
                &p,
                "am_zcopy with am.max_iov+1 entries",
                p.retry("am_zcopy", || ep.am_zcopy(ID, &[], &iov, None)),
            );
        }
    }
    if a.flags.contains(IfaceFlags::PUT_ZCOPY) {
        if let Some(iov) = over(a.put.max_iov) {
            let res = p.retry("put_zcopy", || ep.put_zcopy(&iov, r.addr(0), &r.rkey, None));
            refused(&p, "put_zcopy with put.max_iov+1 entries", res);
        }
    }
    if a.flags.contains(IfaceFlags::GET_ZCOPY) {
        if let Some(iov) = over(a.get.max_iov) {
            let res = p.retry("get_zcopy", || ep.get_zcopy(&iov, r.addr(0), &r.rkey, None));
            refused(&p, "get_zcopy with get.max_iov+1 entries", res);
        }
    }
    assert!(
        r.mem.to_vec().iter().all(|&b| b == 0),
        "[{n}] refused operations modified remote memory"
    );
    valid_send(&p, &rec, 2);
}

/// A message for an id without handler is dropped; a panicking handler loses only its
/// message; the interface keeps delivering.
fn am_unhandled_and_panicking_handler(s: &Setup) {
    let p = s.pair();
    let (ep, n, f) = (p.ep(), p.name(), p.attr().flags);
    if !f.contains(IfaceFlags::AM_SHORT) {
        p.skip("unhandled AM: no AM_SHORT");
        return;
    }
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    // No handler on id 20.
    p.retry("am_short to an id without handler", || {
        ep.am_short(20, 1, b"dropped")
    })
    .unwrap();
    // A handler that panics once.
    let calls = Rc::new(RefCell::new(0));
    let c = calls.clone();
    p.rx.iface
        .set_am_handler(21, p.am_flags(), move |_| {
            *c.borrow_mut() += 1;
            if *c.borrow() == 1 {
                panic!("AM handler panics (expected by the test)");
            }
        })
        .unwrap();
    p.retry("am_short to a panicking handler", || ep.am_short(21, 1, b"boom"))
        .unwrap();
    p.wait_for("the panicking handler", || *calls.borrow() == 1);
    p.retry("am_short after the panic", || ep.am_short(21, 2, b"fine"))
        .unwrap();
    p.wait_for("the handler after its panic", || *calls.borrow() == 2);
    valid_send(&p, &rec, 2);
    assert_eq!(*calls.borrow(), 2, "[{n}]");
}

conformance_test!(
    am_bad_id,
    am_oversized,
    too_many_iov,
    am_unhandled_and_panicking_handler
);
