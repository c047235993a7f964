//! Active messages (UCX `test_p2p_am`): every flavor over its whole size range, data checked
//! byte for byte, header checked, order kept per endpoint.

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::data::{assert_bytes, pattern, scatter, sizes, split};
use rucx_testkit::{am, pair, Pair, Recorder, Setup};
use uct::{Completion, Ep, IfaceFlags, MemIov, Status};

const ID: u8 = 7;

/// am_short over every payload size 0..=max_short-8 (exhaustive for small sizes), header and
/// payload checked.
fn am_short_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.supports(IfaceFlags::AM_SHORT, "am_short") {
        assert_eq!(
            ep.am_short(ID, 0, &[]),
            Err(Status::Unsupported.into()),
            "[{n}] am_short"
        );
        return;
    }
    let max_short = p.attr().am.max_short;
    assert!(
        max_short >= 8,
        "[{n}] am.max_short {max_short} does not even hold the 8-byte header"
    );
    type Got = Rc<RefCell<Vec<(u64, Vec<u8>)>>>;
    let got: Got = Rc::default();
    let g = got.clone();
    p.rx.iface
        .set_am_handler(ID, p.am_flags(), move |m| {
            g.borrow_mut().push((m.header(), m.data().to_vec()))
        })
        .unwrap();
    for (i, len) in sizes(0, max_short - 8, 256).into_iter().enumerate() {
        let data = pattern(len, i as u64);
        let hdr = 0xA5A5_0000_0000_0000 | ((i as u64) << 24) | len as u64;
        p.retry("am_short", || ep.am_short(ID, hdr, &data))
            .unwrap_or_else(|e| panic!("[{n}] am_short with {len} payload bytes: {e}"));
        p.wait_for("am_short delivery", || got.borrow().len() > i);
        let got = got.borrow();
        let (h, msg) = &got[i];
        assert_eq!(got.len(), i + 1, "[{n}] one am_short delivered more than once");
        assert_eq!(*h, hdr, "[{n}] am_short header ({len} bytes)");
        assert_eq!(msg.len(), 8 + len, "[{n}] am_short length ({len} payload bytes)");
        assert_eq!(
            msg[..8],
            hdr.to_le_bytes(),
            "[{n}] am_short header bytes are not little-endian"
        );
        assert_bytes(
            &format!("[{n}] am_short payload of {len} bytes"),
            &msg[8..],
            &data,
        );
    }
}

/// am_short_iov: the receiver gets the concatenation of the parts, up to max_short in total,
/// with 1..max_iov parts.
fn am_short_iov_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.supports(IfaceFlags::AM_SHORT, "am_short_iov") {
        assert_eq!(
            ep.am_short_iov(ID, &[b"x"]),
            Err(Status::Unsupported.into()),
            "[{n}] am_short_iov"
        );
        return;
    }
    let a = p.attr().am;
    let max_iov = a.max_iov.clamp(1, uct::MAX_IOV);
    let rec = p.record_am(ID);
    let mut sent = 0;
    for len in sizes(0, a.max_short, 64) {
        for k in [1, 2, 3, max_iov] {
            let k = k.min(max_iov).min(len.max(1));
            let data = pattern(len, sent as u64);
            let mut parts = Vec::new();
            let mut off = 0;
            for l in split(len, k) {
                parts.push(&data[off..off + l]);
                off += l;
            }
            p.retry("am_short_iov", || ep.am_short_iov(ID, &parts))
                .unwrap_or_else(|e| panic!("[{n}] am_short_iov of {len} bytes in {k} parts: {e}"));
            sent += 1;
            p.wait_msgs(&rec, sent, "am_short_iov");
            assert_bytes(
                &format!("[{n}] am_short_iov {len} bytes in {k} parts"),
                &rec.borrow()[sent - 1],
                &data,
            );
        }
    }
}

