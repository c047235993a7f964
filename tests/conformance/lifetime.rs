//! Completions keep what an outstanding operation uses alive: the user may drop the `Mem`, the
//! `AtomicResult` and even the `Completion` handle right after starting an operation; the
//! operation still finishes (its callback runs iff it returned `InProgress`) without touching
//! freed memory. Run under the normal test harness, a use-after-free shows up as a crash or as
//! corrupted data.

use std::cell::Cell;
use std::rc::Rc;

use rucx_testkit::data::{assert_bytes, pattern};
use rucx_testkit::{Pair, Setup};
use ucs::Outcome;
use uct::{AtomicOp, AtomicResult, AtomicWidth, Completion, IfaceFlags, Status};

const ID: u8 = 13;
const LEN: usize = 4096;

/// A completion whose callback counts; the test keeps only the counter.
fn counting() -> (Completion, Rc<Cell<u32>>, Rc<Cell<Status>>) {
    let (fired, status) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(Status::Ok)));
    let (f, s) = (fired.clone(), status.clone());
    let c = Completion::new(move |st| {
        f.set(f.get() + 1);
        s.set(st);
    });
    (c, fired, status)
}

/// Waits for an operation whose `Completion` handle the user already dropped.
fn finish(p: &Pair, what: &str, r: uct::Result<Outcome>, fired: &Cell<u32>, status: &Cell<Status>) {
    let n = p.name();
    match r {
        Ok(Outcome::Done) => assert_eq!(fired.get(), 0, "[{n}] {what}: returned Ok but ran its callback"),
        Ok(Outcome::InProgress) => {
            p.wait_for(&format!("{what} completion (handle dropped)"), || fired.get() > 0);
            assert_eq!(fired.get(), 1, "[{n}] {what}: callback ran more than once");
            assert_eq!(status.get(), Status::Ok, "[{n}] {what}");
        }
        Err(e) => panic!("[{n}] {what}: {e:?}"),
    }
}

fn zcopy_memory_dropped_before_completion(s: &Setup) {
    let p = s.pair();
    let (ep, f) = (p.ep().clone(), p.attr().flags);
    let rec = p.record_am(ID);
    let data = pattern(LEN, 77);
    let mut ran = false;
    if f.contains(IfaceFlags::AM_ZCOPY) {
        // The header counts towards max_zcopy.
        let len = LEN.min(p.attr().am.max_zcopy - 1);
        let mem = p.local_mem(len, 0);
        mem.write(0, &data[..len]).unwrap();
        let iov = [mem.iov(0, len).unwrap()];
        drop(mem);
        let (c, fired, st) = counting();
        let r = p.retry("am_zcopy", || ep.am_zcopy(ID, b"h", &iov, Some(&c)));
        drop(iov);
        drop(c);
        finish(&p, "am_zcopy", r, &fired, &st);
        p.wait_msgs(&rec, 1, "am_zcopy");
        let mut want = b"h".to_vec();
        want.extend_from_slice(&data[..len]);
        assert_bytes(
            &format!("[{}] am_zcopy from dropped memory", p.name()),
            &rec.borrow()[0],
            &want,
        );
        // Without any completion: the interface keeps the memory alive itself.
        let mem = p.local_mem(len, 0);
        mem.write(0, &data[..len]).unwrap();
        let iov = [mem.iov(0, len).unwrap()];
        drop(mem);
        let _ = p
            .retry("am_zcopy without completion", || {
                ep.am_zcopy(ID, b"h", &iov, None)
            })
            .unwrap();
        drop(iov);
        p.wait_msgs(&rec, 2, "am_zcopy");
        assert_bytes(
            &format!("[{}] am_zcopy without completion", p.name()),
            &rec.borrow()[1],
            &want,
        );
        ran = true;
    }
    let r = p.remote_mem(LEN, 0);
    if f.contains(IfaceFlags::PUT_ZCOPY) {
        let len = LEN.min(p.attr().put.max_zcopy);
        let mem = p.local_mem(len, 0);
        mem.write(0, &data[..len]).unwrap();
        let iov = [mem.whole()];
        drop(mem);
        let (c, fired, st) = counting();
        let res = p.retry("put_zcopy", || ep.put_zcopy(&iov, r.addr(0), &r.rkey, Some(&c)));
        drop((iov, c));
        finish(&p, "put_zcopy", res, &fired, &st);
        let mut got = vec![0; len];
        p.wait_for("put_zcopy data", || {
            r.mem.read(0, &mut got).unwrap();
            got == data[..len]
        });
        ran = true;
    }
    if f.contains(IfaceFlags::GET_ZCOPY) {
        let len = LEN.min(p.attr().get.max_zcopy);
        r.mem.write(0, &data[..len]).unwrap();
        let mem = p.local_mem(len, 0);
        let iov = [mem.whole()];
        drop(mem);
        let (c, fired, st) = counting();
        let res = p.retry("get_zcopy", || ep.get_zcopy(&iov, r.addr(0), &r.rkey, Some(&c)));
        drop((iov, c));
        finish(&p, "get_zcopy into dropped memory", res, &fired, &st);
        ran = true;
    }
    if !ran {
        p.skip("zcopy lifetime: no zcopy operation");
    }
}

