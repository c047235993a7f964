//! tcp connection establishment: the attributes and addresses of an interface on `lo`;
//! endpoints to interfaces pairing up on one connection (adopted, crossing, after a FIN); two
//! interfaces connecting to each other at the same time (both connection models); ten senders
//! with their own workers streaming to one receiver.
//!
//! Run: `cargo test -p uct-tcp --test connect`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rucx_testkit::tcp::gen::Checker;
use rucx_testkit::tcp::peer::StampedSender;
use rucx_testkit::tcp::{self, procfs, Node};
use rucx_testkit::wait::{progress_for, wait_for};
use rucx_testkit::watchdog::Watchdog;
use rucx_testkit::{modules, pair, worker, Setup};
use uct::{AmCbFlags, Context, Ep, IfaceFlags};

/// A context with tcp linked in.
fn ctx() -> Context {
    modules::builtin(uct_tcp::module())
}

/// tcp on `lo`, linked in.
fn lo() -> Setup {
    tcp::lo(&ctx())
}

const AM_ID: u8 = 1;

/// Attributes: loopback is faster than a NIC model, the addresses have the documented sizes.
#[test]
fn attributes_and_addresses() {
    let s = lo();
    let e = s.entity(&worker());
    let a = e.attr();
    assert_eq!(a.am.max_short, 8192);
    assert_eq!(a.am.max_bcopy, 8192);
    assert_eq!(a.am.max_zcopy, 65536);
    assert_eq!(a.am.max_iov, 6);
    assert_eq!(a.iface_addr_len, 2);
    assert_eq!(a.ep_addr_len, 10);
    assert_eq!(a.device_addr_len, e.iface.device_address().unwrap().len());
    assert!(a.flags.contains(
        IfaceFlags::CONNECT_TO_EP | IfaceFlags::CONNECT_TO_IFACE | IfaceFlags::ERRHANDLE_PEER_FAILURE
    ));
    assert!(a.bandwidth.dedicated > 1e9 && a.latency.c < 1e-5);
    assert!(
        !e.iface.is_reachable(&[4, 0, 10, 0, 0, 1], &[1, 2]),
        "lo must not reach a routable address"
    );
    assert!(!e.iface.is_reachable(&e.iface.device_address().unwrap(), &[0, 0]));
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            let t = s.entity(&worker());
            u16::from_le_bytes(t.iface.address().unwrap()[..2].try_into().unwrap())
        })
        .collect();
    assert!(ports.iter().all(|&p| p != 0));
}

/// Connect to iface, both directions: the second endpoint adopts the connection the first one
/// made (usable at once, no new connection); endpoints created at the same time end up sharing
/// one connection too; destroying one side's endpoint leaves the other side's working.
#[test]
fn iface_endpoints_pair_up() {
    let s = lo();
    let (a, b) = (s.entity(&worker()), s.entity(&worker()));
    let got: Rc<RefCell<Vec<(u8, u64)>>> = Rc::default();
    for (e, tag) in [(&a, 1u8), (&b, 2u8)] {
        let g = got.clone();
        e.iface
            .set_am_handler(AM_ID, AmCbFlags::SYNC, move |m| {
                g.borrow_mut().push((tag, m.header()))
            })
            .unwrap();
    }
    let pump = |n: usize| {
        let start = std::time::Instant::now();
        while got.borrow().len() < n {
            a.worker.progress();
            b.worker.progress();
            assert!(
                start.elapsed() < tcp::STEP,
                "messages not delivered: {:?}",
                got.borrow()
            );
        }
    };
    let ab = pair::connect_to_iface(&a, &b);
    let start = std::time::Instant::now();
    while ab.am_short(AM_ID, 1, b"a->b").is_err() {
        a.worker.progress();
        b.worker.progress();
        assert!(start.elapsed() < tcp::STEP);
    }
    pump(1);
    // b's first endpoint to a adopts the connection a made: it can send before any progress.
    let ba = pair::connect_to_iface(&b, &a);
    assert_eq!(
        ba.am_short(AM_ID, 2, b"b->a"),
        Ok(()),
        "the adopting endpoint is connected at once"
    );
    pump(2);
    // Created at once on both sides, before any progress: the connects cross.
    let ab2 = pair::connect_to_iface(&a, &b);
    let ba2 = pair::connect_to_iface(&b, &a);
    let mut sent = [0u64; 2];
    let start = std::time::Instant::now();
    while sent != [50, 50] {
        for (i, e) in [&ab2, &ba2].into_iter().enumerate() {
            if sent[i] < 50 && e.am_short(AM_ID, 100 + sent[i], b"x").is_ok() {
                sent[i] += 1;
            }
        }
        a.worker.progress();
        b.worker.progress();
        assert!(start.elapsed() < tcp::STEP, "simultaneous connect: sent {sent:?}");
    }
    pump(102);
    assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
    // a's endpoint goes away (FIN); b's, on the same connection, keeps working.
    drop(ab);
    for i in 0..20 {
        let start = std::time::Instant::now();
        while ba.am_short(AM_ID, 1000 + i, b"after FIN").is_err() {
            a.worker.progress();
            b.worker.progress();
            assert!(start.elapsed() < tcp::STEP);
        }
    }
    pump(122);
    assert!(b.errors.borrow().is_empty(), "{:?}", b.errors.borrow());
    let from_b: Vec<u64> = got
        .borrow()
        .iter()
        .filter(|m| m.0 == 1 && m.1 >= 1000)
        .map(|m| m.1)
        .collect();
    assert_eq!(from_b, (1000..1020).collect::<Vec<_>>());
}

