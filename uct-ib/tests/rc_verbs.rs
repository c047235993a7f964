//! rc_verbs through the uct API: two interfaces on one device in one process, connected
//! endpoint to endpoint. Every test prints "skipped: no RDMA device" and passes when libibverbs
//! finds no device; run them in the Soft-RoCE VM:
//!   testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1
//! `RUCX_IB_DEVICE=rxe0` picks the device (default: the first one with an active port). The
//! `RUCX_IB_*` settings a test needs are set in code for its interfaces. The MTU test counts the
//! packets of the port, so nothing else may send meanwhile (`--test-threads=1`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rucx_testkit::{device, modules, pair, worker, Connect, Dev, Pair, Remote, Setup, Workers};
use ucs::Outcome;
use uct::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// rc_verbs on the first RDMA device, endpoint to endpoint, a worker per side; `None` (after
/// "skipped: no RDMA device") on a host without one.
fn rc() -> Option<Setup> {
    let ctx = modules::builtin(uct_ib::module());
    let Some(res) = device::find(&ctx, "rc_verbs", Dev::First) else {
        println!("skipped: no RDMA device");
        return None;
    };
    let s = Setup::new("rc_verbs", res).layout(Connect::ToEp, Workers::Separate);
    Some(s.deadline(DEADLINE))
}

/// A connected pair on [`rc`].
fn fixture() -> Option<Pair> {
    Some(rc()?.pair())
}

#[test]
fn attributes_and_addresses() {
    let Some(f) = fixture() else { return };
    let at = f.tx.iface.attr();
    println!("{at:#?}");
    assert!(at
        .flags
        .contains(IfaceFlags::CONNECT_TO_EP | IfaceFlags::AM_SHORT | IfaceFlags::PENDING));
    assert!(!at.flags.contains(IfaceFlags::CONNECT_TO_IFACE));
    assert!(at.flags.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE));
    assert!(at.event_flags.contains(EventFlags::FD | EventFlags::RECV));
    assert_eq!(
        (at.device_addr_len, at.iface_addr_len, at.ep_addr_len),
        (20, 0, 4)
    );
    assert!(at.am.max_short >= 63 && at.am.max_bcopy == 8191 && at.put.max_short >= 64);
    assert!(at.bandwidth.dedicated > 1e8 && at.latency.c > 1e-7 && at.latency.c < 1e-5);
    assert!(at.overhead > 0.0);
    assert_eq!(f.tx.iface.device_address().unwrap().len(), 20);
    assert_eq!(f.ep().address().unwrap().len(), 4);
    assert!(!f.tx.iface.is_reachable(&[9; 20], &[]));
    assert_eq!(f.tx.md.attr().rkey_packed_size, 8);
    assert!(f
        .tx
        .iface
        .ep_create_connected(&f.rx.iface.device_address().unwrap(), &[])
        .is_err());
}

