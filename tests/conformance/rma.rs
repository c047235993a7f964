//! RMA (UCX `test_p2p_rma`): put and get in short, bcopy and zcopy flavors over sizes, at
//! unaligned offsets, zcopy with scattered multi-entry iovs; the target range is checked byte
//! for byte and the bytes around it must stay untouched.

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::data::{assert_bytes, pattern, scatter, sizes, split};
use rucx_testkit::{Pair, Remote, Setup};
use uct::{IfaceFlags, Mem, MemIov, Status};

/// Bytes of untouched memory checked on both sides of every target range.
const GUARD: usize = 16;
/// Largest transfer tested (transports may advertise up to `usize::MAX`).
const CAP: usize = 64 * 1024;
const FILL: u8 = 0xEE;

/// Remote memory for transfers up to `max` bytes at offsets GUARD..GUARD+8.
fn target(p: &Pair, max: usize) -> Remote {
    p.remote_mem(max + 2 * GUARD + 8, FILL)
}

/// Waits until `data` is at `off` in `mem`, then checks that nothing else changed.
fn wait_landed(p: &Pair, mem: &Mem, off: usize, data: &[u8], what: &str) {
    let mut got = vec![0; data.len()];
    p.wait_for(what, || {
        mem.read(off, &mut got).unwrap();
        got == data
    });
    check_guards(p, mem, off, data.len(), what);
}

fn check_guards(p: &Pair, mem: &Mem, off: usize, len: usize, what: &str) {
    let all = mem.to_vec();
    let outside = all[..off]
        .iter()
        .chain(&all[off + len..])
        .position(|&b| b != FILL);
    if let Some(i) = outside {
        let at = if i < off { i } else { i + len };
        panic!(
            "[{}] {what}: byte {at} outside the target range [{off}, +{len}) was modified",
            p.name()
        );
    }
}

/// Scattered local buffer holding `data` in `k` entries; returns it with the entries.
fn scattered(p: &Pair, data: &[u8], k: usize) -> (Mem, Vec<MemIov>) {
    let lens = split(data.len(), k);
    let (offs, size) = scatter(&lens);
    let mem = p.local_mem(size, FILL);
    let mut iov = Vec::new();
    let mut at = 0;
    for (o, l) in offs.iter().zip(&lens) {
        mem.write(*o, &data[at..at + l]).unwrap();
        iov.push(mem.iov(*o, *l).unwrap());
        at += l;
    }
    (mem, iov)
}

fn iov_counts(max_iov: usize) -> Vec<usize> {
    let m = max_iov.clamp(1, uct::MAX_IOV);
    let mut v = vec![1, 2, 3, m];
    v.retain(|&c| c <= m);
    v.dedup();
    v
}

fn put_short_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let max = p.attr().put.max_short.min(CAP);
    let r = target(&p, max);
    if !p.supports(IfaceFlags::PUT_SHORT, "put_short") {
        assert_eq!(
            ep.put_short(&[1], r.addr(GUARD), &r.rkey),
            Err(Status::Unsupported.into()),
            "[{n}] put_short"
        );
        return;
    }
    for (i, len) in sizes(0, max, 64).into_iter().enumerate() {
        let (off, data) = (GUARD + i % 8, pattern(len, i as u64));
        r.mem.fill(FILL);
        p.retry("put_short", || ep.put_short(&data, r.addr(off), &r.rkey))
            .unwrap_or_else(|e| panic!("[{n}] put_short of {len} bytes: {e}"));
        wait_landed(&p, &r.mem, off, &data, &format!("put_short of {len} bytes"));
    }
}

fn put_bcopy_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let max = p.attr().put.max_bcopy.min(CAP);
    let r = target(&p, max);
    if !p.supports(IfaceFlags::PUT_BCOPY, "put_bcopy") {
        assert_eq!(
            ep.put_bcopy(|_| 0, r.addr(GUARD), &r.rkey),
            Err(Status::Unsupported.into()),
            "[{n}] put_bcopy"
        );
        return;
    }
    for (i, len) in sizes(0, max, 64).into_iter().enumerate() {
        let (off, data) = (GUARD + i % 8, pattern(len, i as u64));
        r.mem.fill(FILL);
        let res = p.retry("put_bcopy", || {
            ep.put_bcopy(
                |b| {
                    b[..len].copy_from_slice(&data);
                    len
                },
                r.addr(off),
                &r.rkey,
            )
        });
        assert_eq!(res, Ok(len), "[{n}] put_bcopy of {len} bytes");
        wait_landed(&p, &r.mem, off, &data, &format!("put_bcopy of {len} bytes"));
    }
}

