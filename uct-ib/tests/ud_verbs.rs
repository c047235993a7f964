//! ud_verbs through the uct API, on a real RDMA device: two interfaces in one process. Every
//! test prints "skipped: no RDMA device" and passes without one; run them in the Soft-RoCE VM:
//!   testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1
//! `RUCX_IB_DEVICE=rxe0` picks the device. Loss injection and peer timeouts are in
//! `ud_loss.rs` and `ud_timeout.rs` (they set `RUCX_UD_*` for the whole process).

mod ud_common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use uct::*;
use ud_common::*;

#[test]
fn attributes_and_addresses() {
    let Some((ctx, dev)) = context() else { return };
    let a = side(&ctx, &dev);
    let at = *a.iface.attr();
    println!("{dev}: {at:?}");
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
    let b = side(&ctx, &dev);
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
    assert_eq!(ep.put_short(b"x", mem.addr(), &rkey), Err(Status::Unsupported));
    let mut buf = [0u8; 8];
    assert_eq!(
        ep.get_short(&mut buf, mem.addr(), &rkey),
        Err(Status::Unsupported)
    );
    assert_eq!(
        ep.atomic_post(AtomicWidth::U64, AtomicOp::Add, 1, mem.addr(), &rkey),
        Err(Status::Unsupported)
    );
    // not connected yet: sends wait
    assert_eq!(ep.am_short(1, 0, b"x"), Err(Status::NoResource));
    assert_eq!(ep.am_short(40, 0, b"x"), Err(Status::InvalidParam));
}

#[test]
fn connect_to_ep_am_short_bcopy_both_ways() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, ba) = connect_ep(&a, &b);
    let (at_b, at_a) = (record(&b, 3), record(&a, 4));
    let max = a.iface.attr().am.max_bcopy;
    let s = [&a, &b];
    retry(&s, "am_short", || ab.am_short(3, 0x1122_3344_5566_7788, b"hello")).unwrap();
    let big: Vec<u8> = (0..max).map(|i| (i * 13) as u8).collect();
    let n = retry(&s, "am_bcopy", || {
        ab.am_bcopy(3, |buf| {
            buf[..big.len()].copy_from_slice(&big);
            big.len()
        })
    })
    .unwrap();
    assert_eq!(n, max);
    retry(&s, "am_short_iov", || ab.am_short_iov(3, &[b"ab", b"cd"])).unwrap();
    retry(&s, "reply", || ba.am_short(4, 7, b"back")).unwrap();
    wait(&s, "messages", || {
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
    assert_eq!(ab.am_short(3, 0, &too_big), Err(Status::InvalidParam));
    flush(&s, &ab);
    flush(&s, &ba);
    assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
}

#[test]
fn connect_to_iface_creates_the_peer_endpoint() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let s = [&a, &b];
    let (at_b, at_a) = (record(&b, 1), record(&a, 2));
    let ab = connect_iface(&a, &b);
    // the first send waits for the connection reply, then goes
    retry(&s, "am_short after connect", || ab.am_short(1, 1, b"to b")).unwrap();
    // b answers through its own endpoint to a's interface
    let ba = connect_iface(&b, &a);
    retry(&s, "am_short back", || ba.am_short(2, 2, b"to a")).unwrap();
    wait(&s, "both messages", || {
        at_b.borrow().len() == 1 && at_a.borrow().len() == 1
    });
    assert_eq!(&at_b.borrow()[0][8..], b"to b");
    assert_eq!(&at_a.borrow()[0][8..], b"to a");
    // several endpoints to the same interface are independent connections
    let ab2 = connect_iface(&a, &b);
    retry(&s, "second ep", || ab2.am_short(1, 3, b"ep2")).unwrap();
    retry(&s, "first ep again", || ab.am_short(1, 4, b"ep1")).unwrap();
    wait(&s, "two more", || at_b.borrow().len() == 3);
    flush(&s, &ab);
    flush(&s, &ab2);
    flush(&s, &ba);
    let mut hdrs: Vec<u64> = at_b
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    hdrs.sort();
    assert_eq!(hdrs, vec![1, 3, 4]);
    // a destroyed endpoint tells the peer, which then drops its side; new connections work
    drop(ab2);
    let ab3 = connect_iface(&a, &b);
    retry(&s, "third ep", || ab3.am_short(1, 5, b"ep3")).unwrap();
    wait(&s, "ep3", || at_b.borrow().len() == 4);
    assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
}