#[test]
fn am_short_bcopy_zcopy_and_kept_descriptors() {
    let Some(f) = fixture() else { return };
    let rec = f.record_am(3);
    let kept: Rc<RefCell<Vec<RxDesc>>> = Rc::default();
    let k = kept.clone();
    f.rx.iface
        .set_am_handler(4, AmCbFlags::SYNC, move |m| k.borrow_mut().push(m.keep()))
        .unwrap();
    let max_short = f.tx.iface.attr().am.max_short;
    let payload: Vec<u8> = (0..max_short - 8).map(|i| i as u8).collect();
    f.retry("am_short", || f.ep().am_short(3, 0x1122_3344_5566_7788, &payload))
        .unwrap();
    f.retry("am_short_iov", || f.ep().am_short_iov(3, &[b"ab", b"", b"cde"]))
        .unwrap();
    let big: Vec<u8> = (0..8191u32).map(|i| (i * 7) as u8).collect();
    let n = f
        .retry("am_bcopy", || {
            f.ep().am_bcopy(3, |buf| {
                buf[..big.len()].copy_from_slice(&big);
                big.len()
            })
        })
        .unwrap();
    assert_eq!(n, 8191);
    f.retry("am_bcopy small", || {
        f.ep().am_bcopy(3, |buf| {
            buf[..3].copy_from_slice(b"xyz");
            3
        })
    })
    .unwrap();
    let src = Mem::alloc(&f.tx.md, 6000, MemAccess::ALL).unwrap();
    let zdata: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8).collect();
    src.write(0, &zdata).unwrap();
    let c = Completion::counter();
    let iov = [src.iov(0, 3000).unwrap(), src.iov(3000, 3000).unwrap()];
    let r = f.retry("am_zcopy", || f.ep().am_zcopy(3, b"hdr!", &iov, Some(&c)));
    assert_eq!(r, Ok(Outcome::InProgress));
    f.check_completion("am_zcopy", &c, r);
    for i in 0..10u64 {
        f.retry("am_short to kept", || f.ep().am_short(4, i, b"keep me"))
            .unwrap();
    }
    f.wait_for("5 messages", || rec.borrow().len() == 5);
    f.wait_for("10 kept", || kept.borrow().len() == 10);
    let r = rec.borrow();
    let mut exp = 0x1122_3344_5566_7788u64.to_le_bytes().to_vec();
    exp.extend_from_slice(&payload);
    assert_eq!(r[0], exp);
    assert_eq!(r[1], b"abcde");
    assert_eq!(r[2], big);
    assert_eq!(r[3], b"xyz");
    let mut zexp = b"hdr!".to_vec();
    zexp.extend_from_slice(&zdata);
    assert_eq!(r[4], zexp);
    drop(r);
    // more traffic while descriptors are kept, then check they still hold their data
    for i in 0..200u64 {
        f.retry("am_short", || f.ep().am_short(3, i, &[0xee; 16]))
            .unwrap();
    }
    f.wait_for("205 messages", || rec.borrow().len() == 205);
    for (i, d) in kept.borrow().iter().enumerate() {
        assert_eq!(&d[..8], &(i as u64).to_le_bytes());
        assert_eq!(&d[8..], b"keep me");
    }
    kept.borrow_mut().clear();
    // invalid input
    assert_eq!(
        f.ep().am_short(3, 0, &vec![0; max_short]),
        Err(Status::InvalidParam.into())
    );
    assert_eq!(f.ep().am_short(32, 0, b""), Err(Status::InvalidParam.into()));
    f.no_errors();
}

