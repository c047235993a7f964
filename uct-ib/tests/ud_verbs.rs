//! ud_verbs through the uct API, on a real RDMA device: interfaces in one process. Every test
//! prints "skipped: no RDMA device" and passes without one; run them in the Soft-RoCE VM:
//!   testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1
//! `RUCX_IB_DEVICE=rxe0` picks the device. The `RUCX_UD_*` settings a test needs (injected
//! loss, duplication and reordering; a short peer timeout; slow timers) are set in code for the
//! interfaces it opens. `ud_flush_spin.rs` counts the packets of the port, so it is a binary of
//! its own.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rucx_testkit::wait::{flush, retry, wait_for};
use rucx_testkit::{device, modules, pair, worker, Dev, Entity, Recorder, Setup};
use ucs::Outcome;
use uct::*;

/// Bound of every wait: the tests move many messages through a slow VM.
const DEADLINE: Duration = Duration::from_secs(60);

/// ud_verbs on the first RDMA device; `None` (after "skipped: no RDMA device") on a host
/// without one.
fn ud() -> Option<Setup> {
    let ctx = modules::builtin(uct_ib::module());
    let Some(res) = device::find(&ctx, "ud_verbs", Dev::First) else {
        println!("skipped: no RDMA device");
        return None;
    };
    Some(Setup::new("ud_verbs", res).deadline(DEADLINE))
}

/// [`ud`] with a silent peer declared dead after 1 s (`UD_TIMEOUT`).
fn ud_1s() -> Option<Setup> {
    Some(ud()?.config("UD_TIMEOUT", "1s"))
}

#[test]
fn attributes_and_addresses() {
    let Some(u) = ud() else { return };
    let a = u.entity(&worker());
    let at = *a.iface.attr();
    println!("{}: {at:?}", u.dev());
    for f in [
        IfaceFlags::AM_SHORT,
        IfaceFlags::AM_BCOPY,
        IfaceFlags::AM_ZCOPY,
        IfaceFlags::PENDING,
        IfaceFlags::CONNECT_TO_IFACE,
        IfaceFlags::CONNECT_TO_EP,
        IfaceFlags::CB_SYNC,
        IfaceFlags::ERRHANDLE_PEER_FAILURE,
    ] {
        assert!(at.flags.contains(f), "missing {f:?}");
    }
    for f in [
        IfaceFlags::PUT_SHORT,
        IfaceFlags::GET_BCOPY,
        IfaceFlags::ATOMIC_DEVICE,
    ] {
        assert!(!at.flags.contains(f), "{f:?} advertised");
    }
    assert!(at.event_flags.contains(EventFlags::FD | EventFlags::RECV));
    // one packet per message: path MTU (1024 on rxe) minus the 12-byte header
    assert!(
        at.am.max_short >= 256 - 12 && at.am.max_short == at.am.max_bcopy,
        "{:?}",
        at.am
    );
    assert_eq!(
        (at.device_addr_len, at.iface_addr_len, at.ep_addr_len),
        (20, 3, 6)
    );
    assert_eq!(a.iface.address().unwrap().len(), 3);
    let b = u.entity(&worker());
    assert_ne!(
        a.iface.address().unwrap(),
        b.iface.address().unwrap(),
        "one QP per interface"
    );
    assert!(a
        .iface
        .is_reachable(&b.iface.device_address().unwrap(), &b.iface.address().unwrap()));
    assert!(
        !a.iface.is_reachable(&[0u8; 20], &b.iface.address().unwrap()),
        "garbage device address"
    );
    let ep = a.iface.ep_create().unwrap();
    assert_eq!(ep.address().unwrap().len(), 6);
    assert_eq!(
        ep.address().unwrap()[..3],
        a.iface.address().unwrap()[..],
        "ep address = iface address + ep id"
    );
    // RMA and atomics are not offered
    let mem = Mem::alloc(&b.md, 64, MemAccess::ALL).unwrap();
    let rkey = a.md.component().rkey_unpack(&mem.pack_rkey().unwrap()).unwrap();
    assert_eq!(
        ep.put_short(b"x", mem.addr(), &rkey),
        Err(Status::Unsupported.into())
    );
    let mut buf = [0u8; 8];
    assert_eq!(
        ep.get_short(&mut buf, mem.addr(), &rkey),
        Err(Status::Unsupported.into())
    );
    assert_eq!(
        ep.atomic_post(AtomicWidth::U64, AtomicOp::Add, 1, mem.addr(), &rkey),
        Err(Status::Unsupported.into())
    );
    // not connected yet: sends wait
    assert_eq!(ep.am_short(1, 0, b"x"), Err(Status::NoResource.into()));
    assert_eq!(ep.am_short(40, 0, b"x"), Err(Status::InvalidParam.into()));
}

