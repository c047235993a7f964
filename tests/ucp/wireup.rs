//! Wireup: endpoints usable at once, both sides connecting at once, many endpoints, addresses
//! that do not unpack.

use std::time::Instant;

use ucp::{AmFlags, Worker};
use uct::AsyncMode;

use crate::harness::{context, Setup, DEADLINE};
use crate::ucp_test;

/// Both workers connect to each other at the same time: each side ends with one endpoint
/// pair, and messages flow both ways (with reply endpoints).
fn both_connect_at_once(s: &Setup) {
    if !s.t.two_workers {
        return;
    }
    let Some(ctx) = context(s.t, &[]) else { return };
    let a = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let b = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let ab = a.connect(b.address()).unwrap();
    let ba = b.connect(a.address()).unwrap();
    let got_a = std::rc::Rc::new(std::cell::Cell::new(0));
    let got_b = std::rc::Rc::new(std::cell::Cell::new(0));
    let (ga, gb) = (got_a.clone(), got_b.clone());
    a.set_am_handler(1, move |m| {
        assert!(m.reply_ep().is_some());
        ga.set(ga.get() + 1)
    })
    .unwrap();
    b.set_am_handler(1, move |m| {
        assert!(m.reply_ep().is_some());
        gb.set(gb.get() + 1)
    })
    .unwrap();
    for _ in 0..10 {
        let _ = ab.am_send(1, &[], b"to b", AmFlags::REPLY).unwrap();
        let _ = ba.am_send(1, &[], b"to a", AmFlags::REPLY).unwrap();
    }
    let start = Instant::now();
    while got_a.get() < 10 || got_b.get() < 10 {
        assert!(start.elapsed() < DEADLINE, "[{}] messages both ways", s.t.name);
        a.progress();
        b.progress();
    }
    while !(ab.is_connected() && ba.is_connected()) {
        assert!(start.elapsed() < DEADLINE, "[{}] both endpoints wired", s.t.name);
        a.progress();
        b.progress();
    }
}

/// The endpoint's lanes are on the target's transport (the one `RUCX_TLS` allows), and the
/// lane description names it.
fn lanes_on_target(s: &Setup) {
    let Some(p) = s.pair() else { return };
    p.wait_for("wired", || p.ep.is_connected());
    let d = p.ep.describe_lanes();
    assert!(
        d.contains(s.t.tl_name),
        "[{}] lanes not on {}: {d}",
        p.name,
        s.t.tl_name
    );
    assert!(d.contains("am"), "[{}] no am lane: {d}", p.name);
}

/// Sends posted right after `connect`, before any progress, arrive, in order.
fn send_before_wired(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let inbox = p.inbox(2);
    for i in 0u32..50 {
        let _ =
            p.ep.am_send(2, &[], &i.to_le_bytes(), AmFlags::default())
                .unwrap();
    }
    p.wait_for("50 messages", || inbox.borrow().len() == 50);
    for (i, m) in inbox.borrow().iter().enumerate() {
        assert_eq!(m.1, (i as u32).to_le_bytes(), "[{}] message {i}", p.name);
    }
}

/// Many endpoints on one worker, each used.
fn many_endpoints(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let n = if s.t.rdma { 100 } else { 1000 };
    let inbox = p.inbox(3);
    let eps: Vec<_> = (0..n).map(|_| p.a.connect(p.b.address()).unwrap()).collect();
    for (i, ep) in eps.iter().enumerate() {
        let _ = ep
            .am_send(3, &[], &(i as u32).to_le_bytes(), AmFlags::default())
            .unwrap();
    }
    p.wait_for(&format!("{n} endpoints' messages"), || inbox.borrow().len() == n);
    let mut seen: Vec<u32> = inbox
        .borrow()
        .iter()
        .map(|m| u32::from_le_bytes(m.1[..4].try_into().unwrap()))
        .collect();
    seen.sort_unstable();
    assert!(
        seen.iter().enumerate().all(|(i, v)| *v as usize == i),
        "[{}] each endpoint's message once",
        p.name
    );
}

/// Garbage, truncated and foreign addresses are refused with an error, never a panic.
fn bad_addresses(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let good = p.b.address().to_vec();
    for bad in [
        Vec::new(),
        vec![0u8; 3],
        good[..good.len() / 2].to_vec(),
        vec![0xff; 200],
    ] {
        let e = p.a.connect(&bad).unwrap_err();
        assert!(e.context().is_some(), "[{}] {e}", p.name);
    }
    // The worker goes on working.
    let inbox = p.inbox(1);
    p.send(1, &[], b"still fine", AmFlags::default());
    p.wait_for("a message", || !inbox.borrow().is_empty());
}

/// Interfaces no endpoint uses sleep or are polled every few calls (`RUCX_ADAPTIVE_PROGRESS`):
/// a worker whose interfaces all do still takes a new peer's wireup and messages; while an endpoint lives only its
/// lanes' interfaces are progressed (an auxiliary wireup-only one sleeps); once the endpoint
/// is gone its interfaces sleep again.
fn idle_interfaces_sleep(s: &Setup) {
    if !s.t.two_workers {
        return;
    }
    let Some(ctx) = context(s.t, &[]) else { return };
    let a = Worker::new(&ctx).unwrap();
    let b = Worker::new(&ctx).unwrap();
    let settle = |ws: &[&Worker]| {
        for _ in 0..2000 {
            for w in ws {
                w.progress();
            }
        }
    };
    // No endpoint: nothing is polled on every call (transports with an event fd sleep, those
    // without one, such as cma, are polled every few calls).
    let polls_target = |w: &Worker| {
        w.progressed_resources()
            .iter()
            .any(|r| r.starts_with(s.t.tl_name))
    };
    settle(&[&a, &b]);
    assert_eq!(
        b.progressed_resources(),
        Vec::<String>::new(),
        "[{}] idle worker",
        s.t.name
    );
    let got = std::rc::Rc::new(std::cell::Cell::new(0));
    let g = got.clone();
    b.set_am_handler(1, move |_| g.set(g.get() + 1)).unwrap();
    let ep = a.connect(b.address()).unwrap();
    for _ in 0..10 {
        let _ = ep.am_send(1, &[], b"wake up", AmFlags::default()).unwrap();
    }
    let start = Instant::now();
    while got.get() < 10 || !ep.is_connected() {
        assert!(
            start.elapsed() < DEADLINE,
            "[{}] messages to a sleeping worker",
            s.t.name
        );
        a.progress();
        b.progress();
    }
    settle(&[&a, &b]);
    for w in [&a, &b] {
        let on = w.progressed_resources();
        assert!(polls_target(w), "[{}] progressed while wired: {on:?}", s.t.name);
        // rc's wireup goes over ud_verbs, an auxiliary transport no lane uses afterwards
        if s.t.tl_name == "rc_verbs" {
            assert!(
                !on.iter().any(|r| r.starts_with("ud_verbs")),
                "[{}] auxiliary transport progressed while wired: {on:?}",
                s.t.name
            );
        }
    }
    let _ = ep.close(ucp::CloseMode::Force);
    drop(ep);
    settle(&[&a, &b]);
    assert_eq!(
        a.progressed_resources(),
        Vec::<String>::new(),
        "[{}] endpoint gone",
        s.t.name
    );
}

ucp_test!(
    idle_interfaces_sleep,
    lanes_on_target,
    both_connect_at_once,
    send_before_wired,
    many_endpoints,
    bad_addresses
);
