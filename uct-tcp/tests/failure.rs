//! tcp peer failure and bad input. A peer that goes away makes the error handler fire once per
//! endpoint (ConnectionReset; later operations fail, other endpoints keep working), also when it
//! is a process killed mid-stream or frozen with our operations queued to it; a connect to a port
//! where nobody listens fails with Unreachable; peers speaking anything else, broken frames and
//! connection floods are dropped without harm.
//!
//! The killed peer is this test binary run again (the ignored `child_peer` test, configured
//! through the environment), so nothing else has to be built first.
//!
//! Run: `cargo test -p uct-tcp --test failure`.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rucx_testkit::child::{spawn_self, Lines};
use rucx_testkit::tcp::gen::Checker;
use rucx_testkit::tcp::peer::{self, hex, unhex, StampedSender, AM_DATA, AM_STOP};
use rucx_testkit::tcp::{self, procfs, Node, STEP};
use rucx_testkit::wait::{progress_for, retry, wait_for};
use rucx_testkit::watchdog::Watchdog;
use rucx_testkit::{modules, pair, worker, Connect, Entity, Setup, Workers};
use ucs::Outcome;
use uct::{
    AmCbFlags, Completion, Context, Ep, FlushFlags, IfaceFlags, Mem, MemAccess, PendingRequest,
    PendingResult, Status,
};
use uct_tcp::wire;

/// A context with tcp linked in.
fn ctx() -> Context {
    modules::builtin(uct_tcp::module())
}

/// tcp on `lo`, linked in.
fn lo() -> Setup {
    tcp::lo(&ctx())
}

const ID: u8 = 4;

fn iface_sockaddr(s: &Entity) -> SocketAddr {
    let port = u16::from_le_bytes(s.iface.address().unwrap()[..2].try_into().unwrap());
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Reads until EOF (the interface closed the connection), progressing `s` meanwhile.
fn expect_closed(s: &Entity, sock: &mut TcpStream) -> Vec<u8> {
    sock.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let start = Instant::now();
    loop {
        s.worker.progress();
        let mut b = [0u8; 256];
        match sock.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return got, // reset: closed too
        }
        assert!(
            start.elapsed() < STEP,
            "the interface did not close the connection"
        );
    }
}

#[test]
fn peer_iface_closed_reports_connection_reset() {
    for model in [Connect::ToIface, Connect::ToEp] {
        let s = lo();
        let a = s.entity(&worker());
        let b = s.entity(&worker());
        let third = s.entity(&worker());
        let (ep, back) = pair::connect(&a, &b, model);
        let (ep3, back3) = pair::connect(&a, &third, model);
        let rec: std::rc::Rc<std::cell::RefCell<u32>> = Default::default();
        let r = rec.clone();
        third
            .iface
            .set_am_handler(ID, AmCbFlags::SYNC, move |_| *r.borrow_mut() += 1)
            .unwrap();
        b.iface.set_am_handler(ID, AmCbFlags::SYNC, |_| {}).unwrap();
        let workers = [a.worker.clone(), b.worker.clone(), third.worker.clone()];
        let pump = || {
            workers.iter().for_each(|w| {
                w.progress();
            })
        };
        let both = |n: u32| {
            let start = Instant::now();
            while *rec.borrow() < n {
                pump();
                assert!(start.elapsed() < STEP);
            }
        };
        let send = |e: &Ep| {
            let start = Instant::now();
            loop {
                match e.am_short(ID, 0, b"x") {
                    Err(e) if e == Status::NoResource => {
                        pump();
                        assert!(start.elapsed() < STEP);
                    }
                    r => return r,
                }
            }
        };
        send(&ep).unwrap();
        send(&ep3).unwrap();
        both(1);
        // b goes away (its endpoint and interface).
        drop(back);
        drop(b);
        wait_for(&a, STEP, "error report", || !a.errors.borrow().is_empty());
        for _ in 0..100 {
            a.worker.progress();
        }
        let errs = a.errors.borrow().clone();
        assert_eq!(
            errs,
            vec![(ep.key(), Status::ConnectionReset)],
            "{model:?}: reported once, for that endpoint"
        );
        assert_eq!(ep.am_short(ID, 0, b"x"), Err(Status::ConnectionReset.into()));
        assert_eq!(
            ep.flush(FlushFlags::LOCAL, None),
            Err(Status::ConnectionReset.into())
        );
        match ep.pending_add(PendingRequest::new(|_| PendingResult::Done)) {
            Err((e, _)) => assert_eq!(e, Status::ConnectionReset, "{model:?}: pending_add"),
            Ok(()) => panic!("{model:?}: pending_add on a failed endpoint queued the request"),
        }
        // The other endpoint is unaffected.
        send(&ep3).unwrap();
        both(2);
        drop((ep, ep3, back3));
    }
}

