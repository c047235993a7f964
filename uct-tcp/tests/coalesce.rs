//! Coalesced copied sends (`uct-tcp/src/coalesce.rs`, `RUCX_TCP_TX_COALESCE`): what waits for
//! the sender's next progress call, that nothing is lost or reordered, and what never waits.
//! Then every send flavor (am_short copied and gathered, am_bcopy, am_zcopy, put_short,
//! put_bcopy) under random interleavings: random progress on either side, small socket buffers
//! (`TCP_SNDBUF`/`RCVBUF` set in code) and phases in which the receiver stalls, so that short
//! writes, staged bursts, appends behind unsent bytes and their compaction all happen; every AM
//! must arrive once, in order, with its bytes, and the target memory must end up as the puts
//! left it. Two workers, so the receiver can progress while the sender does not.

use std::time::{Duration, Instant};

use rucx_testkit::am::headers;
use rucx_testkit::data::pattern;
use rucx_testkit::tcp::{self, STEP};
use rucx_testkit::{modules, Connect, Pair, Recorder, Remote, Setup, Workers};
use ucs::Outcome;
use uct::*;
use uct_transport::rng::XorShift;

const ID: u8 = 5;
const MEM: usize = 64 * 1024;

/// tcp on `lo`, linked in.
fn lo() -> Setup {
    tcp::lo(&modules::builtin(uct_tcp::module()))
}

/// A pair on [`lo`] in model `connect` (a worker each), with `config` set in code for both
/// interfaces.
fn lo_with(connect: Connect, config: &[(&str, &str)]) -> Pair {
    config
        .iter()
        .fold(lo(), |s, (k, v)| s.config(k, v))
        .layout(connect, Workers::Separate)
        .pair()
}

/// Progresses only the receiver for `d`.
fn receiver_only(p: &Pair, d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        p.rx.worker.progress();
    }
}

/// A connected pair (one message from a to b went through), both sides idle, a's progress
/// just called: the next send is the first of a burst.
fn ready_pair(model: Connect) -> (Pair, Recorder) {
    let p = lo().layout(model, Workers::Separate).pair();
    let rec = p.record_am(ID);
    p.retry("warm-up", || p.ep().am_short(ID, 0, b"w")).unwrap();
    p.wait_for("warm-up", || rec.borrow().len() == 1);
    rec.borrow_mut().clear();
    p.wait_for("idle", || {
        p.progress() == 0 && p.tx.iface.event_arm(ArmEvents::SEND_COMP).is_ok()
    });
    p.tx.worker.progress();
    (p, rec)
}

fn bcopy(p: &Pair, seq: u64, len: usize) -> Result<usize> {
    let data = pattern(len, seq);
    p.ep().am_bcopy(ID, |b| {
        b[..8].copy_from_slice(&seq.to_le_bytes());
        b[8..8 + len].copy_from_slice(&data);
        8 + len
    })
}

/// The first send after a progress call goes out at once; the rest of the burst waits for the
/// sender's next progress call (event_arm says Busy meanwhile), then arrives complete, in order.
#[test]
fn a_burst_waits_for_the_next_progress_call() {
    for model in [Connect::ToIface, Connect::ToEp] {
        let (p, rec) = ready_pair(model);
        p.ep().am_short(ID, 1, b"first").unwrap();
        assert_eq!(bcopy(&p, 2, 3000), Ok(3008));
        p.ep().am_short(ID, 3, b"third").unwrap();
        assert_eq!(
            p.tx.iface.event_arm(ArmEvents::SEND_COMP),
            Err(Status::Busy.into())
        );
        receiver_only(&p, Duration::from_millis(100));
        assert_eq!(headers(&rec), [1], "{model:?}: only the first send went out");
        p.tx.worker.progress();
        p.wait_for("the burst", || rec.borrow().len() == 3);
        assert_eq!(headers(&rec), [1, 2, 3]);
        assert_eq!(&rec.borrow()[1][8..], &pattern(3000, 2)[..]);
        assert_eq!(&rec.borrow()[2][8..], b"third");
        p.no_errors();
    }
}

