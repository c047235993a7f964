//! The pending queue (UCX `test_pending`): `Busy` while resources are free; after `NoResource`
//! requests queue, dispatch in order, dispatch stops at the first request that runs out of
//! resources again, sends never overtake queued requests, and purge hands every request back.
//!
//! Transports that never run out of resources (self) exercise the `Busy` path and the purge
//! of an empty queue; the rest is skipped with a note.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use rucx_testkit::{Pair, Setup, DEADLINE};
use uct::{Ep, EpKey, IfaceFlags, PendingRequest, PendingResult, Status};

const ID: u8 = 11;
/// Sends attempted without progress before concluding the transport never runs out.
const FILL_LIMIT: u64 = 10_000;
const FILL_BYTES: usize = 4096;

/// Sends message `seq` (am_bcopy of up to FILL_BYTES, or am_short): 8-byte seq, then filler.
fn send(p: &Pair, ep: &Ep, seq: u64) -> uct::Result<()> {
    send_with(How::of(p), ep, seq)
}

/// What [`send_with`] sends; copied into pending requests (which cannot borrow the Pair).
#[derive(Clone, Copy)]
struct How {
    bcopy_len: Option<usize>,
}

impl How {
    fn of(p: &Pair) -> How {
        let a = p.attr();
        let bcopy = a.flags.contains(IfaceFlags::AM_BCOPY) && a.am.max_bcopy >= 8;
        How {
            bcopy_len: bcopy.then(|| a.am.max_bcopy.min(FILL_BYTES)),
        }
    }
}

fn send_with(how: How, ep: &Ep, seq: u64) -> uct::Result<()> {
    match how.bcopy_len {
        Some(len) => ep
            .am_bcopy(ID, |b| {
                b[..8].copy_from_slice(&seq.to_le_bytes());
                b[8..len].fill(seq as u8);
                len
            })
            .map(|_| ()),
        None => ep.am_short(ID, seq, &[seq as u8; 8]),
    }
}

/// Records the sequence numbers the receiver gets (checking each message's filler).
fn receiver(p: &Pair) -> (Rc<RefCell<Vec<u64>>>, Rc<Cell<usize>>) {
    let seqs: Rc<RefCell<Vec<u64>>> = Rc::default();
    let corrupt = Rc::new(Cell::new(0));
    let (s, c) = (seqs.clone(), corrupt.clone());
    p.rx.iface
        .set_am_handler(ID, p.am_flags(), move |m| {
            let d = m.data();
            let seq = u64::from_le_bytes(d[..8].try_into().unwrap());
            if d[8..].iter().any(|&b| b != seq as u8) {
                c.set(c.get() + 1);
            }
            s.borrow_mut().push(seq);
        })
        .unwrap();
    (seqs, corrupt)
}

/// Sends until the endpoint answers `NoResource`, without progress. `None` if it never did.
fn fill(p: &Pair, ep: &Ep, seq: &mut u64) -> Option<u64> {
    let n = p.name();
    for i in 0..FILL_LIMIT {
        match send(p, ep, *seq) {
            Ok(()) => *seq += 1,
            Err(e) if e == Status::NoResource => return Some(i),
            Err(e) => panic!("[{n}] filling the send resources, message {i}: {e}"),
        }
    }
    None
}

/// Makes sure the endpoint is connected and idle (first send succeeded, everything delivered).
fn warm_up(p: &Pair, seq: &mut u64, got: &Rc<RefCell<Vec<u64>>>) {
    let ep = p.ep();
    p.retry("warm-up send", || send(p, ep, *seq))
        .unwrap_or_else(|e| panic!("[{}] warm-up send: {e}", p.name()));
    *seq += 1;
    p.wait_for("warm-up delivery", || got.borrow().len() as u64 == *seq);
    p.flush_ep();
}

fn check_received(p: &Pair, got: &Rc<RefCell<Vec<u64>>>, corrupt: &Cell<usize>, total: u64) {
    p.wait_for(&format!("{total} messages"), || {
        got.borrow().len() as u64 >= total
    });
    let want: Vec<u64> = (0..total).collect();
    assert_eq!(
        *got.borrow(),
        want,
        "[{}] messages lost, duplicated or reordered",
        p.name()
    );
    assert_eq!(corrupt.get(), 0, "[{}] corrupt messages", p.name());
}