#[test]
fn connect_to_ep_am_short_bcopy_both_ways() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, ba) = pair::connect_to_ep(&a, &b);
    let (at_b, at_a) = (b.record_am(3), a.record_am(4));
    let max = a.iface.attr().am.max_bcopy;
    let s = [&a, &b];
    retry(&s, DEADLINE, "am_short", || {
        ab.am_short(3, 0x1122_3344_5566_7788, b"hello")
    })
    .unwrap();
    let big: Vec<u8> = (0..max).map(|i| (i * 13) as u8).collect();
    let n = retry(&s, DEADLINE, "am_bcopy", || {
        ab.am_bcopy(3, |buf| {
            buf[..big.len()].copy_from_slice(&big);
            big.len()
        })
    })
    .unwrap();
    assert_eq!(n, max);
    retry(&s, DEADLINE, "am_short_iov", || {
        ab.am_short_iov(3, &[b"ab", b"cd"])
    })
    .unwrap();
    retry(&s, DEADLINE, "reply", || ba.am_short(4, 7, b"back")).unwrap();
    wait_for(&s, DEADLINE, "messages", || {
        at_b.borrow().len() == 3 && at_a.borrow().len() == 1
    });
    let got = at_b.borrow();
    assert_eq!(got[0][..8], 0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(&got[0][8..], b"hello");
    assert_eq!(got[1], big, "a full-MTU bcopy message");
    assert_eq!(got[2], b"abcd");
    assert_eq!(&at_a.borrow()[0][8..], b"back");
    // one byte more than a packet holds is refused
    let too_big = vec![0u8; a.iface.attr().am.max_short - 8 + 1];
    assert_eq!(ab.am_short(3, 0, &too_big), Err(Status::InvalidParam.into()));
    flush(&s, DEADLINE, &ab);
    flush(&s, DEADLINE, &ba);
    assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
}

#[test]
fn connect_to_iface_creates_the_peer_endpoint() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let s = [&a, &b];
    let (at_b, at_a) = (b.record_am(1), a.record_am(2));
    let ab = pair::connect_to_iface(&a, &b);
    // the first send waits for the connection reply, then goes
    retry(&s, DEADLINE, "am_short after connect", || {
        ab.am_short(1, 1, b"to b")
    })
    .unwrap();
    // b answers through its own endpoint to a's interface
    let ba = pair::connect_to_iface(&b, &a);
    retry(&s, DEADLINE, "am_short back", || ba.am_short(2, 2, b"to a")).unwrap();
    wait_for(&s, DEADLINE, "both messages", || {
        at_b.borrow().len() == 1 && at_a.borrow().len() == 1
    });
    assert_eq!(&at_b.borrow()[0][8..], b"to b");
    assert_eq!(&at_a.borrow()[0][8..], b"to a");
    // several endpoints to the same interface are independent connections
    let ab2 = pair::connect_to_iface(&a, &b);
    retry(&s, DEADLINE, "second ep", || ab2.am_short(1, 3, b"ep2")).unwrap();
    retry(&s, DEADLINE, "first ep again", || ab.am_short(1, 4, b"ep1")).unwrap();
    wait_for(&s, DEADLINE, "two more", || at_b.borrow().len() == 3);
    flush(&s, DEADLINE, &ab);
    flush(&s, DEADLINE, &ab2);
    flush(&s, DEADLINE, &ba);
    let mut hdrs: Vec<u64> = at_b
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    hdrs.sort();
    assert_eq!(hdrs, vec![1, 3, 4]);
    // a destroyed endpoint tells the peer, which then drops its side; new connections work
    drop(ab2);
    let ab3 = pair::connect_to_iface(&a, &b);
    retry(&s, DEADLINE, "third ep", || ab3.am_short(1, 5, b"ep3")).unwrap();
    wait_for(&s, DEADLINE, "ep3", || at_b.borrow().len() == 4);
    assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
}

