//! The tcp transport over `lo`: active messages of every flavor, both connection models, one
//! worker and two workers (one thread), pending queue, flush, event fd.

mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use common::*;
use uct::*;

const ID: u8 = 3;

fn am_all_flavors(model: Model, shared: bool) {
    let p = Pair::new(model, shared);
    let rec = p.record(ID);
    let attr = *p.a.iface.attr();
    // am_short, up to the limit.
    for (i, len) in [0usize, 1, 7, 100, 2047, 2048, 2049, 5000, attr.am.max_short - 8]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u64);
        p.retry("am_short", || {
            p.ep.am_short(ID, 0x1122_3344_5566_7788 ^ i as u64, &data)
        })
        .unwrap();
        p.wait("am_short", || rec.borrow().len() == i + 1);
        let m = &rec.borrow()[i];
        assert_eq!(m[..8], (0x1122_3344_5566_7788u64 ^ i as u64).to_le_bytes());
        assert_eq!(&m[8..], &data[..], "am_short of {len}");
    }
    assert_eq!(
        p.ep.am_short(ID, 0, &vec![0; attr.am.max_short - 7]),
        Err(Status::InvalidParam)
    );
    assert_eq!(p.ep.am_short(32, 0, b"x"), Err(Status::InvalidParam));
    rec.borrow_mut().clear();
    // am_bcopy.
    for (i, len) in [0usize, 5, 4096, attr.am.max_bcopy].into_iter().enumerate() {
        let data = pattern(len, 10 + i as u64);
        let n = p.retry("am_bcopy", || {
            p.ep.am_bcopy(ID, |b| {
                b[..len].copy_from_slice(&data);
                len
            })
        });
        assert_eq!(n, Ok(len));
        p.wait("am_bcopy", || rec.borrow().len() == i + 1);
        assert_eq!(rec.borrow()[i], data);
    }
    assert_eq!(p.ep.am_bcopy(ID, |b| b.len() + 1), Err(Status::MessageTruncated));
    rec.borrow_mut().clear();
    // am_zcopy: header + scattered iov.
    let src = p.local(70_000, 0);
    let data = pattern(60_000, 99);
    src.write(0, &data[..30_000]).unwrap();
    src.write(40_000, &data[30_000..]).unwrap();
    let iov = [src.iov(0, 30_000).unwrap(), src.iov(40_000, 30_000).unwrap()];
    let c = Completion::counter();
    let r = p.retry("am_zcopy", || p.ep.am_zcopy(ID, b"hdr", &iov, Some(&c)));
    assert_eq!(p.finish(r, &c), Status::Ok);
    p.wait("am_zcopy", || rec.borrow().len() == 1);
    assert_eq!(&rec.borrow()[0][..3], b"hdr");
    assert_eq!(&rec.borrow()[0][3..], &data[..]);
    let big = [src.iov(0, attr.am.max_zcopy).unwrap()];
    assert!(
        p.ep.am_zcopy(ID, b"h", &big, None).is_err(),
        "header + payload over max_zcopy"
    );
    p.flush();
    assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
}

#[test]
fn am_iface_one_worker() {
    am_all_flavors(Model::Iface, true);
}

#[test]
fn am_iface_two_workers() {
    am_all_flavors(Model::Iface, false);
}

#[test]
fn am_ep_one_worker() {
    am_all_flavors(Model::Ep, true);
}

#[test]
fn am_ep_two_workers() {
    am_all_flavors(Model::Ep, false);
}

/// Connect-to-ep is full duplex over one socket: both endpoints send, and a handler replies on
/// the other endpoint of its interface.
#[test]
fn connect_to_ep_both_ways_with_replies() {
    let p = Pair::new(Model::Ep, false);
    let back = p.back.clone().unwrap();
    let got_a: Rc<RefCell<Vec<u64>>> = Rc::default();
    let g = got_a.clone();
    p.a.iface
        .set_am_handler(1, AmCbFlags::SYNC, move |m| g.borrow_mut().push(m.header()))
        .unwrap();
    let b2 = back.clone();
    // b echoes every message back, from inside its handler (re-entering the transport).
    p.b.iface
        .set_am_handler(2, AmCbFlags::SYNC, move |m| {
            let h = m.header();
            // The socket may be full: a real application would use pending_add.
            let _ = b2.am_short(1, h + 1000, b"echo");
        })
        .unwrap();
    for i in 0..200u64 {
        p.retry("am_short", || p.ep.am_short(2, i, b"ping")).unwrap();
        p.wait("echo", || got_a.borrow().len() as u64 == i + 1);
    }
    assert_eq!(*got_a.borrow(), (1000..1200).collect::<Vec<_>>());
    // Connections: one each way would be two sockets; connect-to-ep must share one.
    assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
}