/// Connect-to-ep: when one endpoint is destroyed (FIN, a half-close as in UCX), the other
/// keeps sending to that interface; once the interface closes, the error handler fires.
#[test]
fn peer_endpoint_destroyed_then_its_interface() {
    let p = lo().layout(Connect::ToEp, Workers::Separate).pair();
    let rec = p.record_am(ID);
    p.retry("send", || p.ep().am_short(ID, 1, b"first")).unwrap();
    p.wait_for("delivery", || rec.borrow().len() == 1);
    let got_a: std::rc::Rc<std::cell::RefCell<u32>> = Default::default();
    let g = got_a.clone();
    p.tx.iface
        .set_am_handler(ID, AmCbFlags::SYNC, move |_| *g.borrow_mut() += 1)
        .unwrap();
    let (a, b, ep, back) = p.into_parts();
    let back = back.unwrap();
    // a's endpoint goes away; b's stays.
    drop(ep);
    let start = Instant::now();
    let mut sent = 0;
    while *got_a.borrow() < 10 {
        if sent < 10
            && back
                .am_short(ID, sent, b"to a destroyed endpoint's interface")
                .is_ok()
        {
            sent += 1;
        }
        a.worker.progress();
        b.worker.progress();
        assert!(
            start.elapsed() < STEP,
            "messages after the peer endpoint's FIN not delivered"
        );
    }
    assert!(
        b.errors.borrow().is_empty(),
        "a FIN is no failure: {:?}",
        b.errors.borrow()
    );
    let key = back.key();
    drop(a);
    wait_for(&b, STEP, "error report after the peer interface closed", || {
        !b.errors.borrow().is_empty()
    });
    assert_eq!(b.errors.borrow()[0], (key, Status::ConnectionReset));
    assert_eq!(back.am_short(ID, 0, b"x"), Err(Status::ConnectionReset.into()));
}

#[test]
fn connecting_to_a_closed_port_fails_with_unreachable() {
    let s = lo();
    let a = s.entity(&worker());
    let (dev, addr) = {
        let gone = s.entity(&worker());
        (
            gone.iface.device_address().unwrap(),
            gone.iface.address().unwrap(),
        )
    };
    let ep = a.iface.ep_create_connected(&dev, &addr).unwrap();
    let start = Instant::now();
    wait_for(&a, STEP, "Unreachable report", || !a.errors.borrow().is_empty());
    assert_eq!(a.errors.borrow()[0], (ep.key(), Status::Unreachable));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "retries took {:?}",
        start.elapsed()
    );
    assert_eq!(ep.am_short(ID, 0, b"x"), Err(Status::Unreachable.into()));
}

