//! Atomics (UCX `test_amo_*`): post (add/and/or/xor), fetch (add/and/or/xor/swap) and cswap on
//! 32 and 64 bits, as advertised by `atomic32`/`atomic64`; checks old values, the resulting
//! memory, and that neighbouring bytes stay untouched. Operations a width does not advertise must
//! return `Unsupported`.

use rucx_testkit::{Pair, Remote, Setup};
use uct::{AtomicCaps, AtomicOp, AtomicResult, AtomicWidth, Status};

const FILL: u8 = 0xEE;
/// 8-aligned offset for 64-bit operands; 4-aligned (not 8-aligned) offset for 32-bit ones.
const OFF64: usize = 16;
const OFF32: usize = 36;

const POST_OPS: [AtomicOp; 4] = [AtomicOp::Add, AtomicOp::And, AtomicOp::Or, AtomicOp::Xor];
const FETCH_OPS: [AtomicOp; 5] = [
    AtomicOp::Add,
    AtomicOp::And,
    AtomicOp::Or,
    AtomicOp::Xor,
    AtomicOp::Swap,
];

/// (initial value, operand) pairs: mixed bits, carry across the 32-bit boundary and wrap-around.
const CASES: [(u64, u64); 4] = [
    (0xF0F0_1234_5678_9ABC, 0x0FF0_0F0F_FFFF_0001),
    (0x0000_0000_FFFF_FFFF, 1),
    (u64::MAX - 1, 3),
    (0, 0),
];

fn caps(p: &Pair, w: AtomicWidth) -> AtomicCaps {
    match w {
        AtomicWidth::U32 => p.attr().atomic32,
        AtomicWidth::U64 => p.attr().atomic64,
    }
}

fn mask(w: AtomicWidth) -> u64 {
    match w {
        AtomicWidth::U32 => u32::MAX as u64,
        AtomicWidth::U64 => u64::MAX,
    }
}

fn off(w: AtomicWidth) -> usize {
    match w {
        AtomicWidth::U32 => OFF32,
        AtomicWidth::U64 => OFF64,
    }
}

/// Writes `v` (the width's low bytes) at the width's offset of a freshly filled region.
fn init(r: &Remote, w: AtomicWidth, v: u64) {
    r.mem.fill(FILL);
    r.mem.write(off(w), &v.to_le_bytes()[..w as usize]).unwrap();
}

fn read(r: &Remote, w: AtomicWidth) -> u64 {
    let mut b = [0u8; 8];
    r.mem.read(off(w), &mut b[..w as usize]).unwrap();
    u64::from_le_bytes(b)
}

/// Checks the operand slot holds `want` and every other byte is still FILL.
fn check_memory(p: &Pair, r: &Remote, w: AtomicWidth, want: u64, what: &str) {
    assert_eq!(read(r, w), want, "[{}] {what}: memory", p.name());
    let all = r.mem.to_vec();
    let (o, l) = (off(w), w as usize);
    let bad = all
        .iter()
        .enumerate()
        .find(|(i, &b)| (*i < o || *i >= o + l) && b != FILL);
    assert!(
        bad.is_none(),
        "[{}] {what}: neighbouring byte {:?} modified",
        p.name(),
        bad.map(|b| b.0)
    );
}