/// A long burst without progress: sends keep being accepted (the staged bytes are written
/// whenever the buffer fills), and every message arrives once, in order, with its data.
#[test]
fn a_long_burst_is_written_in_batches() {
    let p = lo().layout(Connect::ToIface, Workers::Separate).pair();
    let rec = p.record_am(ID);
    p.tx.worker.progress();
    let n = 200u64;
    let mut seq = 0;
    let t = Instant::now();
    while seq < n {
        match bcopy(&p, seq, 4000) {
            Ok(_) => seq += 1,
            // The socket filled: only now does the sender need progress.
            Err(e) if e == Status::NoResource => {
                p.progress();
            }
            Err(e) => panic!("{e}"),
        }
        p.rx.worker.progress();
        assert!(t.elapsed() < STEP);
    }
    p.wait_for("all", || rec.borrow().len() as u64 == n);
    assert_eq!(headers(&rec), (0..n).collect::<Vec<_>>());
    for (i, m) in rec.borrow().iter().enumerate() {
        assert_eq!(&m[8..], &pattern(4000, i as u64)[..], "message {i}");
    }
}

/// Sends that reference user memory do not wait behind staged bytes: those are written first,
/// and the order holds. put_short joins the burst; the flush that follows covers it.
#[test]
fn zcopy_and_puts_after_staged_sends_keep_order() {
    let (p, rec) = ready_pair(Connect::ToIface);
    p.ep().am_short(ID, 1, b"a").unwrap();
    p.ep().am_short(ID, 2, b"b").unwrap();
    let src = p.local_mem(64, 0);
    src.write(0, &3u64.to_le_bytes()).unwrap();
    let iov = [src.iov(0, 8).unwrap()];
    let c = Completion::counter();
    let r = p.ep().am_zcopy(ID, &[], &iov, Some(&c));
    assert!(r.is_ok(), "{r:?}");
    receiver_only(&p, Duration::from_millis(50));
    assert_eq!(headers(&rec), [1, 2, 3], "staged sends went out before the zcopy");
    assert_eq!(p.outcome(r, &c), Status::Ok);
    // Puts in a burst, then a flush: the data is there when it completes.
    let Remote { mem, rkey } = p.remote_mem(4096, 0);
    p.tx.worker.progress();
    for i in 0..8u8 {
        p.ep()
            .put_short(&[i + 1; 512], mem.addr() + 512 * u64::from(i), &rkey)
            .unwrap();
    }
    p.flush_ep();
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
    let (p, rec) = ready_pair(Connect::ToIface);
    for s in 1..=3u64 {
        p.ep().am_short(ID, s, b"bye").unwrap();
    }
    let (a, b, ep, _) = p.into_parts();
    drop(ep);
    let t = Instant::now();
    while rec.borrow().len() < 3 {
        a.worker.progress();
        b.worker.progress();
        assert!(t.elapsed() < STEP, "staged sends lost with their endpoint");
    }
    assert_eq!(headers(&rec), [1, 2, 3]);
}

/// A pack callback that progresses its worker while the connection holds staged sends (the
/// flush skips that connection until the callback returns): no panic, nothing lost.
#[test]
fn progress_from_a_pack_callback_during_a_burst() {
    let (p, rec) = ready_pair(Connect::ToIface);
    p.ep().am_short(ID, 1, b"one").unwrap();
    p.ep().am_short(ID, 2, b"two").unwrap();
    let n = p.ep().am_bcopy(ID, |b| {
        p.tx.worker.progress();
        b[..8].copy_from_slice(&3u64.to_le_bytes());
        8
    });
    assert_eq!(n, Ok(8));
    p.wait_for("the burst", || rec.borrow().len() == 3);
    assert_eq!(headers(&rec), [1, 2, 3]);
    p.no_errors();
}

#[test]
fn random_send_mix_keeps_order_and_data() {
    for seed in [1u64, 2] {
        random_mix(seed);
    }
}