#[test]
fn strangers_are_refused_and_do_not_disturb() {
    let p = lo().pair();
    let rec = p.record_am(ID);
    let target = iface_sockaddr(&p.rx);
    // HTTP.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(expect_closed(&p.rx, &mut s).is_empty());
    // A newer protocol only: CONN_REJECT(version) comes back, then EOF.
    let req = wire::ConnReq {
        conn_sn: 77,
        src_ep_key: 0,
        mode: wire::ConnectMode::ToIface,
        listen_addr: "127.0.0.1:9".parse().unwrap(),
        max_payload: 4096,
    };
    let mut b = req.encode();
    b[8..10].copy_from_slice(&9u16.to_le_bytes());
    b[10..12].copy_from_slice(&9u16.to_le_bytes());
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(&b).unwrap();
    let answer = expect_closed(&p.rx, &mut s);
    let (h, _) = wire::decode_handshake(&answer).expect("a CONN_REJECT");
    assert!(
        matches!(h.msg, wire::HandshakeMsg::Reject(r) if r.reason == wire::RejectReason::VersionUnsupported)
    );
    // A valid handshake, then a frame longer than the receiver's segment.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(&req.encode()).unwrap();
    s.write_all(&wire::FrameHeader { ty: 1, len: 1 << 30 }.encode())
        .unwrap();
    let answer = expect_closed(&p.rx, &mut s);
    let (h, _) = wire::decode_handshake(&answer).expect("a CONN_ACK");
    assert!(matches!(h.msg, wire::HandshakeMsg::Ack(a) if a.conn_sn == 77));
    // A header cut in the middle waits for the rest; an unknown type is refused.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(&req.encode()).unwrap();
    s.write_all(&[200, 0, 0]).unwrap();
    for _ in 0..50 {
        p.rx.worker.progress();
    }
    s.write_all(&[0, 0, 0, 0, 0]).unwrap();
    expect_closed(&p.rx, &mut s);
    // A connect-to-ep request naming an endpoint that does not exist.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(
        &wire::ConnReq {
            mode: wire::ConnectMode::ToEp { ep_key: 0x1234 },
            ..req
        }
        .encode(),
    )
    .unwrap();
    let answer = expect_closed(&p.rx, &mut s);
    let (h, _) = wire::decode_handshake(&answer).expect("a CONN_REJECT");
    assert!(matches!(h.msg, wire::HandshakeMsg::Reject(r) if r.reason == wire::RejectReason::UnknownEp));
    // The real endpoint never noticed.
    p.retry("send", || p.ep().am_short(ID, 5, b"still here")).unwrap();
    p.wait_for("delivery", || rec.borrow().len() == 1);
    p.no_errors();
}

