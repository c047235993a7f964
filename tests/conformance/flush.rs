//! Flush and fence (UCX `test_flush`, `test_fence`): local flush of an endpoint and of an
//! interface, with and without completion; when a flush completes, every operation issued
//! before it has completed, and a flush's completion fires after theirs. A fence orders a put
//! before a later get.

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::data::pattern;
use rucx_testkit::{Pair, Remote, Setup};
use ucs::Outcome;
use uct::{Completion, FlushFlags, IfaceFlags, MemIov, Status};

/// Flush without completion only reports the state: retries until it reports Done.
fn flush_until_ok(p: &Pair, what: &str, mut f: impl FnMut() -> uct::Result<Outcome>) {
    let n = p.name();
    p.wait_for(what, || match f() {
        Ok(Outcome::Done) => true,
        Ok(Outcome::InProgress) => false,
        Err(e) if e == Status::NoResource => false,
        Err(e) => panic!("[{n}] {what}: {e:?}"),
    });
}

/// The order in which completions fired: each [`FireLog::completion`] appends its entry when
/// it fires (whatever its status).
#[derive(Clone, Default)]
pub struct FireLog(Rc<RefCell<Vec<usize>>>);

impl FireLog {
    /// A completion that logs `entry` when it fires.
    pub fn completion(&self, entry: usize) -> Completion {
        let log = self.0.clone();
        Completion::new(move |_| log.borrow_mut().push(entry))
    }

    /// The entries in the order they fired.
    pub fn order(&self) -> Vec<usize> {
        self.0.borrow().clone()
    }
}

pub type Ops = Vec<(String, Completion, Outcome)>;

/// The flush's entry in the [`FireLog`] (the operations log their index in `Ops`).
pub const FLUSH: usize = usize::MAX;

/// Issues a few zcopy operations (whatever the transport has) with their own completions,
/// each logging its index in the returned `ops` when it fires. Returns them with the remote
/// memory they target, which must outlive them.
fn outstanding_ops(p: &Pair, log: &FireLog) -> (Ops, Remote) {
    let ep = p.ep();
    let flags = p.attr().flags;
    let src = p.local_mem(4096, 0);
    src.write(0, &pattern(4096, 1)).unwrap();
    let dst = p.local_mem(4096, 0);
    let r = p.remote_mem(4096, 0);
    let len = |max: usize| max.min(4096);
    let mut ops = Vec::new();
    for i in 0..8 {
        let mut issue = |what: &str, f: &dyn Fn(&Completion) -> uct::Result<Outcome>| {
            let c = log.completion(ops.len());
            let st = p
                .retry(what, || f(&c))
                .unwrap_or_else(|e| panic!("[{}] {what}: {e}", p.name()));
            ops.push((format!("{what} #{i}"), c, st));
        };
        if flags.contains(IfaceFlags::AM_ZCOPY) {
            let iov: [MemIov; 1] = [src.iov(0, len(p.attr().am.max_zcopy)).unwrap()];
            // (No header: it would count towards max_zcopy.)
            issue("am_zcopy", &|c| ep.am_zcopy(3, &[], &iov, Some(c)));
        }
        if flags.contains(IfaceFlags::PUT_ZCOPY) {
            let iov = [src.iov(0, len(p.attr().put.max_zcopy)).unwrap()];
            issue("put_zcopy", &|c| ep.put_zcopy(&iov, r.addr(0), &r.rkey, Some(c)));
        }
        if flags.contains(IfaceFlags::GET_ZCOPY) {
            let iov = [dst.iov(0, len(p.attr().get.max_zcopy)).unwrap()];
            issue("get_zcopy", &|c| ep.get_zcopy(&iov, r.addr(0), &r.rkey, Some(c)));
        }
    }
    (ops, r)
}

fn check_done(p: &Pair, ops: &[(String, Completion, Outcome)], flush: &str) {
    for (what, c, st) in ops {
        if *st == Outcome::InProgress {
            assert_eq!(
                c.fired(),
                1,
                "[{}] {what} not completed when the {flush} completed",
                p.name()
            );
            assert_eq!(c.last_status(), Status::Ok, "[{}] {what}", p.name());
        }
    }
}