/// am_bcopy over sizes up to max_bcopy: the pack callback sees at least max_bcopy bytes, the
/// call returns the packed length, the receiver gets exactly the packed bytes.
fn am_bcopy_sizes(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.supports(IfaceFlags::AM_BCOPY, "am_bcopy") {
        assert_eq!(
            ep.am_bcopy(ID, |_| 0),
            Err(Status::Unsupported.into()),
            "[{n}] am_bcopy"
        );
        return;
    }
    let max = p.attr().am.max_bcopy;
    let rec = p.record_am(ID);
    for (i, len) in sizes(0, max, 128).into_iter().enumerate() {
        let data = pattern(len, i as u64);
        let r = p.retry("am_bcopy", || {
            ep.am_bcopy(ID, |buf| {
                assert!(
                    buf.len() >= len,
                    "[{n}] am_bcopy buffer of {} bytes < max_bcopy {max}",
                    buf.len()
                );
                buf[..len].copy_from_slice(&data);
                len
            })
        });
        assert_eq!(r, Ok(len), "[{n}] am_bcopy of {len} bytes");
        p.wait_msgs(&rec, i + 1, "am_bcopy");
        assert_bytes(&format!("[{n}] am_bcopy of {len} bytes"), &rec.borrow()[i], &data);
    }
}

/// Sends one am_zcopy with a `hdr_len`-byte header and `len` payload bytes in `k` scattered iov
/// entries; checks completion and the received bytes. The header buffer is overwritten as soon
/// as the call returns (the transport must have copied it).
fn zcopy_once(p: &Pair, rec: &Recorder, seq: usize, hdr_len: usize, len: usize, k: usize) {
    let (ep, n) = (p.ep(), p.name());
    let hdr = pattern(hdr_len, 1_000_000 + seq as u64);
    let data = pattern(len, seq as u64);
    let lens = split(len, k);
    let (offs, size) = scatter(&lens);
    let mem = p.local_mem(size, 0xEE);
    let mut iov: Vec<MemIov> = Vec::new();
    let mut off = 0;
    for (o, l) in offs.iter().zip(&lens) {
        mem.write(*o, &data[off..off + l]).unwrap();
        iov.push(mem.iov(*o, *l).unwrap());
        off += l;
    }
    let what = format!("am_zcopy hdr {hdr_len} + {len} bytes in {k} entries");
    let comp = Completion::counter();
    let mut hb = hdr.clone();
    let r = p.retry(&what, || ep.am_zcopy(ID, &hb, &iov, Some(&comp)));
    hb.fill(0x11);
    p.check_completion(&what, &comp, r);
    p.wait_msgs(rec, seq + 1, "am_zcopy");
    let mut want = hdr;
    want.extend_from_slice(&data);
    assert_bytes(&format!("[{n}] {what}"), &rec.borrow()[seq], &want);
}

/// am_zcopy: header sizes up to max_hdr, 1..max_iov entries, payloads up to max_zcopy. The header
/// counts towards max_zcopy, as in UCX (rc checks header + payload against its segment size, and
/// UCX's own `am_zcopy` gtest splits one max_zcopy buffer into header and payload).
fn am_zcopy_layouts(s: &Setup) {
    let p = s.pair();
    let (ep, n) = (p.ep(), p.name());
    if !p.supports(IfaceFlags::AM_ZCOPY, "am_zcopy") {
        let m = p.local_mem(8, 0);
        assert_eq!(
            ep.am_zcopy(ID, &[], &[m.whole()], None),
            Err(Status::Unsupported.into()),
            "[{n}] am_zcopy"
        );
        return;
    }
    let a = p.attr().am;
    assert!(a.max_iov >= 1, "[{n}] AM_ZCOPY with am.max_iov 0");
    assert!(a.max_zcopy >= a.min_zcopy, "[{n}] am.max_zcopy < am.min_zcopy");
    let max_iov = a.max_iov.min(uct::MAX_IOV);
    let max_zcopy = a.max_zcopy.min(64 * 1024);
    let mut hdrs = vec![0, 1, 7, 8, 9, a.max_hdr / 2, a.max_hdr];
    hdrs.retain(|&h| h <= a.max_hdr);
    hdrs.dedup();
    let counts: Vec<usize> = (1..=max_iov).collect();
    let rec = p.record_am(ID);
    let mut seq = 0;
    for &h in &hdrs {
        for len in sizes(a.min_zcopy, max_zcopy, 16) {
            if h + len > max_zcopy {
                continue;
            }
            for &k in &counts {
                zcopy_once(&p, &rec, seq, h, len, k.min(len.max(1)));
                seq += 1;
            }
        }
    }
    assert!(seq > 0, "[{n}] no am_zcopy layout fits the advertised limits");
}