fn random_mix(seed: u64) {
    let mut rng = XorShift::new(seed);
    let p = lo_with(Connect::ToIface, &[("TCP_SNDBUF", "16k"), ("TCP_RCVBUF", "16k")]);
    let rec = p.record_am(ID);
    p.retry("connect", || p.ep().am_short(ID, u64::MAX, b"")).unwrap();
    p.wait_for("connect", || rec.borrow().len() == 1);
    rec.borrow_mut().clear();
    let Remote { mem, rkey } = p.remote_mem(MEM, 0);
    let mut expect_mem = vec![0u8; MEM];
    let src = p.local_mem(16 * 1024, 0);
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let t = Instant::now();
    for i in 0..2000 {
        assert!(t.elapsed() < STEP, "seed {seed}: too slow");
        // Every other block of 250 operations the receiver stalls: the socket fills, and a
        // send that gets NoResource is dropped instead of retried (only the sender progresses).
        let stalled = (i / 250) % 2 == 1;
        if rng.below(4) == 0 {
            p.tx.worker.progress();
        }
        if !stalled && rng.below(3) == 0 {
            p.rx.worker.progress();
        }
        let attempt = |op: &mut dyn FnMut() -> Result<()>| -> bool {
            if stalled {
                match op() {
                    Ok(()) => true,
                    Err(e) if e == Status::NoResource => {
                        p.tx.worker.progress();
                        false
                    }
                    Err(e) => panic!("seed {seed}: {e}"),
                }
            } else {
                p.retry("send", &mut *op).unwrap();
                true
            }
        };
        let seq = sent.len() as u64;
        match rng.below(8) {
            // am_short: copied (up to SENDV_THRESH) or gathered from the caller's buffer.
            0..=2 => {
                let data = pattern(rng.below(4000), seed ^ seq);
                if attempt(&mut || p.ep().am_short(ID, seq, &data)) {
                    let mut m = seq.to_le_bytes().to_vec();
                    m.extend_from_slice(&data);
                    sent.push(m);
                }
            }
            3 | 4 => {
                let mut m = seq.to_le_bytes().to_vec();
                m.extend(pattern(rng.below(8000), seed ^ seq));
                let ok = attempt(&mut || {
                    let n = p.ep().am_bcopy(ID, |b| {
                        b[..m.len()].copy_from_slice(&m);
                        m.len()
                    })?;
                    assert_eq!(n, m.len());
                    Ok(())
                });
                if ok {
                    sent.push(m);
                }
            }
            5 => {
                let mut m = seq.to_le_bytes().to_vec();
                m.extend(pattern(rng.below(16 * 1024 - 8), seed ^ seq));
                src.write(0, &m[8..]).unwrap();
                let iov = [src.iov(0, m.len() - 8).unwrap()];
                let c = Completion::counter();
                let mut r = Ok(Outcome::Done);
                let ok = attempt(&mut || {
                    r = p.ep().am_zcopy(ID, &m[..8], &iov, Some(&c));
                    r.clone().map(|_| ())
                });
                if ok {
                    // `src` is reused: wait until it is written (the receiver may have to run).
                    assert_eq!(p.outcome(r, &c), Status::Ok);
                    sent.push(m);
                }
            }
            k => {
                let len = 1 + rng.below(if k == 6 { 512 } else { 4000 });
                let off = rng.below(MEM - len);
                let data = pattern(len, seed ^ seq ^ 0xabc);
                let raddr = mem.addr() + off as u64;
                let ok = attempt(&mut || {
                    if k == 6 {
                        p.ep().put_short(&data, raddr, &rkey)
                    } else {
                        let n = p.ep().put_bcopy(
                            |b| {
                                b[..len].copy_from_slice(&data);
                                len
                            },
                            raddr,
                            &rkey,
                        )?;
                        assert_eq!(n, len);
                        Ok(())
                    }
                });
                if ok {
                    expect_mem[off..off + len].copy_from_slice(&data);
                }
            }
        }
    }
    p.flush_ep();
    p.wait_for("all messages", || rec.borrow().len() == sent.len());
    for (i, (got, want)) in rec.borrow().iter().zip(&sent).enumerate() {
        assert_eq!(got.len(), want.len(), "seed {seed}: message {i} length");
        assert!(got == want, "seed {seed}: message {i} differs (order or bytes)");
    }
    let mut got = vec![0u8; MEM];
    mem.read(0, &mut got).unwrap();
    assert!(
        got == expect_mem,
        "seed {seed}: target memory differs from the puts"
    );
    p.no_errors();
}
