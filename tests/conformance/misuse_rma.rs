//! Bad RMA and atomics (UCX `test_p2p_err`): beyond the advertised limits, outside registered
//! memory, with stale rkeys, misaligned: refused (at once, through the completion, by the next
//! flush or through the error handler), with target and local memory left untouched.

use std::cell::Cell;
use std::rc::Rc;

use rucx_testkit::{Pair, Remote, Setup};
use ucs::Outcome;
use uct::{AtomicOp, AtomicResult, AtomicWidth, Completion, FlushFlags, IfaceFlags, Rkey, Status};

use crate::misuse_am::refused;

/// RMA beyond the advertised short/bcopy limits is refused.
fn rma_oversized(s: &Setup) {
    let p = s.pair();
    let (ep, n, a) = (p.ep(), p.name(), *p.attr());
    let r = p.remote_mem(64, 0);
    const CAP: usize = 1 << 20;
    if a.flags.contains(IfaceFlags::PUT_SHORT) && a.put.max_short < CAP {
        let big = vec![1u8; a.put.max_short + 1];
        let t = p.remote_mem(a.put.max_short + 1, 0);
        refused(
            &p,
            "put_short of max_short+1",
            p.retry("put_short", || ep.put_short(&big, t.addr(0), &t.rkey)),
        );
        assert!(
            t.mem.to_vec().iter().all(|&b| b == 0),
            "[{n}] refused put_short modified remote memory"
        );
    }
    if a.flags.contains(IfaceFlags::GET_SHORT) && a.get.max_short < CAP {
        let mut big = vec![1u8; a.get.max_short + 1];
        let t = p.remote_mem(a.get.max_short + 1, 0);
        refused(
            &p,
            "get_short of max_short+1",
            p.retry("get_short", || ep.get_short(&mut big, t.addr(0), &t.rkey)),
        );
    }
    if a.flags.contains(IfaceFlags::PUT_BCOPY) {
        let res = p.retry("put_bcopy", || ep.put_bcopy(|b| b.len() + 1, r.addr(0), &r.rkey));
        assert_eq!(
            res,
            Err(Status::MessageTruncated.into()),
            "[{n}] put_bcopy whose pack claims more than the buffer"
        );
    }
    if a.flags.contains(IfaceFlags::GET_BCOPY) && a.get.max_bcopy < CAP {
        let big = p.remote_mem(a.get.max_bcopy + 1, 0);
        let called = Rc::new(Cell::new(false));
        let c = called.clone();
        let res = p.retry("get_bcopy", || {
            let c = c.clone();
            ep.get_bcopy(
                a.get.max_bcopy + 1,
                big.addr(0),
                &big.rkey,
                move |_| c.set(true),
                None,
            )
        });
        refused(&p, "get_bcopy of max_bcopy+1", res);
        assert!(
            !called.get(),
            "[{n}] refused get_bcopy called its unpack callback"
        );
    }
    assert!(
        r.mem.to_vec().iter().all(|&b| b == 0),
        "[{n}] refused operations modified remote memory"
    );
}

/// Ways to point outside what the target registered.
#[derive(Clone, Copy, Debug)]
enum BadTarget {
    /// Starts inside, ends 4 bytes past the end.
    CrossesEnd,
    /// Starts 8 bytes before the region.
    BeforeStart,
    /// A valid address with the rkey of a deregistered region.
    StaleKey,
    /// Address 8 with a valid rkey.
    FarAway,
}

const BAD_TARGETS: [BadTarget; 4] = [
    BadTarget::CrossesEnd,
    BadTarget::BeforeStart,
    BadTarget::StaleKey,
    BadTarget::FarAway,
];

/// Address and rkey for `bad` over a 64-byte region `r` (8-byte accesses).
fn bad_target(p: &Pair, r: &Remote, bad: BadTarget) -> (u64, Option<Rkey>) {
    match bad {
        BadTarget::CrossesEnd => (r.addr(60), None),
        BadTarget::BeforeStart => (r.addr(0) - 8, None),
        BadTarget::FarAway => (8, None),
        BadTarget::StaleKey => {
            let gone = p.remote_mem(64, 0);
            let packed = gone.mem.pack_rkey().unwrap();
            let rkey = p.tx.md.component().rkey_unpack(&packed).unwrap();
            drop(gone);
            (r.addr(0), Some(rkey))
        }
    }
}

