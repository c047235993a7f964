//! Remote keys of memory the target released: every put, get and atomic with them is refused
//! (at once, through its completion, by the next flush or through the error handler), and the
//! released memory is never touched. Runs on every target that does RMA or atomics, the
//! hardware ones included (no `ERRHANDLE_REMOTE_MEM` gate: a transport that cannot refuse
//! fails here).
//!
//! The released memory stays ours: [`Mem::into_vec`] deregisters and hands the buffer back at
//! the same address, so a write through the stale key would show. A second round drops the
//! registration (freeing the buffer) and registers a fresh buffer of the same size, which the
//! allocator usually places at the same address.

use rucx_testkit::Pair;
use rucx_testkit::Setup;
use ucs::Outcome;
use uct::{
    AtomicOp, AtomicResult, AtomicWidth, Completion, FlushFlags, IfaceFlags, Mem, MemAccess, Rkey, Status,
};

const LEN: usize = 64;
const FILL: u8 = 0xa5;

type Op = fn(&Pair, u64, &Rkey, &Completion) -> uct::Result<Outcome>;

/// The operations, each with the interface flag it needs.
fn ops(p: &Pair) -> Vec<(&'static str, Op)> {
    let a = p.attr();
    let f = a.flags;
    let base: [(&'static str, IfaceFlags, Op); 6] = [
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
                "[{}] refused get_short wrote",
                p.name()
            );
            r
        }),
        ("get_bcopy", IfaceFlags::GET_BCOPY, |p, a, k, c| {
            let n = p.name();
            p.ep().get_bcopy(
                8,
                a,
                k,
                move |_| panic!("[{n}] stale get_bcopy got data"),
                Some(c),
            )
        }),
        ("get_zcopy", IfaceFlags::GET_ZCOPY, |p, a, k, c| {
            let m = p.local_mem(8, 0x11);
            let r = p.ep().get_zcopy(&[m.whole()], a, k, Some(c));
            if !matches!(r, Ok(Outcome::InProgress)) {
                assert_eq!(m.to_vec(), [0x11; 8], "[{}] refused get_zcopy wrote", p.name());
            }
            r
        }),
    ];
    let mut v: Vec<(&'static str, IfaceFlags, Op)> = base
        .into_iter()
        .filter(|(_, flag, _)| f.contains(*flag))
        .collect();
    for (w, caps) in [(AtomicWidth::U64, a.atomic64), (AtomicWidth::U32, a.atomic32)] {
        let add = AtomicOp::Add.flag();
        let (post, fetch, cswap): (Op, Op, Op) = match w {
            AtomicWidth::U64 => (
                |p, a, k, _| {
                    p.ep()
                        .atomic_post(AtomicWidth::U64, AtomicOp::Add, 1, a, k)
                        .map(|_| Outcome::Done)
                },
                |p, a, k, c| {
                    let out = Box::leak(Box::new(AtomicResult::new()));
                    p.ep()
                        .atomic_fetch(AtomicWidth::U64, AtomicOp::Add, 1, out, a, k, Some(c))
                },
                |p, a, k, c| {
                    let out = Box::leak(Box::new(AtomicResult::new()));
                    let cmp = u64::from_ne_bytes([FILL; 8]);
                    p.ep().atomic_cswap(AtomicWidth::U64, cmp, 1, out, a, k, Some(c))
                },
            ),
            AtomicWidth::U32 => (
                |p, a, k, _| {
                    p.ep()
                        .atomic_post(AtomicWidth::U32, AtomicOp::Add, 1, a, k)
                        .map(|_| Outcome::Done)
                },
                |p, a, k, c| {
                    let out = Box::leak(Box::new(AtomicResult::new()));
                    p.ep()
                        .atomic_fetch(AtomicWidth::U32, AtomicOp::Add, 1, out, a, k, Some(c))
                },
                |p, a, k, c| {
                    let out = Box::leak(Box::new(AtomicResult::new()));
                    let cmp = u32::from_ne_bytes([FILL; 4]) as u64;
                    p.ep().atomic_cswap(AtomicWidth::U32, cmp, 1, out, a, k, Some(c))
                },
            ),
        };
        let names = match w {
            AtomicWidth::U64 => ["atomic_post 64", "atomic_fetch 64", "atomic_cswap 64"],
            AtomicWidth::U32 => ["atomic_post 32", "atomic_fetch 32", "atomic_cswap 32"],
        };
        if caps.op_flags.contains(add) {
            v.push((names[0], IfaceFlags::EMPTY, post));
        }
        if caps.fop_flags.contains(add) {
            v.push((names[1], IfaceFlags::EMPTY, fetch));
        }
        if caps.fop_flags.contains(AtomicOp::Cswap.flag()) {
            v.push((names[2], IfaceFlags::EMPTY, cswap));
        }
    }
    v.into_iter().map(|(n, _, op)| (n, op)).collect()
}

