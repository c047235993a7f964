//! Put and get: every size class (short, bcopy, zcopy, fragments) from 1 B to 8 MiB, owned
//! and copied buffers, accesses outside the region refused (nothing written), hostile keys,
//! flush ordering and operations issued before the endpoint is wired. ud_verbs has no RMA:
//! there the API says `Unsupported`.

use ucp::{Features, Issued, MemHandle, RemoteKey};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

const SIZES: &[usize] = &[1, 7, 64, 1000, 8192, 8193, 65539, 1 << 20, 8 << 20];

/// A pair whose context has RMA and both atomic widths.
pub fn pair(s: &Setup) -> Option<Pair> {
    s.pair_with(Features::AM | Features::RMA | Features::AMO32 | Features::AMO64)
}

/// Waits for an issued operation and returns its result.
pub fn wait<T>(p: &Pair, what: &str, i: ucs::Result<Issued<T>>) -> ucs::Result<T> {
    match i? {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            p.wait_for(what, || r.is_done());
            r.take().unwrap()
        }
    }
}

/// `len` bytes mapped on the target and the initiator's key to them; `None` on a target
/// without RMA (after checking that the API says so).
pub fn target(p: &Pair, len: usize) -> Option<(MemHandle, RemoteKey)> {
    let mem = match p.b.mem_alloc(len) {
        Ok(m) => m,
        Err(e) => {
            assert_eq!(e, ucs::Status::Unsupported, "[{}] mem_alloc: {e}", p.name);
            assert!(p.name == "ud_verbs", "[{}] mem_alloc: {e}", p.name);
            return None;
        }
    };
    let rkey = match p.ep.rkey_unpack(&mem.rkey_pack().unwrap()) {
        Ok(k) => k,
        Err(e) => {
            assert_eq!(e, ucs::Status::Unsupported, "[{}] rkey_unpack: {e}", p.name);
            assert!(p.name == "ud_verbs", "[{}] rkey_unpack: {e}", p.name);
            return None;
        }
    };
    assert_ne!(p.name, "ud_verbs", "ud_verbs has no RMA lane");
    Some((mem, rkey))
}

fn flush(p: &Pair) {
    wait(p, "a flush", p.ep.flush()).unwrap_or_else(|e| panic!("[{}] flush: {e}", p.name));
}

/// Every size, put (copied and owned) then get, at an unaligned offset.
fn put_get_sizes(s: &Setup) {
    let Some(p) = pair(s) else { return };
    let Some((mem, rkey)) = target(&p, (8 << 20) + 64) else {
        assert!(p.ep.put_protocol(8).is_err_and(|e| e == ucs::Status::Unsupported));
        return;
    };
    let mut protos = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let at = mem.addr() + 3;
        protos.push(p.ep.put_protocol(n).unwrap());
        let data = pattern(n, i);
        wait(&p, "a put", p.ep.put(&data, at, &rkey)).unwrap_or_else(|e| panic!("[{}] put {n}: {e}", p.name));
        flush(&p);
        let mut got = vec![0; n];
        mem.read(3, &mut got).unwrap();
        assert!(got == data, "[{}] put of {n} bytes", p.name);
        let back =
            wait(&p, "a get", p.ep.get(n, at, &rkey)).unwrap_or_else(|e| panic!("[{}] get {n}: {e}", p.name));
        assert!(back == data, "[{}] get of {n} bytes", p.name);

        let data = pattern(n, i + 100);
        let owned = wait(&p, "an owned put", p.ep.put_owned(data.clone(), at, &rkey)).unwrap();
        assert!(owned == data, "[{}] the owned buffer came back changed", p.name);
        flush(&p);
        mem.read(3, &mut got).unwrap();
        assert!(got == data, "[{}] owned put of {n} bytes", p.name);
        let back = wait(&p, "a get", p.ep.get_into(vec![1; n], at, &rkey)).unwrap();
        assert!(back == data, "[{}] get_into of {n} bytes", p.name);
    }
    println!("[{}] put protocols: {protos:?}", p.name);
    if p.name == "tcp" || p.name == "rc_verbs" {
        assert_eq!(protos[0], ucp::RmaProto::Short, "[{}]", p.name);
        assert!(
            protos
                .iter()
                .any(|x| matches!(x, ucp::RmaProto::Zcopy | ucp::RmaProto::ZcopyFragments(_))),
            "[{}] {protos:?}",
            p.name
        );
    }
}