/// Accepts a refusal reported at once (`Err`), through the completion, or through the error
/// handler; anything else fails.
fn expect_refusal(p: &Pair, what: &str, res: uct::Result<Outcome>, comp: &Completion) {
    let n = p.name();
    match res {
        Err(e) if e == Status::NoResource => unreachable!("retried"),
        Err(_) => {}
        Ok(Outcome::InProgress) => {
            p.wait_for(&format!("{what} completion"), || comp.fired() > 0);
            assert!(
                comp.last_status().is_err(),
                "[{n}] {what}: completed with {}",
                comp.last_status()
            );
        }
        Ok(Outcome::Done) => {
            // Accepted locally: a remote transport reports the refusal later, with the next
            // flush (tcp: the endpoint keeps working) or through the error handler (rc_verbs:
            // the endpoint failed). docs/architecture.md has the table.
            let c = Completion::counter();
            let via_flush = match p.retry("flush", || p.ep().flush(FlushFlags::LOCAL, Some(&c))) {
                Err(_) => true,
                Ok(Outcome::InProgress) => {
                    p.wait_for(&format!("{what}: flush"), || c.fired() > 0);
                    c.last_status().is_err()
                }
                Ok(Outcome::Done) => false,
            };
            if via_flush {
                if p.errors().is_empty() {
                    // Reported by the flush and the endpoint lives on: it still writes.
                    let ok = p.remote_mem(8, 0);
                    p.retry("put after a refusal", || {
                        p.ep().put_short(&[7; 8], ok.addr(0), &ok.rkey)
                    })
                    .unwrap_or_else(|e| panic!("[{n}] {what}: the endpoint no longer works: {e}"));
                    p.flush_ep();
                    assert_eq!(ok.mem.to_vec(), [7; 8], "[{n}] {what}: put after the refusal");
                }
            } else {
                p.wait_for(
                    &format!("{what}: error report (the operation was accepted, the flush succeeded)"),
                    || !p.errors().is_empty(),
                );
            }
        }
    }
}

fn rma_outside_registered_memory(s: &Setup) {
    let probe = s.pair();
    let f = probe.attr().flags;
    if !f.contains(IfaceFlags::ERRHANDLE_REMOTE_MEM) {
        probe.skip("bad remote access: no ERRHANDLE_REMOTE_MEM (bad accesses are not caught)");
        return;
    }
    drop(probe);
    type Op = fn(&Pair, u64, &Rkey, &Completion) -> uct::Result<Outcome>;
    let ops: [(&str, IfaceFlags, Op); 6] = [
        ("put_short", IfaceFlags::PUT_SHORT, |p, a, k, _| {
            p.ep().put_short(&[9; 8], a, k).map(|_| Outcome::Done)
        }),
        ("put_bcopy", IfaceFlags::PUT_BCOPY, |p, a, k, _| {
            p.ep()
                .put_bcopy(
                    |b| {
                        b[..8].fill(9);
                        8
                    },
                    a,
                    k,
                )
                .map(|_| Outcome::Done)
        }),
        ("put_zcopy", IfaceFlags::PUT_ZCOPY, |p, a, k, c| {
            let m = p.local_mem(8, 9);
            p.ep().put_zcopy(&[m.whole()], a, k, Some(c))
        }),
        ("get_short", IfaceFlags::GET_SHORT, |p, a, k, _| {
            let mut b = [0x11u8; 8];
            let r = p.ep().get_short(&mut b, a, k).map(|_| Outcome::Done);
            assert!(
                r.is_ok() || b == [0x11; 8],
                "[{}] refused get_short wrote the buffer",
                p.name()
            );
            r
        }),
        ("get_bcopy", IfaceFlags::GET_BCOPY, |p, a, k, c| {
            p.ep().get_bcopy(8, a, k, |_| UNPACKED.set(true), Some(c))
        }),
        ("get_zcopy", IfaceFlags::GET_ZCOPY, |p, a, k, c| {
            let m = p.local_mem(8, 0x11);
            let r = p.ep().get_zcopy(&[m.whole()], a, k, Some(c));
            if r.is_err() {
                assert_eq!(
                    m.to_vec(),
                    [0x11; 8],
                    "[{}] refused get_zcopy wrote the buffer",
                    p.name()
                );
            }
            r
        }),
    ];
    for (name, flag, op) in ops {
        for bad in BAD_TARGETS {
            // A fresh pair each time: a remote transport may close the connection on a bad access.
            let p = s.pair();
            if !p.attr().flags.contains(flag) {
                continue;
            }
            let r = p.remote_mem(64, 0);
            let (addr, stale) = bad_target(&p, &r, bad);
            let rkey = stale.as_ref().unwrap_or(&r.rkey);
            let what = format!("{name} at {bad:?}");
            let comp = Completion::counter();
            let res = p.retry(&what, || op(&p, addr, rkey, &comp));
            expect_refusal(&p, &what, res, &comp);
            for _ in 0..100 {
                p.progress();
            }
            assert!(
                r.mem.to_vec().iter().all(|&b| b == 0),
                "[{}] {what}: target memory modified",
                p.name()
            );
            assert!(
                !UNPACKED.replace(false),
                "[{}] {what}: the unpack callback got data",
                p.name()
            );
        }
    }
}

