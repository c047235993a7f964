//! Peer failure and bad input: a peer that goes away makes the error handler fire once per
//! endpoint with ConnectionReset (later operations fail, other endpoints keep working); peers
//! speaking anything else, broken frames and connection floods are dropped without harm.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use uct::*;
use uct_tcp::wire;

const ID: u8 = 4;

fn iface_sockaddr(s: &Side) -> SocketAddr {
    let port = u16::from_le_bytes(s.iface.address().unwrap()[..2].try_into().unwrap());
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Progresses `s` until `cond`, failing after a deadline.
fn wait_side(s: &Side, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        s.worker.progress();
    }
}

/// Reads until EOF (the interface closed the connection), progressing `s` meanwhile.
fn expect_closed(s: &Side, sock: &mut TcpStream) -> Vec<u8> {
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
            start.elapsed() < DEADLINE,
            "the interface did not close the connection"
        );
    }
}

#[test]
fn peer_iface_closed_reports_connection_reset() {
    for model in [Model::Iface, Model::Ep] {
        let c = ctx();
        let w = worker();
        let a = side(&c, &w);
        let b = side(&c, &worker());
        let third = side(&c, &worker());
        let (ep, back) = connect(&a, &b, model);
        let (ep3, back3) = connect(&a, &third, model);
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
                assert!(start.elapsed() < DEADLINE);
            }
        };
        let send = |e: &Ep| {
            let start = Instant::now();
            loop {
                match e.am_short(ID, 0, b"x") {
                    Err(Status::NoResource) => {
                        pump();
                        assert!(start.elapsed() < DEADLINE);
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
        wait_side(&a, "error report", || !a.errors.borrow().is_empty());
        for _ in 0..100 {
            a.worker.progress();
        }
        let errs = a.errors.borrow().clone();
        assert_eq!(
            errs,
            vec![(ep.key(), Status::ConnectionReset)],
            "{model:?}: reported once, for that endpoint"
        );
        assert_eq!(ep.am_short(ID, 0, b"x"), Err(Status::ConnectionReset));
        assert_eq!(ep.flush(FlushFlags::LOCAL, None), Err(Status::ConnectionReset));
        assert!(ep.pending_add(PendingRequest::new(|| Status::Ok)).is_err());
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
    let p = Pair::new(Model::Ep, false);
    let rec = p.record(ID);
    p.retry("send", || p.ep.am_short(ID, 1, b"first")).unwrap();
    p.wait("delivery", || rec.borrow().len() == 1);
    let back = p.back.clone().unwrap();
    let got_a: std::rc::Rc<std::cell::RefCell<u32>> = Default::default();
    let g = got_a.clone();
    p.a.iface
        .set_am_handler(ID, AmCbFlags::SYNC, move |_| *g.borrow_mut() += 1)
        .unwrap();
    let Pair {
        a, b, ep, back: bk, ..
    } = p;
    drop(ep);
    drop(bk);
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
            start.elapsed() < DEADLINE,
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
    wait_side(&b, "error report after the peer interface closed", || {
        !b.errors.borrow().is_empty()
    });
    assert_eq!(b.errors.borrow()[0], (key, Status::ConnectionReset));
    assert_eq!(back.am_short(ID, 0, b"x"), Err(Status::ConnectionReset));
}

#[test]
fn connecting_to_a_closed_port_fails_with_unreachable() {
    let c = ctx();
    let a = side(&c, &worker());
    let (dev, addr) = {
        let gone = side(&c, &worker());
        (
            gone.iface.device_address().unwrap(),
            gone.iface.address().unwrap(),
        )
    };
    let ep = a.iface.ep_create_connected(&dev, &addr).unwrap();
    let start = Instant::now();
    wait_side(&a, "Unreachable report", || !a.errors.borrow().is_empty());
    assert_eq!(a.errors.borrow()[0], (ep.key(), Status::Unreachable));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "retries took {:?}",
        start.elapsed()
    );
    assert_eq!(ep.am_short(ID, 0, b"x"), Err(Status::Unreachable));
}

#[test]
fn strangers_are_refused_and_do_not_disturb() {
    let p = Pair::new(Model::Iface, false);
    let rec = p.record(ID);
    let target = iface_sockaddr(&p.b);
    // HTTP.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(expect_closed(&p.b, &mut s).is_empty());
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
    let answer = expect_closed(&p.b, &mut s);
    let (h, _) = wire::decode_handshake(&answer).expect("a CONN_REJECT");
    assert!(
        matches!(h.msg, wire::HandshakeMsg::Reject(r) if r.reason == wire::RejectReason::VersionUnsupported)
    );
    // A valid handshake, then a frame longer than the receiver's segment.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(&req.encode()).unwrap();
    s.write_all(&wire::FrameHeader { ty: 1, len: 1 << 30 }.encode())
        .unwrap();
    let answer = expect_closed(&p.b, &mut s);
    let (h, _) = wire::decode_handshake(&answer).expect("a CONN_ACK");
    assert!(matches!(h.msg, wire::HandshakeMsg::Ack(a) if a.conn_sn == 77));
    // A header cut in the middle waits for the rest; an unknown type is refused.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(&req.encode()).unwrap();
    s.write_all(&[200, 0, 0]).unwrap();
    for _ in 0..50 {
        p.b.worker.progress();
    }
    s.write_all(&[0, 0, 0, 0, 0]).unwrap();
    expect_closed(&p.b, &mut s);
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
    let answer = expect_closed(&p.b, &mut s);
    let (h, _) = wire::decode_handshake(&answer).expect("a CONN_REJECT");
    assert!(matches!(h.msg, wire::HandshakeMsg::Reject(r) if r.reason == wire::RejectReason::UnknownEp));
    // The real endpoint never noticed.
    p.retry("send", || p.ep.am_short(ID, 5, b"still here")).unwrap();
    p.wait("delivery", || rec.borrow().len() == 1);
    assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
}

/// A flood of connections that send nothing: at most RUCX_TCP_MAX_HALF_OPEN (128) are kept,
/// the oldest are dropped, and real peers still connect.
#[test]
fn idle_connection_flood_is_bounded() {
    let p = Pair::new(Model::Iface, false);
    let rec = p.record(ID);
    let target = iface_sockaddr(&p.b);
    let mut flood: Vec<TcpStream> = (0..300)
        .map(|_| {
            let s = TcpStream::connect(target).unwrap();
            p.b.worker.progress(); // accept as they come (the backlog is bounded too)
            s
        })
        .collect();
    for _ in 0..200 {
        p.b.worker.progress();
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
    p.retry("send", || p.ep.am_short(ID, 1, b"through the flood"))
        .unwrap();
    p.wait("delivery", || rec.borrow().len() == 1);
}