#[test]
fn put_get_all_flavours() {
    let Some(f) = fixture() else { return };
    let Remote { mem: dst, rkey } = f.remote_mem(3 * 8192, 0);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    let max_short = f.tx.iface.attr().put.max_short;
    f.retry("put_short", || {
        f.ep().put_short(&data[..max_short], dst.addr(), &rkey)
    })
    .unwrap();
    f.retry("put_bcopy", || {
        f.ep().put_bcopy(
            |b| {
                b[..8192].copy_from_slice(&data);
                8192
            },
            dst.addr() + 8192,
            &rkey,
        )
    })
    .unwrap();
    let src = Mem::alloc(&f.tx.md, 8192, MemAccess::ALL).unwrap();
    src.write(0, &data).unwrap();
    let c = Completion::counter();
    let r = f.retry("put_zcopy", || {
        f.ep().put_zcopy(
            &[src.iov(0, 4096).unwrap(), src.iov(4096, 4096).unwrap()],
            dst.addr() + 16384,
            &rkey,
            Some(&c),
        )
    });
    f.check_completion("put_zcopy", &c, r);
    f.flush_ep();
    let all = dst.to_vec();
    assert_eq!(&all[..max_short], &data[..max_short]);
    assert_eq!(&all[8192..16384], &data[..]);
    assert_eq!(&all[16384..], &data[..]);

    // get_bcopy into a closure, get_zcopy into registered memory
    let got: Rc<RefCell<Vec<u8>>> = Rc::default();
    let g = got.clone();
    let c = Completion::counter();
    let r = f.retry("get_bcopy", || {
        let g = g.clone();
        f.ep().get_bcopy(
            5000,
            dst.addr() + 8192,
            &rkey,
            move |d| g.borrow_mut().extend_from_slice(d),
            Some(&c),
        )
    });
    f.check_completion("get_bcopy", &c, r);
    assert_eq!(&got.borrow()[..], &data[..5000]);
    let back = Mem::alloc(&f.tx.md, 8192, MemAccess::ALL).unwrap();
    let c = Completion::counter();
    let r = f.retry("get_zcopy", || {
        f.ep().get_zcopy(
            &[back.iov(0, 100).unwrap(), back.iov(100, 8092).unwrap()],
            dst.addr() + 16384,
            &rkey,
            Some(&c),
        )
    });
    f.check_completion("get_zcopy", &c, r);
    assert_eq!(back.to_vec(), data);
    assert_eq!(
        f.ep().get_short(&mut [0u8; 8], dst.addr(), &rkey),
        Err(Status::Unsupported.into())
    );
    // many small puts (moderated, unsignaled) complete by one flush
    for i in 0..1000u64 {
        f.retry("put_short", || {
            f.ep()
                .put_short(&i.to_le_bytes(), dst.addr() + (i % 100) * 8, &rkey)
        })
        .unwrap();
    }
    f.flush_ep();
    for j in 0..100u64 {
        assert_eq!(dst.read_u64(j as usize * 8).unwrap(), 900 + j);
    }
    // flush REMOTE too, and the iface flush
    let c = Completion::counter();
    let r = f.retry("flush remote", || f.ep().flush(FlushFlags::REMOTE, Some(&c)));
    f.check_completion("flush remote", &c, r);
    f.retry("put", || f.ep().put_short(b"12345678", dst.addr(), &rkey))
        .unwrap();
    let c = Completion::counter();
    let r = f.retry("iface flush", || f.tx.iface.flush(FlushFlags::LOCAL, Some(&c)));
    f.check_completion("iface flush", &c, r);
    assert_eq!(dst.read_u64(0).unwrap(), u64::from_le_bytes(*b"12345678"));
    f.no_errors();
}

#[test]
fn atomics_64_bit() {
    let Some(f) = fixture() else { return };
    let at = f.tx.iface.attr();
    if !at.flags.contains(IfaceFlags::ATOMIC_DEVICE) {
        println!("skipped: device without atomics");
        return;
    }
    assert!(at.atomic64.fop_flags.contains(AtomicOps::ADD | AtomicOps::CSWAP));
    assert!(at.atomic32.op_flags.is_empty() && at.atomic32.fop_flags.is_empty());
    let Remote { mem: dst, rkey } = f.remote_mem(64, 0);
    f.retry("post add", || {
        f.ep()
            .atomic_post(AtomicWidth::U64, AtomicOp::Add, 5, dst.addr(), &rkey)
    })
    .unwrap();
    let r = AtomicResult::new();
    let c = Completion::counter();
    let st = f.retry("fetch add", || {
        f.ep().atomic_fetch(
            AtomicWidth::U64,
            AtomicOp::Add,
            10,
            &r,
            dst.addr(),
            &rkey,
            Some(&c),
        )
    });
    f.check_completion("fetch add", &c, st);
    assert_eq!(r.get(), 5);
    let c = Completion::counter();
    let st = f.retry("cswap miss", || {
        f.ep()
            .atomic_cswap(AtomicWidth::U64, 1, 99, &r, dst.addr(), &rkey, Some(&c))
    });
    f.check_completion("cswap", &c, st);
    assert_eq!(r.get(), 15);
    let c = Completion::counter();
    let st = f.retry("cswap hit", || {
        f.ep()
            .atomic_cswap(AtomicWidth::U64, 15, 99, &r, dst.addr(), &rkey, Some(&c))
    });
    f.check_completion("cswap", &c, st);
    assert_eq!(r.get(), 15);
    f.flush_ep();
    assert_eq!(dst.read_u64(0).unwrap(), 99);
    let r2 = AtomicResult::new();
    assert_eq!(
        f.ep()
            .atomic_fetch(AtomicWidth::U32, AtomicOp::Add, 1, &r2, dst.addr(), &rkey, None),
        Err(Status::Unsupported.into())
    );
    assert_eq!(
        f.ep()
            .atomic_post(AtomicWidth::U64, AtomicOp::Xor, 1, dst.addr(), &rkey),
        Err(Status::Unsupported.into())
    );
    assert_eq!(
        f.ep()
            .atomic_post(AtomicWidth::U64, AtomicOp::Add, 1, dst.addr() + 4, &rkey),
        Err(Status::InvalidParam.into())
    );
    f.no_errors();
}

