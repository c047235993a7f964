//! Tag matching: every size class expected and unexpected, order across eager and
//! rendezvous mixes, wildcard masks, truncation, probe, synchronous sends, cancel.

use ucp::{Features, Issued, Status, TagRecvd};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

const FULL: u64 = u64::MAX;
const SIZES: &[usize] = &[
    0,
    1,
    7,
    100,
    1000,
    4000,
    8192,
    9000,
    65537,
    200_000,
    (4 << 20) + 3,
];

/// Waits for a receive (or returns what finished at once).
fn recv_done(p: &Pair, r: Issued<TagRecvd>) -> ucp::Result<TagRecvd> {
    match r {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            p.wait_for("a tag receive", || r.is_done());
            r.take().unwrap()
        }
    }
}

fn send_done(p: &Pair, r: ucp::Result<Issued<()>>) {
    if let Issued::Pending(mut r) = r.unwrap_or_else(|e| panic!("[{}] tag send: {e}", p.name)) {
        p.wait_for("a tag send", || r.is_done());
        r.take().unwrap().unwrap();
    }
}

/// Every size: posted before (expected) and after (unexpected) the message, copied and owned
/// sends; with the default thresholds and with rendezvous from 4 KiB.
fn tag_sizes(s: &Setup) {
    for rndv in ["auto", "4096"] {
        let Some(p) = s.with("RNDV_THRESH", rndv).pair_with(Features::TAG) else {
            return;
        };
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            let tag = 0x1000 + i as u64;
            // expected
            let r = p.b.tag_recv(tag, FULL, vec![0; n + 5]).unwrap();
            let sent = p.ep.tag_send(tag, &data).unwrap();
            let got = recv_done(&p, r).unwrap_or_else(|e| panic!("[{}] {n} B expected: {e}", p.name));
            assert_eq!(got.tag, tag);
            assert!(got.data == data, "[{}] {n} bytes expected ({rndv})", p.name);
            send_done(&p, Ok(sent));
            // unexpected, owned send
            let sent = p.ep.tag_send_owned(tag, data.clone()).unwrap();
            for _ in 0..50 {
                p.progress();
            }
            let got = recv_done(&p, p.b.tag_recv(tag, FULL, vec![0; n]).unwrap()).unwrap();
            assert!(got.data == data, "[{}] {n} bytes unexpected ({rndv})", p.name);
            let back = match sent {
                Issued::Done(v) => v,
                Issued::Pending(mut r) => {
                    p.wait_for("an owned tag send", || r.is_done());
                    r.take().unwrap().unwrap()
                }
            };
            assert!(back == data, "[{}] the owned buffer", p.name);
        }
    }
}

/// One endpoint's messages match in send order, rendezvous and eager mixed (a small message
/// right behind a large one), for receives posted before and after.
fn tag_order(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "10000").pair_with(Features::TAG) else {
        return;
    };
    let sizes = [200_000usize, 10, 30_000, 0, 5000, 100_000, 1];
    for posted_first in [true, false] {
        let mut recvs = Vec::new();
        if posted_first {
            for _ in &sizes {
                recvs.push(p.b.tag_recv(0, 0, vec![0; 200_000]).unwrap());
            }
        }
        let mut sends = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            sends.push(p.ep.tag_send(i as u64, &pattern(n, i)).unwrap());
        }
        if !posted_first {
            for _ in 0..100 {
                p.progress();
            }
            for _ in &sizes {
                recvs.push(p.b.tag_recv(0, 0, vec![0; 200_000]).unwrap());
            }
        }
        for (i, r) in recvs.into_iter().enumerate() {
            let got = recv_done(&p, r).unwrap();
            assert_eq!(
                got.tag, i as u64,
                "[{}] order (posted first: {posted_first})",
                p.name
            );
            assert!(got.data == pattern(sizes[i], i), "[{}] message {i}", p.name);
        }
        for s in sends {
            send_done(&p, Ok(s));
        }
    }
}

/// Masks pick bits: a receive for high half 0xab takes only such tags, the oldest first.
fn tag_wildcards(s: &Setup) {
    let Some(p) = s.pair_with(Features::TAG) else {
        return;
    };
    let mask = 0xffff_0000_0000_0000;
    for (i, tag) in [
        0xac00_0000_0000_0001u64,
        0xab00_0000_0000_0002,
        0xab00_0000_0000_0003,
    ]
    .iter()
    .enumerate()
    {
        send_done(&p, p.ep.tag_send(*tag, &[i as u8]));
    }
    for _ in 0..50 {
        p.progress();
    }
    let a = recv_done(&p, p.b.tag_recv(0xab00_0000_0000_0000, mask, vec![0; 4]).unwrap()).unwrap();
    let b = recv_done(&p, p.b.tag_recv(0xab00_0000_0000_0000, mask, vec![0; 4]).unwrap()).unwrap();
    assert_eq!(
        (a.tag, b.tag),
        (0xab00_0000_0000_0002, 0xab00_0000_0000_0003),
        "[{}]",
        p.name
    );
    // the remaining one matches an exact receive
    let c = recv_done(&p, p.b.tag_recv(0xac00_0000_0000_0001, FULL, vec![0; 4]).unwrap()).unwrap();
    assert_eq!(c.data, [0]);
    // nothing left for a wildcard
    assert!(p.b.tag_probe(0, 0, false).unwrap().is_none());
}

