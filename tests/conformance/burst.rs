//! Bursts: many sends between two progress calls (rc_verbs posts such bcopy sends as chains,
//! one doorbell each; other transports must behave the same). Bursts of every length from 1
//! to 40 on two endpoints, switching endpoint inside a burst and mixing in am_short; a flush
//! or an endpoint's destruction right after a burst, with no progress in between. The same
//! into a receive ring smaller than a burst, where the transport has a ring to shrink.

use rucx_testkit::data::pattern;
use rucx_testkit::{Pair, Setup};
use uct::IfaceParams;
use uct::{Ep, FlushFlags, IfaceFlags, Status};

use crate::am::check_two_endpoints;

const ID: u8 = 9;

/// Message length: above rc_verbs' inline limit (so the registered-buffer path runs), within
/// every transport's max_bcopy.
fn msg_len(p: &Pair) -> usize {
    p.attr().am.max_bcopy.min(2000)
}

/// Sends message `seq` of endpoint `e` (8-byte header: endpoint, sequence; then a pattern).
fn send(p: &Pair, ep: &Ep, e: u64, seq: u64, len: usize, short: bool) {
    let hdr = (e << 32) | seq;
    let r = if short {
        let data = pattern(p.attr().am.max_short.min(64) - 8, hdr);
        p.retry("am_short", || ep.am_short(ID, hdr, &data))
    } else {
        let data = pattern(len - 8, hdr);
        p.retry("am_bcopy", || {
            ep.am_bcopy(ID, |b| {
                b[..8].copy_from_slice(&hdr.to_le_bytes());
                b[8..len].copy_from_slice(&data);
                len
            })
        })
        .map(|_| ())
    };
    r.unwrap_or_else(|err| panic!("[{}] endpoint {e} message {seq}: {err}", p.name()));
}

fn bursts(s: &Setup) {
    run_bursts(s.pair());
}

/// A receive ring of 16 buffers, given back in batches of 8, on transports that post one: bursts
/// of up to 40 overrun it while the receiver does not progress (the provider or the peer's
/// retries hold the rest), and the batches must all go back.
fn small_ring(tl: &str) -> Option<[(&'static str, &'static str); 2]> {
    match tl {
        "ofi" => Some([("OFI_RX_QUEUE_LEN", "16"), ("OFI_RX_MAX_BATCH", "8")]),
        "rc_verbs" | "ud_verbs" => Some([("IB_RX_QUEUE_LEN", "16"), ("IB_RX_MAX_BATCH", "8")]),
        _ => None,
    }
}

fn bursts_into_a_small_receive_ring(s: &Setup) {
    let Some(knobs) = small_ring(s.tl()) else {
        s.skip("no receive ring to shrink");
        return;
    };
    let set = |mut p: IfaceParams| {
        for (k, v) in knobs {
            p = p.config(k, v);
        }
        p
    };
    run_bursts(s.pair_with(set, set));
}

fn run_bursts(p: Pair) {
    let n = p.name();
    if !p.supports(IfaceFlags::AM_BCOPY, "am_bcopy") {
        return;
    }
    let short = p.attr().flags.contains(IfaceFlags::AM_SHORT) && p.attr().am.max_short >= 16;
    let len = msg_len(&p);
    let rec = p.record_am(ID);
    let (ep2, _back2) = p.connect();
    let eps = [p.ep().clone(), ep2];
    let mut seqs = [0u64; 2];
    let mut total = 0;
    for burst in 1..=40usize {
        for i in 0..burst {
            // switch endpoint inside some bursts; an am_short now and then
            let e = if burst % 3 == 0 && i >= burst / 2 {
                1
            } else {
                burst % 2
            };
            let is_short = short && i % 7 == 6;
            send(&p, &eps[e], e as u64, seqs[e], len, is_short);
            seqs[e] += 1;
            total += 1;
        }
        if burst % 10 == 5 {
            // a flush right after a burst: covers the burst's last sends
            let ep = eps[burst / 10 % 2].clone();
            p.complete("ep flush after a burst", |c| ep.flush(FlushFlags::LOCAL, Some(c)));
        }
        p.progress();
    }
    // the last burst (40) ended without a flush: progress alone must get it out
    p.wait_msgs(&rec, total, "burst");
    check_two_endpoints(&p, &rec, seqs, "burst");

    // an endpoint destroyed right after a burst (no progress, no flush): whatever it sent may
    // or may not arrive, but the interface goes on and the other endpoint loses nothing
    let [ep1, ep2] = eps;
    let before = rec.borrow().len();
    for seq in seqs[1]..seqs[1] + 9 {
        send(&p, &ep2, 1, seq, len, false);
    }
    drop(ep2);
    for _ in 0..9 {
        send(&p, &ep1, 0, seqs[0], len, false);
        seqs[0] += 1;
    }
    let c = uct::Completion::counter();
    let r = p.retry("ep flush", || ep1.flush(FlushFlags::LOCAL, Some(&c)));
    p.check_completion("ep flush after a destroyed endpoint's burst", &c, r);
    p.wait_for("the surviving endpoint's burst", || {
        rec.borrow().iter().filter(|m| m[4..8] == [0, 0, 0, 0]).count() as u64 == seqs[0]
    });
    let got = rec.borrow().len() - before;
    assert!(
        (9..=18).contains(&got),
        "[{n}] {got} messages after the destroy (9 from the live endpoint, up to 9 more)"
    );
    check_two_endpoints(
        &p,
        &rec,
        [seqs[0], rec.borrow().iter().filter(|m| m[4] == 1).count() as u64],
        "burst",
    );
    assert!(
        p.errors().iter().all(|(_, st)| *st == Status::Canceled),
        "[{n}] {:?}",
        p.errors()
    );
}

conformance_test!(bursts);
conformance_test!(bursts_into_a_small_receive_ring);