#[test]
fn pending_queue_under_no_resource() {
    let Some(s) = rc() else { return };
    let f = s
        .config("IB_TX_QUEUE_LEN", "8")
        .config("IB_TX_CQ_MODERATION", "2")
        .pair();
    let rec = f.record_am(1);
    // fill the send queue without progress
    let mut sent = 0u64;
    while f.ep().am_short(1, sent, b"x").is_ok() {
        sent += 1;
        assert!(sent < 100, "send queue never filled");
    }
    assert_eq!(f.ep().am_short(1, sent, b"x"), Err(Status::NoResource.into()));
    // queue requests that each send one message
    let next = Rc::new(Cell::new(sent));
    let total = sent + 50;
    let ep = f.ep();
    let dispatched = Rc::new(Cell::new(0u32));
    let mut queued = 0;
    for _ in 0..50 {
        let (n, d) = (next.clone(), dispatched.clone());
        // The callback gets the endpoint the request was added on.
        let req = PendingRequest::new(move |ep: &Ep| {
            d.set(d.get() + 1);
            match ep.am_short(1, n.get(), b"x") {
                Ok(()) => {
                    n.set(n.get() + 1);
                    PendingResult::Done
                }
                Err(_) => PendingResult::Stop,
            }
        });
        match ep.pending_add(req) {
            Ok(()) => queued += 1,
            Err((st, _)) => panic!("pending_add: {st}"),
        }
    }
    assert_eq!(queued, 50);
    // sends may not overtake the queue
    assert_eq!(ep.am_short(1, 999, b"x"), Err(Status::NoResource.into()));
    let start = Instant::now();
    while rec.borrow().len() < total as usize {
        assert!(
            start.elapsed() < DEADLINE,
            "pending requests not dispatched: {}",
            rec.borrow().len()
        );
        f.tx.worker.progress();
        f.rx.worker.progress();
    }
    let order: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..total).collect::<Vec<_>>(), "messages out of order");
    assert!(dispatched.get() >= 50);
    // resources are back: pending_add says Busy
    let c = Completion::counter();
    let st = loop {
        match ep.flush(FlushFlags::LOCAL, Some(&c)) {
            Err(e) if e == Status::NoResource => {
                f.tx.worker.progress();
            }
            r => break r.unwrap(),
        }
    };
    if st == Outcome::InProgress {
        while c.fired() == 0 {
            f.tx.worker.progress();
            f.rx.worker.progress();
        }
    }
    match ep.pending_add(PendingRequest::new(|_| PendingResult::Done)) {
        Err((e, _)) if e == Status::Busy => {}
        other => panic!("pending_add with free resources: {:?}", other.map_err(|e| e.0)),
    }
    // purge hands back queued requests
    let mut purged = 0;
    ep.pending_purge(|_| purged += 1);
    assert_eq!(purged, 0);
    assert_eq!(*f.tx.errors.borrow(), vec![]);
}