fn pending_busy_when_resources_free(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let ran = Rc::new(Cell::new(0));
    let r = ran.clone();
    let req = PendingRequest::new(move |_: &Ep| {
        r.set(r.get() + 1);
        PendingResult::Done
    });
    if !p.supports(IfaceFlags::PENDING, "pending") {
        match ep.pending_add(req) {
            Err((e, _)) if e == Status::Unsupported => return,
            Err((e, _)) => panic!("[{n}] pending_add without PENDING: {e} instead of Unsupported"),
            Ok(()) => panic!("[{n}] pending_add without PENDING queued the request"),
        }
    }
    let (got, corrupt) = receiver(&p);
    let mut seq = 0;
    warm_up(&p, &mut seq, &got);
    match ep.pending_add(req) {
        Err((e, mut req)) if e == Status::Busy => {
            assert_eq!(ran.get(), 0, "[{n}] the transport ran a request it handed back");
            assert_eq!(
                req.run(ep),
                PendingResult::Done,
                "[{n}] the handed-back request is not ours"
            );
            assert_eq!(ran.get(), 1, "[{n}] the handed-back request is not ours");
        }
        Err((e, _)) => panic!("[{n}] pending_add with free resources: {e} instead of Busy"),
        Ok(()) => panic!("[{n}] pending_add queued a request although resources are free (must answer Busy)"),
    }
    let mut purged = 0;
    ep.pending_purge(|_| purged += 1);
    assert_eq!(purged, 0, "[{n}] purge of an empty queue handed back requests");
    // The endpoint still works.
    p.retry("send after purge", || send(&p, ep, seq)).unwrap();
    check_received(&p, &got, &corrupt, seq + 1);
}

fn pending_dispatch_in_order(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.attr().flags.contains(IfaceFlags::PENDING) {
        p.skip("pending dispatch: no PENDING (Unsupported checked elsewhere)");
        return;
    }
    let (got, corrupt) = receiver(&p);
    let mut seq = 0;
    warm_up(&p, &mut seq, &got);
    let Some(sent) = fill(&p, ep, &mut seq) else {
        p.skip(&format!(
            "pending dispatch: never ran out of resources in {FILL_LIMIT} sends"
        ));
        return;
    };
    assert!(sent > 0, "[{n}] NoResource on an idle endpoint");
    assert_eq!(
        send(&p, ep, seq),
        Err(Status::NoResource.into()),
        "[{n}] send right after NoResource"
    );
    const R: u64 = 100;
    // (request, what it returned), in call order.
    let log: Rc<RefCell<Vec<(u64, Status)>>> = Rc::default();
    let done = Rc::new(Cell::new(0u64));
    for j in 0..R {
        let (log, done, how) = (log.clone(), done.clone(), How::of(&p));
        let my_seq = seq + j;
        // The callback sends on the endpoint it gets: the one the request was added on.
        let req = PendingRequest::new(move |ep: &Ep| {
            let st = match send_with(how, ep, my_seq) {
                Ok(()) => Status::Ok,
                Err(e) => e.status(),
            };
            log.borrow_mut().push((j, st));
            match st {
                Status::Ok => {
                    done.set(done.get() + 1);
                    PendingResult::Done
                }
                Status::NoResource => PendingResult::Stop,
                // Dropped: the checks below report it.
                _ => PendingResult::Done,
            }
        });
        if let Err((e, _)) = ep.pending_add(req) {
            panic!("[{n}] pending_add #{j} after NoResource: {e} (must queue)");
        }
    }
    seq += R;
    let start = Instant::now();
    let probe = |when: &str| {
        if done.get() < R {
            // While requests are queued nothing may overtake them, even when resources are free.
            let r = send(&p, ep, u64::MAX);
            assert_eq!(
                r,
                Err(Status::NoResource.into()),
                "[{n}] a send overtook queued pending requests ({when})"
            );
        }
    };
    while done.get() < R {
        assert!(
            start.elapsed() < DEADLINE,
            "[{n}] pending requests not dispatched after {DEADLINE:?}: {:?}",
            log.borrow()
        );
        // The receiver alone first: resources may free up before the sender's progress runs
        // the queue, which is when an overtaking send would slip through.
        p.rx.worker.progress();
        probe("after receiver progress");
        p.progress();
        probe("after progress");
    }
    let log = log.borrow();
    let stops = log
        .iter()
        .filter(|e| !matches!(e.1, Status::Ok | Status::InProgress))
        .count();
    println!(
        "[{n}] {} dispatch calls, {stops} stopped on NoResource",
        log.len()
    );
    assert_eq!(
        log.first().map(|e| e.0),
        Some(0),
        "[{n}] first dispatched request"
    );
    for w in log.windows(2) {
        let ((a, st), (b, _)) = (w[0], w[1]);
        match st {
            Status::Ok => assert_eq!(b, a + 1, "[{n}] dispatch order: {log:?}"),
            Status::InProgress => {}
            _ => assert_eq!(
                b, a,
                "[{n}] dispatch went on after a request returned {st}: {log:?}"
            ),
        }
    }
    let oks: Vec<u64> = log.iter().filter(|e| e.1 == Status::Ok).map(|e| e.0).collect();
    assert_eq!(
        oks,
        (0..R).collect::<Vec<_>>(),
        "[{n}] requests completed: {log:?}"
    );
    check_received(&p, &got, &corrupt, seq);
    // The queue drained and the endpoint flushed: resources are free again.
    p.flush_ep();
    match ep.pending_add(PendingRequest::new(|_: &Ep| PendingResult::Done)) {
        Err((e, _)) if e == Status::Busy => {}
        other => panic!(
            "[{n}] pending_add once the queue drained: {:?} instead of Busy",
            other.err().map(|e| e.0)
        ),
    }
}