#[test]
fn am_zcopy_gathers_registered_memory_and_completes_on_ack() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    let rec = b.record_am(12);
    let s = [&a, &b];
    let at = *a.iface.attr();
    assert!(at.am.max_iov >= 2, "{:?}", at.am);
    let mem = Mem::alloc(&a.md, 4096, MemAccess::ALL).unwrap();
    let pattern: Vec<u8> = (0..4096).map(|i| (i * 7 + 3) as u8).collect();
    mem.write(0, &pattern).unwrap();
    let mut want = Vec::new();
    for (k, (hdr, len)) in [(0usize, 1usize), (8, 100), (16, 500), (3, at.am.max_zcopy - 3)]
        .into_iter()
        .enumerate()
    {
        let header = vec![k as u8 + 1; hdr];
        let half = len / 2;
        let iov = [mem.iov(0, half).unwrap(), mem.iov(1000, len - half).unwrap()];
        let c = Completion::counter();
        let r = retry(&s, DEADLINE, "am_zcopy", || {
            ab.am_zcopy(12, &header, &iov, Some(&c))
        })
        .unwrap();
        assert_eq!(r, Outcome::InProgress);
        wait_for(&s, DEADLINE, "zcopy completion", || c.fired() == 1);
        assert_eq!(c.last_status(), Status::Ok);
        let mut m = header.clone();
        m.extend_from_slice(&pattern[..half]);
        m.extend_from_slice(&pattern[1000..1000 + len - half]);
        want.push(m);
    }
    // header + payload beyond one packet, or unregistered memory: refused
    let iov = [mem.iov(0, at.am.max_zcopy).unwrap()];
    assert_eq!(
        ab.am_zcopy(12, b"h", &iov, None),
        Err(Status::InvalidParam.into())
    );
    wait_for(&s, DEADLINE, "zcopy messages", || {
        rec.borrow().len() == want.len()
    });
    assert_eq!(*rec.borrow(), want);
    // completions of many in flight, in order
    let c = Completion::counter();
    for _ in 0..200 {
        let iov = [mem.iov(0, 64).unwrap()];
        let _ = retry(&s, DEADLINE, "am_zcopy", || ab.am_zcopy(12, b"", &iov, Some(&c))).unwrap();
    }
    wait_for(&s, DEADLINE, "200 completions", || {
        c.outstanding() == 0 && rec.borrow().len() == want.len() + 200
    });
    assert_eq!(c.last_status(), Status::Ok);
}

/// A receiver that stops progressing in the round that delivered the message (as a
/// one-message server does) has still sent the ACK the sender asked for: ACKs a peer asks for
/// go out in the round that received its packet, even a round that returns early.
#[test]
fn receiver_acknowledges_in_the_round_that_received() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let ab = pair::connect_to_iface(&a, &b);
    let rec = b.record_am(4);
    let mem = Mem::alloc(&a.md, 4096, MemAccess::ALL).unwrap();
    mem.write(0, &[0x5a; 1000]).unwrap();
    let iov = [mem.iov(0, 1000).unwrap()];
    let c = Completion::counter();
    let s = [&a, &b];
    let r = retry(&s, DEADLINE, "am_zcopy", || ab.am_zcopy(4, &[], &iov, Some(&c))).unwrap();
    assert_eq!(r, Outcome::InProgress);
    // `wait` progresses a, then b, and stops right after b's round that delivered it
    wait_for(&s, DEADLINE, "the message at b", || !rec.borrow().is_empty());
    let start = Instant::now();
    while c.fired() == 0 && start.elapsed() < Duration::from_secs(3) {
        a.worker.progress();
    }
    assert_eq!(
        c.fired(),
        1,
        "the zcopy was not acknowledged by a receiver that stopped progressing"
    );
    assert_eq!(c.last_status(), Status::Ok);
    assert_eq!(rec.borrow()[0], vec![0x5a; 1000]);
}

