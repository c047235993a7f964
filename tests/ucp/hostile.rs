//! Hostile bytes: a raw uct endpoint sends malformed UCP messages (headers, fragments, wireup,
//! rendezvous) to a worker's interface. Each is dropped with a log line; the worker keeps serving its real
//! peer, and messages it was reassembling from that peer are not disturbed.

use ucp::{AddressEntry, AmFlags, WorkerAddress};

use crate::harness::{pattern, uct_context, Pair, Setup};
use crate::ucp_test;

/// UCP's uct AM ids (docs/wire-ucp.md; 9..=14 are tag matching's, 15 streams').
const WIREUP: u8 = 1;
const SINGLE: u8 = 2;
const FIRST: u8 = 3;
const MIDDLE: u8 = 4;
const RTS: u8 = 5;
const ATS: u8 = 6;
const RTR: u8 = 7;
const DATA: u8 = 8;

/// A rendezvous announcement: header word, worker, ep, rndv id, total, address, rkey length,
/// resource, reserved, rkey.
fn rts(am: u16, worker: u64, total: u64, addr: u64, resource: u8, rkey: &[u8]) -> Vec<u8> {
    [
        &le(u64::from(am))[..],
        &le(worker)[..],
        &le(1)[..],
        &le(77)[..],
        &le(total)[..],
        &le(addr)[..],
        &(rkey.len() as u16).to_le_bytes()[..],
        &[resource, 0, 0, 0, 0, 0][..],
        rkey,
    ]
    .concat()
}