/// A flood of connections that send nothing: at most RUCX_TCP_MAX_HALF_OPEN (128) are kept,
/// the oldest are dropped, and real peers still connect.
#[test]
fn idle_connection_flood_is_bounded() {
    let p = lo().pair();
    let rec = p.record_am(ID);
    let target = iface_sockaddr(&p.rx);
    let mut flood: Vec<TcpStream> = (0..300)
        .map(|_| {
            let s = TcpStream::connect(target).unwrap();
            p.rx.worker.progress(); // accept as they come (the backlog is bounded too)
            s
        })
        .collect();
    for _ in 0..200 {
        p.rx.worker.progress();
    }
    // The oldest ones were closed by the interface.
    let closed = flood
        .iter_mut()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            !matches!((&**s).read(&mut [0u8; 8]), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    assert!(
        closed >= 300 - 128,
        "only {closed} of 300 idle connections were dropped"
    );
    p.retry("send", || p.ep().am_short(ID, 1, b"through the flood"))
        .unwrap();
    p.wait_for("delivery", || rec.borrow().len() == 1);
}

/// Connections that finish a valid connect-to-iface handshake and never pair with an
/// endpoint: at most RUCX_TCP_MAX_UNPAIRED are kept, later ones are refused with
/// CONN_REJECT(no resource), and real peers are still served.
#[test]
fn unpaired_connection_flood_is_bounded() {
    let p = lo().config("TCP_MAX_UNPAIRED", "16").pair();
    let rec = p.record_am(ID);
    let target = iface_sockaddr(&p.rx);
    // The real peer connects first (to the interface: it takes one of the 16 too).
    p.retry("send", || p.ep().am_short(ID, 0, b"before the flood"))
        .unwrap();
    p.wait_for("delivery", || rec.borrow().len() == 1);
    let mut acked = 0;
    let mut refused = 0;
    let mut kept = Vec::new();
    for sn in 0..40u64 {
        let req = wire::ConnReq {
            conn_sn: 1000 + sn,
            src_ep_key: 0,
            mode: wire::ConnectMode::ToIface,
            listen_addr: "127.0.0.1:9".parse().unwrap(),
            max_payload: 4096,
        };
        let mut s = TcpStream::connect(target).unwrap();
        s.write_all(&req.encode()).unwrap();
        s.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let start = Instant::now();
        let answer = loop {
            p.rx.worker.progress();
            let mut b = [0u8; 256];
            match s.read(&mut b) {
                Ok(n) if n > 0 => got.extend_from_slice(&b[..n]),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {}
            }
            if let Ok((h, _)) = wire::decode_handshake(&got) {
                break h.msg;
            }
            assert!(start.elapsed() < STEP, "no answer to handshake {sn}");
        };
        match answer {
            wire::HandshakeMsg::Ack(_) => {
                acked += 1;
                kept.push(s);
            }
            wire::HandshakeMsg::Reject(r) => {
                assert_eq!(r.reason, wire::RejectReason::NoResource, "handshake {sn}");
                refused += 1;
            }
            other => panic!("handshake {sn}: {other:?}"),
        }
    }
    assert_eq!((acked, refused), (15, 25), "of 40 unpaired connections");
    p.retry("send", || p.ep().am_short(ID, 1, b"through the flood"))
        .unwrap();
    p.wait_for("delivery", || rec.borrow().len() == 2);
}

// A peer process killed mid-stream, and a connect to a closed port with few retries.

/// Environment variable carrying a child peer's options (see `rucx_testkit::tcp::peer`).
const PEER_ARGS: &str = "RUCX_TCP_PEER_ARGS";

/// Child process: a scripted peer (`rucx_testkit::tcp::peer`) configured by `RUCX_TCP_PEER_ARGS`.
#[test]
#[ignore = "runs only as a child process of the killed-peer tests"]
fn child_peer() {
    let Ok(args) = std::env::var(PEER_ARGS) else {
        return;
    };
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    let a = peer::parse(&args).unwrap_or_else(|e| panic!("bad {PEER_ARGS}: {e}"));
    std::process::exit(peer::run(&ctx(), &a));
}

fn is_peer_failure(s: Status) -> bool {
    matches!(s, Status::ConnectionReset | Status::EndpointTimeout)
}

#[test]
fn peer_killed_while_frozen_fails_its_endpoint_and_queued_ops() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "peer_killed_while_frozen_fails_its_endpoint_and_queued_ops",
        Duration::from_secs(300),
    );
    killed_peer(&ctx, true);
}

#[test]
fn peer_killed_mid_stream_fails_its_endpoint_and_spares_the_others() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "peer_killed_mid_stream_fails_its_endpoint_and_spares_the_others",
        Duration::from_secs(300),
    );
    killed_peer(&ctx, false);
}

