//! The tcp transport against raw sockets that speak (or break) `docs/wire-tcp.md`: frames split at
//! every byte boundary, junk from many connections beside legitimate traffic, forged RMA
//! requests outside registered memory, and spoofed handshakes.
//!
//! Run: `cargo test -p uct-tcp --test wire`.

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rucx_testkit::modules;
use rucx_testkit::tcp::drive::{drive, drive_with, Ticks};
use rucx_testkit::tcp::gen::{Checker, Rng};
use rucx_testkit::tcp::peer::StampedSender;
use rucx_testkit::tcp::wire::*;
use rucx_testkit::tcp::{Node, STEP};
use rucx_testkit::wait::{progress_for, wait_for};
use rucx_testkit::watchdog::Watchdog;
use uct::{AmCbFlags, Context, Mem, MemAccess};

/// A context with tcp linked in.
fn ctx() -> Context {
    modules::builtin(uct_tcp::module())
}

const AM_ID: u8 = 5;

type Inbox = Arc<Mutex<Vec<Vec<u8>>>>;

/// Installs a handler on `id` that records every message.
fn collect(node: &Node, id: u8) -> Inbox {
    let inbox: Inbox = Arc::default();
    let i = inbox.clone();
    node.iface
        .set_am_handler(id, AmCbFlags::SYNC, move |m| {
            i.lock().unwrap().push(m.data().to_vec())
        })
        .expect("set_am_handler");
    inbox
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Waits (helper thread) until `inbox` holds `n` messages.
fn wait_count(inbox: &Inbox, n: usize, what: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let have = inbox.lock().unwrap().len();
        if have >= n {
            return Ok(());
        }
        if start.elapsed() > STEP {
            return Err(format!("{what}: {have} of {n} messages delivered after {STEP:?}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Sends `f` in two writes split at `at`, letting the interface progress in between.
fn send_split(c: &mut RawConn, f: &[u8], at: usize, ticks: &Ticks) -> Result<(), String> {
    c.send(&f[..at]).map_err(io("write"))?;
    ticks.wait_rounds(20);
    std::thread::sleep(Duration::from_millis(1));
    c.send(&f[at..]).map_err(io("write"))
}

#[test]
fn split_frames_arrive_once_intact_and_in_order() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "split_frames_arrive_once_intact_and_in_order",
        Duration::from_secs(300),
    );
    let node = Node::open(&ctx);
    let inbox = collect(&node, AM_ID);
    let (port, ib) = (node.port, inbox.clone());
    let sent = drive(
        &[&node.worker],
        Duration::from_secs(240),
        move |ticks| -> Result<Vec<Vec<u8>>, String> {
            let mut sent: Vec<Vec<u8>> = Vec::new();
            let mut rng = Rng::new(11);
            // The handshake itself one byte per write.
            let t = ticks.clone();
            let mut c = RawConn::open_with(port, 0x51, move |s: &mut TcpStream, b: &[u8]| {
                for x in b {
                    s.write_all(&[*x])?;
                    t.wait_rounds(3);
                }
                Ok(())
            })?;
            let maxp = c.ack_max_payload as usize;
            // One small frame split at every boundary (inside the header and the payload).
            let msg = rng.bytes(40);
            let f = frame(AM_ID, &msg);
            for at in 1..f.len() {
                send_split(&mut c, &f, at, &ticks)?;
                sent.push(msg.clone());
                wait_count(&ib, sent.len(), &format!("frame split at byte {at}"))?;
            }
            // A large frame split around the header/payload border and in the middle.
            let big = rng.bytes(maxp.min(60_000));
            let f = frame(AM_ID, &big);
            for at in [1, 3, 4, 5, 7, 8, 9, f.len() / 2, f.len() - 1] {
                send_split(&mut c, &f, at, &ticks)?;
                sent.push(big.clone());
                wait_count(&ib, sent.len(), &format!("large frame split at byte {at}"))?;
            }
            // Many frames back to back, cut into random chunks regardless of frame borders.
            let mut stream = Vec::new();
            for _ in 0..400 {
                let len = rng.range(0, maxp.min(3000));
                let m = rng.bytes(len);
                stream.extend_from_slice(&frame(AM_ID, &m));
                sent.push(m);
            }
            let mut off = 0;
            while off < stream.len() {
                let n = rng.range(1, 700).min(stream.len() - off);
                c.send(&stream[off..off + n]).map_err(io("write"))?;
                off += n;
                if rng.next_u64().is_multiple_of(4) {
                    ticks.wait_rounds(1);
                }
            }
            wait_count(&ib, sent.len(), "randomly chunked frames")?;
            // Frames one byte per write.
            for _ in 0..15 {
                let m = rng.bytes_between(0, 60);
                for b in frame(AM_ID, &m) {
                    c.send(&[b]).map_err(io("write"))?;
                    ticks.wait_rounds(1);
                }
                sent.push(m);
            }
            wait_count(&ib, sent.len(), "frames written one byte at a time")?;
            Ok(sent)
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Give duplicates a chance to show up.
    progress_for(&[&node.worker], Duration::from_millis(300));
    let got = inbox.lock().unwrap().clone();
    assert_eq!(
        got.len(),
        sent.len(),
        "number of messages delivered (each sent once)"
    );
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert!(
            g == s,
            "message {i}: delivered {} bytes differ from the {} sent",
            g.len(),
            s.len()
        );
    }
    assert!(
        node.errors.borrow().is_empty(),
        "error handler fired: {:?}",
        node.errors.borrow()
    );
}

/// Ways to abuse an interface's listening port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Junk {
    Random,
    CloseAtOnce,
    HalfMagicThenQuit,
    /// Connects and says nothing: dropped by the handshake timeout.
    Silent,
    /// Half a handshake, then silence: dropped by the handshake timeout.
    HalfMagicThenSilent,
    MagicThenGarbage,
    Http,
    BadFamily,
    HandshakeThenUnknownType,
    HandshakeThenHugeLength,
    HandshakeThenReservedBits,
    HandshakeThenRandom,
}

const JUNK: [Junk; 12] = [
    Junk::Silent,
    Junk::HalfMagicThenSilent,
    Junk::Random,
    Junk::CloseAtOnce,
    Junk::HalfMagicThenQuit,
    Junk::MagicThenGarbage,
    Junk::Http,
    Junk::BadFamily,
    Junk::HandshakeThenUnknownType,
    Junk::HandshakeThenHugeLength,
    Junk::HandshakeThenReservedBits,
    Junk::HandshakeThenRandom,
];

/// Opens one junk connection and sends its junk; returns the socket if the interface must close
/// it.
fn junk_connection(port: u16, kind: Junk, rng: &mut Rng, i: u64) -> Result<Option<TcpStream>, String> {
    let mut s = connect(port).map_err(io("connect"))?;
    // Writes may fail once the interface dropped us: that is the point.
    let w = |s: &mut TcpStream, b: &[u8]| {
        let _ = s.write_all(b);
    };
    match kind {
        Junk::CloseAtOnce => return Ok(None),
        Junk::HalfMagicThenQuit => {
            w(&mut s, &MAGIC[..5]);
            return Ok(None);
        }
        Junk::Silent => {}
        Junk::HalfMagicThenSilent => w(&mut s, &MAGIC[..5]),
        Junk::Random => {
            let mut b = rng.bytes_between(1, 4096);
            b[0] = b'A' + (b[0] % 16); // never the magic's first byte 'R'
            w(&mut s, &b);
        }
        Junk::MagicThenGarbage => {
            let mut b = MAGIC.to_vec();
            let mut rest = rng.bytes_between(8, 2000);
            rest[4] = 200 + rest[4] % 50; // handshake kind: invalid
            b.extend_from_slice(&rest);
            w(&mut s, &b);
        }
        Junk::Http => w(&mut s, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        Junk::BadFamily => {
            let mut r = ConnReq::to_iface(i, 1, 4096).encode();
            r[PREAMBLE_LEN + 42] = 9;
            w(&mut s, &r);
        }
        Junk::HandshakeThenUnknownType
        | Junk::HandshakeThenHugeLength
        | Junk::HandshakeThenReservedBits
        | Junk::HandshakeThenRandom => {
            drop(s);
            let mut c =
                RawConn::open(port, 0x1000 + i).map_err(|e| format!("valid handshake refused: {e}"))?;
            let bytes = match kind {
                Junk::HandshakeThenUnknownType => frame(200, b"junk"),
                Junk::HandshakeThenHugeLength => header(AM_ID, 0xFFFF_FFF0).to_vec(),
                Junk::HandshakeThenReservedBits => {
                    let mut f = frame(AM_ID, b"x");
                    f[2] = 0x80;
                    f
                }
                _ => {
                    let mut b = rng.bytes_between(8, 3000);
                    b[0] = 40 + b[0] % 200; // no valid frame type
                    b
                }
            };
            w(&mut c.stream, &bytes);
            return Ok(Some(c.stream));
        }
    }
    Ok(Some(s))
}

#[test]
fn junk_connections_are_dropped_and_legit_traffic_is_unaffected() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "junk_connections_are_dropped_and_legit_traffic_is_unaffected",
        Duration::from_secs(300),
    );
    let target = Node::open(&ctx);
    let legit = Node::open(&ctx);
    let checker = Arc::new(Mutex::new(Checker::new(None)));
    let c2 = checker.clone();
    target
        .iface
        .set_am_handler(1, AmCbFlags::SYNC, move |m| {
            c2.lock().unwrap().check(m.data());
        })
        .unwrap();
    let mut sender = StampedSender::new(&legit.iface, legit.connect(&target), 1, 1, None).unwrap();
    let legit_key = sender.ep.key();
    const N: u32 = 2000;
    let port = target.port;
    let mut send_err = None;
    let failures = drive_with(
        &[&target.worker, &legit.worker],
        Duration::from_secs(200),
        move |_ticks| -> Vec<String> {
            let mut rng = Rng::new(99);
            let mut failures = Vec::new();
            let mut open = Vec::new();
            for i in 0..50u64 {
                let kind = JUNK[i as usize % JUNK.len()];
                match junk_connection(port, kind, &mut rng, i) {
                    Ok(Some(s)) => open.push((i, kind, s)),
                    Ok(None) => {}
                    Err(e) => failures.push(format!("junk connection {i} ({kind:?}): {e}")),
                }
            }
            for (i, kind, mut s) in open {
                if let Err(e) = wait_closed(&mut s, STEP) {
                    failures.push(format!(
                        "junk connection {i} ({kind:?}) not closed by the interface: {e:?}"
                    ));
                }
            }
            failures
        },
        || {
            for _ in 0..4 {
                if sender.seq >= N || send_err.is_some() {
                    break;
                }
                match sender.try_send_next() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => send_err = Some(e),
                }
            }
        },
    );
    assert!(
        failures.is_empty(),
        "{} junk connection problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(send_err, None, "legit sender got an error");
    // Finish the legit stream.
    wait_for(
        &[&target.worker, &legit.worker],
        Duration::from_secs(60),
        "the legit stream",
        || {
            while sender.seq < N {
                match sender.try_send_next() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => panic!("legit sender: {e:?} at message {}", sender.seq),
                }
            }
            checker.lock().unwrap().count(1) >= N
        },
    );
    progress_for(&[&target.worker, &legit.worker], Duration::from_millis(200));
    {
        let c = checker.lock().unwrap();
        assert_eq!(c.bad, 0, "legit stream damaged: {:?}", c.problems);
        assert_eq!(c.total, N as u64, "legit messages delivered");
    }
    assert!(
        legit.errors_for(legit_key).is_empty(),
        "legit ep failed: {:?}",
        legit.errors.borrow()
    );
    // The interface still takes new peers.
    let late = Node::open(&ctx);
    let mut s2 = StampedSender::new(&late.iface, late.connect(&target), 1, 2, Some(100)).unwrap();
    wait_for(
        &[&target.worker, &late.worker],
        STEP,
        "a new peer after the junk",
        || {
            while s2.seq < 50 && s2.try_send_next().expect("send") {}
            checker.lock().unwrap().count(2) >= 50
        },
    );
    eprintln!(
        "target's error handler saw {:?} (internal endpoints of junk connections)",
        target.errors.borrow()
    );
}

/// Sends a forged request and expects it refused: an error reply with `seq`, or the connection
/// dropped (then `conn` is cleared and the next step reconnects). Returns how it was refused.
fn expect_refused(
    conn: &mut Option<RawConn>,
    port: u16,
    what: &str,
    req: &[u8],
    bulk: &[u8],
    seq: u32,
) -> Result<String, String> {
    if conn.is_none() {
        *conn = Some(RawConn::open(port, 0x2000 + seq as u64)?);
    }
    let c = conn.as_mut().unwrap();
    c.send(req).map_err(io(what))?;
    if !bulk.is_empty() {
        let _ = c.send(bulk);
    }
    match c.recv_frame(STEP) {
        Ok(RxFrame::PutAck { seq: s, status }) | Ok(RxFrame::AtomicRep { seq: s, status, .. })
            if s == seq =>
        {
            if status < 0 {
                Ok(format!("{what}: error reply (status {status})"))
            } else {
                Err(format!("{what}: accepted (reply status {status})"))
            }
        }
        Ok(RxFrame::GetRep { seq: s, status, data }) if s == seq => {
            if status < 0 && data.is_empty() {
                Ok(format!("{what}: error reply (status {status})"))
            } else {
                Err(format!(
                    "{what}: served (status {status}, {} bytes returned)",
                    data.len()
                ))
            }
        }
        Ok(f) => Err(format!("{what}: unexpected reply {f:?}")),
        Err(RxEnd::Closed(how)) => {
            *conn = None;
            Ok(format!("{what}: connection dropped ({how})"))
        }
        Err(e) => Err(format!(
            "{what}: neither an error reply nor a dropped connection: {e:?}"
        )),
    }
}

#[test]
fn forged_rma_outside_registered_memory_is_refused() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "forged_rma_outside_registered_memory_is_refused",
        Duration::from_secs(300),
    );
    let node = Node::open(&ctx);
    let md = node.iface.md().clone();
    const LEN: usize = 4096;
    let m1 = Mem::alloc(&md, LEN, MemAccess::ALL).expect("register m1");
    let m2 = Mem::alloc(&md, LEN, MemAccess::ALL).expect("register m2");
    let ro = Mem::alloc(
        &md,
        256,
        MemAccess::REMOTE_GET | MemAccess::LOCAL_READ | MemAccess::LOCAL_WRITE,
    )
    .ok();
    m1.fill(0x11);
    m2.fill(0x22);
    if let Some(r) = &ro {
        r.fill(0x33);
    }
    // The wire rkey is the key a packed rkey starts with (uct_transport::rma::RegionTable layout).
    let key = |m: &Mem| {
        let p = m.pack_rkey().expect("pack rkey");
        uct_transport::rma::RegionTable::unpack(&p).expect("packed rkey holds a key")
    };
    let (a1, k1, a2) = (m1.addr(), key(&m1), m2.addr());
    let ro_ak = ro.as_ref().map(|r| (r.addr(), key(r)));
    let port = node.port;
    let notes = drive(&[&node.worker], Duration::from_secs(240), move |_| -> Result<Vec<String>, String> {
        let mut notes = Vec::new();
        let mut conn = Some(RawConn::open(port, 0x77)?);
        // Positive control: a valid put and a valid get work (so refusals below are real).
        let c = conn.as_mut().unwrap();
        c.send(&put_req(a1 + 16, k1, 8, 1, PUT_FLAG_ACK_REQ)).map_err(io("put"))?;
        c.send(&[0xAB; 8]).map_err(io("put data"))?;
        match c.recv_frame(STEP) {
            Ok(RxFrame::PutAck { seq: 1, status: 0 }) => {}
            r => return Err(format!("positive control: a valid put (rkey from the first 8 bytes of the packed rkey) got {r:?}")),
        }
        let bad_key = k1 ^ 0x5A5A_0000_0000_0001;
        let d8 = [0xEE; 8];
        let cases: Vec<(&str, Vec<u8>, Vec<u8>, u32)> = vec![
            ("put straddling the end", put_req(a1 + LEN as u64 - 4, k1, 8, 10, PUT_FLAG_ACK_REQ), d8.to_vec(), 10),
            ("put just past the end", put_req(a1 + LEN as u64, k1, 8, 11, PUT_FLAG_ACK_REQ), d8.to_vec(), 11),
            ("put before the start", put_req(a1 - 8, k1, 8, 12, PUT_FLAG_ACK_REQ), d8.to_vec(), 12),
            ("put with address overflow", put_req(u64::MAX - 3, k1, 8, 13, PUT_FLAG_ACK_REQ), d8.to_vec(), 13),
            ("put to another region with m1's key", put_req(a2, k1, 8, 14, PUT_FLAG_ACK_REQ), d8.to_vec(), 14),
            ("put with an unknown rkey", put_req(a1, bad_key, 8, 15, PUT_FLAG_ACK_REQ), d8.to_vec(), 15),
            ("put longer than the region", put_req(a1, k1, 2 * LEN as u64, 16, PUT_FLAG_ACK_REQ), vec![0xEE; 2 * LEN], 16),
            ("failed put without ACK_REQ", put_req(a1 + LEN as u64, k1, 8, 17, 0), d8.to_vec(), 17),
            ("get straddling the end", get_req(a1 + LEN as u64 - 6, k1, 16, 20), vec![], 20),
            ("get with an unknown rkey", get_req(a1, bad_key, 8, 21), vec![], 21),
            ("get from another region with m1's key", get_req(a2, k1, 8, 22), vec![], 22),
            ("atomic add past the end", atomic_req(a1 + LEN as u64, k1, 1, 0, 30, 0, 8, ATOMIC_FLAG_FETCH), vec![], 30),
            ("misaligned atomic add", atomic_req(a1 + 3, k1, 1, 0, 31, 0, 8, ATOMIC_FLAG_FETCH), vec![], 31),
            ("atomic swap with an unknown rkey", atomic_req(a1, bad_key, 1, 0, 32, 4, 8, ATOMIC_FLAG_FETCH), vec![], 32),
        ];
        let mut failures = Vec::new();
        for (what, req, bulk, seq) in &cases {
            match expect_refused(&mut conn, port, what, req, bulk, *seq) {
                Ok(n) => notes.push(n),
                Err(e) => failures.push(e),
            }
        }
        if let Some((ra, rk)) = ro_ak {
            match expect_refused(&mut conn, port, "put to get-only memory", &put_req(ra, rk, 8, 40, PUT_FLAG_ACK_REQ), &d8, 40) {
                Ok(n) => notes.push(n),
                Err(e) => failures.push(e),
            }
        }
        // The connection (or a new one) still serves valid requests: read back the control put.
        if conn.is_none() {
            conn = Some(RawConn::open(port, 0x78)?);
        }
        let c = conn.as_mut().unwrap();
        c.send(&get_req(a1 + 16, k1, 8, 50)).map_err(io("get"))?;
        match c.recv_frame(STEP) {
            Ok(RxFrame::GetRep { seq: 50, status: 0, data }) if data == [0xAB; 8] => {}
            r => failures.push(format!("valid get after the refusals got {r:?}")),
        }
        if failures.is_empty() {
            Ok(notes)
        } else {
            Err(failures.join("\n"))
        }
    })
    .unwrap_or_else(|e| panic!("forged RMA requests:\n{e}"));
    for n in &notes {
        eprintln!("{n}");
    }
    let mut want1 = vec![0x11u8; LEN];
    want1[16..24].fill(0xAB);
    let got1 = m1.to_vec();
    if let Some(i) = got1.iter().zip(&want1).position(|(a, b)| a != b) {
        panic!(
            "m1 changed at byte {i}: {:#04x} (expected {:#04x})",
            got1[i], want1[i]
        );
    }
    assert!(
        m2.to_vec().iter().all(|&b| b == 0x22),
        "m2 changed by a put carrying m1's key"
    );
    if let Some(r) = &ro {
        assert!(
            r.to_vec().iter().all(|&b| b == 0x33),
            "get-only memory was written"
        );
    }
}