fn pending_purge_hands_back_all(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.attr().flags.contains(IfaceFlags::PENDING) {
        p.skip("pending purge: no PENDING (Unsupported checked elsewhere)");
        return;
    }
    let (got, corrupt) = receiver(&p);
    let mut seq = 0;
    warm_up(&p, &mut seq, &got);
    if fill(&p, ep, &mut seq).is_none() {
        p.skip(&format!(
            "pending purge: never ran out of resources in {FILL_LIMIT} sends"
        ));
        return;
    }
    let ran: Rc<RefCell<Vec<u64>>> = Rc::default();
    let token = Rc::new(());
    for j in 0..5u64 {
        let (r, t) = (ran.clone(), token.clone());
        let req = PendingRequest::new(move |_: &Ep| {
            let _ = &t;
            r.borrow_mut().push(j);
            PendingResult::Done
        });
        if let Err((e, _)) = ep.pending_add(req) {
            panic!("[{n}] pending_add #{j} after NoResource: {e}");
        }
    }
    let mut back = Vec::new();
    ep.pending_purge(|r| back.push(r));
    assert!(
        ran.borrow().is_empty(),
        "[{n}] requests ran before the purge: {:?}",
        ran.borrow()
    );
    assert_eq!(
        back.len(),
        5,
        "[{n}] purge handed back {} of 5 requests",
        back.len()
    );
    for r in &mut back {
        assert_eq!(r.run(ep), PendingResult::Done);
    }
    assert_eq!(
        *ran.borrow(),
        vec![0, 1, 2, 3, 4],
        "[{n}] purge order (queue order expected)"
    );
    drop(back);
    assert_eq!(Rc::strong_count(&token), 1, "[{n}] purged requests leaked");
    let mut again = 0;
    ep.pending_purge(|_| again += 1);
    assert_eq!(again, 0, "[{n}] second purge handed back requests");
    // The queue is empty: sends work again once resources free up.
    p.retry("send after purge", || send(&p, ep, seq)).unwrap();
    check_received(&p, &got, &corrupt, seq + 1);
}

/// Dropping an endpoint with queued requests releases them (Ep's drop purges).
fn pending_released_on_ep_destroy(s: &Setup) {
    let p = s.pair();
    if !p.attr().flags.contains(IfaceFlags::PENDING) {
        p.skip("pending on ep destroy: no PENDING");
        return;
    }
    let (got, _corrupt) = receiver(&p);
    let (ep2, back2) = p.connect();
    let mut seq = 0;
    p.retry("warm-up", || send(&p, &ep2, seq)).unwrap();
    seq += 1;
    p.wait_for("warm-up delivery", || !got.borrow().is_empty());
    if fill(&p, &ep2, &mut seq).is_none() {
        p.skip("pending on ep destroy: never ran out of resources");
        return;
    }
    let token = Rc::new(());
    for _ in 0..3 {
        let t = token.clone();
        let req = PendingRequest::new(move |_: &Ep| {
            let _ = &t;
            PendingResult::Done
        });
        assert!(
            ep2.pending_add(req).is_ok(),
            "[{}] pending_add after NoResource",
            p.name()
        );
    }
    drop(ep2);
    drop(back2);
    assert_eq!(
        Rc::strong_count(&token),
        1,
        "[{}] queued requests not released by ep destroy",
        p.name()
    );
}