/// A receiver that does not progress fills the socket: sends answer NoResource, pending
/// requests queue and run in order once it progresses again, nothing overtakes them.
#[test]
fn pending_when_the_receiver_stalls() {
    for model in [Model::Iface, Model::Ep] {
        let p = Pair::new(model, false);
        let rec = p.record(ID);
        p.retry("warm-up", || p.ep.am_short(ID, 0, b"w")).unwrap();
        p.wait("warm-up", || rec.borrow().len() == 1);
        let payload = vec![7u8; 4000];
        let mut sent = 1u64;
        // Only the sender progresses.
        loop {
            match p.ep.am_short(ID, sent, &payload) {
                Ok(()) => sent += 1,
                Err(Status::NoResource) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(sent < 1_000_000, "never ran out of socket buffer");
            p.a.worker.progress();
        }
        assert_eq!(p.ep.am_short(ID, sent, &payload), Err(Status::NoResource));
        let done = Rc::new(Cell::new(0u64));
        for j in 0..50u64 {
            let (ep, d, pl) = (Rc::downgrade(&p.ep), done.clone(), payload.clone());
            let seq = sent + j;
            let req = PendingRequest::new(move || match ep.upgrade().unwrap().am_short(ID, seq, &pl) {
                Ok(()) => {
                    d.set(d.get() + 1);
                    Status::Ok
                }
                Err(e) => e,
            });
            assert!(
                p.ep.pending_add(req).is_ok(),
                "pending_add after NoResource must queue"
            );
        }
        // Nothing overtakes queued requests.
        assert_eq!(p.ep.am_short(ID, u64::MAX, b"x"), Err(Status::NoResource));
        p.wait("pending dispatch", || done.get() == 50);
        let total = sent + 50;
        p.wait("all messages", || rec.borrow().len() as u64 == total);
        let seqs: Vec<u64> = rec
            .borrow()
            .iter()
            .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
            .collect();
        assert_eq!(seqs, (0..total).collect::<Vec<_>>());
        // Resources free again: pending_add says Busy.
        p.flush();
        match p.ep.pending_add(PendingRequest::new(|| Status::Ok)) {
            Err((Status::Busy, _)) => {}
            other => panic!("pending_add on an idle endpoint: {:?}", other.err().map(|e| e.0)),
        }
    }
}

/// Sends before the connection is up answer NoResource; the pending queue runs once connected.
#[test]
fn pending_dispatched_once_connected() {
    let p = Pair::new(Model::Iface, true);
    let rec = p.record(ID);
    assert_eq!(p.ep.am_short(ID, 1, b"early"), Err(Status::NoResource));
    let ep = Rc::downgrade(&p.ep);
    p.ep.pending_add(PendingRequest::new(move || {
        match ep.upgrade().unwrap().am_short(ID, 1, b"queued") {
            Ok(()) => Status::Ok,
            Err(e) => e,
        }
    }))
    .unwrap_or_else(|(e, _)| panic!("pending_add while connecting: {e}"));
    p.wait("queued message", || rec.borrow().len() == 1);
    assert_eq!(&rec.borrow()[0][8..], b"queued");
}

/// The event fd: armed when idle, readable once a message arrives, Busy while work waits.
#[test]
fn event_fd_wakes_up_on_arrival() {
    use std::os::fd::BorrowedFd;
    let p = Pair::new(Model::Iface, false);
    let rec = p.record(ID);
    p.retry("warm-up", || p.ep.am_short(ID, 0, b"w")).unwrap();
    p.wait("warm-up", || rec.borrow().len() == 1);
    let fd = p.b.iface.event_fd().unwrap();
    // Drain until the receiver is idle.
    p.wait("receiver idle", || {
        p.progress();
        p.b.iface.event_arm(ArmEvents::RECV).is_ok()
    });
    p.ep.am_short(ID, 1, b"wake").unwrap();
    let bfd = borrow_fd(fd);
    let mut fds = [nix::poll::PollFd::new(bfd, nix::poll::PollFlags::POLLIN)];
    let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).unwrap();
    assert_eq!(n, 1, "event fd did not become readable");
    assert_eq!(p.b.iface.event_arm(ArmEvents::RECV), Err(Status::Busy));
    p.wait("message", || rec.borrow().len() == 2);
    fn borrow_fd(fd: i32) -> BorrowedFd<'static> {
        // SAFETY: the interface owns the fd and keeps it open for the whole test.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }
}