/// Many messages in a row on two endpoints to the same receiver, mixing am_short and am_bcopy:
/// each endpoint's messages arrive in the order sent.
fn am_order_many(s: &Setup) {
    let p = s.pair();
    let n = p.name();
    let flags = p.attr().flags;
    let short = flags.contains(IfaceFlags::AM_SHORT) && p.attr().am.max_short >= 8 + 64;
    let bcopy = flags.contains(IfaceFlags::AM_BCOPY) && p.attr().am.max_bcopy >= 72;
    if !short && !bcopy {
        p.skip("am_order_many: neither am_short nor am_bcopy");
        return;
    }
    let rec = p.record_am(ID);
    let (ep2, _back2) = p.connect();
    let eps = [p.ep().clone(), ep2];
    const N: usize = 3000;
    let mut seqs = [0u64; 2];
    for i in 0..N {
        let e = (i * 7 / 3) % 2; // irregular interleaving
        let hdr = ((e as u64) << 32) | seqs[e];
        let data = pattern(i % 64, hdr);
        let use_short = short && (!bcopy || i % 5 != 0);
        let r = if use_short {
            p.retry("am_short", || eps[e].am_short(ID, hdr, &data))
        } else {
            p.retry("am_bcopy", || {
                eps[e].am_bcopy(ID, |b| {
                    b[..8].copy_from_slice(&hdr.to_le_bytes());
                    b[8..8 + data.len()].copy_from_slice(&data);
                    8 + data.len()
                })
            })
            .map(|_| ())
        };
        r.unwrap_or_else(|e| panic!("[{n}] message {i}: {e}"));
        seqs[e] += 1;
    }
    p.wait_msgs(&rec, N, "ordered");
    check_two_endpoints(&p, &rec, seqs, "ordered");
}

/// Every message in `rec` carries an 8-byte header (endpoint 0 or 1 in the high half, its
/// sequence number in the low half) and then `pattern(len, header)`: each is intact, each
/// endpoint's arrive in order, `expect[e]` of them.
pub(crate) fn check_two_endpoints(p: &Pair, rec: &Recorder, expect: [u64; 2], what: &str) {
    let n = p.name();
    let mut next = [0u64; 2];
    for (i, m) in rec.borrow().iter().enumerate() {
        let hdr = u64::from_le_bytes(m[..8].try_into().unwrap());
        let e = (hdr >> 32) as usize;
        assert!(e < 2, "[{n}] message {i}: corrupt header {hdr:#x}");
        assert_eq!(
            hdr & 0xffff_ffff,
            next[e],
            "[{n}] message {i}: endpoint {e} out of order"
        );
        next[e] += 1;
        assert_bytes(
            &format!("[{n}] {what} message {i}"),
            &m[8..],
            &pattern(m.len() - 8, hdr),
        );
    }
    assert_eq!(next, expect, "[{n}] messages lost");
}

/// am_short sent from inside an AM handler (UCX allows sends from callbacks) at sizes around
/// the self transport's stack-assembly limits (16 and 64 bytes with the header): the nested
/// message arrives intact, and the message the handler is reading does not change while the
/// nested send runs (self delivers a nested send at once, into the same interface).
fn am_short_from_handler(s: &Setup) {
    const NESTED: u8 = 8;
    let p = s.pair();
    let n = p.name();
    if !p.supports(IfaceFlags::AM_SHORT, "am_short_from_handler") {
        return;
    }
    let ep = p.ep().clone();
    let max = p.attr().am.max_short - 8;
    let rec = p.record_am(NESTED);
    // Sends the transport refused inside the handler (NoResource: no progress allowed there),
    // made by the test after the handler returned.
    type Deferred = Rc<RefCell<Vec<(u64, Vec<u8>)>>>;
    let deferred: Deferred = Rc::default();
    let problems: Rc<RefCell<Vec<String>>> = Rc::default();
    let (d, pr, weak) = (deferred.clone(), problems.clone(), Rc::downgrade(&ep));
    p.rx.iface
        .set_am_handler(ID, p.am_flags(), move |m| {
            let before = m.data().to_vec();
            let Some(e) = weak.upgrade() else { return };
            match e.am_short(NESTED, m.header(), &before[8..]) {
                Ok(()) => {}
                Err(e) if e == Status::NoResource => d.borrow_mut().push((m.header(), before[8..].to_vec())),
                Err(err) => pr
                    .borrow_mut()
                    .push(format!("nested send of {}: {err}", before.len())),
            }
            if m.data() != &before[..] {
                pr.borrow_mut().push(format!(
                    "message of {} bytes changed by a nested send",
                    before.len()
                ));
            }
        })
        .unwrap();
    let mut lens: Vec<usize> = [0, 1, 8, 9, 56, 57, 200, max]
        .into_iter()
        .filter(|&l| l <= max)
        .collect();
    lens.dedup();
    for (i, &len) in lens.iter().enumerate() {
        let data = pattern(len, 100 + i as u64);
        let hdr = 0x5A5A_0000 | i as u64;
        p.retry("am_short", || ep.am_short(ID, hdr, &data))
            .unwrap_or_else(|e| panic!("[{n}] am_short of {len} payload bytes: {e}"));
        p.wait_for("the nested send", || {
            rec.borrow().len() + deferred.borrow().len() > i
        });
        let later: Vec<_> = deferred.borrow_mut().drain(..).collect();
        for (h, d) in later {
            p.retry("deferred am_short", || ep.am_short(NESTED, h, &d))
                .unwrap_or_else(|e| panic!("[{n}] deferred am_short: {e}"));
        }
        p.wait_msgs(&rec, i + 1, "nested");
        let got = &rec.borrow()[i];
        assert_eq!(
            got[..8],
            hdr.to_le_bytes(),
            "[{n}] nested am_short header ({len} bytes)"
        );
        assert_bytes(&format!("[{n}] nested am_short of {len} bytes"), &got[8..], &data);
    }
    let pr = problems.borrow();
    assert!(pr.is_empty(), "[{n}] {pr:?}");
}