#[test]
fn flow_control_slow_receiver() {
    // a small receive queue, a window that fits in it, and no RNR retries: any receiver-not-ready
    // NAK would fail the endpoint
    let Some(s) = rc() else { return };
    let f = s
        .config("IB_RX_QUEUE_LEN", "64")
        .config("IB_RX_MAX_BATCH", "8")
        .config("IB_FC_WND_SIZE", "32")
        .config("IB_RNR_RETRY_COUNT", "0")
        .config("IB_RNR_TIMEOUT", "10us")
        .pair();
    let rec = f.record_am(2);
    let total = 3000u64;
    let mut i = 0;
    let mut no_res = 0;
    let mut loops = 0u64;
    let start = Instant::now();
    while rec.borrow().len() < total as usize {
        assert!(
            start.elapsed() < DEADLINE * 2,
            "only {} of {total} delivered",
            rec.borrow().len()
        );
        if i < total {
            match f.ep().am_bcopy(2, |b| {
                b[..8].copy_from_slice(&i.to_le_bytes());
                200
            }) {
                Ok(_) => i += 1,
                Err(e) if e == Status::NoResource => no_res += 1,
                Err(e) => panic!("am_bcopy: {e}"),
            }
        }
        f.tx.worker.progress();
        loops += 1;
        // the receiver progresses only every 50th round
        if loops.is_multiple_of(50) || i == total {
            f.rx.worker.progress();
        }
        assert_eq!(*f.tx.errors.borrow(), vec![], "sender failed (RNR?)");
    }
    let order: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..total).collect::<Vec<_>>());
    assert!(no_res > 0, "the window never closed: flow control not exercised");
    println!("{total} AMs delivered, {no_res} NoResource from the window");
    f.no_errors();
}

#[test]
fn bogus_peer_qp_fails_the_endpoint() {
    let Some(s) = rc() else { return };
    let s = s.config("IB_TIMEOUT", "10ms").config("IB_RETRY_COUNT", "1");
    let a = s.entity(&worker());
    let b = s.entity(&worker());
    let ep = a.iface.ep_create().unwrap();
    // a QP number nobody has
    ep.connect_to_ep(&b.iface.device_address().unwrap(), &[1, 0xfe, 0xff, 0xff])
        .unwrap();
    assert_eq!(
        ep.connect_to_ep(&b.iface.device_address().unwrap(), &[1, 0, 0, 0]),
        Err(Status::InvalidParam.into())
    );
    let src = Mem::alloc(&a.md, 64, MemAccess::ALL).unwrap();
    let (dst_mem, rkey) = {
        let m = Mem::alloc(&b.md, 64, MemAccess::ALL).unwrap();
        let r = a.md.component().rkey_unpack(&m.pack_rkey().unwrap()).unwrap();
        (m, r)
    };
    ep.am_short(0, 1, b"hello?").unwrap();
    let c = Completion::counter();
    assert_eq!(
        ep.put_zcopy(&[src.iov(0, 64).unwrap()], dst_mem.addr(), &rkey, Some(&c)),
        Ok(Outcome::InProgress)
    );
    let start = Instant::now();
    while a.errors.borrow().is_empty() {
        assert!(start.elapsed() < DEADLINE, "no error reported for a bogus peer");
        a.worker.progress();
        b.worker.progress();
    }
    let errs = a.errors.borrow().clone();
    assert_eq!(errs.len(), 1, "reported once: {errs:?}");
    assert_eq!(errs[0].0, ep.key());
    assert_eq!(errs[0].1, Status::EndpointTimeout);
    assert_eq!(c.fired(), 1);
    assert!(c.last_status().is_err());
    // later operations fail with the endpoint's status
    assert_eq!(ep.am_short(0, 1, b"x"), Err(Status::EndpointTimeout.into()));
    assert_eq!(
        ep.flush(FlushFlags::LOCAL, None),
        Err(Status::EndpointTimeout.into())
    );
    match ep.pending_add(PendingRequest::new(|_| PendingResult::Done)) {
        Err((e, _)) if e == Status::EndpointTimeout => {}
        other => panic!("pending_add on a failed ep: {:?}", other.map_err(|e| e.0)),
    }
    for _ in 0..100 {
        a.worker.progress();
    }
    assert_eq!(a.errors.borrow().len(), 1, "reported once");
    drop(ep);
}

