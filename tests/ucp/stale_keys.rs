//! Remote keys of memory the target released (its `MemHandle` unmapped): every put, get and
//! atomic through them fails (on the operation or, for a put, by the next flush) and the
//! released memory is unchanged, on every target with RMA (the RDMA ones in the VM too).
//!
//! [`MemHandle::into_vec`] unmaps and gives the buffer back at the same address, so a write
//! through the stale key would show in it; a second round drops the handle (freeing the
//! buffer) and maps a fresh buffer of the same size, which the allocator usually places at
//! the same address.

use ucp::{AtomicOp, AtomicWidth, Issued, MemHandle, RemoteKey};

use crate::harness::{Pair, Setup};
use crate::rma::{pair, wait};
use crate::ucp_test;

const LEN: usize = 128 << 10;
const FILL: u8 = 0xa5;

/// A region mapped on the target from a buffer of `FILL`s and the initiator's key to it;
/// `None` on a target without RMA.
fn mapped(p: &Pair) -> Option<(MemHandle, RemoteKey)> {
    let mem = match p.b.mem_map(vec![FILL; LEN]) {
        Ok(m) => m,
        Err(e) => {
            assert_eq!(e, ucs::Status::Unsupported, "[{}] mem_map: {e}", p.name);
            return None;
        }
    };
    match p.ep.rkey_unpack(&mem.rkey_pack().unwrap()) {
        Ok(k) => Some((mem, k)),
        Err(e) => {
            assert_eq!(e, ucs::Status::Unsupported, "[{}] rkey_unpack: {e}", p.name);
            assert!(p.name == "ud_verbs", "[{}] rkey_unpack: {e}", p.name);
            None
        }
    }
}

/// The operation must fail: at once, when its request completes, or (an operation without a
/// result) with the next flush. A result (get data, a fetched value) is a failure.
fn refused<T: std::fmt::Debug>(p: &Pair, what: &str, r: ucs::Result<Issued<T>>, has_result: bool) {
    let n = p.name;
    let v = match r.and_then(|i| wait(p, what, Ok(i))) {
        Err(_) => return,
        Ok(v) => v,
    };
    assert!(!has_result, "[{n}] {what}: succeeded with {v:?}");
    let f = wait(p, "a flush", p.ep.flush());
    assert!(f.is_err(), "[{n}] {what}: succeeded, and so did the next flush");
}

type Op = fn(&Pair, &str, u64, &RemoteKey);

const OPS: &[(&str, Op)] = &[
    ("put 8 B", |p, w, a, k| {
        refused(p, w, p.ep.put(&[9; 8], a, k), false)
    }),
    ("put 64 KiB", |p, w, a, k| {
        refused(p, w, p.ep.put_owned(vec![9; 64 << 10], a, k), false)
    }),
    ("get 8 B", |p, w, a, k| refused(p, w, p.ep.get(8, a, k), true)),
    ("get 64 KiB", |p, w, a, k| {
        refused(p, w, p.ep.get(64 << 10, a, k), true)
    }),
    ("atomic_post add 64", |p, w, a, k| {
        refused(
            p,
            w,
            p.ep.atomic_post(AtomicOp::Add, AtomicWidth::U64, 1, a, k),
            false,
        )
    }),
    ("atomic_fetch add 32", |p, w, a, k| {
        refused(
            p,
            w,
            p.ep.atomic_fetch(AtomicOp::Add, AtomicWidth::U32, 1, a, k),
            true,
        )
    }),
    ("atomic_cswap 64", |p, w, a, k| {
        let cmp = u64::from_ne_bytes([FILL; 8]);
        refused(p, w, p.ep.atomic_cswap(AtomicWidth::U64, cmp, 1, a, k), true)
    }),
];

fn after_release(s: &Setup) {
    for (name, op) in OPS {
        // A fresh pair each time: a transport may fail the endpoint on a bad access.
        let Some(p) = pair(s) else { return };
        let Some((mem, rkey)) = mapped(&p) else { return };
        let addr = mem.addr();
        let released = mem.into_vec().unwrap_or_else(|_| panic!("[{}] into_vec", p.name));
        assert_eq!(released.as_ptr() as u64, addr);
        op(
            &p,
            &format!("{name} with the key of unmapped memory"),
            addr,
            &rkey,
        );
        for _ in 0..100 {
            p.progress();
        }
        assert!(
            released.iter().all(|&b| b == FILL),
            "[{}] {name}: the unmapped memory was written",
            p.name
        );

        let p = pair(s).unwrap();
        let (mem, rkey) = mapped(&p).unwrap();
        let addr = mem.addr();
        drop(mem);
        let fresh = p.b.mem_map(vec![FILL; LEN]).unwrap();
        op(&p, &format!("{name} with the key of freed memory"), addr, &rkey);
        for _ in 0..100 {
            p.progress();
        }
        assert!(
            fresh.to_vec().iter().all(|&b| b == FILL),
            "[{}] {name}: memory mapped after the release was written (same address: {})",
            p.name,
            fresh.addr() == addr
        );
    }
}

ucp_test!(after_release);