#[test]
fn split_rma_requests_and_bulk_data_land_intact() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "split_rma_requests_and_bulk_data_land_intact",
        Duration::from_secs(300),
    );
    let node = Node::open(&ctx);
    let inbox = collect(&node, AM_ID);
    const LEN: usize = 65536;
    let mem = Mem::alloc(node.iface.md(), LEN, MemAccess::ALL).expect("register");
    let key = uct_transport::rma::RegionTable::unpack(&mem.pack_rkey().unwrap()).unwrap();
    let (port, base, ib) = (node.port, mem.addr(), inbox.clone());
    // The image the target memory must end up with, built by the helper thread.
    let image = drive(
        &[&node.worker],
        Duration::from_secs(240),
        move |ticks| -> Result<Vec<u8>, String> {
            let mut image = vec![0u8; LEN];
            let mut rng = Rng::new(5);
            let mut c = RawConn::open(port, 0x99)?;
            let expect_ack = |c: &mut RawConn, seq: u32, what: &str| match c.recv_frame(STEP) {
                Ok(RxFrame::PutAck { seq: s, status: 0 }) if s == seq => Ok(()),
                r => Err(format!("{what}: expected PUT_ACK {seq} OK, got {r:?}")),
            };
            // One put (request + 8 bulk bytes) split at every byte boundary.
            for at in 1..48usize {
                let data = rng.bytes(8);
                let off = 8 * at;
                let mut f = put_req(base + off as u64, key, 8, at as u32, PUT_FLAG_ACK_REQ);
                f.extend_from_slice(&data);
                send_split(&mut c, &f, at, &ticks)?;
                expect_ack(&mut c, at as u32, &format!("put split at byte {at}"))?;
                image[off..off + 8].copy_from_slice(&data);
            }
            // Puts with bulk data and AMs interleaved, the whole stream cut into random chunks.
            let mut stream = Vec::new();
            let mut markers = Vec::new();
            for k in 0..30u32 {
                let off = 1024 + k as usize * 2000;
                let len = rng.range(1, 2000);
                let data = rng.bytes(len);
                stream.extend_from_slice(&put_req(
                    base + off as u64,
                    key,
                    len as u64,
                    100 + k,
                    PUT_FLAG_ACK_REQ,
                ));
                stream.extend_from_slice(&data);
                image[off..off + len].copy_from_slice(&data);
                let m = k.to_le_bytes().to_vec();
                stream.extend_from_slice(&frame(AM_ID, &m));
                markers.push(m);
            }
            let mut off = 0;
            while off < stream.len() {
                let n = rng.range(1, 300).min(stream.len() - off);
                c.send(&stream[off..off + n]).map_err(io("write"))?;
                off += n;
                if rng.next_u64().is_multiple_of(3) {
                    ticks.wait_rounds(1);
                }
            }
            for k in 0..30u32 {
                expect_ack(&mut c, 100 + k, &format!("chunked put {k}"))?;
            }
            wait_count(&ib, markers.len(), "AMs between the puts")?;
            if *ib.lock().unwrap() != markers {
                return Err(format!(
                    "AMs between the puts arrived as {:?}",
                    ib.lock().unwrap()
                ));
            }
            // A put whose bulk data comes one byte per write.
            let data = rng.bytes(100);
            c.send(&put_req(base + 62_000, key, 100, 200, PUT_FLAG_ACK_REQ))
                .map_err(io("write"))?;
            for b in &data {
                c.send(&[*b]).map_err(io("write"))?;
                ticks.wait_rounds(1);
            }
            expect_ack(&mut c, 200, "put with bulk data written byte by byte")?;
            image[62_000..62_100].copy_from_slice(&data);
            // Read everything back with one large get.
            c.send(&get_req(base, key, LEN as u64, 300))
                .map_err(io("write"))?;
            match c.recv_frame(STEP) {
                Ok(RxFrame::GetRep {
                    seq: 300,
                    status: 0,
                    data,
                }) if data == image => Ok(image),
                Ok(RxFrame::GetRep {
                    seq: 300,
                    status: 0,
                    data,
                }) => Err(format!(
                    "get of the whole region returned {} bytes differing from what was put (first at {:?})",
                    data.len(),
                    data.iter().zip(&image).position(|(a, b)| a != b)
                )),
                r => Err(format!("get of the whole region: {r:?}")),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let got = mem.to_vec();
    if let Some(i) = got.iter().zip(&image).position(|(a, b)| a != b) {
        panic!(
            "target memory differs at byte {i}: {:#04x}, expected {:#04x}",
            got[i], image[i]
        );
    }
    assert!(
        node.errors.borrow().is_empty(),
        "error handler fired: {:?}",
        node.errors.borrow()
    );
}

#[test]
fn spoofed_handshake_does_not_disturb_the_peer_it_names() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "spoofed_handshake_does_not_disturb_the_peer_it_names",
        Duration::from_secs(300),
    );
    let a = Node::open(&ctx);
    let b = Node::open(&ctx);
    let (ca, cb) = (
        Arc::new(Mutex::new(Checker::new(None))),
        Arc::new(Mutex::new(Checker::new(None))),
    );
    for (n, c) in [(&a, &ca), (&b, &cb)] {
        let c = c.clone();
        n.iface
            .set_am_handler(1, AmCbFlags::SYNC, move |m| {
                c.lock().unwrap().check(m.data());
            })
            .unwrap();
    }
    // Legit traffic both ways between a and b (one connection once settled).
    let mut sab = StampedSender::new(&a.iface, a.connect(&b), 1, 1, Some(2000)).unwrap();
    let mut sba = StampedSender::new(&b.iface, b.connect(&a), 1, 2, Some(2000)).unwrap();
    let (kab, kba) = (sab.ep.key(), sba.ep.key());
    let w = [&a.worker, &b.worker];
    wait_for(&w, STEP, "the legit streams to start", || {
        for s in [&mut sab, &mut sba] {
            if s.seq < 100 {
                s.try_send_next().expect("legit send");
            }
        }
        cb.lock().unwrap().count(1) >= 100 && ca.lock().unwrap().count(2) >= 100
    });
    // Raw connections to a that claim to be b (b's listening address in CONN_REQ), in both
    // connection modes, then misbehave.
    let (port, b_port) = (a.port, b.port);
    const N: u32 = 1500;
    let mut send_err = None;
    let outcome = drive_with(
        &w,
        Duration::from_secs(200),
        move |ticks| -> Vec<String> {
            let mut notes = Vec::new();
            // Quiet impostors: a valid CONN_REQ naming b, then nothing. a must not route its
            // traffic for b into them.
            let mut quiet = Vec::new();
            for i in 0..2u64 {
                let Ok(mut s) = connect(port) else {
                    notes.push(format!("quiet spoof {i}: connect failed"));
                    continue;
                };
                let _ = s.write_all(&ConnReq::to_iface(0x6000 + i, b_port, 1 << 20).encode());
                let mut pre = [0u8; 16];
                let deadline = Instant::now() + STEP;
                let reply = read_full(&mut s, &mut pre, deadline).and_then(|_| {
                    let mut body = vec![0u8; u16::from_le_bytes([pre[14], pre[15]]).min(1024) as usize];
                    read_full(&mut s, &mut body, deadline).map(|_| parse_hs_reply(&pre, &body))
                });
                notes.push(format!("quiet spoof {i}: handshake reply {reply:?}"));
                quiet.push(s);
            }
            for (i, mode) in [0u8, 1, 0, 1].into_iter().enumerate() {
                let Ok(mut s) = connect(port) else {
                    notes.push(format!("spoof {i}: connect failed"));
                    continue;
                };
                let mut req = ConnReq::to_iface(0x5000 + i as u64, b_port, 1 << 20);
                req.mode = mode;
                if mode == 1 {
                    req.dst_ep_key = 0xdead_beef_0000_0000 | i as u64;
                }
                let mut bytes = req.encode();
                bytes.extend_from_slice(&frame(200, b"hijack"));
                let _ = s.write_all(&bytes);
                let r = wait_closed(&mut s, STEP);
                notes.push(format!("spoof {i} (mode {mode}): {r:?}"));
            }
            // Let the legit streams run past the impostors, then see what they were sent.
            ticks.wait_rounds(2000);
            for (i, s) in quiet.iter_mut().enumerate() {
                let mut buf = [0u8; 65536];
                let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
                match std::io::Read::read(s, &mut buf) {
                    Ok(n) if n > 0 => {
                        notes.push(format!("HIJACK: quiet spoof {i} received {n} bytes meant for b"))
                    }
                    r => notes.push(format!("quiet spoof {i}: nothing received ({r:?})")),
                }
            }
            notes
        },
        || {
            for s in [&mut sab, &mut sba] {
                if s.seq < N && send_err.is_none() {
                    if let Err(e) = s.try_send_next() {
                        send_err = Some(e);
                    }
                }
            }
        },
    );
    for n in &outcome {
        eprintln!("{n}");
    }
    assert_eq!(
        send_err, None,
        "a legit sender failed while spoofed connections came and went"
    );
    wait_for(&w, Duration::from_secs(60), "the legit streams to finish", || {
        for s in [&mut sab, &mut sba] {
            while s.seq < N && s.try_send_next().expect("legit send") {}
        }
        cb.lock().unwrap().count(1) >= N && ca.lock().unwrap().count(2) >= N
    });
    progress_for(&w, Duration::from_millis(200));
    for (who, c) in [("a->b", &cb), ("b->a", &ca)] {
        let c = c.lock().unwrap();
        assert_eq!(c.bad, 0, "{who}: {:?}", c.problems);
        assert_eq!(c.total, N as u64, "{who}: messages delivered");
    }
    assert!(
        a.errors_for(kab).is_empty(),
        "a's endpoint to b failed: {:?}",
        a.errors.borrow()
    );
    assert!(
        b.errors_for(kba).is_empty(),
        "b's endpoint to a failed: {:?}",
        b.errors.borrow()
    );
    for n in &outcome {
        assert!(!n.contains("HIJACK"), "{n}");
        assert!(
            !(n.starts_with("spoof") && n.contains("Timeout")),
            "spoofed connection never dropped: {n}"
        );
    }
}