/// A flush that returns `Ok` comes after the completions of the operations it covers, also
/// when their ACK was applied at the start of a round that then received more packets (a
/// round that returns early after its receives must not leave those completions unfired).
/// Each step lets the previous packets arrive before the next progress round.
#[test]
fn flush_ok_only_after_the_completions_its_ack_released() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, ba) = pair::connect_to_ep(&a, &b);
    let (at_a, at_b) = (a.record_am(6), b.record_am(6));
    let mem = Mem::alloc(&a.md, 4096, MemAccess::ALL).unwrap();
    let iov = [mem.iov(0, 64).unwrap()];
    let settle = || std::thread::sleep(Duration::from_millis(20));
    // open b's congestion window (it starts at 2; each round below sends three packets)
    let s = [&a, &b];
    let max = a.iface.attr().am.max_bcopy;
    send_numbered(&s, &ba, 7, 200, max);
    send_numbered(&s, &ab, 7, 200, max);
    flush(&s, DEADLINE, &ba);
    flush(&s, DEADLINE, &ab);
    let c = Completion::counter();
    let order: Rc<RefCell<Vec<&str>>> = Rc::default();
    for round in 0..6 {
        // odd rounds: the zcopy and the flush with completions that record their order
        let o = order.clone();
        let zc = Completion::new(move |_| o.borrow_mut().push("zcopy"));
        let o = order.clone();
        let fc = Completion::new(move |_| o.borrow_mut().push("flush"));
        let (zcopy_comp, with_comp) = if round % 2 == 1 { (&zc, true) } else { (&c, false) };
        // a round with nothing to receive
        a.worker.progress();
        // a packet for a that does not acknowledge the zcopy yet
        ba.am_short(6, 0, b"m0").unwrap();
        assert_eq!(
            ab.am_zcopy(6, &[], &iov, Some(zcopy_comp)),
            Ok(Outcome::InProgress)
        );
        settle();
        a.worker.progress(); // receives m0
        wait_for(&[&b], DEADLINE, "the zcopy at b", || !at_b.borrow().is_empty());
        at_b.borrow_mut().clear();
        ba.am_short(6, 1, b"m1").unwrap(); // acknowledges it
        settle();
        a.worker.progress(); // receives m1
        ba.am_short(6, 2, b"m2").unwrap();
        settle();
        a.worker.progress(); // receives m2
        if with_comp {
            let r = retry(&s, DEADLINE, "flush", || ab.flush(FlushFlags::LOCAL, Some(&fc)));
            if r == Ok(Outcome::Done) {
                order.borrow_mut().push("flush");
            }
            wait_for(&s, DEADLINE, "both completions", || order.borrow().len() == 2);
            assert_eq!(*order.borrow(), ["zcopy", "flush"], "the flush completed first");
            order.borrow_mut().clear();
        } else {
            match ab.flush(FlushFlags::LOCAL, None) {
                Ok(Outcome::Done) => {
                    assert_eq!(c.outstanding(), 0, "flush Ok before the zcopy completed")
                }
                Ok(Outcome::InProgress) => {}
                Err(e) if e == Status::NoResource => {}
                other => panic!("flush: {other:?}"),
            }
        }
        wait_for(&[&a, &b], DEADLINE, "the zcopy's completion", || {
            c.outstanding() == 0 && zc.outstanding() == 0
        });
        wait_for(&[&a, &b], DEADLINE, "m0-m2 at a", || at_a.borrow().len() == 3);
        at_a.borrow_mut().clear();
        flush(&[&a, &b], DEADLINE, &ba);
    }
    assert_eq!(c.last_status(), Status::Ok);
}

#[test]
fn many_messages_arrive_once_in_order() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, ba) = pair::connect_to_ep(&a, &b);
    let (at_b, at_a) = (b.record_am(5), a.record_am(5));
    let max = a.iface.attr().am.max_bcopy;
    let s = [&a, &b];
    let n = 20_000;
    let t = Instant::now();
    send_numbered(&s, &ab, 5, n, max);
    send_numbered(&s, &ba, 5, 1000, max);
    wait_for(&s, DEADLINE, "all messages", || {
        at_b.borrow().len() as u64 == n && at_a.borrow().len() == 1000
    });
    flush(&s, DEADLINE, &ab);
    flush(&s, DEADLINE, &ba);
    println!("{n} messages in {:?}", t.elapsed());
    check_numbered(&at_b, n, max);
    check_numbered(&at_a, 1000, max);
}

#[test]
fn flush_ep_and_iface_wait_for_acknowledgements() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    let rec = b.record_am(0);
    let s = [&a, &b];
    assert_eq!(
        ab.flush(FlushFlags::LOCAL, None),
        Ok(Outcome::Done),
        "nothing sent: flushed"
    );
    assert_eq!(a.iface.flush(FlushFlags::LOCAL, None), Ok(Outcome::Done));
    retry(&s, DEADLINE, "send", || ab.am_short(0, 1, b"x")).unwrap();
    let c = Completion::counter();
    assert_eq!(
        ab.flush(FlushFlags::LOCAL, Some(&c)),
        Ok(Outcome::InProgress),
        "not acknowledged yet"
    );
    // the receiver has not progressed: the flush cannot complete
    for _ in 0..100 {
        a.worker.progress();
    }
    assert_eq!(c.fired(), 0, "flush completed before the peer received anything");
    wait_for(&s, DEADLINE, "flush", || c.fired() == 1);
    assert_eq!((c.last_status(), rec.borrow().len()), (Status::Ok, 1));
    retry(&s, DEADLINE, "send", || ab.am_short(0, 2, b"y")).unwrap();
    let ci = Completion::counter();
    assert_eq!(
        a.iface.flush(FlushFlags::LOCAL, Some(&ci)),
        Ok(Outcome::InProgress)
    );
    wait_for(&s, DEADLINE, "iface flush", || ci.fired() == 1);
    assert_eq!(ci.last_status(), Status::Ok);
    assert_eq!(ab.flush(FlushFlags::LOCAL, None), Ok(Outcome::Done));
}