fn checker_on(node: &Node) -> Rc<RefCell<Checker>> {
    let c = Rc::new(RefCell::new(Checker::new(None)));
    let c2 = c.clone();
    node.iface
        .set_am_handler(AM_ID, AmCbFlags::SYNC, move |m| {
            c2.borrow_mut().check(m.data());
        })
        .unwrap();
    c
}

/// Both directions send `n` stamped messages, interleaved, right after the endpoints were
/// created (no progress in between); everything must arrive once, in order, intact; then the
/// pair must be down to one socket.
fn exchange_both_ways(a: &Node, b: &Node, ep_ab: Ep, ep_ba: Ep, n: u32, round: u32) {
    let (ca, cb) = (checker_on(a), checker_on(b));
    let (ka, kb) = (ep_ab.key(), ep_ba.key());
    let mut sab = StampedSender::new(&a.iface, ep_ab, AM_ID, 1, Some(2000)).unwrap();
    let mut sba = StampedSender::new(&b.iface, ep_ba, AM_ID, 2, Some(2000)).unwrap();
    let w = [&a.worker, &b.worker];
    wait_for(
        &w,
        Duration::from_secs(60),
        &format!("round {round}: both streams"),
        || {
            for s in [&mut sab, &mut sba] {
                for _ in 0..4 {
                    if s.seq >= n
                        || !s
                            .try_send_next()
                            .unwrap_or_else(|e| panic!("round {round}: send failed: {e:?}"))
                    {
                        break;
                    }
                }
            }
            cb.borrow().count(1) >= n && ca.borrow().count(2) >= n
        },
    );
    // Duplicates would show up now.
    progress_for(&w, Duration::from_millis(300));
    for (who, c, want_stream) in [("b (from a)", &cb, 1), ("a (from b)", &ca, 2)] {
        let c = c.borrow();
        assert_eq!(c.bad, 0, "round {round}: {who}: {:?}", c.problems);
        assert_eq!(
            c.total, n as u64,
            "round {round}: {who}: messages delivered (each sent once)"
        );
        assert_eq!(c.count(want_stream), n, "round {round}: {who}");
    }
    assert!(
        a.errors_for(ka).is_empty() && b.errors_for(kb).is_empty(),
        "round {round}: error handler fired: {:?} {:?}",
        a.errors.borrow(),
        b.errors.borrow()
    );
    // One connection (two socket ends, both in this process) between the pair once settled.
    let ports = [a.port, b.port];
    let mut rows = procfs::own_established_touching(&ports);
    let start = Instant::now();
    while rows.len() > 2 && start.elapsed() < Duration::from_secs(5) {
        progress_for(&w, Duration::from_millis(50));
        rows = procfs::own_established_touching(&ports);
    }
    eprintln!(
        "round {round}: connection(s) between ports {ports:?}: {:?}",
        rows.iter().map(|r| (r.local, r.remote)).collect::<Vec<_>>()
    );
    assert_eq!(
        rows.len(),
        2,
        "round {round}: expected one TCP connection (2 socket ends) between the interfaces on ports {ports:?}, found {} ends: {rows:#?}",
        rows.len()
    );
    drop((sab, sba));
}

#[test]
fn simultaneous_connect_to_iface_delivers_everything_once() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "simultaneous_connect_to_iface_delivers_everything_once",
        Duration::from_secs(300),
    );
    for round in 0..5 {
        let a = Node::open(&ctx);
        let b = Node::open(&ctx);
        // Both endpoints exist before either side progresses: the connects cross.
        let ep_ab = a.connect(&b);
        let ep_ba = b.connect(&a);
        exchange_both_ways(&a, &b, ep_ab, ep_ba, 300, round);
    }
}