/// A child streams to us and we to it (and to an in-process peer); the child is SIGKILLed,
/// either while it streams or after it froze (stopped reading) so that our operations to it stay
/// queued. Our endpoint to it must fail through the error handler, queued operations complete
/// with an error, later ones fail, and the other endpoint keeps working.
fn killed_peer(ctx: &uct::Context, freeze: bool) {
    let me = Node::open(ctx);
    let other = Node::open(ctx);
    // Messages from the child (stream 7) and from `other` (stream 9) land in one checker.
    let checker = Rc::new(RefCell::new(Checker::new(None)));
    let c2 = checker.clone();
    me.iface
        .set_am_handler(AM_DATA, AmCbFlags::SYNC, move |m| {
            c2.borrow_mut().check(m.data());
        })
        .unwrap();
    let other_in = Rc::new(RefCell::new(Checker::new(None)));
    let o2 = other_in.clone();
    other
        .iface
        .set_am_handler(AM_DATA, AmCbFlags::SYNC, move |m| {
            o2.borrow_mut().check(m.data());
        })
        .unwrap();

    let args = format!(
        "--connect {}:{} --send inf --stream 7 --max-size 4000 --stall-on-stop --watch-stdin --lifetime 120 --idle-timeout 120",
        hex(&me.dev_addr),
        hex(&me.iface_addr)
    );
    let mut child = spawn_self("child_peer", &[(PEER_ARGS, &args)]);
    let mut lines = Lines::new(child.0.stdout.take().unwrap());
    let addr = lines
        .wait("RUCXPEER addr ", STEP, &[&me.worker])
        .unwrap_or_else(|| panic!("child printed no address; saw {:?}", lines.seen));
    let (d, i) = addr.split_once(':').expect("addr line");
    let (cdev, cifa) = (unhex(d).unwrap(), unhex(i).unwrap());

    // Both directions live: the child streams to us, we stream to the child and to `other`.
    let to_child = me.connect_to(&cdev, &cifa);
    let child_key = to_child.key();
    let mut s_child = StampedSender::new(&me.iface, to_child, AM_DATA, 8, Some(4000)).unwrap();
    let mut s_other = StampedSender::new(&me.iface, me.connect(&other), AM_DATA, 9, Some(4000)).unwrap();
    let other_key = s_other.ep.key();
    let w = [&me.worker, &other.worker];
    wait_for(&w, STEP, "the child's stream and ours to both peers", || {
        for s in [&mut s_child, &mut s_other] {
            if s.seq < 300 {
                s.try_send_next().expect("send before the kill");
            }
        }
        checker.borrow().count(7) >= 300 && s_child.seq >= 300 && other_in.borrow().count(9) >= 300
    });

    let zcomp = Completion::counter();
    let flush_comp = Completion::counter();
    let (outstanding, flush_state) = if freeze {
        freeze_and_fill(&me, &w, &mut s_child, &mut lines, &zcomp, &flush_comp)
    } else {
        // Kill in the middle of the streams: keep both directions busy a little longer first.
        let (c0, s0) = (checker.borrow().count(7), s_child.seq);
        wait_for(&w, STEP, "more of both streams", || {
            let _ = s_child.try_send_next().expect("send before the kill");
            checker.borrow().count(7) >= c0 + 200 && s_child.seq >= s0 + 200
        });
        (0, None)
    };

    child.0.kill().expect("SIGKILL the child");
    let _ = child.0.wait();
    if !freeze {
        // Keep sending into the dead peer: the failure must surface, not hang.
        let start = Instant::now();
        while me.errors_for(child_key).is_empty() && start.elapsed() < STEP {
            match s_child.try_send_next() {
                Ok(_) => {}
                Err(e) => {
                    eprintln!("send after the kill failed: {e:?}");
                    break;
                }
            }
            progress_for(&w, Duration::from_millis(1));
        }
    }
    wait_for(
        &w,
        Duration::from_secs(60),
        "the error handler for the killed peer's endpoint",
        || !me.errors_for(child_key).is_empty() && zcomp.outstanding() == 0 && flush_comp.outstanding() == 0,
    );
    progress_for(&w, Duration::from_millis(200));
    let errs = me.errors_for(child_key);
    assert!(
        is_peer_failure(errs[0]),
        "error handler status {:?}, expected ConnectionReset or EndpointTimeout",
        errs[0]
    );
    assert_eq!(
        errs.len(),
        1,
        "error handler fired more than once for one endpoint: {errs:?}"
    );
    if outstanding > 0 {
        assert_eq!(zcomp.fired(), 1, "outstanding zcopy completion fired once");
        assert_ne!(
            zcomp.last_status(),
            Status::Ok,
            "zcopy ops outstanding at the kill completed with OK"
        );
    } else if freeze {
        eprintln!("note: no zcopy op was outstanding at the kill (transport copied or refused them)");
    }
    if flush_state == Some(Ok(Outcome::InProgress)) {
        assert_ne!(
            flush_comp.last_status(),
            Status::Ok,
            "a flush outstanding at the kill completed with OK"
        );
    }
    later_ops_fail_and_others_work(&w, &mut s_child, &mut s_other, &other_in, &checker);
    assert!(
        me.errors_for(other_key).is_empty(),
        "the surviving endpoint failed: {:?}",
        me.errors.borrow()
    );
}