/// A message longer than the buffer: `MessageTruncated`, the next message is fine.
fn tag_truncation(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "50000").pair_with(Features::TAG) else {
        return;
    };
    for n in [100usize, 20_000, 100_000] {
        for posted_first in [true, false] {
            let r = posted_first.then(|| p.b.tag_recv(7, FULL, vec![0; n / 2]).unwrap());
            let sent = p.ep.tag_send(7, &pattern(n, 1)).unwrap();
            // Matched at once, the receive call itself returns the error.
            let e = match r {
                Some(r) => recv_done(&p, r),
                None => {
                    p.b.tag_recv(7, FULL, vec![0; n / 2])
                        .and_then(|r| recv_done(&p, r))
                }
            }
            .unwrap_err();
            assert_eq!(e, Status::MessageTruncated, "[{}] {n} B: {e}", p.name);
            send_done(&p, Ok(sent));
            send_done(&p, p.ep.tag_send(8, b"next"));
            let ok = recv_done(&p, p.b.tag_recv(8, FULL, vec![0; 4]).unwrap()).unwrap();
            assert_eq!(ok.data, b"next");
        }
    }
}

/// Probe reports tag and length; with remove, `tag_msg_recv` receives the message.
fn tag_probe(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "50000").pair_with(Features::TAG) else {
        return;
    };
    assert!(p.b.tag_probe(0, 0, false).unwrap().is_none());
    for n in [10usize, 30_000, 70_000] {
        let data = pattern(n, 3);
        let sent = p.ep.tag_send(42, &data).unwrap();
        p.wait_for("the message", || {
            p.b.tag_probe(42, FULL, false).unwrap().is_some()
        });
        let seen = p.b.tag_probe(0, 0, false).unwrap().unwrap();
        assert_eq!(
            (seen.info.tag, seen.info.length, seen.msg.is_none()),
            (42, n, true)
        );
        let taken = p.b.tag_probe(42, FULL, true).unwrap().unwrap();
        assert!(
            p.b.tag_probe(42, FULL, false).unwrap().is_none(),
            "[{}] removed",
            p.name
        );
        let got = recv_done(&p, p.b.tag_msg_recv(taken.msg.unwrap(), vec![0; n]).unwrap()).unwrap();
        assert!(got.data == data, "[{}] {n} B by probe", p.name);
        send_done(&p, Ok(sent));
    }
}

/// A synchronous send completes only after the receiver matched it (eager and rendezvous).
fn tag_sync(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "50000").pair_with(Features::TAG) else {
        return;
    };
    for n in [8usize, 20_000, 100_000] {
        let data = pattern(n, 2);
        let sent = p.ep.tag_send_sync(5, &data).unwrap();
        let Issued::Pending(mut sent) = sent else {
            panic!("[{}] a synchronous send completed before any receive", p.name)
        };
        for _ in 0..200 {
            p.progress();
        }
        assert!(
            !sent.is_done(),
            "[{}] {n} B: completed before the receive",
            p.name
        );
        let got = recv_done(&p, p.b.tag_recv(5, FULL, vec![0; n]).unwrap()).unwrap();
        assert!(got.data == data);
        p.wait_for("the synchronous send", || sent.is_done());
        sent.take().unwrap().unwrap();
    }
}

/// A posted receive can be canceled until a message matches it; the message then waits.
fn tag_cancel(s: &Setup) {
    let Some(p) = s.pair_with(Features::TAG) else {
        return;
    };
    let Issued::Pending(mut r) = p.b.tag_recv(9, FULL, vec![0; 8]).unwrap() else {
        panic!("[{}] nothing to receive yet", p.name)
    };
    assert!(r.cancel());
    assert_eq!(r.take().unwrap().unwrap_err(), Status::Canceled);
    assert!(!r.cancel(), "[{}] canceled twice", p.name);
    send_done(&p, p.ep.tag_send(9, b"later"));
    let got = recv_done(&p, p.b.tag_recv(9, FULL, vec![0; 8]).unwrap()).unwrap();
    assert_eq!(got.data, b"later");
    // a matched receive cannot be canceled
    let r = p.b.tag_recv(10, FULL, vec![0; 8]).unwrap();
    send_done(&p, p.ep.tag_send(10, b"x"));
    if let Issued::Pending(r) = r {
        p.wait_for("the receive", || r.is_done());
        assert!(!r.cancel());
    }
}

ucp_test!(
    tag_sizes,
    tag_order,
    tag_wildcards,
    tag_truncation,
    tag_probe,
    tag_sync,
    tag_cancel
);