#[test]
fn pending_requests_run_in_order_when_the_window_opens() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    let ab = Rc::new(ab);
    let rec = b.record_am(9);
    let s = [&a, &b];
    // resources free: pending_add says Busy
    match ab.pending_add(PendingRequest::new(|_| PendingResult::Done)) {
        Err((e, _)) if e == Status::Busy => {}
        other => panic!("pending_add on an idle endpoint: {:?}", other.map_err(|e| e.0)),
    }
    // fill the window (the receiver does not progress, so nothing is acknowledged)
    let mut seq = 0u64;
    while ab.am_short(9, seq, b"fill").is_ok() {
        seq += 1;
        assert!(seq < 100_000, "never ran out of window");
    }
    println!("window full after {seq} messages");
    let done = Rc::new(Cell::new(0u64));
    for j in 0..50u64 {
        let (ep, done) = (Rc::downgrade(&ab), done.clone());
        let my = seq + j;
        let req = PendingRequest::new(move |_| match ep.upgrade().unwrap().am_short(9, my, b"pending") {
            Ok(()) => {
                done.set(done.get() + 1);
                PendingResult::Done
            }
            Err(_) => PendingResult::Stop,
        });
        assert!(
            ab.pending_add(req).is_ok(),
            "pending_add while out of resources must queue"
        );
    }
    assert_eq!(
        ab.am_short(9, u64::MAX, b"overtake"),
        Err(Status::NoResource.into()),
        "nothing overtakes the queue"
    );
    assert_eq!(
        ab.flush(FlushFlags::LOCAL, None),
        Err(Status::NoResource.into()),
        "flush waits for the queue"
    );
    wait_for(&s, DEADLINE, "pending dispatch", || done.get() == 50);
    wait_for(&s, DEADLINE, "all delivered", || {
        rec.borrow().len() as u64 == seq + 50
    });
    let hdrs: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(hdrs, (0..seq + 50).collect::<Vec<_>>());
    flush(&s, DEADLINE, &ab);
}

#[test]
fn event_fd_signals_arrivals() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    let rec = b.record_am(2);
    let s = [&a, &b];
    let fd = b.iface.event_fd().expect("event fd");
    let readable = |ms: u16| {
        let mut p = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        nix::poll::poll(&mut p, nix::poll::PollTimeout::from(ms)).unwrap() > 0
    };
    for round in 0..3u64 {
        // arm until it sticks (Busy: progress first)
        let t = Instant::now();
        while b.iface.event_arm(ArmEvents::RECV) == Err(Status::Busy.into()) {
            b.worker.progress();
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        assert!(!readable(0), "round {round}: readable before anything was sent");
        retry(&s[..1], DEADLINE, "send", || ab.am_short(2, round, b"wake")).unwrap();
        assert!(readable(5000), "round {round}: no event for an arrival");
        wait_for(&s, DEADLINE, "delivery", || {
            rec.borrow().len() as u64 == round + 1
        });
    }
    // the sender may sleep only once its packets are acknowledged (resends need progress)
    retry(&s[..1], DEADLINE, "send", || ab.am_short(2, 99, b"unacked")).unwrap();
    assert_eq!(
        a.iface.event_arm(ArmEvents::RECV),
        Err(Status::Busy.into()),
        "unacknowledged packets"
    );
    wait_for(&s, DEADLINE, "acknowledgement", || {
        a.iface.event_arm(ArmEvents::RECV).is_ok()
    });
    assert_eq!(rec.borrow().len(), 4);
}

/// Packets of up to 64 bytes with their GRH (an AM of up to 12 bytes) land in the receive
/// head slots, longer ones run on into their buffer: every length across the boundary, both
/// ways, arrives intact, and a handler that keeps a head-slot message keeps its own copy.
#[test]
fn messages_across_the_receive_head_boundary() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, ba) = pair::connect_to_ep(&a, &b);
    let s = [&a, &b];
    let (at_b, at_a) = (b.record_am(9), a.record_am(9));
    let kept: Rc<RefCell<Vec<RxDesc>>> = Rc::default();
    let k = kept.clone();
    b.iface
        .set_am_handler(10, AmCbFlags::SYNC, move |m| k.borrow_mut().push(m.keep()))
        .unwrap();
    let mut want = Vec::new();
    for n in 0..=40usize {
        let payload: Vec<u8> = (0..n).map(|i| (n * 7 + i) as u8).collect();
        let hdr = 0xa0a0_0000_0000_0000 | n as u64;
        retry(&s, DEADLINE, "am_short", || ab.am_short(9, hdr, &payload)).unwrap();
        retry(&s, DEADLINE, "am_short back", || ba.am_short(9, hdr, &payload)).unwrap();
        retry(&s, DEADLINE, "kept", || ab.am_short(10, hdr, &payload)).unwrap();
        let mut m = hdr.to_le_bytes().to_vec();
        m.extend_from_slice(&payload);
        want.push(m);
    }
    for n in 0..=24usize {
        let body: Vec<u8> = (0..n).map(|i| (0x55 ^ (n + i)) as u8).collect();
        let sent = retry(&s, DEADLINE, "am_bcopy", || {
            ab.am_bcopy(9, |buf| {
                buf[..n].copy_from_slice(&body);
                n
            })
        })
        .unwrap();
        assert_eq!(sent, n);
        want.push(body);
    }
    wait_for(&s, DEADLINE, "every length", || {
        at_b.borrow().len() == want.len() && at_a.borrow().len() == 41 && kept.borrow().len() == 41
    });
    assert_eq!(*at_b.borrow(), want);
    assert_eq!(*at_a.borrow(), want[..41]);
    // more traffic through the same slots before the kept copies are read
    send_numbered(&s, &ab, 9, 600, a.iface.attr().am.max_bcopy);
    wait_for(&s, DEADLINE, "more", || at_b.borrow().len() == want.len() + 600);
    for (d, w) in kept.borrow().iter().zip(&want) {
        assert_eq!(&d[..], &w[..], "kept message intact");
    }
    kept.borrow_mut().clear();
    flush(&s, DEADLINE, &ab);
    flush(&s, DEADLINE, &ba);
}