#[test]
fn am_zcopy_gathers_registered_memory_and_completes_on_ack() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, _ba) = connect_ep(&a, &b);
    let rec = record(&b, 12);
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
        let r = retry(&s, "am_zcopy", || ab.am_zcopy(12, &header, &iov, Some(&c))).unwrap();
        assert_eq!(r, Status::InProgress);
        wait(&s, "zcopy completion", || c.fired() == 1);
        assert_eq!(c.last_status(), Status::Ok);
        let mut m = header.clone();
        m.extend_from_slice(&pattern[..half]);
        m.extend_from_slice(&pattern[1000..1000 + len - half]);
        want.push(m);
    }
    // header + payload beyond one packet, or unregistered memory: refused
    let iov = [mem.iov(0, at.am.max_zcopy).unwrap()];
    assert_eq!(ab.am_zcopy(12, b"h", &iov, None), Err(Status::InvalidParam));
    wait(&s, "zcopy messages", || rec.borrow().len() == want.len());
    assert_eq!(*rec.borrow(), want);
    // completions of many in flight, in order
    let c = Completion::counter();
    for _ in 0..200 {
        let iov = [mem.iov(0, 64).unwrap()];
        retry(&s, "am_zcopy", || ab.am_zcopy(12, b"", &iov, Some(&c))).unwrap();
    }
    wait(&s, "200 completions", || {
        c.outstanding() == 0 && rec.borrow().len() == want.len() + 200
    });
    assert_eq!(c.last_status(), Status::Ok);
}

/// A receiver that stops progressing in the round that delivered the message (as a
/// one-message server does) has still sent the ACK the sender asked for: ACKs a peer asks for
/// go out in the round that received its packet, even a round that returns early.
#[test]
fn receiver_acknowledges_in_the_round_that_received() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let ab = connect_iface(&a, &b);
    let rec = record(&b, 4);
    let mem = Mem::alloc(&a.md, 4096, MemAccess::ALL).unwrap();
    mem.write(0, &[0x5a; 1000]).unwrap();
    let iov = [mem.iov(0, 1000).unwrap()];
    let c = Completion::counter();
    let s = [&a, &b];
    let r = retry(&s, "am_zcopy", || ab.am_zcopy(4, &[], &iov, Some(&c))).unwrap();
    assert_eq!(r, Status::InProgress);
    // `wait` progresses a, then b, and stops right after b's round that delivered it
    wait(&s, "the message at b", || !rec.borrow().is_empty());
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
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, ba) = connect_ep(&a, &b);
    let (at_a, at_b) = (record(&a, 6), record(&b, 6));
    let mem = Mem::alloc(&a.md, 4096, MemAccess::ALL).unwrap();
    let iov = [mem.iov(0, 64).unwrap()];
    let settle = || std::thread::sleep(Duration::from_millis(20));
    // open b's congestion window (it starts at 2; each round below sends three packets)
    let s = [&a, &b];
    let max = a.iface.attr().am.max_bcopy;
    send_numbered(&s, &ba, 7, 200, max);
    send_numbered(&s, &ab, 7, 200, max);
    flush(&s, &ba);
    flush(&s, &ab);
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
            Ok(Status::InProgress)
        );
        settle();
        a.worker.progress(); // receives m0
        wait(&[&b], "the zcopy at b", || !at_b.borrow().is_empty());
        at_b.borrow_mut().clear();
        ba.am_short(6, 1, b"m1").unwrap(); // acknowledges it
        settle();
        a.worker.progress(); // receives m1
        ba.am_short(6, 2, b"m2").unwrap();
        settle();
        a.worker.progress(); // receives m2
        if with_comp {
            let r = retry(&s, "flush", || ab.flush(FlushFlags::LOCAL, Some(&fc)));
            if r == Ok(Status::Ok) {
                order.borrow_mut().push("flush");
            }
            wait(&s, "both completions", || order.borrow().len() == 2);
            assert_eq!(*order.borrow(), ["zcopy", "flush"], "the flush completed first");
            order.borrow_mut().clear();
        } else {
            match ab.flush(FlushFlags::LOCAL, None) {
                Ok(Status::Ok) => {
                    assert_eq!(c.outstanding(), 0, "flush Ok before the zcopy completed")
                }
                Ok(Status::InProgress) | Err(Status::NoResource) => {}
                other => panic!("flush: {other:?}"),
            }
        }
        wait(&[&a, &b], "the zcopy's completion", || {
            c.outstanding() == 0 && zc.outstanding() == 0
        });
        wait(&[&a, &b], "m0-m2 at a", || at_a.borrow().len() == 3);
        at_a.borrow_mut().clear();
        flush(&[&a, &b], &ba);
    }
    assert_eq!(c.last_status(), Status::Ok);
}

