//! Coalesced copied sends (`uct-tcp/src/coalesce.rs`, `RUCX_TCP_TX_COALESCE`): what waits for
//! the sender's next progress call, that nothing is lost or reordered, and what never waits.
//! Two workers, so the receiver can progress while the sender does not.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use uct::*;

const ID: u8 = 5;

/// Progresses only the receiver for `d`.
fn receiver_only(p: &Pair, d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        p.b.worker.progress();
    }
}

fn seqs(rec: &RefCell<Vec<Vec<u8>>>) -> Vec<u64> {
    rec.borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect()
}

/// A connected pair (one message from a to b went through), both sides idle, a's progress
/// just called: the next send is the first of a burst.
fn ready_pair(model: Model) -> (Pair, Rc<RefCell<Vec<Vec<u8>>>>) {
    let p = Pair::new(model, false);
    let rec = p.record(ID);
    p.retry("warm-up", || p.ep.am_short(ID, 0, b"w")).unwrap();
    p.wait("warm-up", || rec.borrow().len() == 1);
    rec.borrow_mut().clear();
    p.wait("idle", || {
        p.progress() == 0 && p.a.iface.event_arm(ArmEvents::SEND_COMP).is_ok()
    });
    p.a.worker.progress();
    (p, rec)
}

fn bcopy(p: &Pair, seq: u64, len: usize) -> Result<usize> {
    let data = pattern(len, seq);
    p.ep.am_bcopy(ID, |b| {
        b[..8].copy_from_slice(&seq.to_le_bytes());
        b[8..8 + len].copy_from_slice(&data);
        8 + len
    })
}

/// The first send after a progress call goes out at once; the rest of the burst waits for the
/// sender's next progress call (event_arm says Busy meanwhile), then arrives complete, in order.
#[test]
fn a_burst_waits_for_the_next_progress_call() {
    for model in [Model::Iface, Model::Ep] {
        let (p, rec) = ready_pair(model);
        p.ep.am_short(ID, 1, b"first").unwrap();
        assert_eq!(bcopy(&p, 2, 3000), Ok(3008));
        p.ep.am_short(ID, 3, b"third").unwrap();
        assert_eq!(p.a.iface.event_arm(ArmEvents::SEND_COMP), Err(Status::Busy));
        receiver_only(&p, Duration::from_millis(100));
        assert_eq!(seqs(&rec), [1], "{model:?}: only the first send went out");
        p.a.worker.progress();
        p.wait("the burst", || rec.borrow().len() == 3);
        assert_eq!(seqs(&rec), [1, 2, 3]);
        assert_eq!(&rec.borrow()[1][8..], &pattern(3000, 2)[..]);
        assert_eq!(&rec.borrow()[2][8..], b"third");
        assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
    }
}

/// A long burst without progress: sends keep being accepted (the staged bytes are written
/// whenever the buffer fills), and every message arrives once, in order, with its data.
#[test]
fn a_long_burst_is_written_in_batches() {
    let p = Pair::new(Model::Iface, false);
    let rec = p.record(ID);
    p.a.worker.progress();
    let n = 200u64;
    let mut seq = 0;
    let t = Instant::now();
    while seq < n {
        match bcopy(&p, seq, 4000) {
            Ok(_) => seq += 1,
            // The socket filled: only now does the sender need progress.
            Err(Status::NoResource) => {
                p.progress();
            }
            Err(e) => panic!("{e}"),
        }
        p.b.worker.progress();
        assert!(t.elapsed() < DEADLINE);
    }
    p.wait("all", || rec.borrow().len() as u64 == n);
    assert_eq!(seqs(&rec), (0..n).collect::<Vec<_>>());
    for (i, m) in rec.borrow().iter().enumerate() {
        assert_eq!(&m[8..], &pattern(4000, i as u64)[..], "message {i}");
    }
}

/// Sends that reference user memory do not wait behind staged bytes: those are written first,
/// and the order holds. put_short joins the burst; the flush that follows covers it.
#[test]
fn zcopy_and_puts_after_staged_sends_keep_order() {
    let (p, rec) = ready_pair(Model::Iface);
    p.ep.am_short(ID, 1, b"a").unwrap();
    p.ep.am_short(ID, 2, b"b").unwrap();
    let src = p.local(64, 0);
    src.write(0, &3u64.to_le_bytes()).unwrap();
    let iov = [src.iov(0, 8).unwrap()];
    let c = Completion::counter();
    let r = p.ep.am_zcopy(ID, &[], &iov, Some(&c));
    assert!(matches!(r, Ok(Status::Ok) | Ok(Status::InProgress)), "{r:?}");
    receiver_only(&p, Duration::from_millis(50));
    assert_eq!(seqs(&rec), [1, 2, 3], "staged sends went out before the zcopy");
    assert_eq!(p.finish(r, &c), Status::Ok);
    // Puts in a burst, then a flush: the data is there when it completes.
    let (mem, rkey) = p.remote(4096, 0);
    p.a.worker.progress();
    for i in 0..8u8 {
        p.ep.put_short(&[i + 1; 512], mem.addr() + 512 * u64::from(i), &rkey)
            .unwrap();
    }
    p.flush();
    let mut got = vec![0u8; 4096];
    mem.read(0, &mut got).unwrap();
    for i in 0..8 {
        assert!(
            got[512 * i..512 * (i + 1)].iter().all(|&b| b == i as u8 + 1),
            "put {i}"
        );
    }
}

/// An endpoint destroyed right after a burst: the staged messages still reach the peer.
#[test]
fn staged_sends_survive_ep_destroy() {
    let (p, rec) = ready_pair(Model::Iface);
    for s in 1..=3u64 {
        p.ep.am_short(ID, s, b"bye").unwrap();
    }
    let Pair { a, b, ep, .. } = p;
    drop(ep);
    let t = Instant::now();
    while rec.borrow().len() < 3 {
        a.worker.progress();
        b.worker.progress();
        assert!(t.elapsed() < DEADLINE, "staged sends lost with their endpoint");
    }
    assert_eq!(seqs(&rec), [1, 2, 3]);
}

/// A pack callback that progresses its worker while the connection holds staged sends (the
/// flush skips that connection until the callback returns): no panic, nothing lost.
#[test]
fn progress_from_a_pack_callback_during_a_burst() {
    let (p, rec) = ready_pair(Model::Iface);
    p.ep.am_short(ID, 1, b"one").unwrap();
    p.ep.am_short(ID, 2, b"two").unwrap();
    let n = p.ep.am_bcopy(ID, |b| {
        p.a.worker.progress();
        b[..8].copy_from_slice(&3u64.to_le_bytes());
        8
    });
    assert_eq!(n, Ok(8));
    p.wait("the burst", || rec.borrow().len() == 3);
    assert_eq!(seqs(&rec), [1, 2, 3]);
    assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
}
