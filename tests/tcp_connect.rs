//! tcp connection establishment under load: two interfaces connecting to each other at the same
//! time (both connection models), and ten senders with their own workers streaming to one
//! receiver.
//!
//! Run: `cargo test -p rucx --test tcp_connect` (skips, with a note, until tcp is built in).

mod tcp_common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcp_common::gen::Checker;
use tcp_common::peer::StampedSender;
use tcp_common::{procfs, progress_for, progress_until, tcp_context, Node, Watchdog};
use uct::{AmCbFlags, Ep, IfaceFlags};

const AM_ID: u8 = 1;

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
    progress_until(
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
    let Some(ctx) = tcp_context() else { return };
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
    let Some(ctx) = tcp_context() else { return };
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
    let Some(ctx) = tcp_context() else { return };
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