thread_local! {
    /// Set by the unpack callback of a get_bcopy that must be refused.
    static UNPACKED: Cell<bool> = const { Cell::new(false) };
}

fn atomic_misaligned_or_outside(s: &Setup) {
    let p = s.pair();
    let a = *p.attr();
    if !a.flags.contains(IfaceFlags::ERRHANDLE_REMOTE_MEM) {
        p.skip("bad atomics: no ERRHANDLE_REMOTE_MEM");
        return;
    }
    drop(p);
    for (w, caps) in [(AtomicWidth::U32, a.atomic32), (AtomicWidth::U64, a.atomic64)] {
        let post = caps.op_flags.contains(AtomicOp::Add.flag());
        let fetch = caps.fop_flags.contains(AtomicOp::Add.flag());
        if !post && !fetch {
            s.skip(&format!("bad atomics {w:?}: no add"));
            continue;
        }
        let mut cases: Vec<(String, i64)> = vec![
            ("unaligned +1".into(), 17),
            ("unaligned +2".into(), 18),
            ("just past the end".into(), 64),
        ];
        if w == AtomicWidth::U64 {
            cases.push(("4-aligned only".into(), 20));
        }
        for (desc, off) in cases {
            let p = s.pair();
            let r = p.remote_mem(64, 0);
            let addr = r.mem.addr() + off as u64;
            let what = format!("atomic {w:?} add {desc}");
            let comp = Completion::counter();
            let res = if post {
                p.retry(&what, || {
                    p.ep()
                        .atomic_post(w, AtomicOp::Add, 1, addr, &r.rkey)
                        .map(|_| Outcome::Done)
                })
            } else {
                let out = AtomicResult::new();
                p.retry(&what, || {
                    p.ep()
                        .atomic_fetch(w, AtomicOp::Add, 1, &out, addr, &r.rkey, Some(&comp))
                })
            };
            expect_refusal(&p, &what, res, &comp);
            for _ in 0..100 {
                p.progress();
            }
            assert!(
                r.mem.to_vec().iter().all(|&b| b == 0),
                "[{}] {what}: memory modified",
                p.name()
            );
        }
    }
}

/// Garbage rkeys are refused by `rkey_unpack` when the memory domain has packed rkeys at all.
fn rkey_unpack_garbage(s: &Setup) {
    let p = s.pair();
    let len = p.tx.md.attr().rkey_packed_size;
    if len == 0 {
        p.skip("rkey_unpack: rkeys are empty for this memory domain");
        return;
    }
    let r = p.tx.md.component().rkey_unpack(&[]);
    assert!(r.is_err(), "[{}] rkey_unpack of an empty buffer: {r:?}", p.name());
}

conformance_test!(
    rma_oversized,
    rma_outside_registered_memory,
    atomic_misaligned_or_outside,
    rkey_unpack_garbage
);