#[test]
fn endpoint_created_after_a_spoofed_handshake_reaches_the_real_peer() {
    let ctx = ctx();
    let _wd = Watchdog::new(
        "endpoint_created_after_a_spoofed_handshake_reaches_the_real_peer",
        Duration::from_secs(300),
    );
    let a = Node::open(&ctx);
    let b = Node::open(&ctx);
    let cb = Arc::new(Mutex::new(Checker::new(None)));
    let c2 = cb.clone();
    b.iface
        .set_am_handler(1, AmCbFlags::SYNC, move |m| {
            c2.lock().unwrap().check(m.data());
        })
        .unwrap();
    // An impostor completes a handshake with a, claiming b's listening address, before a has
    // any endpoint to b.
    let (port, b_port) = (a.port, b.port);
    let spoof = drive(&[&a.worker], STEP * 2, move |_| -> Result<TcpStream, String> {
        let mut s = connect(port).map_err(io("connect"))?;
        s.write_all(&ConnReq::to_iface(0x7000, b_port, 1 << 20).encode())
            .map_err(io("write"))?;
        let mut pre = [0u8; 16];
        let deadline = Instant::now() + STEP;
        read_full(&mut s, &mut pre, deadline).map_err(|e| format!("{e:?}"))?;
        let mut body = vec![0u8; u16::from_le_bytes([pre[14], pre[15]]).min(1024) as usize];
        read_full(&mut s, &mut body, deadline).map_err(|e| format!("{e:?}"))?;
        eprintln!("impostor's handshake: {:?}", parse_hs_reply(&pre, &body));
        Ok(s)
    });
    let mut spoof = match spoof {
        Ok(s) => s,
        Err(e) => {
            eprintln!("the impostor was refused at once ({e}): nothing to hijack");
            return;
        }
    };
    // Now a connects to b: its messages must reach b, not the impostor.
    let mut s = StampedSender::new(&a.iface, a.connect(&b), 1, 1, Some(1000)).unwrap();
    let key = s.ep.key();
    const N: u32 = 200;
    wait_for(&[&a.worker, &b.worker], STEP, "a's messages to reach b", || {
        while s.seq < N && s.try_send_next().expect("send to b") {}
        cb.lock().unwrap().count(1) >= N
    });
    let _ = spoof.set_nonblocking(true);
    let mut buf = [0u8; 65536];
    let got = std::io::Read::read(&mut spoof, &mut buf);
    assert!(
        !matches!(got, Ok(n) if n > 0),
        "the impostor claiming b's address received {:?} bytes of a's traffic for b",
        got
    );
    {
        let c = cb.lock().unwrap();
        assert_eq!((c.bad, c.total), (0, N as u64), "b's inbox: {:?}", c.problems);
    }
    // And the real b, connecting to a while the impostor still holds its name, gets through.
    let ca = Arc::new(Mutex::new(Checker::new(None)));
    let c3 = ca.clone();
    a.iface
        .set_am_handler(1, AmCbFlags::SYNC, move |m| {
            c3.lock().unwrap().check(m.data());
        })
        .unwrap();
    let mut sb = StampedSender::new(&b.iface, b.connect(&a), 1, 2, Some(1000)).unwrap();
    let kb = sb.ep.key();
    wait_for(&[&a.worker, &b.worker], STEP, "b's messages to reach a", || {
        while sb.seq < N && sb.try_send_next().expect("send to a") {}
        while s.seq < 2 * N && s.try_send_next().expect("send to b") {}
        ca.lock().unwrap().count(2) >= N && cb.lock().unwrap().count(1) >= 2 * N
    });
    let got = std::io::Read::read(&mut spoof, &mut buf);
    assert!(
        !matches!(got, Ok(n) if n > 0),
        "the impostor claiming b's address received {:?} bytes once b connected",
        got
    );
    assert_eq!(ca.lock().unwrap().bad, 0, "{:?}", ca.lock().unwrap().problems);
    assert!(
        a.errors_for(key).is_empty(),
        "a's endpoint to b failed: {:?}",
        a.errors.borrow()
    );
    assert!(
        b.errors_for(kb).is_empty(),
        "b's endpoint to a failed: {:?}",
        b.errors.borrow()
    );
}