fn atomic_post_ops(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let r = p.remote_mem(64, FILL);
    for w in [AtomicWidth::U32, AtomicWidth::U64] {
        let c = caps(&p, w);
        for op in POST_OPS {
            let addr = r.addr(off(w));
            if !c.op_flags.contains(op.flag()) {
                p.skip(&format!(
                    "atomic_post {op:?} {w:?} not advertised; checking Unsupported"
                ));
                assert_eq!(
                    ep.atomic_post(w, op, 1, addr, &r.rkey),
                    Err(Status::Unsupported.into()),
                    "[{n}] {op:?} {w:?}"
                );
                continue;
            }
            for (init_v, operand) in CASES {
                let (v0, x) = (init_v & mask(w), operand & mask(w));
                init(&r, w, v0);
                let what = format!("atomic_post {op:?} {w:?} {v0:#x} with {x:#x}");
                p.retry(&what, || ep.atomic_post(w, op, x, addr, &r.rkey))
                    .unwrap_or_else(|e| panic!("[{n}] {what}: {e}"));
                // Completed at the target before the next case rewrites the memory (an op that
                // leaves the value unchanged could otherwise still be in flight).
                p.quiesce();
                let want = op.apply(v0, x) & mask(w);
                p.wait_for(&what, || read(&r, w) == want);
                check_memory(&p, &r, w, want, &what);
            }
        }
        // Swap and cswap have no post form.
        for op in [AtomicOp::Swap, AtomicOp::Cswap] {
            let res = ep.atomic_post(w, op, 1, r.addr(off(w)), &r.rkey);
            assert!(
                matches!(
                    res.as_ref().map_err(|e| e.status()),
                    Err(Status::InvalidParam | Status::Unsupported)
                ),
                "[{n}] atomic_post {op:?} {w:?}: {res:?} (must be refused)"
            );
        }
    }
}

fn atomic_fetch_ops(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let r = p.remote_mem(64, FILL);
    for w in [AtomicWidth::U32, AtomicWidth::U64] {
        let c = caps(&p, w);
        for op in FETCH_OPS {
            let addr = r.addr(off(w));
            if !c.fop_flags.contains(op.flag()) {
                p.skip(&format!(
                    "atomic_fetch {op:?} {w:?} not advertised; checking Unsupported"
                ));
                let res = ep.atomic_fetch(w, op, 1, &AtomicResult::new(), addr, &r.rkey, None);
                assert_eq!(
                    res,
                    Err(Status::Unsupported.into()),
                    "[{n}] atomic_fetch {op:?} {w:?}"
                );
                continue;
            }
            for (init_v, operand) in CASES {
                let (v0, x) = (init_v & mask(w), operand & mask(w));
                init(&r, w, v0);
                let result = AtomicResult::new();
                let what = format!("atomic_fetch {op:?} {w:?} {v0:#x} with {x:#x}");
                p.complete(&what, |comp| {
                    ep.atomic_fetch(w, op, x, &result, addr, &r.rkey, Some(comp))
                });
                assert_eq!(result.get(), v0, "[{n}] {what}: fetched value");
                check_memory(&p, &r, w, op.apply(v0, x) & mask(w), &what);
            }
        }
        // Cswap has its own call.
        let res = ep.atomic_fetch(
            w,
            AtomicOp::Cswap,
            1,
            &AtomicResult::new(),
            r.addr(off(w)),
            &r.rkey,
            None,
        );
        assert!(
            res.is_err(),
            "[{n}] atomic_fetch Cswap {w:?}: {res:?} (must be refused)"
        );
    }
}

fn atomic_cswap_both_outcomes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let r = p.remote_mem(64, FILL);
    for w in [AtomicWidth::U32, AtomicWidth::U64] {
        let addr = r.addr(off(w));
        if !caps(&p, w).fop_flags.contains(AtomicOp::Cswap.flag()) {
            p.skip(&format!(
                "atomic_cswap {w:?} not advertised; checking Unsupported"
            ));
            let res = ep.atomic_cswap(w, 0, 1, &AtomicResult::new(), addr, &r.rkey, None);
            assert_eq!(res, Err(Status::Unsupported.into()), "[{n}] atomic_cswap {w:?}");
            continue;
        }
        for (init_v, operand) in CASES {
            let (v0, swap) = (init_v & mask(w), !operand & mask(w));
            for equal in [true, false] {
                let compare = if equal { v0 } else { v0 ^ 1 };
                init(&r, w, v0);
                let result = AtomicResult::new();
                let what = format!("atomic_cswap {w:?} {v0:#x} compare {compare:#x} swap {swap:#x}");
                p.complete(&what, |comp| {
                    ep.atomic_cswap(w, compare, swap, &result, addr, &r.rkey, Some(comp))
                });
                assert_eq!(result.get(), v0, "[{n}] {what}: fetched value");
                check_memory(&p, &r, w, if equal { swap } else { v0 }, &what);
            }
        }
    }
}

conformance_test!(atomic_post_ops, atomic_fetch_ops, atomic_cswap_both_outcomes);