#[test]
fn bad_rkey_is_an_error_completion() {
    let Some(f) = fixture() else { return };
    let Remote { mem: dst, rkey } = f.remote_mem(64, 0);
    let bad =
        f.tx.md
            .component()
            .rkey_unpack(&[1, 7, 0, 0, 0x78, 0x56, 0x34, 0x12])
            .unwrap();
    assert_ne!(bad.raw(), rkey.raw());
    assert!(f.tx.md.component().rkey_unpack(&[0; 3]).is_err());
    let src = Mem::alloc(&f.tx.md, 64, MemAccess::ALL).unwrap();
    let c = Completion::counter();
    let st = f
        .ep()
        .put_zcopy(&[src.iov(0, 64).unwrap()], dst.addr(), &bad, Some(&c))
        .unwrap();
    assert_eq!(st, Outcome::InProgress);
    f.wait_for("error completion", || c.fired() > 0);
    assert_eq!(c.last_status(), Status::IoError);
    assert_eq!(*f.tx.errors.borrow(), vec![(f.ep().key(), Status::IoError)]);
    assert_eq!(
        f.ep().put_short(b"x", dst.addr(), &rkey),
        Err(Status::IoError.into())
    );
    for _ in 0..100 {
        f.progress();
    }
    assert_eq!(f.tx.errors.borrow().len(), 1, "reported once");
    // the interfaces are fine: a new connection works
    let (ab2, _ba2) = pair::connect_to_ep(&f.tx, &f.rx);
    let rec = f.record_am(5);
    f.retry("am on a new endpoint", || ab2.am_short(5, 7, b""))
        .unwrap();
    f.wait_for("am on a new endpoint", || rec.borrow().len() == 1);
}

#[test]
fn events_through_the_completion_channel() {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let Some(f) = fixture() else { return };
    let rec = f.record_am(6);
    let fd = f.rx.iface.event_fd().unwrap();
    // drain anything from connection setup, then arm
    let start = Instant::now();
    loop {
        f.progress();
        match f.rx.iface.event_arm(ArmEvents::RECV) {
            Ok(()) => break,
            Err(e) if e == Status::Busy => assert!(start.elapsed() < DEADLINE),
            Err(e) => panic!("event_arm: {e}"),
        }
    }
    let bfd = fd;
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    assert_eq!(
        poll(&mut fds, PollTimeout::ZERO).unwrap(),
        0,
        "no event before a message"
    );
    f.ep().am_short(6, 1, b"wake up").unwrap();
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    assert_eq!(
        poll(&mut fds, PollTimeout::from(5000u16)).unwrap(),
        1,
        "the receive raised an event"
    );
    // the event is pending: arming again says Busy until progress consumed everything
    assert_eq!(f.rx.iface.event_arm(ArmEvents::RECV), Err(Status::Busy.into()));
    f.wait_for("message", || rec.borrow().len() == 1);
    // a completion that arrived before arming is reported as Busy (it raises no event)
    f.ep().am_short(6, 2, b"again").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    match f.rx.iface.event_arm(ArmEvents::RECV) {
        Err(e) if e == Status::Busy => {}
        Ok(()) => {
            // it had not arrived yet: then it raises the event
            let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
            assert_eq!(
                poll(&mut fds, PollTimeout::from(5000u16)).unwrap(),
                1,
                "armed, no event"
            );
        }
        Err(e) => panic!("event_arm: {e}"),
    }
    f.wait_for("second message", || rec.borrow().len() == 2);
    f.no_errors();
}

#[test]
fn destroy_with_outstanding_operations() {
    let Some(f) = fixture() else { return };
    let Remote { mem: dst, rkey } = f.remote_mem(1 << 16, 0);
    let src = Mem::alloc(&f.tx.md, 1 << 16, MemAccess::ALL).unwrap();
    let comps: Vec<Completion> = (0..8).map(|_| Completion::counter()).collect();
    for c in &comps {
        let r = f.retry("put_zcopy", || {
            f.ep().put_zcopy(&[src.whole()], dst.addr(), &rkey, Some(c))
        });
        assert_eq!(r, Ok(Outcome::InProgress));
    }
    let (a, b, ab, ba) = f.into_parts();
    drop(ab);
    let start = Instant::now();
    while comps.iter().any(|c| c.fired() == 0) {
        assert!(
            start.elapsed() < DEADLINE,
            "completions of a destroyed endpoint never fired"
        );
        a.worker.progress();
        b.worker.progress();
    }
    assert!(a.errors.borrow().is_empty(), "destroying is not a peer failure");
    drop(ba);
    drop(a);
    drop(b);
}