/// Attributes: loopback is faster than a NIC model, the addresses have the documented sizes.
#[test]
fn attributes_and_addresses() {
    let c = ctx();
    let s = side(&c, &worker());
    let a = s.iface.attr();
    assert_eq!(a.am.max_short, 8192);
    assert_eq!(a.am.max_bcopy, 8192);
    assert_eq!(a.am.max_zcopy, 65536);
    assert_eq!(a.am.max_iov, 6);
    assert_eq!(a.iface_addr_len, 2);
    assert_eq!(a.ep_addr_len, 10);
    assert_eq!(a.device_addr_len, s.iface.device_address().unwrap().len());
    assert!(a.flags.contains(
        IfaceFlags::CONNECT_TO_EP | IfaceFlags::CONNECT_TO_IFACE | IfaceFlags::ERRHANDLE_PEER_FAILURE
    ));
    assert!(a.bandwidth.dedicated > 1e9 && a.latency.c < 1e-5);
    assert!(
        !s.iface.is_reachable(&[4, 0, 10, 0, 0, 1], &[1, 2]),
        "lo must not reach a routable address"
    );
    assert!(!s.iface.is_reachable(&s.iface.device_address().unwrap(), &[0, 0]));
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            let t = side(&c, &worker());
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
    let c = ctx();
    let (a, b) = (side(&c, &worker()), side(&c, &worker()));
    let got: Rc<RefCell<Vec<(u8, u64)>>> = Rc::default();
    for (s, tag) in [(&a, 1u8), (&b, 2u8)] {
        let g = got.clone();
        s.iface
            .set_am_handler(ID, AmCbFlags::SYNC, move |m| {
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
                start.elapsed() < DEADLINE,
                "messages not delivered: {:?}",
                got.borrow()
            );
        }
    };
    let (ab, _) = connect(&a, &b, Model::Iface);
    let start = std::time::Instant::now();
    while ab.am_short(ID, 1, b"a->b").is_err() {
        a.worker.progress();
        b.worker.progress();
        assert!(start.elapsed() < DEADLINE);
    }
    pump(1);
    // b's first endpoint to a adopts the connection a made: it can send before any progress.
    let (ba, _) = connect(&b, &a, Model::Iface);
    assert_eq!(
        ba.am_short(ID, 2, b"b->a"),
        Ok(()),
        "the adopting endpoint is connected at once"
    );
    pump(2);
    // Created at once on both sides, before any progress: the connects cross.
    let (ab2, _) = connect(&a, &b, Model::Iface);
    let (ba2, _) = connect(&b, &a, Model::Iface);
    let mut sent = [0u64; 2];
    let start = std::time::Instant::now();
    while sent != [50, 50] {
        for (i, e) in [&ab2, &ba2].into_iter().enumerate() {
            if sent[i] < 50 && e.am_short(ID, 100 + sent[i], b"x").is_ok() {
                sent[i] += 1;
            }
        }
        a.worker.progress();
        b.worker.progress();
        assert!(start.elapsed() < DEADLINE, "simultaneous connect: sent {sent:?}");
    }
    pump(102);
    assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
    // a's endpoint goes away (FIN); b's, on the same connection, keeps working.
    drop(ab);
    for i in 0..20 {
        let start = std::time::Instant::now();
        while ba.am_short(ID, 1000 + i, b"after FIN").is_err() {
            a.worker.progress();
            b.worker.progress();
            assert!(start.elapsed() < DEADLINE);
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