#[test]
fn kept_descriptors_and_handlers_that_send() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, ba) = pair::connect_to_ep(&a, &b);
    let s = [&a, &b];
    let kept: Rc<RefCell<Vec<RxDesc>>> = Rc::default();
    let k = kept.clone();
    b.iface
        .set_am_handler(6, AmCbFlags::SYNC, move |m| k.borrow_mut().push(m.keep()))
        .unwrap();
    // a handler that answers from inside the callback (refused with NoResource while the
    // window is full; every accepted answer must arrive, in order)
    let ba = Rc::new(ba);
    let echo = Rc::downgrade(&ba);
    let accepted = Rc::new(Cell::new(0u64));
    let acc = accepted.clone();
    b.iface
        .set_am_handler(7, AmCbFlags::SYNC, move |m| {
            if echo
                .upgrade()
                .unwrap()
                .am_short(8, m.header() + 1000, b"echo")
                .is_ok()
            {
                acc.set(acc.get() + 1);
            }
        })
        .unwrap();
    let echoes = a.record_am(8);
    for i in 0..200u64 {
        retry(&s, DEADLINE, "keep", || ab.am_short(6, i, &[i as u8; 100])).unwrap();
        retry(&s, DEADLINE, "echo", || ab.am_short(7, i, b"ping")).unwrap();
    }
    wait_for(&s, DEADLINE, "kept", || kept.borrow().len() == 200);
    for (i, d) in kept.borrow().iter().enumerate() {
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), i as u64);
        assert!(d[8..].iter().all(|&x| x == i as u8), "kept data {i} intact");
    }
    kept.borrow_mut().clear(); // released to the transport
    wait_for(&s, DEADLINE, "pings handled", || accepted.get() > 0);
    flush(&s, DEADLINE, &ba);
    wait_for(&s, DEADLINE, "accepted echoes", || {
        echoes.borrow().len() as u64 == accepted.get()
    });
    println!("{} of 200 echoes accepted inside the handler", accepted.get());
    let hdrs: Vec<u64> = echoes
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert!(hdrs.windows(2).all(|w| w[0] < w[1]), "echoes in order: {hdrs:?}");
    flush(&s, DEADLINE, &ab);
}

#[test]
fn destroyed_endpoint_still_delivers_what_it_sent() {
    let Some(u) = ud() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let s = [&a, &b];
    let rec = b.record_am(11);
    let ab = pair::connect_to_iface(&a, &b);
    for i in 0..64u64 {
        retry(&s, DEADLINE, "send", || ab.am_short(11, i, b"linger")).unwrap();
    }
    drop(ab); // packets still unacknowledged: the endpoint lingers until they are
    wait_for(&s, DEADLINE, "delivery after destroy", || {
        rec.borrow().len() == 64
    });
    let c = Completion::counter();
    let r = a.iface.flush(FlushFlags::LOCAL, Some(&c)).unwrap();
    if r == Outcome::InProgress {
        wait_for(&s, DEADLINE, "iface flush", || c.fired() == 1);
    }
    assert!(a.errors.borrow().is_empty(), "{:?}", a.errors.borrow());
}

/// Sends `n` numbered messages on `ep` (am_short and am_bcopy alternately, some of them
/// long), retrying on `NoResource`.
fn send_numbered(sides: &[&Entity], ep: &Ep, id: u8, n: u64, max_bcopy: usize) {
    send_numbered_range(sides, ep, id, 0, n, max_bcopy)
}

