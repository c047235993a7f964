//! Interface basics (UCX `test_uct_iface`, `test_progress`): attributes consistent with the
//! capability flags, addresses and reachability, connection models, everything not advertised
//! answering `Unsupported`, progress enable/disable.

use rucx_testkit::{Pair, Setup};
use uct::{ArmEvents, AtomicOp, AtomicResult, AtomicWidth, EventFlags, IfaceFlags, ProgressFlags, Status};

fn attrs_consistent(s: &Setup) {
    let p = s.pair();
    let (a, n) = (p.attr(), p.name());
    let f = a.flags;
    if f.contains(IfaceFlags::AM_SHORT) {
        assert!(
            a.am.max_short >= 8,
            "[{n}] AM_SHORT with am.max_short {} < 8 (the header)",
            a.am.max_short
        );
    }
    if f.contains(IfaceFlags::AM_BCOPY) {
        assert!(a.am.max_bcopy > 0, "[{n}] AM_BCOPY with am.max_bcopy 0");
    }
    for (flag, caps, what) in [
        (IfaceFlags::AM_ZCOPY, a.am, "am"),
        (IfaceFlags::PUT_ZCOPY, a.put, "put"),
        (IfaceFlags::GET_ZCOPY, a.get, "get"),
    ] {
        if f.contains(flag) {
            assert!(caps.max_iov >= 1, "[{n}] {flag:?} with {what}.max_iov 0");
            assert!(
                caps.max_zcopy >= caps.min_zcopy.max(1),
                "[{n}] {what}.max_zcopy below min_zcopy"
            );
        }
    }
    for (flag, max, what) in [
        (IfaceFlags::PUT_SHORT, a.put.max_short, "put.max_short"),
        (IfaceFlags::PUT_BCOPY, a.put.max_bcopy, "put.max_bcopy"),
        (IfaceFlags::GET_SHORT, a.get.max_short, "get.max_short"),
        (IfaceFlags::GET_BCOPY, a.get.max_bcopy, "get.max_bcopy"),
    ] {
        if f.contains(flag) {
            assert!(max > 0, "[{n}] {flag:?} with {what} 0");
        }
    }
    let atomics =
        !(a.atomic32.op_flags | a.atomic32.fop_flags | a.atomic64.op_flags | a.atomic64.fop_flags).is_empty();
    assert_eq!(
        atomics,
        f.intersects(IfaceFlags::ATOMIC_CPU | IfaceFlags::ATOMIC_DEVICE),
        "[{n}] atomic caps and ATOMIC_CPU/ATOMIC_DEVICE disagree"
    );
    for c in [a.atomic32, a.atomic64] {
        assert!(
            !c.op_flags
                .intersects(AtomicOp::Swap.flag() | AtomicOp::Cswap.flag()),
            "[{n}] post swap/cswap advertised"
        );
    }
    assert!(
        f.intersects(IfaceFlags::CONNECT_TO_IFACE | IfaceFlags::CONNECT_TO_EP),
        "[{n}] no connection model"
    );
    if f.contains(IfaceFlags::CONNECT_TO_EP) {
        assert!(a.ep_addr_len > 0, "[{n}] CONNECT_TO_EP with ep_addr_len 0");
    }
    if f.contains(IfaceFlags::CONNECT_TO_IFACE) {
        assert!(
            a.iface_addr_len > 0 || a.device_addr_len > 0,
            "[{n}] CONNECT_TO_IFACE without any address"
        );
    }
    assert!(
        f.intersects(IfaceFlags::CB_SYNC | IfaceFlags::CB_ASYNC),
        "[{n}] neither CB_SYNC nor CB_ASYNC"
    );
    assert!(
        a.bandwidth.dedicated + a.bandwidth.shared > 0.0,
        "[{n}] zero bandwidth"
    );
    assert!(
        a.overhead >= 0.0 && a.latency.c >= 0.0,
        "[{n}] negative performance figures"
    );
}

fn addresses_and_reachability(s: &Setup) {
    let p = s.pair();
    let (iface, a, n) = (&p.rx.iface, *p.rx.attr(), p.name());
    let dev = iface.device_address().unwrap();
    let addr = iface.address().unwrap();
    assert_eq!(dev.len(), a.device_addr_len, "[{n}] device address length");
    assert_eq!(addr.len(), a.iface_addr_len, "[{n}] iface address length");
    assert!(p.tx.iface.is_reachable(&dev, &addr), "[{n}] peer not reachable");
    assert!(iface.is_reachable(&dev, &addr), "[{n}] own address not reachable");
    // Of many corrupted addresses, at least one must be unreachable (UCX's is_reachable test).
    let mut unreachable = 0;
    for i in 0..100usize {
        let (mut d, mut x) = (dev.clone(), addr.clone());
        let flip = |v: &mut Vec<u8>, k: usize| {
            if !v.is_empty() {
                let at = k % v.len();
                v[at] ^= 0x5A ^ (k as u8);
            }
        };
        if i % 2 == 0 {
            flip(&mut d, i * 7 + 1)
        } else {
            flip(&mut x, i * 5 + 3)
        }
        if i % 3 == 0 {
            d.truncate(d.len() / 2);
        }
        if !p.tx.iface.is_reachable(&d, &x) {
            unreachable += 1;
        }
    }
    assert!(
        unreachable > 0,
        "[{n}] every corrupted address reads as reachable"
    );
    // Wrong lengths are just unreachable, never a crash.
    assert!(
        !p.tx.iface.is_reachable(&[], &[]) || a.device_addr_len == 0,
        "[{n}] empty address reachable"
    );
}

