//! Atomics: every op and width, fetched and posted, against expected values; 32-bit ops leave
//! the neighbouring bytes alone; misuse refused; many fetch-adds in flight at once. Each test
//! runs with the lane's own ops and with `RUCX_ATOMIC_EMULATE=y` (compare-and-swap rounds,
//! what a lane without the op gets). ud_verbs has no atomics: the API says `Unsupported`.

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{AtomicOp, AtomicWidth, Issued, MemHandle};

use crate::harness::{Pair, Setup};
use crate::rma::{pair, target, wait};
use crate::ucp_test;

const OPS: [AtomicOp; 5] = [
    AtomicOp::Add,
    AtomicOp::And,
    AtomicOp::Or,
    AtomicOp::Xor,
    AtomicOp::Swap,
];

fn expect(op: AtomicOp, old: u64, v: u64, m: u64) -> u64 {
    (match op {
        AtomicOp::Add => old.wrapping_add(v),
        AtomicOp::And => old & v,
        AtomicOp::Or => old | v,
        AtomicOp::Xor => old ^ v,
        AtomicOp::Swap => v,
        AtomicOp::Cswap => unreachable!(),
    }) & m
}

fn store(mem: &MemHandle, off: usize, w: AtomicWidth, v: u64) {
    match w {
        AtomicWidth::U32 => mem.write(off, &(v as u32).to_le_bytes()).unwrap(),
        AtomicWidth::U64 => mem.write(off, &v.to_le_bytes()).unwrap(),
    }
}

fn load(mem: &MemHandle, off: usize, w: AtomicWidth) -> u64 {
    match w {
        AtomicWidth::U32 => u64::from(mem.read_u32(off).unwrap()),
        AtomicWidth::U64 => mem.read_u64(off).unwrap(),
    }
}

fn flush(p: &Pair) {
    wait(p, "a flush", p.ep.flush()).unwrap();
}

fn each_mode(s: &Setup, f: impl Fn(&Pair, bool)) {
    for emulate in [false, true] {
        let s = s.with("ATOMIC_EMULATE", if emulate { "y" } else { "n" });
        let Some(p) = pair(&s) else { return };
        f(&p, emulate);
    }
}

/// Every op, width and placement: the fetched value is the old one, memory holds the new one,
/// the neighbouring bytes are unchanged.
fn ops_and_widths(s: &Setup) {
    each_mode(s, |p, emulate| {
        let Some((mem, rkey)) = target(p, 64) else { return };
        let base = mem.addr();
        let cases = [
            (AtomicWidth::U32, 0usize),
            (AtomicWidth::U32, 4),
            (AtomicWidth::U32, 12),
            (AtomicWidth::U64, 8),
            (AtomicWidth::U64, 16),
        ];
        for (w, off) in cases {
            let m = if w == AtomicWidth::U32 {
                u32::MAX as u64
            } else {
                u64::MAX
            };
            let ctx = format!("[{} emulate={emulate}] {w:?} at +{off}", p.name);
            for (k, op) in OPS.into_iter().enumerate() {
                let init = 0xf0f0_1234_ffff_fffe_u64.rotate_left(k as u32 * 7) & m;
                let v = 0x0ff0_0000_ffff_0003_u64.rotate_left(k as u32 * 5) & m;
                mem.fill(0xa5);
                store(&mem, off, w, init);
                let old = wait(
                    p,
                    "a fetching atomic",
                    p.ep.atomic_fetch(op, w, v, base + off as u64, &rkey),
                )
                .unwrap_or_else(|e| panic!("{ctx} {op:?}: {e}"));
                assert_eq!(old, init, "{ctx} {op:?}: fetched");
                assert_eq!(load(&mem, off, w), expect(op, init, v, m), "{ctx} {op:?}: memory");
                let mut all = mem.to_vec();
                all[off..off + w as usize].fill(0xa5);
                assert!(
                    all.iter().all(|&b| b == 0xa5),
                    "{ctx} {op:?}: neighbouring bytes changed"
                );
                if op != AtomicOp::Swap {
                    store(&mem, off, w, init);
                    wait(
                        p,
                        "a posted atomic",
                        p.ep.atomic_post(op, w, v, base + off as u64, &rkey),
                    )
                    .unwrap_or_else(|e| panic!("{ctx} post {op:?}: {e}"));
                    flush(p);
                    assert_eq!(load(&mem, off, w), expect(op, init, v, m), "{ctx} post {op:?}");
                }
            }
            // compare-and-swap, matching and not
            let init = 0x1234_5678_9abc_def0 & m;
            store(&mem, off, w, init);
            let old = wait(
                p,
                "cswap",
                p.ep.atomic_cswap(w, init, 77, base + off as u64, &rkey),
            )
            .unwrap();
            assert_eq!((old, load(&mem, off, w)), (init, 77), "{ctx} cswap");
            let old = wait(
                p,
                "cswap",
                p.ep.atomic_cswap(w, init, 99, base + off as u64, &rkey),
            )
            .unwrap();
            assert_eq!((old, load(&mem, off, w)), (77, 77), "{ctx} failed cswap");
        }
    });
}