/// [`send_numbered`] for messages `from..to` (same numbering and lengths).
fn send_numbered_range(s: &[&Entity], ep: &Ep, id: u8, from: u64, to: u64, max_bcopy: usize) {
    for i in from..to {
        let long = (i % 7) as usize * (max_bcopy / 8);
        if i % 2 == 0 {
            let payload = vec![(i % 251) as u8; long.saturating_sub(8)];
            retry(s, DEADLINE, "am_short", || ep.am_short(id, i, &payload)).unwrap();
        } else {
            retry(s, DEADLINE, "am_bcopy", || {
                ep.am_bcopy(id, |b| {
                    let len = long.clamp(8, b.len());
                    b[..8].copy_from_slice(&i.to_le_bytes());
                    b[8..len].fill((i % 251) as u8);
                    len
                })
            })
            .unwrap();
        }
    }
}

/// Checks that `rec` holds exactly the messages 0..n of [`send_numbered`], in order.
fn check_numbered(rec: &Recorder, n: u64, max_bcopy: usize) {
    let got = rec.borrow();
    assert_eq!(got.len() as u64, n, "message count");
    for (i, m) in got.iter().enumerate() {
        let i = i as u64;
        let seq = u64::from_le_bytes(m[..8].try_into().unwrap());
        assert_eq!(seq, i, "message {i} out of order or duplicated");
        let long = (i % 7) as usize * (max_bcopy / 8);
        assert_eq!(m.len(), long.max(8), "message {i} length");
        assert!(
            m[8..].iter().all(|&b| b == (i % 251) as u8),
            "message {i} payload"
        );
    }
}

// Loss, duplication and reordering: the `UD_TEST_*` hook.

#[test]
fn exactly_once_in_order_under_loss_duplication_and_reordering() {
    let Some(u) = ud() else { return };
    // UD_LOSS_SEED varies the injected faults (same seed, same decisions)
    let base: u64 = std::env::var("UD_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1234);
    for (i, loss) in ["1", "5", "10"].into_iter().enumerate() {
        let seed = (base + i as u64).to_string();
        let bad = u
            .clone()
            .config("UD_TEST_LOSS", loss)
            .config("UD_TEST_DUP", "5")
            .config("UD_TEST_REORDER", "5")
            .config("UD_TEST_SEED", &seed)
            // keep the run short on a slow VM: resend sooner
            .config("UD_TIMER_TICK", "2ms");
        let (a, b) = (bad.entity(&worker()), bad.entity(&worker()));
        let s = [&a, &b];
        let max = a.iface.attr().am.max_bcopy;
        let (at_b, at_a) = (b.record_am(1), a.record_am(2));
        // connection requests and replies cross the bad network too
        let ab = pair::connect_to_iface(&a, &b);
        let ba = pair::connect_to_iface(&b, &a);
        let n = 3000;
        let t = Instant::now();
        for chunk in 0..10 {
            let (from, to) = (chunk * n / 10, (chunk + 1) * n / 10);
            send_numbered_range(&s, &ab, 1, from, to, max);
            send_numbered_range(&s, &ba, 2, from / 3, to / 3, max);
        }
        wait_for(&s, DEADLINE, "every message", || {
            at_b.borrow().len() as u64 == n && at_a.borrow().len() as u64 == n / 3
        });
        flush(&s, DEADLINE, &ab);
        flush(&s, DEADLINE, &ba);
        println!(
            "loss {loss}%: {n} + {} messages exactly once, in order, in {:?}",
            n / 3,
            t.elapsed()
        );
        check_numbered(&at_b, n, max);
        check_numbered(&at_a, n / 3, max);
        assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
    }
}

// Peer failure: `UD_TIMEOUT` 1 s.

/// Sends on `ep` (ignoring NoResource) and progresses `a` until its error handler fires;
/// returns how long that took.
fn until_error(a: &Entity, ep: &Ep) -> Duration {
    let t = Instant::now();
    let mut i = 0u64;
    while a.errors.borrow().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(20), "peer never declared dead");
        let _ = ep.am_short(1, i, b"anyone?");
        i += 1;
        a.worker.progress();
    }
    t.elapsed()
}

fn check_failed(a: &Entity, ep: &Ep) {
    let errs = a.errors.borrow().clone();
    assert_eq!(
        errs,
        vec![(ep.key(), Status::EndpointTimeout)],
        "one report, for this endpoint"
    );
    assert_eq!(
        ep.am_short(1, 0, b"late"),
        Err(Status::EndpointTimeout.into()),
        "later sends fail"
    );
    assert_eq!(ep.am_bcopy(1, |_| 1), Err(Status::EndpointTimeout.into()));
    assert_eq!(
        ep.flush(FlushFlags::LOCAL, None),
        Err(Status::EndpointTimeout.into())
    );
    match ep.pending_add(PendingRequest::new(|_| PendingResult::Done)) {
        Err((e, _)) if e == Status::EndpointTimeout => {}
        other => panic!("pending_add on a failed endpoint: {:?}", other.map_err(|e| e.0)),
    }
}