/// Accesses outside the region fail on the initiator and leave the target as it was; keys of
/// another worker and garbage are refused.
fn out_of_range(s: &Setup) {
    let Some(p) = pair(s) else { return };
    let Some((mem, rkey)) = target(&p, 4096) else {
        return;
    };
    mem.fill(0xee);
    let end = mem.addr() + 4096;
    for (at, n) in [(end - 10, 11), (end, 1), (mem.addr() - 1, 2), (end - 100, 65536)] {
        let e = p.ep.put(&vec![1; n], at, &rkey).unwrap_err();
        assert_eq!(
            e,
            ucs::Status::OutOfRange,
            "[{}] put {n} at +{}",
            p.name,
            at.wrapping_sub(mem.addr())
        );
        assert!(e.context().unwrap().contains("outside the remote region"), "{e}");
        let e = p.ep.get(n, at, &rkey).unwrap_err();
        assert_eq!(e, ucs::Status::OutOfRange, "[{}] get", p.name);
    }
    flush(&p);
    assert!(
        mem.to_vec().iter().all(|&b| b == 0xee),
        "[{}] the target was written",
        p.name
    );

    // Hostile bytes never panic.
    let good = mem.rkey_pack().unwrap();
    for cut in 0..good.len() {
        assert!(p.ep.rkey_unpack(&good[..cut]).is_err());
    }
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x5a;
        let _ = p.ep.rkey_unpack(&b);
    }

    // A key whose region claims more than was mapped: software RMA (self, tcp) checks the
    // transport key's registration at the target, refuses, and the initiator's request fails.
    if p.name == "self_" || p.name == "tcp" {
        let mut forged = good.clone();
        forged[20..28].copy_from_slice(&(1u64 << 20).to_le_bytes());
        let big = p.ep.rkey_unpack(&forged).unwrap();
        let r = wait(
            &p,
            "a get past the registration",
            p.ep.get(8192, end - 4096, &big),
        );
        assert!(
            r.is_err(),
            "[{}] a get past the registered memory succeeded",
            p.name
        );
        let r = wait(
            &p,
            "an owned put past the registration",
            p.ep.put_owned(vec![1; 65536], end - 4096, &big),
        );
        assert!(
            r.is_err(),
            "[{}] a put past the registered memory succeeded",
            p.name
        );
        assert!(
            mem.to_vec().iter().all(|&b| b == 0xee),
            "[{}] the target was written",
            p.name
        );
    }

    // A key of another worker.
    if p.a.id() != p.b.id() {
        let other = p.a.mem_alloc(64).unwrap();
        let e = p.ep.rkey_unpack(&other.rkey_pack().unwrap()).unwrap_err();
        assert_eq!(e, ucs::Status::InvalidParam, "[{}] {e}", p.name);
    }
}

/// Puts issued before the endpoint is wired wait and go in order; a flush after them
/// completes when all are in the target's memory.
fn flush_ordering(s: &Setup) {
    let Some(p) = pair(s) else { return };
    let Some((mem, rkey)) = target(&p, 1 << 20) else {
        return;
    };
    // Many puts to the same place, of growing sizes (each class): the last one wins.
    let mut last = Vec::new();
    for (i, &n) in [8usize, 100, 9000, 70000, 300000].iter().enumerate() {
        for k in 0..20 {
            last = pattern(n, i * 20 + k);
            let r = p.ep.put(&last, mem.addr(), &rkey).unwrap();
            drop(r); // detached: the flush still covers it
        }
    }
    flush(&p);
    let mut got = vec![0; last.len()];
    mem.read(0, &mut got).unwrap();
    assert!(got == last, "[{}] the last put did not win", p.name);
    // Distinct places, then one flush.
    for i in 0..64usize {
        let _ =
            p.ep.put(&[i as u8; 512], mem.addr() + (i * 512) as u64, &rkey)
                .unwrap();
    }
    flush(&p);
    for i in 0..64usize {
        assert_eq!(
            mem.to_vec()[i * 512..(i + 1) * 512],
            [i as u8; 512],
            "[{}] put {i}",
            p.name
        );
    }

    // Before the wireup finished: on a fresh endpoint.
    let p2 = pair(s).unwrap();
    let (mem2, k2) = target(&p2, 4096).unwrap();
    let wired_at_once = p2.ep.is_connected();
    let _ = p2.ep.put(b"early bird", mem2.addr() + 100, &k2).unwrap();
    let g = p2.ep.get(10, mem2.addr() + 100, &k2).unwrap();
    flush(&p2);
    let mut got = [0u8; 10];
    mem2.read(100, &mut got).unwrap();
    assert_eq!(
        &got, b"early bird",
        "[{}] (wired at once: {wired_at_once})",
        p2.name
    );
    // The get went after the put on the same lane's queue while not wired; once wired,
    // transports keep one lane's put and get in order only on self and tcp.
    let g = wait(&p2, "an early get", Ok(g)).unwrap();
    if !wired_at_once {
        assert_eq!(g, b"early bird", "[{}]", p2.name);
    }
    let _ = mem;
}

/// Without the RMA feature (the harness's contexts have AM only) the endpoint has no RMA lane
/// and the API says so.
fn needs_feature(s: &Setup) {
    let Some(p) = s.pair() else { return };
    match p.b.mem_alloc(64) {
        Ok(m) => {
            let e = p.ep.rkey_unpack(&m.rkey_pack().unwrap()).unwrap_err();
            assert_eq!(e, ucs::Status::Unsupported, "[{}] {e}", p.name);
            assert!(e.context().unwrap().contains("RMA"), "{e}");
        }
        Err(e) => assert_eq!(e, ucs::Status::Unsupported),
    }
    assert_eq!(p.ep.put_protocol(8).unwrap_err(), ucs::Status::Unsupported);
}

ucp_test!(put_get_sizes, out_of_range, flush_ordering, needs_feature);