/// Freezes the child (it stops reading), then fills the path until operations stay queued;
/// returns the zcopy operations outstanding and what a flush answered.
fn freeze_and_fill(
    me: &Node,
    w: &[&uct::Worker],
    s_child: &mut StampedSender,
    lines: &mut Lines,
    zcomp: &Completion,
    flush_comp: &Completion,
) -> (i32, Option<uct::Result<Outcome>>) {
    retry(w, STEP, "STOP", || s_child.ep.am_short(AM_STOP, 0, &[])).expect("send STOP");
    lines
        .wait("RUCXPEER stopped", STEP, w)
        .unwrap_or_else(|| panic!("child did not stop; saw {:?}", lines.seen));
    let attr = *me.iface.attr();
    let zlen = attr.am.max_zcopy.min(attr.am.max_bcopy).saturating_sub(8).max(1);
    let zmem = Mem::alloc(me.iface.md(), zlen, MemAccess::ALL).unwrap();
    let use_zcopy = attr.flags.contains(IfaceFlags::AM_ZCOPY);
    let start = Instant::now();
    let mut queued = false;
    while start.elapsed() < STEP {
        let r = if use_zcopy {
            s_child
                .ep
                .am_zcopy(
                    AM_DATA + 10,
                    &[0u8; 8],
                    &[zmem.iov(0, zlen).unwrap()],
                    Some(zcomp),
                )
                .map(|_| ())
        } else {
            s_child
                .ep
                .am_bcopy(AM_DATA + 10, |b| b.len().min(zlen + 8))
                .map(|_| ())
        };
        match r {
            Ok(()) => {}
            Err(e) if e == Status::NoResource => {
                queued = true;
                break;
            }
            Err(e) => panic!("send to the frozen child failed early: {e:?}"),
        }
        me.worker.progress();
    }
    assert!(
        queued,
        "the path to a frozen peer never filled up (no NoResource in {STEP:?})"
    );
    let flush_state = s_child.ep.flush(FlushFlags::LOCAL, Some(flush_comp));
    let outstanding = zcomp.outstanding();
    eprintln!("before the kill: {outstanding} zcopy ops outstanding, flush -> {flush_state:?}");
    (outstanding, Some(flush_state))
}