fn put_zcopy_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let c = p.attr().put;
    let max = c.max_zcopy.min(CAP);
    let r = target(&p, max);
    if !p.supports(IfaceFlags::PUT_ZCOPY, "put_zcopy") {
        let m = p.local_mem(8, 0);
        assert_eq!(
            ep.put_zcopy(&[m.whole()], r.addr(GUARD), &r.rkey, None),
            Err(Status::Unsupported.into()),
            "[{n}] put_zcopy"
        );
        return;
    }
    let mut i = 0u64;
    for len in sizes(c.min_zcopy, max, 32) {
        for k in iov_counts(c.max_iov) {
            let k = k.min(len.max(1));
            let (off, data) = (GUARD + i as usize % 8, pattern(len, i));
            i += 1;
            r.mem.fill(FILL);
            let (_src, iov) = scattered(&p, &data, k);
            let what = format!("put_zcopy of {len} bytes in {k} entries");
            p.complete(&what, |comp| ep.put_zcopy(&iov, r.addr(off), &r.rkey, Some(comp)));
            wait_landed(&p, &r.mem, off, &data, &what);
        }
    }
}

fn get_short_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let max = p.attr().get.max_short.min(CAP);
    let r = target(&p, max);
    if !p.supports(IfaceFlags::GET_SHORT, "get_short") {
        assert_eq!(
            ep.get_short(&mut [0], r.addr(GUARD), &r.rkey),
            Err(Status::Unsupported.into()),
            "[{n}] get_short"
        );
        return;
    }
    for (i, len) in sizes(0, max, 64).into_iter().enumerate() {
        let (off, data) = (GUARD + i % 8, pattern(len, i as u64));
        r.mem.write(off, &data).unwrap();
        let mut buf = vec![0x11; len + 4];
        p.retry("get_short", || {
            ep.get_short(&mut buf[..len], r.addr(off), &r.rkey)
        })
        .unwrap_or_else(|e| panic!("[{n}] get_short of {len} bytes: {e}"));
        assert_bytes(&format!("[{n}] get_short of {len} bytes"), &buf[..len], &data);
        assert_eq!(
            buf[len..],
            [0x11; 4],
            "[{n}] get_short of {len} bytes wrote past the buffer"
        );
    }
}

fn get_bcopy_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let max = p.attr().get.max_bcopy.min(CAP);
    let r = target(&p, max);
    if !p.supports(IfaceFlags::GET_BCOPY, "get_bcopy") {
        assert_eq!(
            ep.get_bcopy(1, r.addr(GUARD), &r.rkey, |_| {}, None),
            Err(Status::Unsupported.into()),
            "[{n}] get_bcopy"
        );
        return;
    }
    for (i, len) in sizes(0, max, 64).into_iter().enumerate() {
        let (off, data) = (GUARD + i % 8, pattern(len, i as u64));
        r.mem.write(off, &data).unwrap();
        let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
        let what = format!("get_bcopy of {len} bytes");
        p.complete(&what, |comp| {
            let g = got.clone();
            ep.get_bcopy(
                len,
                r.addr(off),
                &r.rkey,
                move |d| g.borrow_mut().push(d.to_vec()),
                Some(comp),
            )
        });
        let got = got.borrow();
        assert_eq!(
            got.len(),
            1,
            "[{n}] {what}: unpack callback not called once before completion"
        );
        assert_bytes(&format!("[{n}] {what}"), &got[0], &data);
    }
}

fn get_zcopy_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let c = p.attr().get;
    let max = c.max_zcopy.min(CAP);
    let r = target(&p, max);
    if !p.supports(IfaceFlags::GET_ZCOPY, "get_zcopy") {
        let m = p.local_mem(8, 0);
        assert_eq!(
            ep.get_zcopy(&[m.whole()], r.addr(GUARD), &r.rkey, None),
            Err(Status::Unsupported.into()),
            "[{n}] get_zcopy"
        );
        return;
    }
    let mut i = 0u64;
    for len in sizes(c.min_zcopy, max, 32) {
        for k in iov_counts(c.max_iov) {
            let k = k.min(len.max(1));
            let (off, data) = (GUARD + i as usize % 8, pattern(len, i));
            i += 1;
            r.mem.write(off, &data).unwrap();
            let lens = split(len, k);
            let (offs, size) = scatter(&lens);
            let dst = p.local_mem(size, FILL);
            let iov: Vec<MemIov> = offs
                .iter()
                .zip(&lens)
                .map(|(o, l)| dst.iov(*o, *l).unwrap())
                .collect();
            let what = format!("get_zcopy of {len} bytes into {k} entries");
            p.complete(&what, |comp| ep.get_zcopy(&iov, r.addr(off), &r.rkey, Some(comp)));
            // Gather what arrived and check the gaps stayed untouched.
            let all = dst.to_vec();
            let mut got = Vec::new();
            let mut prev = 0;
            for (o, l) in offs.iter().zip(&lens) {
                assert!(
                    all[prev..*o].iter().all(|&b| b == FILL),
                    "[{n}] {what}: wrote into a gap before offset {o}"
                );
                got.extend_from_slice(&all[*o..o + l]);
                prev = o + l;
            }
            assert!(
                all[prev..].iter().all(|&b| b == FILL),
                "[{n}] {what}: wrote past the last entry"
            );
            assert_bytes(&format!("[{n}] {what}"), &got, &data);
        }
    }
}