/// A flush that fired its completion did so after every operation's completion: a user who
/// frees buffers in the flush's callback must find all of them released. (Checking only that
/// they have fired by the time the caller sees the flush done would let a transport fire them
/// later in the same progress call.)
pub fn check_order(name: &str, ops: &Ops, log: &FireLog, flush: &str) {
    let log = log.order();
    let Some(at) = log.iter().position(|&e| e == FLUSH) else {
        return; // the flush returned Ok at once: `check_done` saw every operation done
    };
    for (i, (what, _, st)) in ops.iter().enumerate() {
        if *st == Outcome::InProgress {
            assert!(
                log[..at].contains(&i),
                "[{name}] the {flush}'s completion fired before {what}'s (order fired: {:?})",
                log.iter()
                    .map(|&e| if e == FLUSH {
                        "flush".to_string()
                    } else {
                        ops[e].0.clone()
                    })
                    .collect::<Vec<_>>()
            );
        }
    }
}

fn flush_ep(s: &Setup) {
    let p = s.pair();
    p.record_am(3);
    let ep = p.ep().clone();
    flush_until_ok(&p, "idle ep flush without completion", || {
        ep.flush(FlushFlags::LOCAL, None)
    });
    p.complete("idle ep flush", |c| ep.flush(FlushFlags::LOCAL, Some(c)));
    let log = FireLog::default();
    let (ops, _r) = outstanding_ops(&p, &log);
    if ops.is_empty() {
        p.skip("flush_ep: no zcopy operation to flush");
    }
    let what = "ep flush after zcopy operations";
    let c = log.completion(FLUSH);
    let r = p.retry(what, || ep.flush(FlushFlags::LOCAL, Some(&c)));
    p.check_completion(what, &c, r);
    check_done(&p, &ops, "ep flush");
    check_order(p.name(), &ops, &log, "ep flush");
    let (ops, _r) = outstanding_ops(&p, &FireLog::default());
    flush_until_ok(&p, "ep flush without completion", || {
        ep.flush(FlushFlags::LOCAL, None)
    });
    check_done(&p, &ops, "ep flush without completion");
}

fn flush_iface(s: &Setup) {
    let p = s.pair();
    p.record_am(3);
    let iface = p.tx.iface.clone();
    flush_until_ok(&p, "idle iface flush without completion", || {
        iface.flush(FlushFlags::LOCAL, None)
    });
    let log = FireLog::default();
    let (ops, _r) = outstanding_ops(&p, &log);
    let c = log.completion(FLUSH);
    let r = p.retry("iface flush", || iface.flush(FlushFlags::LOCAL, Some(&c)));
    if r == Err(Status::Unsupported.into()) {
        // UCX's tcp has no iface flush with completion either.
        p.skip("iface flush with a completion is Unsupported; flushing without");
        flush_until_ok(&p, "iface flush without completion", || {
            iface.flush(FlushFlags::LOCAL, None)
        });
    } else {
        p.check_completion("iface flush after zcopy operations", &c, r);
    }
    check_done(&p, &ops, "iface flush");
    check_order(p.name(), &ops, &log, "iface flush");
}

/// `fence` succeeds on endpoint and interface, and orders a put before a following get.
fn fence_orders_put_then_get(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    assert_eq!(ep.fence(), Ok(()), "[{n}] ep fence");
    assert_eq!(p.tx.iface.fence(), Ok(()), "[{n}] iface fence");
    let f = p.attr().flags;
    let put = f.contains(IfaceFlags::PUT_SHORT) && p.attr().put.max_short >= 8;
    let get = f.contains(IfaceFlags::GET_BCOPY) && p.attr().get.max_bcopy >= 8;
    if !put || !get {
        p.skip("fence ordering: needs put_short and get_bcopy of 8 bytes");
        return;
    }
    let r = p.remote_mem(64, 0);
    for i in 0..50u64 {
        let v = (i * 0x0101_0101_0101_0101) ^ 0xA5;
        p.retry("put_short", || ep.put_short(&v.to_le_bytes(), r.addr(8), &r.rkey))
            .unwrap();
        assert_eq!(ep.fence(), Ok(()), "[{n}] ep fence");
        let got = std::rc::Rc::new(std::cell::Cell::new(None));
        let g = got.clone();
        p.complete("get_bcopy after fence", |c| {
            let g = g.clone();
            ep.get_bcopy(
                8,
                r.addr(8),
                &r.rkey,
                move |d| g.set(Some(u64::from_le_bytes(d.try_into().unwrap()))),
                Some(c),
            )
        });
        assert_eq!(
            got.get(),
            Some(v),
            "[{n}] get after fence did not see the put before it (round {i})"
        );
    }
}

conformance_test!(flush_ep, flush_iface, fence_orders_put_then_get);