/// After the failure: operations on the failed endpoint fail (not NoResource forever, never
/// OK); what the child sent before dying arrived intact; the other endpoint still delivers.
fn later_ops_fail_and_others_work(
    w: &[&uct::Worker],
    s_child: &mut StampedSender,
    s_other: &mut StampedSender,
    other_in: &Rc<RefCell<Checker>>,
    checker: &Rc<RefCell<Checker>>,
) {
    // Later operations fail (not NoResource forever, never OK).
    let start = Instant::now();
    let later = loop {
        match s_child.ep.am_short(AM_DATA, 0, b"after") {
            Ok(()) => panic!("am_short on the failed endpoint succeeded"),
            Err(e) if e == Status::NoResource && start.elapsed() < Duration::from_secs(5) => {
                progress_for(w, Duration::from_millis(10));
            }
            Err(e) => break e,
        }
    };
    assert_ne!(
        later,
        Status::NoResource,
        "am_short on the failed endpoint kept answering NoResource"
    );
    let bc = s_child.ep.am_bcopy(AM_DATA, |b| {
        b[0] = 1;
        1
    });
    assert!(
        matches!(&bc, Err(e) if *e != Status::NoResource),
        "am_bcopy on the failed endpoint: {bc:?}"
    );
    // Whatever the child sent before dying arrived intact.
    assert_eq!(
        checker.borrow().bad,
        0,
        "child's stream: {:?}",
        checker.borrow().problems
    );
    // The other endpoint is unaffected.
    let before = s_other.seq;
    wait_for(w, STEP, "traffic to the surviving peer", || {
        if s_other.seq < before + 500 {
            s_other.try_send_next().expect("send to the surviving peer");
        }
        other_in.borrow().count(9) >= before + 500
    });
    assert_eq!(other_in.borrow().bad, 0, "{:?}", other_in.borrow().problems);
}

/// A connect to a port where nobody listens (with a small retry count, set in code) fails with
/// Unreachable or Rejected: through `ep_create_connected`, the operations or the error handler
/// (once), and the endpoint stays failed.
#[test]
fn connect_to_a_closed_port_fails_cleanly() {
    let ctx = ctx();
    let _wd = Watchdog::new("connect_to_a_closed_port_fails_cleanly", Duration::from_secs(120));
    let me = Node::open_with(&ctx, &[("TCP_MAX_CONN_RETRIES", "2")]);
    // An interface address whose port nobody listens on any more.
    let (dev, ifa, port) = {
        let gone = Node::open(&ctx);
        (gone.dev_addr.clone(), gone.iface_addr.clone(), gone.port)
    };
    assert!(
        !procfs::own_listening().iter().any(|a| a.port() == port),
        "port {port} still listening after the iface closed"
    );
    let ok = |s: Status| matches!(s, Status::Unreachable | Status::Rejected);
    let ep = match me.iface.ep_create_connected(&dev, &ifa) {
        Err(e) => {
            assert!(
                ok(e.status()),
                "ep_create_connected to a closed port failed with {e:?}, expected Unreachable or Rejected"
            );
            eprintln!("result: ep_create_connected -> {e:?}");
            return;
        }
        Ok(ep) => ep,
    };
    let key = ep.key();
    let start = Instant::now();
    let mut op_err = None;
    let mut sent_ok = 0;
    while start.elapsed() < Duration::from_secs(60) {
        if !me.errors_for(key).is_empty() {
            break;
        }
        match ep.am_short(1, 0, b"hello") {
            Ok(()) => sent_ok += 1,
            Err(e) if e == Status::NoResource => {}
            Err(e) => {
                op_err = Some(e);
                break;
            }
        }
        me.worker.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let the error handler report too if the op failed first.
    progress_for(&[&me.worker], Duration::from_millis(300));
    let handler = me.errors_for(key);
    eprintln!("result: op error {op_err:?}, handler {handler:?}, {sent_ok} sends accepted before");
    assert!(
        op_err.is_some() || !handler.is_empty(),
        "no error within 60 s (no handler call, ops kept answering NoResource/OK)"
    );
    if let Some(e) = op_err {
        assert!(
            ok(e.status()),
            "ops on the endpoint failed with {e:?}, expected Unreachable or Rejected"
        );
    }
    if let Some(&h) = handler.first() {
        assert!(
            ok(h),
            "error handler reported {h:?}, expected Unreachable or Rejected"
        );
        assert_eq!(
            handler.len(),
            1,
            "error handler fired more than once: {handler:?}"
        );
    }
    // The endpoint stays failed.
    match ep.am_short(1, 0, b"again") {
        Err(e) if e != Status::NoResource => {}
        r => panic!("am_short after the failure: {r:?}"),
    }
}