/// Zero-copy put and get of a few MiB: copies this long take other paths than short ones
/// (self copies from the L2 size up with the CPU's string copy, `ucs::arch`).
fn zcopy_large(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let a = p.attr();
    if !p.supports(IfaceFlags::PUT_ZCOPY, "put_zcopy") || !p.supports(IfaceFlags::GET_ZCOPY, "get_zcopy") {
        return;
    }
    let lens = [(1 << 20) - 1, 1 << 20, (2 << 20) + 3];
    let max = lens
        .into_iter()
        .filter(|&l| l <= a.put.max_zcopy.min(a.get.max_zcopy))
        .max();
    let Some(max) = max else { return };
    let r = target(&p, max);
    for (i, len) in lens.into_iter().filter(|&l| l <= max).enumerate() {
        let (off, data) = (GUARD + 1 + i, pattern(len, 77 + i as u64));
        r.mem.fill(FILL);
        let (_src, iov) = scattered(&p, &data, 1);
        let what = format!("put_zcopy of {len} bytes");
        p.complete(&what, |comp| ep.put_zcopy(&iov, r.addr(off), &r.rkey, Some(comp)));
        wait_landed(&p, &r.mem, off, &data, &what);
        let dst = p.local_mem(len + 2 * GUARD, FILL);
        let what = format!("get_zcopy of {len} bytes");
        let iov = [dst.iov(GUARD, len).unwrap()];
        p.complete(&what, |comp| ep.get_zcopy(&iov, r.addr(off), &r.rkey, Some(comp)));
        let all = dst.to_vec();
        assert_bytes(&format!("[{n}] {what}"), &all[GUARD..GUARD + len], &data);
        assert!(
            all[..GUARD].iter().chain(&all[GUARD + len..]).all(|&b| b == FILL),
            "[{n}] {what}: wrote outside the target entry"
        );
    }
}

/// `get_zcopy` into writable memory the caller lends (`Mem::try_register_lent_mut`, a receive
/// buffer's route): the fetched range lands, every other byte keeps what the caller had there
/// (nothing zeroed), and the same vector comes back.
fn get_zcopy_lent(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.supports(IfaceFlags::GET_ZCOPY, "get_zcopy") {
        return;
    }
    let len = p.attr().get.max_zcopy.min(100_000);
    let r = target(&p, len);
    let data = pattern(len, 91);
    r.mem.write(GUARD, &data).unwrap();
    let mine = pattern(len + 2 * GUARD, 17);
    let lent = mine.clone();
    let at = lent.as_ptr();
    let mem = Mem::try_register_lent_mut(&p.tx.md, lent, uct::MemAccess::LOCAL_WRITE)
        .unwrap_or_else(|(e, _)| panic!("[{n}] try_register_lent_mut: {e}"));
    assert!(mem.is_lent(), "[{n}] a lent registration");
    let what = format!("get_zcopy of {len} bytes into a lent vector");
    let iov = [mem.iov(GUARD, len).unwrap()];
    p.complete(&what, |comp| {
        ep.get_zcopy(&iov, r.addr(GUARD), &r.rkey, Some(comp))
    });
    drop(iov);
    let back: Vec<u8> = match mem.into_lent() {
        Ok(v) => v,
        Err(_) => panic!("[{n}] {what}: the lent vector did not come back"),
    };
    assert_eq!(back.as_ptr(), at, "[{n}] {what}: the same vector, not a copy");
    assert_bytes(&format!("[{n}] {what}"), &back[GUARD..GUARD + len], &data);
    assert!(
        back[..GUARD] == mine[..GUARD] && back[GUARD + len..] == mine[GUARD + len..],
        "[{n}] {what}: bytes outside the fetched range changed"
    );
}

conformance_test!(
    get_zcopy_lent,
    zcopy_large,
    put_short_sizes,
    put_bcopy_sizes,
    put_zcopy_sizes,
    get_short_sizes,
    get_bcopy_sizes,
    get_zcopy_sizes
);