#[test]
fn simultaneous_connect_to_ep_delivers_everything_once() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "simultaneous_connect_to_ep_delivers_everything_once",
        Duration::from_secs(300),
    );
    for round in 0..5 {
        let a = Node::open(&ctx);
        let b = Node::open(&ctx);
        if !a.iface.attr().flags.contains(IfaceFlags::CONNECT_TO_EP) {
            eprintln!("skipped: tcp does not advertise CONNECT_TO_EP");
            return;
        }
        let ep_ab = a.iface.ep_create().expect("ep_create");
        let ep_ba = b.iface.ep_create().expect("ep_create");
        let (addr_ab, addr_ba) = (ep_ab.address().unwrap(), ep_ba.address().unwrap());
        ep_ab
            .connect_to_ep(&b.dev_addr, &addr_ba)
            .expect("connect_to_ep a->b");
        ep_ba
            .connect_to_ep(&a.dev_addr, &addr_ab)
            .expect("connect_to_ep b->a");
        exchange_both_ways(&a, &b, ep_ab, ep_ba, 300, round);
    }
}

#[test]
fn ten_senders_to_one_receiver_keep_order_and_data() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "ten_senders_to_one_receiver_keep_order_and_data",
        Duration::from_secs(600),
    );
    const SENDERS: u32 = 10;
    const N: u32 = 1000;
    let rx = Node::open(&ctx);
    let cap = StampedSender::payload_cap(rx.iface.attr(), None);
    let checker = Rc::new(RefCell::new(Checker::new(Some(cap))));
    let c2 = checker.clone();
    rx.iface
        .set_am_handler(AM_ID, AmCbFlags::SYNC, move |m| {
            c2.borrow_mut().check(m.data());
        })
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for i in 0..SENDERS {
        let (ctx, dev, ifa, done) = (
            ctx.clone(),
            rx.dev_addr.clone(),
            rx.iface_addr.clone(),
            done.clone(),
        );
        threads.push(std::thread::spawn(move || -> Result<[u64; 3], String> {
            let node = Node::open(&ctx);
            let ep = node.connect_to(&dev, &ifa);
            let key = ep.key();
            let mut s = StampedSender::new(&node.iface, ep, AM_ID, i + 1, None)
                .map_err(|e| format!("sender {i}: {e:?}"))?;
            if s.cap() != cap {
                return Err(format!(
                    "sender {i}: payload cap {} differs from the receiver's {cap}",
                    s.cap()
                ));
            }
            let start = Instant::now();
            while s.seq < N {
                if start.elapsed() > Duration::from_secs(300) {
                    return Err(format!("sender {i}: only {} of {N} sent after 300 s", s.seq));
                }
                match s.try_send_next() {
                    Ok(true) => {}
                    Ok(false) => {
                        node.worker.progress();
                    }
                    Err(e) => return Err(format!("sender {i}: {e:?} at message {}", s.seq)),
                }
                if let Some(e) = node.errors_for(key).first() {
                    return Err(format!("sender {i}: error handler {e:?}"));
                }
            }
            // Stay alive (and progressing) until the receiver has everything.
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() > Duration::from_secs(400) {
                    return Err(format!("sender {i}: receiver never finished"));
                }
                if node.worker.progress() == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                if let Some(e) = node.errors_for(key).first() {
                    return Err(format!(
                        "sender {i}: error handler {e:?} after sending everything"
                    ));
                }
            }
            Ok(s.sent_by)
        }));
    }
    let start = Instant::now();
    let all_in = || (1..=SENDERS).all(|st| checker.borrow().count(st) >= N);
    while !all_in() && start.elapsed() < Duration::from_secs(400) && !threads.iter().all(|t| t.is_finished())
    {
        if rx.worker.progress() == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    progress_for(&[&rx.worker], Duration::from_millis(300));
    done.store(true, Ordering::Relaxed);
    let mut by_flavour = [0u64; 3];
    let mut errs = Vec::new();
    for t in threads {
        match t.join().expect("sender thread panicked") {
            Ok(f) => (0..3).for_each(|k| by_flavour[k] += f[k]),
            Err(e) => errs.push(e),
        }
    }
    eprintln!("sent with am_short/am_bcopy/am_zcopy: {by_flavour:?}; payload cap {cap}");
    let c = checker.borrow();
    assert!(errs.is_empty(), "sender failures:\n{}", errs.join("\n"));
    assert_eq!(c.bad, 0, "{} bad messages, first: {:?}", c.bad, c.problems);
    for st in 1..=SENDERS {
        assert_eq!(c.count(st), N, "messages of sender {}", st - 1);
    }
    assert_eq!(
        c.total,
        (SENDERS * N) as u64,
        "total messages delivered (each once)"
    );
    assert!(
        rx.errors.borrow().is_empty(),
        "receiver's error handler fired: {:?}",
        rx.errors.borrow()
    );
}