/// A queued request's callback gets the endpoint it was added on (here a second endpoint of
/// the interface, not the pair's first one) and sends on it: no endpoint captured in the
/// callback.
fn pending_callback_gets_its_endpoint(s: &Setup) {
    let p = s.pair();
    let n = p.name();
    if !p.attr().flags.contains(IfaceFlags::PENDING) {
        p.skip("pending callback's endpoint: no PENDING");
        return;
    }
    let (got, corrupt) = receiver(&p);
    let (ep2, _back2) = p.connect();
    let mut seq = 0;
    p.retry("warm-up send", || send(&p, &ep2, seq))
        .unwrap_or_else(|e| panic!("[{n}] warm-up send: {e}"));
    seq += 1;
    p.wait_for("warm-up delivery", || got.borrow().len() == 1);
    if fill(&p, &ep2, &mut seq).is_none() {
        p.skip(&format!(
            "pending callback's endpoint: never ran out of resources in {FILL_LIMIT} sends"
        ));
        return;
    }
    const R: u64 = 20;
    let keys: Rc<RefCell<Vec<EpKey>>> = Rc::default();
    let failed: Rc<RefCell<Vec<String>>> = Rc::default();
    let done = Rc::new(Cell::new(0u64));
    for j in 0..R {
        let (keys, failed, done, how) = (keys.clone(), failed.clone(), done.clone(), How::of(&p));
        let my_seq = seq + j;
        let req = PendingRequest::new(move |ep: &Ep| {
            keys.borrow_mut().push(ep.key());
            match send_with(how, ep, my_seq) {
                Ok(()) => {
                    done.set(done.get() + 1);
                    PendingResult::Done
                }
                Err(e) if e == Status::NoResource => PendingResult::Stop,
                Err(e) => {
                    failed.borrow_mut().push(format!("request {j}: {e}"));
                    PendingResult::Done
                }
            }
        });
        if let Err((e, _)) = ep2.pending_add(req) {
            panic!("[{n}] pending_add #{j} after NoResource: {e} (must queue)");
        }
    }
    seq += R;
    p.wait_for("pending requests re-sent from their callbacks", || {
        done.get() + failed.borrow().len() as u64 == R
    });
    assert!(failed.borrow().is_empty(), "[{n}] {:?}", failed.borrow());
    let keys = keys.borrow();
    assert!(!keys.is_empty(), "[{n}] no callback ran");
    assert!(
        keys.iter().all(|&k| k == ep2.key()),
        "[{n}] callbacks got endpoints {keys:?}, not the one they were added on ({:?}; the \
         pair's first is {:?})",
        ep2.key(),
        p.ep().key()
    );
    check_received(&p, &got, &corrupt, seq);
}

/// A send on an endpoint whose connection is not up yet answers `NoResource`; a request queued
/// then runs once the connection is up, and its message arrives. Transports whose endpoints
/// can send at once skip the queueing (with a note).
fn pending_before_connected(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.attr().flags.contains(IfaceFlags::PENDING) {
        p.skip("pending before connected: no PENDING");
        return;
    }
    let (got, corrupt) = receiver(&p);
    // No progress since the endpoint was created.
    match send(&p, ep, 0) {
        Ok(()) => {
            p.skip("pending before connected: the endpoint sent at once");
            check_received(&p, &got, &corrupt, 1);
            return;
        }
        Err(e) if e == Status::NoResource => {}
        Err(e) => panic!("[{n}] first send on a new endpoint: {e}"),
    }
    let how = How::of(&p);
    let req = PendingRequest::new(move |ep: &Ep| match send_with(how, ep, 0) {
        Ok(()) => PendingResult::Done,
        Err(e) if e == Status::NoResource => PendingResult::Stop,
        Err(_) => PendingResult::Done,
    });
    if let Err((e, _)) = ep.pending_add(req) {
        panic!("[{n}] pending_add while connecting: {e} (must queue)");
    }
    check_received(&p, &got, &corrupt, 1);
}

conformance_test!(
    pending_before_connected,
    pending_busy_when_resources_free,
    pending_dispatch_in_order,
    pending_purge_hands_back_all,
    pending_released_on_ep_destroy,
    pending_callback_gets_its_endpoint
);