/// The receiver answers every message from inside its handler: on its endpoint back
/// (connect-to-ep, which is full duplex) or on an endpoint of its own to the sender's interface.
/// 200 pings, one at a time, each echoed in order. A reply the transport refuses inside the
/// handler (NoResource: no progress allowed there) is sent by the test once the handler
/// returned.
fn am_reply_from_handler(s: &Setup) {
    const PING: u8 = 2;
    const ECHO: u8 = 1;
    let p = s.pair();
    let n = p.name();
    if !p.supports(IfaceFlags::AM_SHORT, "am_reply_from_handler") {
        return;
    }
    let back: Rc<Ep> = match p.back() {
        Some(b) => b.clone(),
        None => Rc::new(pair::connect_to_iface(&p.rx, &p.tx)),
    };
    let echoes: Rc<RefCell<Vec<u64>>> = Rc::default();
    let e = echoes.clone();
    p.tx.iface
        .set_am_handler(ECHO, am::cb_flags(p.tx.attr()), move |m| {
            e.borrow_mut().push(m.header())
        })
        .unwrap();
    type Deferred = Rc<RefCell<Vec<u64>>>;
    let deferred: Deferred = Rc::default();
    let problems: Rc<RefCell<Vec<String>>> = Rc::default();
    // The handler reaches the endpoint back through a Weak: an Rc would keep the receiver's
    // interface (which owns the handler) alive forever.
    let (d, pr, weak) = (deferred.clone(), problems.clone(), Rc::downgrade(&back));
    p.rx.iface
        .set_am_handler(PING, p.am_flags(), move |m| {
            let Some(b) = weak.upgrade() else { return };
            match b.am_short(ECHO, m.header() + 1000, b"echo") {
                Ok(()) => {}
                Err(e) if e == Status::NoResource => d.borrow_mut().push(m.header() + 1000),
                Err(e) => pr.borrow_mut().push(format!("reply to {}: {e}", m.header())),
            }
        })
        .unwrap();
    for i in 0..200u64 {
        p.retry("ping", || p.ep().am_short(PING, i, b"ping"))
            .unwrap_or_else(|e| panic!("[{n}] ping {i}: {e}"));
        p.wait_for("the ping handled", || {
            echoes.borrow().len() + deferred.borrow().len() > i as usize || !problems.borrow().is_empty()
        });
        let later: Vec<u64> = deferred.borrow_mut().drain(..).collect();
        for h in later {
            p.retry("deferred reply", || back.am_short(ECHO, h, b"echo"))
                .unwrap_or_else(|e| panic!("[{n}] deferred reply: {e}"));
        }
        p.wait_for("the echo", || {
            echoes.borrow().len() as u64 == i + 1 || !problems.borrow().is_empty()
        });
        assert!(problems.borrow().is_empty(), "[{n}] {:?}", problems.borrow());
    }
    assert_eq!(*echoes.borrow(), (1000..1200).collect::<Vec<_>>(), "[{n}] echoes");
    p.no_errors();
}

conformance_test!(
    am_short_sizes,
    am_short_iov_sizes,
    am_bcopy_sizes,
    am_zcopy_layouts,
    am_order_many,
    am_short_from_handler,
    am_reply_from_handler
);