fn connect_models(s: &Setup) {
    let p = s.pair();
    let (f, n) = (p.attr().flags, p.name());
    let dev = p.rx.iface.device_address().unwrap();
    let addr = p.rx.iface.address().unwrap();
    if f.contains(IfaceFlags::CONNECT_TO_IFACE) {
        let ep =
            p.tx.iface
                .ep_create_connected(&dev, &addr)
                .unwrap_or_else(|e| panic!("[{n}] ep_create_connected: {e}"));
        drop(ep);
    } else {
        p.skip("no CONNECT_TO_IFACE; checking Unsupported");
        let r = p.tx.iface.ep_create_connected(&dev, &addr);
        assert_eq!(
            r.err(),
            Some(Status::Unsupported.into()),
            "[{n}] ep_create_connected"
        );
    }
    if f.contains(IfaceFlags::CONNECT_TO_EP) {
        let ep =
            p.tx.iface
                .ep_create()
                .unwrap_or_else(|e| panic!("[{n}] ep_create: {e}"));
        assert_eq!(
            ep.address().unwrap().len(),
            p.attr().ep_addr_len,
            "[{n}] ep address length"
        );
    } else {
        p.skip("no CONNECT_TO_EP; checking Unsupported");
        assert_eq!(
            p.tx.iface.ep_create().err(),
            Some(Status::Unsupported.into()),
            "[{n}] ep_create"
        );
        let ep = p.ep();
        assert_eq!(
            ep.connect_to_ep(&dev, &[0; 8]),
            Err(Status::Unsupported.into()),
            "[{n}] connect_to_ep"
        );
    }
}

/// Every operation whose flag is missing answers `Unsupported` (the feature tests check this
/// too when they skip; this covers everything in one place).
fn unsupported_ops_say_so(s: &Setup) {
    let p = s.pair();
    let (ep, a, n) = (p.ep(), *p.attr(), p.name());
    let m = p.local_mem(64, 0);
    let r = p.remote_mem(64, 0);
    let u = Err(Status::Unsupported.into());
    type Check<'a> = (IfaceFlags, &'static str, Box<dyn Fn(&Pair) -> bool + 'a>);
    let checks: Vec<Check> = vec![
        (
            IfaceFlags::AM_SHORT,
            "am_short",
            Box::new(|_| ep.am_short(1, 0, b"x") == u),
        ),
        (
            IfaceFlags::AM_BCOPY,
            "am_bcopy",
            Box::new(|_| ep.am_bcopy(1, |_| 1) == Err(Status::Unsupported.into())),
        ),
        (
            IfaceFlags::AM_ZCOPY,
            "am_zcopy",
            Box::new(|_| ep.am_zcopy(1, &[], &[m.whole()], None) == Err(Status::Unsupported.into())),
        ),
        (
            IfaceFlags::PUT_SHORT,
            "put_short",
            Box::new(|_| ep.put_short(b"x", r.addr(0), &r.rkey) == u),
        ),
        (
            IfaceFlags::PUT_BCOPY,
            "put_bcopy",
            Box::new(|_| ep.put_bcopy(|_| 1, r.addr(0), &r.rkey) == Err(Status::Unsupported.into())),
        ),
        (
            IfaceFlags::PUT_ZCOPY,
            "put_zcopy",
            Box::new(|_| {
                ep.put_zcopy(&[m.whole()], r.addr(0), &r.rkey, None) == Err(Status::Unsupported.into())
            }),
        ),
        (
            IfaceFlags::GET_SHORT,
            "get_short",
            Box::new(|_| ep.get_short(&mut [0], r.addr(0), &r.rkey) == u),
        ),
        (
            IfaceFlags::GET_BCOPY,
            "get_bcopy",
            Box::new(|_| {
                ep.get_bcopy(1, r.addr(0), &r.rkey, |_| {}, None) == Err(Status::Unsupported.into())
            }),
        ),
        (
            IfaceFlags::GET_ZCOPY,
            "get_zcopy",
            Box::new(|_| {
                ep.get_zcopy(&[m.whole()], r.addr(0), &r.rkey, None) == Err(Status::Unsupported.into())
            }),
        ),
    ];
    for (flag, what, check) in checks {
        if !a.flags.contains(flag) {
            p.skip(&format!("{what}: not advertised; checking Unsupported"));
            assert!(check(&p), "[{n}] {what} without {flag:?} must return Unsupported");
        }
    }
    for (w, c) in [(AtomicWidth::U32, a.atomic32), (AtomicWidth::U64, a.atomic64)] {
        for op in [AtomicOp::Add, AtomicOp::And, AtomicOp::Or, AtomicOp::Xor] {
            if !c.op_flags.contains(op.flag()) {
                assert_eq!(
                    ep.atomic_post(w, op, 1, r.addr(0), &r.rkey),
                    u,
                    "[{n}] atomic_post {op:?} {w:?}"
                );
            }
            if !c.fop_flags.contains(op.flag()) {
                let res = ep.atomic_fetch(w, op, 1, &AtomicResult::new(), r.addr(0), &r.rkey, None);
                assert_eq!(
                    res,
                    Err(Status::Unsupported.into()),
                    "[{n}] atomic_fetch {op:?} {w:?}"
                );
            }
        }
    }
    if !a.event_flags.contains(EventFlags::FD) {
        p.skip("event fd: not advertised; checking Unsupported");
        assert_eq!(
            p.tx.iface.event_fd().err(),
            Some(Status::Unsupported.into()),
            "[{n}] event_fd"
        );
    }
    if a.event_flags.is_empty() {
        assert_eq!(
            p.tx.iface.event_arm(ArmEvents::RECV),
            u,
            "[{n}] event_arm without event flags"
        );
    }
}