#[test]
fn many_messages_arrive_once_in_order() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, ba) = connect_ep(&a, &b);
    let (at_b, at_a) = (record(&b, 5), record(&a, 5));
    let max = a.iface.attr().am.max_bcopy;
    let s = [&a, &b];
    let n = 20_000;
    let t = Instant::now();
    send_numbered(&s, &ab, 5, n, max);
    send_numbered(&s, &ba, 5, 1000, max);
    wait(&s, "all messages", || {
        at_b.borrow().len() as u64 == n && at_a.borrow().len() == 1000
    });
    flush(&s, &ab);
    flush(&s, &ba);
    println!("{n} messages in {:?}", t.elapsed());
    check_numbered(&at_b, n, max);
    check_numbered(&at_a, 1000, max);
}

#[test]
fn flush_ep_and_iface_wait_for_acknowledgements() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, _ba) = connect_ep(&a, &b);
    let rec = record(&b, 0);
    let s = [&a, &b];
    assert_eq!(
        ab.flush(FlushFlags::LOCAL, None),
        Ok(Status::Ok),
        "nothing sent: flushed"
    );
    assert_eq!(a.iface.flush(FlushFlags::LOCAL, None), Ok(Status::Ok));
    retry(&s, "send", || ab.am_short(0, 1, b"x")).unwrap();
    let c = Completion::counter();
    assert_eq!(
        ab.flush(FlushFlags::LOCAL, Some(&c)),
        Ok(Status::InProgress),
        "not acknowledged yet"
    );
    // the receiver has not progressed: the flush cannot complete
    for _ in 0..100 {
        a.worker.progress();
    }
    assert_eq!(c.fired(), 0, "flush completed before the peer received anything");
    wait(&s, "flush", || c.fired() == 1);
    assert_eq!((c.last_status(), rec.borrow().len()), (Status::Ok, 1));
    retry(&s, "send", || ab.am_short(0, 2, b"y")).unwrap();
    let ci = Completion::counter();
    assert_eq!(
        a.iface.flush(FlushFlags::LOCAL, Some(&ci)),
        Ok(Status::InProgress)
    );
    wait(&s, "iface flush", || ci.fired() == 1);
    assert_eq!(ci.last_status(), Status::Ok);
    assert_eq!(ab.flush(FlushFlags::LOCAL, None), Ok(Status::Ok));
}

#[test]
fn pending_requests_run_in_order_when_the_window_opens() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, _ba) = connect_ep(&a, &b);
    let ab = Rc::new(ab);
    let rec = record(&b, 9);
    let s = [&a, &b];
    // resources free: pending_add says Busy
    match ab.pending_add(PendingRequest::new(|| Status::Ok)) {
        Err((Status::Busy, _)) => {}
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
        let req = PendingRequest::new(move || match ep.upgrade().unwrap().am_short(9, my, b"pending") {
            Ok(()) => {
                done.set(done.get() + 1);
                Status::Ok
            }
            Err(e) => e,
        });
        assert!(
            ab.pending_add(req).is_ok(),
            "pending_add while out of resources must queue"
        );
    }
    assert_eq!(
        ab.am_short(9, u64::MAX, b"overtake"),
        Err(Status::NoResource),
        "nothing overtakes the queue"
    );
    assert_eq!(
        ab.flush(FlushFlags::LOCAL, None),
        Err(Status::NoResource),
        "flush waits for the queue"
    );
    wait(&s, "pending dispatch", || done.get() == 50);
    wait(&s, "all delivered", || rec.borrow().len() as u64 == seq + 50);
    let hdrs: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(hdrs, (0..seq + 50).collect::<Vec<_>>());
    flush(&s, &ab);
}

#[test]
fn event_fd_signals_arrivals() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, _ba) = connect_ep(&a, &b);
    let rec = record(&b, 2);
    let s = [&a, &b];
    let fd = b.iface.event_fd().expect("event fd");
    let readable = |ms: u16| {
        use std::os::fd::BorrowedFd;
        // SAFETY: the fd belongs to the open interface for the whole test.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut p = [nix::poll::PollFd::new(bfd, nix::poll::PollFlags::POLLIN)];
        nix::poll::poll(&mut p, nix::poll::PollTimeout::from(ms)).unwrap() > 0
    };
    for round in 0..3u64 {
        // arm until it sticks (Busy: progress first)
        let t = Instant::now();
        while b.iface.event_arm(ArmEvents::RECV) == Err(Status::Busy) {
            b.worker.progress();
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        assert!(!readable(0), "round {round}: readable before anything was sent");
        retry(&s[..1], "send", || ab.am_short(2, round, b"wake")).unwrap();
        assert!(readable(5000), "round {round}: no event for an arrival");
        wait(&s, "delivery", || rec.borrow().len() as u64 == round + 1);
    }
    // the sender may sleep only once its packets are acknowledged (resends need progress)
    retry(&s[..1], "send", || ab.am_short(2, 99, b"unacked")).unwrap();
    assert_eq!(
        a.iface.event_arm(ArmEvents::RECV),
        Err(Status::Busy),
        "unacknowledged packets"
    );
    wait(&s, "acknowledgement", || {
        a.iface.event_arm(ArmEvents::RECV).is_ok()
    });
    assert_eq!(rec.borrow().len(), 4);
}