fn le(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// Malformed and spoofed messages, by uct AM id (`peer`: the victim's real peer).
fn garbage(victim_uuid: u64, peer: u64) -> Vec<(u8, Vec<u8>)> {
    let word = |id: u64, flags: u64, uh: u64| le(id | flags << 16 | uh << 32);
    let mut v = vec![
        (SINGLE, vec![]),
        (SINGLE, vec![1, 2, 3]),
        (SINGLE, word(2, 0x80, 0).to_vec()),                 // unknown flag
        (SINGLE, le(2 | 1 << 24).to_vec()),                  // reserved bits
        (SINGLE, word(2, 0, 1 << 30).to_vec()),              // header longer than message
        (SINGLE, [&word(2, 1, 0)[..], &le(7)[..]].concat()), // truncated reply fields
        (FIRST, word(2, 0, 0).to_vec()),
        // a 1 TiB message: refused, nothing reserved for it
        (
            FIRST,
            [
                &word(2, 0, 0)[..],
                &le(victim_uuid)[..],
                &le(1)[..],
                &le(1 << 40)[..],
            ]
            .concat(),
        ),
        // 1 GiB claimed: reassembly starts and must not disturb the real peer's messages
        (
            FIRST,
            [
                &word(2, 0, 0)[..],
                &le(99)[..],
                &le(1)[..],
                &le(1 << 30)[..],
                b"x",
            ]
            .concat(),
        ),
        (
            FIRST,
            [
                &word(2, 0, 0)[..],
                &le(99)[..],
                &le(2)[..],
                &le(1)[..],
                b"too long",
            ]
            .concat(),
        ),
        (MIDDLE, vec![9; 10]),
        (
            MIDDLE,
            [&le(99)[..], &le(1)[..], &le(12345)[..], b"wrong offset"].concat(),
        ),
        (
            MIDDLE,
            [&le(99)[..], &le(77)[..], &le(0)[..], b"unknown message"].concat(),
        ),
        (WIREUP, vec![]),
        (WIREUP, vec![2; 39]),
        (
            WIREUP,
            [&[1u8, 1, 0, 0][..], &100u32.to_le_bytes()[..], &[0; 32][..]].concat(),
        ),
        (
            WIREUP,
            [
                &[1u8, 2, 0, 0, 0, 0, 0, 0][..],
                &le(1)[..],
                &le(2)[..],
                &le(3)[..],
                &le(0)[..],
            ]
            .concat(),
        ),
        (
            WIREUP,
            [
                &[1u8, 3, 0, 0, 0, 0, 0, 0][..],
                &le(1)[..],
                &le(2)[..],
                &le(3)[..],
                &le(0)[..],
            ]
            .concat(),
        ),
        // a REQUEST whose address is garbage
        (
            WIREUP,
            [
                &[1u8, 1, 0, 0, 4, 0, 0, 0][..],
                &le(1)[..],
                &le(2)[..],
                &le(0)[..],
                &le(0)[..],
                b"RXWA",
            ]
            .concat(),
        ),
        (9, b"an AM id UCP does not use".to_vec()),
        (RTS, vec![5; 20]),
        (RTS, rts(2, 12345, 100, 0x1000, 255, &[])), // no endpoint to that worker
        (RTS, rts(2, peer, 1 << 40, 0x1000, 255, &[])), // 1 TiB
        (RTS, rts(2, peer, 100, 0x1000, 0, &[])),    // a resource without rkey
        (RTS, rts(2, peer, 100, 0x1000, 0, b"not an rkey")), // spoofed: the fetch must fail cleanly
        (ATS, vec![1; 23]),
        (ATS, [&le(5)[..], &le(peer)[..], &[0; 8][..]].concat()), // unknown transfer
        (RTR, [&le(5)[..], &le(6)[..], &le(peer)[..]].concat()),
        (9, vec![1, 2, 3]), // tag message shorter than its tag
        (10, vec![0; 20]),  // synchronous tag message, truncated
        (
            11,
            [
                &le(5)[..],
                &le(peer)[..],
                &le(1)[..],
                &le(2)[..],
                &le(0)[..],
                &le(0)[..],
                b"more than two",
            ]
            .concat(),
        ),
        (
            12,
            [&le(peer)[..], &le(77)[..], &le(0)[..], b"no such message"].concat(),
        ),
        (13, [&le(12345)[..], &le(peer)[..]].concat()), // acknowledges nothing
        (14, vec![0; 30]),
        (15, vec![1; 3]),                                           // stream message, short
        (15, [&le(12345)[..], &le(1)[..], b"not a peer"].concat()), // stream from a stranger
        (DATA, vec![]),
        (
            DATA,
            [&le(41)[..], &le(peer)[..], &le(0)[..], b"no such receive"].concat(),
        ),
    ];
    v.push((WIREUP, [&[7u8][..], &[0; 60][..]].concat())); // another version
    v
}

/// An interface of the transport under test on the victim's own uct worker (the self
/// transport reaches only its worker), with a raw endpoint to the victim's interface; `None`
/// where the transport connects endpoint to endpoint only (rc_verbs: no raw way in). Fields
/// drop in order: the endpoint before its interface.
struct Attacker {
    raw: uct::Ep,
    _iface: uct::Iface,
    md: uct::Md,
}

fn attacker(s: &Setup, p: &Pair, entry: &AddressEntry) -> Option<Attacker> {
    if entry.iface_addr.is_empty() {
        return None;
    }
    let uct = uct_context(s.t);
    let (md, _) = uct.find_resource(&entry.tl.tl_name, &entry.tl.dev_name).unwrap();
    let iface = uct::Iface::open(
        &md,
        p.b.uct(),
        uct::IfaceParams::new(&entry.tl.tl_name, &entry.tl.dev_name),
    )
    .unwrap();
    let raw = iface
        .ep_create_connected(&entry.dev_addr, &entry.iface_addr)
        .unwrap();
    Some(Attacker {
        raw,
        _iface: iface,
        md,
    })
}

/// Sends `bytes` as uct AM `id` from the raw endpoint (retrying while it has no resources).
fn send_raw(p: &Pair, raw: &uct::Ep, id: u8, bytes: &[u8]) {
    p.wait_for("the raw endpoint to take a message", || {
        match raw.am_bcopy(id, |b| {
            let n = bytes.len().min(b.len());
            b[..n].copy_from_slice(&bytes[..n]);
            n
        }) {
            Ok(_) => true,
            Err(e) if e == ucs::Status::NoResource => false,
            Err(e) => panic!("[{}] raw am_bcopy: {e}", p.name),
        }
    });
}

fn hostile_bytes_are_dropped(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let victim = WorkerAddress::unpack(p.b.address()).unwrap();
    let Some(entry) = victim.entries.iter().find(|e| e.tl.tl_name == s.t.tl_name) else {
        panic!("[{}] no {} entry in the worker address", p.name, s.t.tl_name)
    };
    let Some(a) = attacker(s, &p, entry) else { return };

    // A real fragmented message in flight from the real peer while the garbage arrives.
    let inbox = p.inbox(2);
    let big = pattern(1 << 20, 5);
    let _ = p.ep.am_send(2, b"real", &big, AmFlags::default()).unwrap();
    for (id, bytes) in garbage(victim.uuid, p.a.id()) {
        send_raw(&p, &a.raw, id, &bytes);
        p.progress();
    }
    let _ =
        p.ep.am_send(2, b"after", b"still here", AmFlags::default())
            .unwrap();
    p.wait_for("the real messages", || inbox.borrow().len() >= 2);
    let got = inbox.borrow();
    assert_eq!(got.len(), 2, "[{}] a malformed message was delivered", p.name);
    assert_eq!(
        (got[0].0.as_slice(), got[0].1 == big),
        (&b"real"[..], true),
        "[{}]",
        p.name
    );
    assert_eq!(
        (got[1].0.as_slice(), got[1].1.as_slice()),
        (&b"after"[..], &b"still here"[..]),
        "[{}]",
        p.name
    );
}

/// A forged rendezvous announcement: an rkey the sender does not own (registered on another
/// memory domain) and an address and length beyond what it covers. The receiver's fetch fails
/// with an error, nothing is read from outside registered memory, and the worker goes on.
fn forged_rendezvous(s: &Setup) {
    if s.t.rdma {
        return; // rc_verbs would fail the whole connection on a remote access error
    }
    if !s.t.am_zcopy {
        // posix has no RMA: its rendezvous fetches go over cma, whose rkey checks the uct
        // conformance suite covers (misuse_rma on cma).
        return;
    }
    let Some(p) = s.pair() else { return };
    let victim = WorkerAddress::unpack(p.b.address()).unwrap();
    let sender = WorkerAddress::unpack(p.a.address()).unwrap();
    // the device the endpoint's lanes use (a transport may have several: ofi's shm and tcp)
    p.wait_for("wired", || p.ep.is_connected());
    let lanes = p.ep.describe_lanes();
    let on_lane = |e: &&AddressEntry| {
        e.tl.tl_name == s.t.tl_name && lanes.contains(&format!("{}/{} ", e.tl.tl_name, e.tl.dev_name))
    };
    let entry = victim.entries.iter().find(on_lane).unwrap();
    let resource = sender.entries.iter().position(|e| on_lane(&e)).unwrap() as u8;
    let a = attacker(s, &p, entry).expect("self and tcp connect to interfaces");
    let region = uct::Mem::register(&a.md, vec![7u8; 4096], uct::MemAccess::ALL).unwrap();
    let rkey = region.pack_rkey().unwrap();
    // The victim must know the claimed sender: a real message from it first.
    let inbox = p.inbox(2);
    let _ = p.ep.am_send(2, b"real", b"first", AmFlags::default()).unwrap();
    p.wait_for("the real message", || inbox.borrow().len() == 1);

    let results: std::rc::Rc<std::cell::RefCell<Vec<ucp::Result<usize>>>> = Default::default();
    let r2 = results.clone();
    let w = p.b.downgrade();
    p.b.set_am_handler_with(3, ucp::AmHandlerFlags::RNDV_DESC, move |m| {
        let desc = m.take_data_desc().expect("a rendezvous message");
        let r3 = r2.clone();
        match w.upgrade().unwrap().am_recv_data(desc, Vec::new()) {
            Ok(issued) => issued.on_complete(move |r| r3.borrow_mut().push(r.map(|v| v.len()))),
            Err(e) => r2.borrow_mut().push(Err(e)),
        }
    })
    .unwrap();
    let cases = [
        (region.addr() + (1 << 20), 4096u64), // outside the region
        (region.addr(), 1 << 20),             // runs past its end
    ];
    for (i, &(addr, total)) in cases.iter().enumerate() {
        send_raw(&p, &a.raw, RTS, &rts(3, p.a.id(), total, addr, resource, &rkey));
        p.wait_for("the forged fetch to end", || results.borrow().len() == i + 1);
        let r = &results.borrow()[i];
        assert!(r.is_err(), "[{}] forged case {i} was fetched: {r:?}", p.name);
    }
    drop(region);
    let _ =
        p.ep.am_send(2, b"after", b"still here", AmFlags::default())
            .unwrap();
    p.wait_for("the next real message", || inbox.borrow().len() == 2);
}

/// uct AM id of tag matching's first fragment.
const TAG_FIRST: u8 = 11;

/// An AM first fragment for handler 2, as `worker` would send it.
fn am_first(worker: u64, msg_id: u64, total: u64, data: &[u8]) -> Vec<u8> {
    [&le(2)[..], &le(worker)[..], &le(msg_id)[..], &le(total)[..], data].concat()
}

/// A tag first fragment (not synchronous), as `worker` would send it.
fn tag_first(tag: u64, worker: u64, msg_id: u64, total: u64, data: &[u8]) -> Vec<u8> {
    [
        &le(tag)[..],
        &le(worker)[..],
        &le(msg_id)[..],
        &le(total)[..],
        &le(0)[..],
        &le(0)[..],
        data,
    ]
    .concat()
}

/// Sends a single AM for handler 2 from the raw endpoint and waits until the victim ran its
/// handler: everything the raw endpoint sent before it has been handled (one connection
/// delivers in order). `inbox` is the victim's handler 2.
fn sentinel(p: &Pair, raw: &uct::Ep, inbox: &crate::harness::Inbox) {
    let n = inbox.borrow().len();
    send_raw(p, raw, SINGLE, &[&le(2)[..], b"sentinel"].concat());
    p.wait_for("the raw endpoint's sentinel", || inbox.borrow().len() > n);
    assert_eq!(inbox.borrow().last().unwrap().1, b"sentinel", "[{}]", p.name);
}

/// The victim's real peer, wired and known to it (a message went through).
fn wired(p: &Pair, inbox: &crate::harness::Inbox) {
    let _ = p.ep.am_send(2, b"real", b"first", AmFlags::default()).unwrap();
    p.wait_for("the real message", || !inbox.borrow().is_empty());
}

/// A wired AM and tag pair, a raw attacker toward the receiver, and the receiver's handler 2
/// (which has seen one real message); `None` where the target has no raw way in.
fn attacked(s: &Setup) -> Option<(Pair, Attacker, crate::harness::Inbox)> {
    let p = s.pair_with(ucp::Features::AM | ucp::Features::TAG)?;
    let victim = WorkerAddress::unpack(p.b.address()).unwrap();
    let entry = victim.entries.iter().find(|e| e.tl.tl_name == s.t.tl_name)?;
    let a = attacker(s, &p, entry)?;
    let inbox = p.inbox(2);
    wired(&p, &inbox);
    Some((p, a, inbox))
}

/// Forged first fragments claiming workers the victim has no endpoint to start nothing:
/// thousands of them, AM and tag, each claiming 1 GiB, leave nothing under reassembly.
fn strangers_start_no_reassembly(s: &Setup) {
    let Some((p, a, inbox)) = attacked(s) else { return };
    for i in 0..2000u64 {
        let stranger = 0x5eed_0000_0000 + i;
        send_raw(&p, &a.raw, FIRST, &am_first(stranger, i, 1 << 30, b"x"));
        send_raw(&p, &a.raw, TAG_FIRST, &tag_first(7, stranger, i, 1 << 30, b"x"));
        if i % 32 == 0 {
            p.progress();
        }
    }
    sentinel(&p, &a.raw, &inbox);
    assert_eq!(
        p.b.reassembly(),
        ucp::HeldUse {
            messages: 0,
            bytes: 0
        },
        "[{}] a stranger's fragments started a reassembly",
        p.name
    );
}

/// A peer (here forged in the real peer's name) whose first fragments would hold more than
/// `RUCX_REASM_PEER_LIMIT`: the victim never holds more, fails that peer's endpoints (its
/// messages dropped, later fragments refused), and serves another peer as before.
fn peer_over_reassembly_budget(s: &Setup) {
    if !s.t.two_workers {
        return; // one worker: the spoofed peer would be the victim itself
    }
    let limit = 64 << 10;
    let s = s.with("REASM_PEER_LIMIT", "64k");
    let Some((p, a, inbox)) = attacked(&s) else { return };
    let peer = p.a.id();
    let mut most = 0;
    for i in 0..400u64 {
        if i % 2 == 0 {
            send_raw(&p, &a.raw, FIRST, &am_first(peer, 1 << 40 | i, 1 << 30, b"x"));
        } else {
            send_raw(
                &p,
                &a.raw,
                TAG_FIRST,
                &tag_first(7, peer, 1 << 40 | i, 1 << 30, b"x"),
            );
        }
        p.progress();
        most = most.max(p.b.reassembly().bytes);
        assert!(
            most <= limit,
            "[{}] {most} bytes held, over the 64k budget",
            p.name
        );
    }
    sentinel(&p, &a.raw, &inbox);
    assert!(
        most > 0,
        "[{}] nothing was ever held: the test tested nothing",
        p.name
    );
    // The failure reaches the peer's endpoints from progress, and their messages go.
    p.wait_for("the peer's messages to be dropped", || {
        p.b.reassembly().messages == 0
    });
    assert_eq!(p.b.reassembly().bytes, 0, "[{}]", p.name);

    // Another peer of the same worker is served, fragments and all.
    let ctx = s.context(ucp::Features::AM | ucp::Features::TAG).unwrap();
    let c = ucp::Worker::new(&ctx).unwrap();
    let ep = c.connect(p.b.address()).unwrap();
    let big = pattern(20_000, 3); // fragmented, within the budget
    let _ = ep.am_send(2, b"other", &big, AmFlags::EAGER).unwrap();
    let n = inbox.borrow().len();
    let start = std::time::Instant::now();
    while inbox.borrow().len() == n {
        assert!(
            start.elapsed() < crate::harness::DEADLINE,
            "[{}] the other peer's message",
            p.name
        );
        c.progress();
        p.progress();
    }
    assert!(inbox.borrow().last().unwrap().1 == big, "[{}]", p.name);
}

/// A message whose fragments stop: after `RUCX_REASM_TIMEOUT` it is dropped, the posted tag
/// receive it was filling completes with `TimedOut`, and what it held is freed.
fn stalled_fragments_time_out(s: &Setup) {
    let s = s.with("REASM_TIMEOUT", "200ms");
    let Some((p, a, inbox)) = attacked(&s) else { return };
    let peer = p.a.id();
    let ucp::Issued::Pending(mut recv) = p.b.tag_recv(0, 0, vec![0; 64]).unwrap() else {
        panic!("[{}] nothing was sent yet", p.name)
    };
    send_raw(&p, &a.raw, TAG_FIRST, &tag_first(5, peer, 1 << 41, 4 << 30, b"x"));
    send_raw(&p, &a.raw, FIRST, &am_first(peer, 1 << 41 | 1, 1 << 30, b"x"));
    sentinel(&p, &a.raw, &inbox);
    assert_eq!(p.b.reassembly().messages, 2, "[{}]", p.name);
    p.wait_for("the stalled receive to fail", || recv.is_done());
    let e = recv.take().unwrap().unwrap_err();
    assert_eq!(e.status(), ucs::Status::TimedOut, "[{}] {e}", p.name);
    assert!(e.to_string().contains("RUCX_REASM_TIMEOUT"), "[{}] {e}", p.name);
    p.wait_for("the stalled AM to be dropped", || p.b.reassembly().messages == 0);
    assert_eq!(p.b.reassembly().bytes, 0, "[{}]", p.name);
    // The tag service goes on.
    let r = p.b.tag_recv(0, 0, vec![0; 64]).unwrap();
    let _ = p.ep.tag_send(9, b"after").unwrap();
    let got = r.wait(&p.b).unwrap();
    assert_eq!((got.tag, got.data.as_slice()), (9, &b"after"[..]), "[{}]", p.name);
}

/// uct AM ids of tag matching's plain eager message and rendezvous announcement.
const TAG_EAGER: u8 = 9;
const TAG_RTS: u8 = 14;

/// A flood of unexpected tag messages: plain eager ones (no sender named) never hold more
/// than `RUCX_TAG_UNEXP_WORKER_LIMIT` (the rest are dropped, logged), and room comes back as
/// the application receives them; rendezvous announcements in a peer's name past
/// `RUCX_TAG_UNEXP_PEER_LIMIT` fail that peer's endpoints, and their announcements go.
fn unexpected_tag_flood_bounded(s: &Setup) {
    if !s.t.two_workers {
        return; // one worker: the spoofed peer would be the victim itself
    }
    let limit = 64 << 10;
    let s = s
        .with("TAG_UNEXP_WORKER_LIMIT", "64k")
        .with("TAG_UNEXP_PEER_LIMIT", "64k");
    let Some((p, a, inbox)) = attacked(&s) else { return };
    let body = [&le(7)[..], &[0xab; 500][..]].concat();
    let mut most = 0;
    for _ in 0..400 {
        send_raw(&p, &a.raw, TAG_EAGER, &body);
        p.progress();
        most = most.max(p.b.tag_unexpected().bytes);
        assert!(most <= limit, "[{}] {most} bytes held, over 64k", p.name);
    }
    sentinel(&p, &a.raw, &inbox);
    let kept = p.b.tag_unexpected().messages;
    assert!(
        (64..400).contains(&kept),
        "[{}] {kept} of 400 kept: the budget did not bound them, or bounded nothing",
        p.name
    );
    for _ in 0..kept {
        let ucp::Issued::Done(got) = p.b.tag_recv(7, u64::MAX, vec![0; 600]).unwrap() else {
            panic!("[{}] an unexpected message was not there", p.name)
        };
        assert_eq!(got.data.as_slice(), &body[8..], "[{}]", p.name);
    }
    assert_eq!(
        p.b.tag_unexpected(),
        ucp::HeldUse {
            messages: 0,
            bytes: 0
        },
        "[{}]",
        p.name
    );
    // Room again: the real peer's message is kept until received.
    let _ = p.ep.tag_send(8, b"real").unwrap();
    let got =
        p.b.tag_recv(8, u64::MAX, vec![0; 16])
            .unwrap()
            .wait(&p.b)
            .unwrap();
    assert_eq!(got.data.as_slice(), b"real", "[{}]", p.name);

    // Announcements in the peer's name: the peer fails once past its limit, and its
    // announcements, which no receive could fetch now, leave the queue.
    let mut most = 0;
    for _ in 0..400 {
        send_raw(&p, &a.raw, TAG_RTS, &rts(9, p.a.id(), 100, 0x1000, 255, &[]));
        p.progress();
        most = most.max(p.b.tag_unexpected().bytes);
        assert!(most <= limit, "[{}] announcements over 64k", p.name);
    }
    assert!(most > limit / 2, "[{}] only {most} bytes were ever held", p.name);
    sentinel(&p, &a.raw, &inbox);
    p.wait_for("the flooding peer's announcements to go", || {
        p.b.tag_unexpected().messages == 0
    });
    assert_eq!(p.b.tag_unexpected().bytes, 0, "[{}]", p.name);
}

/// A rendezvous receive by RTR whose sender sends no data: after `RUCX_RNDV_TIMEOUT` it
/// completes with `TimedOut`, and the worker goes on.
fn rndv_without_data_times_out(s: &Setup) {
    let s = s.with("RNDV_TIMEOUT", "200ms").with("RNDV_SCHEME", "am");
    let Some((p, a, inbox)) = attacked(&s) else { return };
    let ucp::Issued::Pending(mut recv) = p.b.tag_recv(4, u64::MAX, vec![0; 4096]).unwrap() else {
        panic!("[{}] nothing was sent yet", p.name)
    };
    // No resource to fetch from: the victim asks the claimed sender (its real peer, which
    // knows no such transfer) for DATA that never comes.
    send_raw(&p, &a.raw, TAG_RTS, &rts(4, p.a.id(), 4096, 0x1000, 255, &[]));
    sentinel(&p, &a.raw, &inbox);
    p.wait_for("the stalled receive to fail", || recv.is_done());
    let e = recv.take().unwrap().unwrap_err();
    assert_eq!(e.status(), ucs::Status::TimedOut, "[{}] {e}", p.name);
    assert!(e.to_string().contains("RUCX_RNDV_TIMEOUT"), "[{}] {e}", p.name);
    // Real rendezvous messages still go, under the same short timeout.
    let big = pattern(1 << 20, 9);
    let ucp::Issued::Pending(mut r) = p.b.tag_recv(5, u64::MAX, vec![0; 1 << 20]).unwrap() else {
        panic!("[{}] nothing was sent yet", p.name)
    };
    let _ = p.ep.tag_send_owned(5, big.clone()).unwrap();
    p.wait_for("the real rendezvous message", || r.is_done());
    let got = r.take().unwrap().unwrap();
    assert!(got.data == big, "[{}]", p.name);
}

/// uct AM id of stream messages.
const STREAM: u8 = 15;

/// Stream bytes in a peer's name that the application never reads: the victim never holds
/// more than `RUCX_STREAM_PEER_LIMIT`, fails the peer's endpoints past it, and refuses its
/// stream messages from then on (no endpoint takes them).
fn unread_stream_flood_bounded(s: &Setup) {
    if !s.t.two_workers {
        return; // one worker: the spoofed peer would be the victim itself
    }
    let limit = 64 << 10;
    let s = s.with("STREAM_PEER_LIMIT", "64k");
    let Some((p, a, inbox)) = attacked(&s) else { return };
    let msg = [&le(p.a.id())[..], &le(1)[..], &[0x5a; 900][..]].concat();
    let mut most = 0;
    for _ in 0..200 {
        send_raw(&p, &a.raw, STREAM, &msg);
        p.progress();
        most = most.max(p.b.stream_unread().bytes);
        assert!(most <= limit, "[{}] {most} unread bytes, over 64k", p.name);
    }
    sentinel(&p, &a.raw, &inbox);
    assert!(most > limit / 2, "[{}] only {most} bytes were ever held", p.name);
    // A one-byte message would fit in what is left (900-byte messages leave room for one),
    // yet it is refused: the peer failed.
    let held = p.b.stream_unread();
    assert!(limit - held.bytes > 256, "[{}] {held:?}", p.name);
    send_raw(&p, &a.raw, STREAM, &msg[..17]);
    sentinel(&p, &a.raw, &inbox);
    assert_eq!(
        p.b.stream_unread(),
        held,
        "[{}] the failed peer's stream was still taken",
        p.name
    );
}

/// A wireup REQUEST from worker `uuid` (its address: `addr` renamed to it), connection `sn`.
fn request(addr: &WorkerAddress, uuid: u64, sn: u64) -> Vec<u8> {
    let mut a = addr.clone();
    a.uuid = uuid;
    let packed = a.pack();
    [
        &[1u8, 1, 0, 0][..],
        &(packed.len() as u32).to_le_bytes()[..],
        &le(uuid)[..],
        &le(1000 + sn)[..],
        &le(0)[..],
        &le(sn)[..],
        &packed[..],
    ]
    .concat()
}

/// Wireup REQUEST floods, from one forged worker and from many: the endpoints they make stay
/// within `RUCX_PASSIVE_PEER_LIMIT` and `RUCX_PASSIVE_WORKER_LIMIT`, later requests are
/// refused, and the real peer is served as before.
fn wireup_request_flood_bounded(s: &Setup) {
    if !s.t.two_workers {
        return; // one worker: its address is the victim's own
    }
    let s = s
        .with("PASSIVE_PEER_LIMIT", "8")
        .with("PASSIVE_WORKER_LIMIT", "32");
    let Some((p, a, inbox)) = attacked(&s) else { return };
    let peer_addr = WorkerAddress::unpack(p.a.address()).unwrap();
    let before = p.b.passive_endpoints();
    for sn in 0..40 {
        send_raw(&p, &a.raw, WIREUP, &request(&peer_addr, 0xf0f0_0001, sn));
        p.progress();
    }
    sentinel(&p, &a.raw, &inbox);
    let one = p.b.passive_endpoints() - before;
    assert!(
        (1..=8).contains(&one),
        "[{}] {one} endpoints from one worker's 40 requests",
        p.name
    );
    for i in 0..200 {
        send_raw(&p, &a.raw, WIREUP, &request(&peer_addr, 0xf1f1_0000 + i, 0));
        p.progress();
        assert!(
            p.b.passive_endpoints() <= 32,
            "[{}] over the worker limit",
            p.name
        );
    }
    sentinel(&p, &a.raw, &inbox);
    let _ = p.ep.am_send(2, b"real", b"after", AmFlags::default()).unwrap();
    p.wait_for("the real peer's message", || {
        inbox.borrow().last().is_some_and(|m| m.1 == b"after")
    });
}

/// A peer that stops reading (its worker never progresses): what the sender's queue holds
/// stays within `RUCX_EP_SEND_QUEUE_LIMIT`, and past it the endpoint fails with
/// `ExceedsLimit`, in error mode None, and its queued sends complete with that error.
fn non_reader_fails_the_sender(s: &Setup) {
    if !s.t.two_workers {
        return; // one worker: the receiver progresses with the sender
    }
    let limit = 1 << 20;
    let s = s.with("EP_SEND_QUEUE_LIMIT", "1m");
    let Some(p) = s.pair_with(ucp::Features::AM | ucp::Features::TAG) else {
        return;
    };
    let inbox = p.inbox(2);
    wired(&p, &inbox);
    let msg = pattern(8000, 1);
    let mut pending = Vec::new();
    let mut most = 0;
    let mut failed = None;
    for _ in 0..(64 << 20) / msg.len() {
        match p.ep.tag_send(1, &msg) {
            Ok(ucp::Issued::Pending(r)) => pending.push(r),
            Ok(ucp::Issued::Done(())) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        most = most.max(p.ep.queued_bytes());
        assert!(most <= limit + 2 * msg.len(), "[{}] {most} bytes queued", p.name);
        p.a.progress(); // the sender only
        if let Some(e) = p.ep.error() {
            failed = Some(e);
            break;
        }
    }
    let e = failed.unwrap_or_else(|| panic!("[{}] 64 MiB sent to a peer that reads nothing", p.name));
    assert_eq!(e.status(), ucs::Status::ExceedsLimit, "[{}] {e}", p.name);
    assert!(
        e.to_string().contains("RUCX_EP_SEND_QUEUE_LIMIT"),
        "[{}] {e}",
        p.name
    );
    assert!(
        most > limit / 2,
        "[{}] only {most} bytes were ever queued",
        p.name
    );
    for r in &mut pending {
        let start = std::time::Instant::now();
        while !r.is_done() {
            assert!(
                start.elapsed() < crate::harness::DEADLINE,
                "[{}] a queued send",
                p.name
            );
            p.a.progress();
        }
    }
    assert!(
        pending.iter_mut().any(|r| r.take().unwrap().is_err()),
        "[{}] no queued send failed",
        p.name
    );
    assert_eq!(p.ep.queued_bytes(), 0, "[{}]", p.name);
}

ucp_test!(
    non_reader_fails_the_sender,
    wireup_request_flood_bounded,
    unread_stream_flood_bounded,
    hostile_bytes_are_dropped,
    forged_rendezvous,
    strangers_start_no_reassembly,
    peer_over_reassembly_budget,
    stalled_fragments_time_out,
    unexpected_tag_flood_bounded,
    rndv_without_data_times_out
);