#[test]
fn destroyed_peer_times_out() {
    let Some(u) = ud_1s() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, ba) = pair::connect_to_ep(&a, &b);
    let rec = b.record_am(1);
    let s = [&a, &b];
    retry(&s, DEADLINE, "first", || ab.am_short(1, 0, b"hi")).unwrap();
    flush(&s, DEADLINE, &ab);
    assert_eq!(rec.borrow().len(), 1);
    drop(ba);
    drop(b);
    // a zcopy and a flush outstanding when the peer dies complete with the error
    retry(&[&a], DEADLINE, "send", || ab.am_short(1, 1, b"lost")).unwrap();
    let mem = Mem::alloc(&a.md, 256, MemAccess::ALL).unwrap();
    let zc = Completion::counter();
    let iov = [mem.iov(0, 200).unwrap()];
    assert_eq!(
        retry(&[&a], DEADLINE, "zcopy", || ab.am_zcopy(
            1,
            b"hdr",
            &iov,
            Some(&zc)
        )),
        Ok(Outcome::InProgress)
    );
    let c = Completion::counter();
    assert_eq!(ab.flush(FlushFlags::LOCAL, Some(&c)), Ok(Outcome::InProgress));
    let took = until_error(&a, &ab);
    println!("declared dead after {took:?}");
    assert!(took >= Duration::from_millis(900), "too early: {took:?}");
    assert_eq!((c.fired(), c.last_status()), (1, Status::EndpointTimeout));
    wait_for(&[&a], DEADLINE, "zcopy completion", || zc.fired() == 1);
    assert_eq!(zc.last_status(), Status::EndpointTimeout);
    check_failed(&a, &ab);
    // other endpoints of the interface are not affected
    let c2 = u.entity(&worker());
    let (ac, _ca) = pair::connect_to_ep(&a, &c2);
    let rec2 = c2.record_am(1);
    retry(&[&a, &c2], DEADLINE, "healthy", || ac.am_short(1, 5, b"ok")).unwrap();
    wait_for(&[&a, &c2], DEADLINE, "healthy delivery", || {
        rec2.borrow().len() == 1
    });
    assert_eq!(a.errors.borrow().len(), 1);
}

#[test]
fn peer_that_stops_progressing_times_out() {
    let Some(u) = ud_1s() else { return };
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    b.record_am(1);
    retry(&[&a, &b], DEADLINE, "first", || ab.am_short(1, 0, b"hi")).unwrap();
    flush(&[&a, &b], DEADLINE, &ab);
    // b is alive but never progresses again
    until_error(&a, &ab);
    check_failed(&a, &ab);
}

#[test]
fn connection_request_to_nobody_times_out() {
    let Some(u) = ud_1s() else { return };
    let a = u.entity(&worker());
    let (dev_addr, iface_addr) = {
        let gone = u.entity(&worker());
        (
            gone.iface.device_address().unwrap(),
            gone.iface.address().unwrap(),
        )
    };
    let ep = a.iface.ep_create_connected(&dev_addr, &iface_addr).unwrap();
    until_error(&a, &ep);
    check_failed(&a, &ep);
}

// Doorbell batching.

/// Bursts of am_bcopy (after the first of each, posted in chains: `RUCX_IB_TX_DB_BATCH`) go
/// out with progress alone: resends are 60 s away, so a packet that progress did not post
/// would not arrive within the 10 s each burst is given.
#[test]
fn bcopy_bursts_go_out_with_progress_not_resends() {
    let Some(u) = ud() else { return };
    let u = u
        .config("UD_TIMER_TICK", "60s")
        .config("UD_MAX_RESEND_TIMEOUT", "60s")
        .config("UD_TIMEOUT", "120s");
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    let at_b = b.record_am(6);
    let len = a.iface.attr().am.max_bcopy;
    let s = [&a, &b];
    let mut seq = 0u64;
    for burst in [1u64, 2, 3, 5, 7, 9, 16, 17] {
        for _ in 0..burst {
            retry(&s, DEADLINE, "am_bcopy", || {
                ab.am_bcopy(6, |buf| {
                    buf[..8].copy_from_slice(&seq.to_le_bytes());
                    buf[8..len].fill(seq as u8);
                    len
                })
            })
            .unwrap();
            seq += 1;
        }
        let t = Instant::now();
        while (at_b.borrow().len() as u64) < seq {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "burst of {burst}: {} of {seq} messages arrived",
                at_b.borrow().len()
            );
            a.worker.progress();
            b.worker.progress();
        }
    }
    for (i, m) in at_b.borrow().iter().enumerate() {
        assert_eq!(m.len(), len, "message {i}");
        assert_eq!(
            u64::from_le_bytes(m[..8].try_into().unwrap()),
            i as u64,
            "message {i} in order"
        );
        assert!(m[8..].iter().all(|&x| x == i as u8), "message {i} intact");
    }
}