/// A region registered on the receiver, its key unpacked by the sender.
fn register(p: &Pair) -> (Mem, Rkey) {
    let n = p.name();
    let mem = Mem::register(&p.rx.md, vec![FILL; LEN], MemAccess::ALL)
        .unwrap_or_else(|e| panic!("[{n}] Mem::register: {e}"));
    let packed = mem.pack_rkey().unwrap();
    let rkey =
        p.tx.md
            .component()
            .rkey_unpack(&packed)
            .unwrap_or_else(|e| panic!("[{n}] rkey_unpack: {e}"));
    (mem, rkey)
}

/// Accepts a refusal reported at once (`Err`), through the operation's completion, by the next
/// flush or through the error handler (the endpoint may fail: rc_verbs); a success fails.
fn expect_refusal(p: &Pair, what: &str, res: uct::Result<Outcome>, comp: &Completion) {
    let n = p.name();
    let failed = || !p.errors().is_empty();
    match res {
        Err(e) => assert_ne!(e, Status::NoResource, "[{n}] {what}: retried"),
        Ok(Outcome::InProgress) => {
            p.wait_for(&format!("{what}: completion"), || comp.fired() > 0 || failed());
            if comp.fired() > 0 {
                let st = comp.last_status();
                assert!(st.is_err(), "[{n}] {what}: completed with {st}");
            }
        }
        Ok(Outcome::Done) => {
            let c = Completion::counter();
            let flushed = match p.retry("flush", || p.ep().flush(FlushFlags::LOCAL, Some(&c))) {
                Err(_) => return,
                Ok(Outcome::InProgress) => {
                    p.wait_for(&format!("{what}: flush"), || c.fired() > 0 || failed());
                    c.fired() > 0 && !c.last_status().is_err()
                }
                Ok(Outcome::Done) => true,
            };
            if flushed {
                p.wait_for(
                    &format!("{what}: an error report (the operation and the flush succeeded)"),
                    failed,
                );
            }
        }
    }
}

fn settle(p: &Pair) {
    for _ in 0..100 {
        p.progress();
    }
}

fn rma_after_release(s: &Setup) {
    let probe = s.pair();
    let all = ops(&probe);
    if all.is_empty() {
        let (mem, rkey) = register(&probe);
        let r = probe.ep().put_short(&[0; 8], mem.addr(), &rkey);
        assert_eq!(r, Err(Status::Unsupported.into()), "[{}] put_short", probe.name());
        probe.skip("stale keys: no put, get or atomic");
        return;
    }
    drop(probe);
    for (name, op) in all {
        // A fresh pair each time: a transport may close the endpoint on a bad access.
        let p = s.pair();
        let n = p.name();
        // Released, the buffer still ours (at the same address).
        let (mem, rkey) = register(&p);
        let addr = mem.addr();
        let released = mem.into_vec().unwrap_or_else(|_| panic!("[{n}] into_vec"));
        assert_eq!(released.as_ptr() as u64, addr);
        let what = format!("{name} with the key of released memory");
        let comp = Completion::counter();
        let res = p.retry(&what, || op(&p, addr, &rkey, &comp));
        expect_refusal(&p, &what, res, &comp);
        settle(&p);
        assert!(
            released.iter().all(|&b| b == FILL),
            "[{n}] {what}: the released memory was written"
        );
        drop(rkey);

        // Freed, and fresh memory mapped in its place (usually at the same address).
        let p = s.pair();
        let (mem, rkey) = register(&p);
        let addr = mem.addr();
        drop(mem);
        let fresh = Mem::register(&p.rx.md, vec![FILL; LEN], MemAccess::ALL).unwrap();
        let what = format!("{name} with the key of freed memory");
        let comp = Completion::counter();
        let res = p.retry(&what, || op(&p, addr, &rkey, &comp));
        expect_refusal(&p, &what, res, &comp);
        settle(&p);
        assert!(
            fresh.to_vec().iter().all(|&b| b == FILL),
            "[{n}] {what}: memory mapped after the release was written (same address: {})",
            fresh.addr() == addr
        );
    }
}

conformance_test!(rma_after_release);