/// Misuse is refused before anything is sent.
fn misuse(s: &Setup) {
    let Some(p) = pair(s) else { return };
    let Some((mem, rkey)) = target(&p, 64) else { return };
    let a = mem.addr();
    let e =
        p.ep.atomic_fetch(AtomicOp::Add, AtomicWidth::U64, 1, a + 4, &rkey)
            .unwrap_err();
    assert_eq!(e, ucs::Status::InvalidParam, "unaligned: {e}");
    let e =
        p.ep.atomic_fetch(AtomicOp::Add, AtomicWidth::U64, 1, a + 64, &rkey)
            .unwrap_err();
    assert_eq!(e, ucs::Status::OutOfRange, "past the end: {e}");
    let e =
        p.ep.atomic_fetch(AtomicOp::Add, AtomicWidth::U32, 1 << 32, a, &rkey)
            .unwrap_err();
    assert_eq!(e, ucs::Status::InvalidParam, "wide operand: {e}");
    let e =
        p.ep.atomic_post(AtomicOp::Swap, AtomicWidth::U64, 1, a, &rkey)
            .unwrap_err();
    assert_eq!(e, ucs::Status::InvalidParam, "posted swap: {e}");
    let e =
        p.ep.atomic_fetch(AtomicOp::Cswap, AtomicWidth::U64, 1, a, &rkey)
            .unwrap_err();
    assert_eq!(e, ucs::Status::InvalidParam, "cswap by fetch: {e}");
    flush(&p);
    assert!(
        mem.to_vec().iter().all(|&b| b == 0),
        "[{}] memory written",
        p.name
    );
}

/// Many fetch-adds in flight at once on one 64-bit and one 32-bit counter: each old value
/// seen once, the sums exact.
fn concurrent_fetch_add(s: &Setup) {
    each_mode(s, |p, emulate| {
        let Some((mem, rkey)) = target(p, 64) else { return };
        const N: u64 = 500;
        for (w, off) in [(AtomicWidth::U64, 0u64), (AtomicWidth::U32, 12)] {
            let seen = Rc::new(RefCell::new(Vec::new()));
            for _ in 0..N {
                match p
                    .ep
                    .atomic_fetch(AtomicOp::Add, w, 1, mem.addr() + off, &rkey)
                    .unwrap()
                {
                    Issued::Done(v) => seen.borrow_mut().push(v),
                    Issued::Pending(r) => {
                        let s = seen.clone();
                        r.on_complete(move |v| s.borrow_mut().push(v.unwrap()));
                    }
                }
            }
            p.wait_for("the fetch-adds", || seen.borrow().len() == N as usize);
            let mut v = seen.borrow().clone();
            v.sort_unstable();
            assert!(
                v.iter().copied().eq(0..N),
                "[{} emulate={emulate}] {w:?}: old values",
                p.name
            );
            assert_eq!(
                load(&mem, off as usize, w),
                N,
                "[{} emulate={emulate}] {w:?}",
                p.name
            );
        }
        assert_eq!(mem.read_u32(8).unwrap(), 0, "the 32-bit counter's neighbour");
    });
}

ucp_test!(ops_and_widths, misuse, concurrent_fetch_add);