/// Packets of up to 64 bytes with their GRH (an AM of up to 12 bytes) land in the receive
/// head slots, longer ones run on into their buffer: every length across the boundary, both
/// ways, arrives intact, and a handler that keeps a head-slot message keeps its own copy.
#[test]
fn messages_across_the_receive_head_boundary() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, ba) = connect_ep(&a, &b);
    let s = [&a, &b];
    let (at_b, at_a) = (record(&b, 9), record(&a, 9));
    let kept: Rc<RefCell<Vec<RxDesc>>> = Rc::default();
    let k = kept.clone();
    b.iface
        .set_am_handler(10, AmCbFlags::SYNC, move |m| k.borrow_mut().push(m.keep()))
        .unwrap();
    let mut want = Vec::new();
    for n in 0..=40usize {
        let payload: Vec<u8> = (0..n).map(|i| (n * 7 + i) as u8).collect();
        let hdr = 0xa0a0_0000_0000_0000 | n as u64;
        retry(&s, "am_short", || ab.am_short(9, hdr, &payload)).unwrap();
        retry(&s, "am_short back", || ba.am_short(9, hdr, &payload)).unwrap();
        retry(&s, "kept", || ab.am_short(10, hdr, &payload)).unwrap();
        let mut m = hdr.to_le_bytes().to_vec();
        m.extend_from_slice(&payload);
        want.push(m);
    }
    for n in 0..=24usize {
        let body: Vec<u8> = (0..n).map(|i| (0x55 ^ (n + i)) as u8).collect();
        let sent = retry(&s, "am_bcopy", || {
            ab.am_bcopy(9, |buf| {
                buf[..n].copy_from_slice(&body);
                n
            })
        })
        .unwrap();
        assert_eq!(sent, n);
        want.push(body);
    }
    wait(&s, "every length", || {
        at_b.borrow().len() == want.len() && at_a.borrow().len() == 41 && kept.borrow().len() == 41
    });
    assert_eq!(*at_b.borrow(), want);
    assert_eq!(*at_a.borrow(), want[..41]);
    // more traffic through the same slots before the kept copies are read
    send_numbered(&s, &ab, 9, 600, a.iface.attr().am.max_bcopy);
    wait(&s, "more", || at_b.borrow().len() == want.len() + 600);
    for (d, w) in kept.borrow().iter().zip(&want) {
        assert_eq!(&d[..], &w[..], "kept message intact");
    }
    kept.borrow_mut().clear();
    flush(&s, &ab);
    flush(&s, &ba);
}

#[test]
fn kept_descriptors_and_handlers_that_send() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, ba) = connect_ep(&a, &b);
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
    let echoes = record(&a, 8);
    for i in 0..200u64 {
        retry(&s, "keep", || ab.am_short(6, i, &[i as u8; 100])).unwrap();
        retry(&s, "echo", || ab.am_short(7, i, b"ping")).unwrap();
    }
    wait(&s, "kept", || kept.borrow().len() == 200);
    for (i, d) in kept.borrow().iter().enumerate() {
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), i as u64);
        assert!(d[8..].iter().all(|&x| x == i as u8), "kept data {i} intact");
    }
    kept.borrow_mut().clear(); // released to the transport
    wait(&s, "pings handled", || accepted.get() > 0);
    flush(&s, &ba);
    wait(&s, "accepted echoes", || {
        echoes.borrow().len() as u64 == accepted.get()
    });
    println!("{} of 200 echoes accepted inside the handler", accepted.get());
    let hdrs: Vec<u64> = echoes
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert!(hdrs.windows(2).all(|w| w[0] < w[1]), "echoes in order: {hdrs:?}");
    flush(&s, &ab);
}

#[test]
fn destroyed_endpoint_still_delivers_what_it_sent() {
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let s = [&a, &b];
    let rec = record(&b, 11);
    let ab = connect_iface(&a, &b);
    for i in 0..64u64 {
        retry(&s, "send", || ab.am_short(11, i, b"linger")).unwrap();
    }
    drop(ab); // packets still unacknowledged: the endpoint lingers until they are
    wait(&s, "delivery after destroy", || rec.borrow().len() == 64);
    let c = Completion::counter();
    let r = a.iface.flush(FlushFlags::LOCAL, Some(&c)).unwrap();
    if r == Status::InProgress {
        wait(&s, "iface flush", || c.fired() == 1);
    }
    assert!(a.errors.borrow().is_empty(), "{:?}", a.errors.borrow());
}