/// Pending requests wait for the connection, and for credits when the window is closed; a
/// grant from the receiver dispatches them, in order.
#[test]
fn pending_before_connect_and_behind_the_window() {
    let Some(s) = rc() else { return };
    let s = s.config("IB_FC_WND_SIZE", "8");
    let a = s.entity(&worker());
    let b = s.entity(&worker());
    let rec = b.record_am(9);
    let ab = a.iface.ep_create().unwrap();
    let ba = b.iface.ep_create().unwrap();
    // not connected yet: sends wait, pending requests are kept
    assert_eq!(ab.am_short(9, 0, b""), Err(Status::NoResource.into()));
    let next = Rc::new(Cell::new(0u64));
    let add = |n: usize| {
        for _ in 0..n {
            let nx = next.clone();
            // The callback gets the endpoint the request was added on.
            let r = ab.pending_add(PendingRequest::new(move |ep: &Ep| {
                match ep.am_short(9, nx.get(), b"p") {
                    Ok(()) => {
                        nx.set(nx.get() + 1);
                        PendingResult::Done
                    }
                    Err(_) => PendingResult::Stop,
                }
            }));
            assert!(r.is_ok(), "pending_add");
        }
    };
    add(20);
    ab.connect_to_ep(&b.iface.device_address().unwrap(), &ba.address().unwrap())
        .unwrap();
    ba.connect_to_ep(&a.iface.device_address().unwrap(), &ab.address().unwrap())
        .unwrap();
    // only the sender progresses: the window (8) lets some go, then it closes
    for _ in 0..2000 {
        a.worker.progress();
    }
    let first = next.get();
    assert!(first > 0, "nothing dispatched after connect");
    assert!(first < 20, "the window never closed ({first} sent)");
    // the receiver answers the hard request with a grant: the rest goes
    let start = Instant::now();
    while rec.borrow().len() < 20 {
        assert!(start.elapsed() < DEADLINE, "stuck at {}", rec.borrow().len());
        a.worker.progress();
        b.worker.progress();
    }
    let order: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..20).collect::<Vec<_>>());
    assert_eq!(*a.errors.borrow(), vec![]);
}

/// Packets the port has sent, from Soft-RoCE's counters (`None` elsewhere).
fn sent_pkts(dev: &str) -> Option<u64> {
    let (name, port) = dev.split_once(':')?;
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{name}/ports/{port}/hw_counters/sent_pkts"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// Sends `n` 8000-byte AMs a -> b over a fresh pair of `s` and returns the port's packets per
/// message (data and the responder's ACKs: both QPs are on this port).
fn packets_per_message(s: &Setup, n: usize) -> f64 {
    let dev = s.dev();
    let f = s.pair();
    let rec = f.record_am(5);
    let data = vec![0x5au8; 8000];
    let before = sent_pkts(dev).expect("counters");
    for _ in 0..n {
        f.retry("am_bcopy", || {
            f.ep().am_bcopy(5, |buf| {
                buf[..data.len()].copy_from_slice(&data);
                data.len()
            })
        })
        .unwrap();
    }
    f.wait_for("all AMs", || rec.borrow().len() == n);
    f.flush_ep();
    assert!(rec.borrow().iter().all(|m| m[..] == data[..]));
    f.no_errors();
    (sent_pkts(dev).expect("counters") - before) as f64 / n as f64
}

#[test]
fn a_peer_on_the_same_soft_roce_port_gets_the_largest_mtu() {
    let Some(s) = rc() else { return };
    if sent_pkts(s.dev()).is_none() {
        println!("skipped: {} is not Soft-RoCE (no hw_counters/sent_pkts)", s.dev());
        return;
    }
    // auto (the default): MTU 4096 between two QPs of this port, 2 data packets per 8000 B.
    let auto = packets_per_message(&s, 64);
    // default: the port's active MTU (1024 on rxe over a 1500-byte netdev): 8 data packets.
    let active = packets_per_message(&s.clone().config("IB_PATH_MTU", "default"), 64);
    println!("packets per 8000-byte message: auto {auto:.2}, default {active:.2}");
    assert!(auto < 4.0, "auto: {auto} packets per 8000-byte message");
    assert!(active >= 8.0, "default: {active} packets per 8000-byte message");
}