fn fetch_result_dropped_before_completion(s: &Setup) {
    let p = s.pair();
    let ep = p.ep().clone();
    let r = p.remote_mem(64, 0);
    let mut ran = false;
    for (w, caps) in [
        (AtomicWidth::U32, p.attr().atomic32),
        (AtomicWidth::U64, p.attr().atomic64),
    ] {
        if !caps.fop_flags.contains(AtomicOp::Add.flag()) {
            continue;
        }
        let result = AtomicResult::new();
        let (c, fired, st) = counting();
        let res = p.retry("atomic_fetch", || {
            ep.atomic_fetch(w, AtomicOp::Add, 1, &result, r.addr(0), &r.rkey, Some(&c))
        });
        drop((result, c));
        finish(
            &p,
            &format!("atomic_fetch {w:?} with dropped result"),
            res,
            &fired,
            &st,
        );
        ran = true;
    }
    if !ran {
        p.skip("fetch result lifetime: no fetching add");
    }
}

/// The pair (endpoints, interfaces, memory domains, workers) may be dropped with kept objects
/// still referenced elsewhere: memory registered on a domain outlives the user's Md handle.
fn mem_outlives_pair(s: &Setup) {
    let p = s.pair();
    let r = p.remote_mem(64, 3);
    let local = p.local_mem(64, 4);
    drop(p);
    assert_eq!(r.mem.to_vec(), vec![3; 64]);
    assert_eq!(local.to_vec(), vec![4; 64]);
    drop(r);
    drop(local);
}

/// Destroying an endpoint finishes its outstanding operations: their completions fire (with any
/// status), so nothing they keep alive leaks (UCX `test_uct_ep.destroy_entity_after_send`).
fn ep_destroy_completes_outstanding(s: &Setup) {
    let p = s.pair();
    if !p.attr().flags.contains(IfaceFlags::AM_ZCOPY) {
        p.skip("ep destroy with outstanding operations: no AM_ZCOPY");
        return;
    }
    p.record_am(ID);
    let (ep, back) = p.connect();
    let len = 64.min(p.attr().am.max_zcopy);
    let mem = p.local_mem(len, 5);
    let mut started = Vec::new();
    for i in 0..8 {
        let (c, fired, _st) = counting();
        let iov = [mem.iov(0, len).unwrap()];
        match ep.am_zcopy(ID, &[], &iov, Some(&c)) {
            Ok(Outcome::InProgress) => started.push((i, c, fired)),
            Ok(Outcome::Done) => {}
            Err(e) if e == Status::NoResource => {}
            Err(e) => panic!("[{}] am_zcopy #{i}: {e:?}", p.name()),
        }
    }
    drop(mem);
    drop(ep);
    drop(back);
    for (i, _c, fired) in &started {
        p.wait_for(
            &format!("completion of am_zcopy #{i} after its endpoint was destroyed"),
            || fired.get() > 0,
        );
        assert_eq!(
            fired.get(),
            1,
            "[{}] am_zcopy #{i} completed more than once",
            p.name()
        );
    }
}

conformance_test!(
    ep_destroy_completes_outstanding,
    zcopy_memory_dropped_before_completion,
    fetch_result_dropped_before_completion,
    mem_outlives_pair
);