/// Enabling progress twice is harmless; after disable + enable messages still arrive.
fn progress_enable_disable(s: &Setup) {
    let p = s.pair();
    let (ep, n, f) = (p.ep(), p.name(), p.attr().flags);
    if !f.contains(IfaceFlags::AM_SHORT) {
        p.skip("progress enable/disable: no AM_SHORT");
        return;
    }
    let rec = p.record_am(3);
    let both = ProgressFlags::SEND | ProgressFlags::RECV;
    for e in [&p.tx, &p.rx] {
        e.iface.progress_enable(both);
        e.iface.progress_enable(both);
        e.iface.progress_disable(ProgressFlags::SEND);
        e.iface.progress_disable(both);
        e.iface.progress_disable(both);
        e.iface.progress_enable(both);
    }
    for i in 0..10u64 {
        p.retry("am_short", || ep.am_short(3, i, b"p"))
            .unwrap_or_else(|e| panic!("[{n}] am_short: {e}"));
    }
    p.wait_msgs(&rec, 10, "after progress re-enable");
}

/// Nothing to progress: a worker with idle interfaces reports no work.
fn idle_progress_does_nothing(s: &Setup) {
    let p = s.pair();
    // Let connection establishment and the like settle, then expect quiet.
    let mut quiet = 0;
    p.wait_for("an idle progress round", || {
        if p.progress() == 0 {
            quiet += 1;
        } else {
            quiet = 0;
        }
        quiet >= 3
    });
}

/// The receiver's event fd (UCX `test_uct_event_fd`): armed once the receiver is idle,
/// readable when a message arrives, and arming again answers `Busy` until progress consumed
/// the message.
fn event_fd_wakes_on_arrival(s: &Setup) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    const ID: u8 = 3;
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    let events = p.rx.attr().event_flags;
    if !events.contains(EventFlags::FD | EventFlags::RECV) || !p.attr().flags.contains(IfaceFlags::AM_SHORT) {
        p.skip("event fd on arrival: needs EventFlags FD and RECV, and AM_SHORT");
        return;
    }
    let rec = p.record_am(ID);
    p.retry("warm-up", || ep.am_short(ID, 0, b"w"))
        .unwrap_or_else(|e| panic!("[{n}] warm-up: {e}"));
    p.wait_msgs(&rec, 1, "warm-up");
    let fd =
        p.rx.iface
            .event_fd()
            .unwrap_or_else(|e| panic!("[{n}] event_fd: {e}"));
    p.wait_for("an idle receiver that arms", || {
        p.progress();
        p.rx.iface.event_arm(ArmEvents::RECV).is_ok()
    });
    ep.am_short(ID, 1, b"wake")
        .unwrap_or_else(|e| panic!("[{n}] am_short to an idle receiver: {e}"));
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(5000u16)).unwrap();
    assert_eq!(ready, 1, "[{n}] the event fd did not become readable");
    assert_eq!(
        p.rx.iface.event_arm(ArmEvents::RECV),
        Err(Status::Busy.into()),
        "[{n}] arming with a message waiting"
    );
    p.wait_msgs(&rec, 2, "after the event");
}

conformance_test!(
    attrs_consistent,
    addresses_and_reachability,
    connect_models,
    unsupported_ops_say_so,
    progress_enable_disable,
    idle_progress_does_nothing,
    event_fd_wakes_on_arrival
);
