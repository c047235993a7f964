//! Active messages: every size class (short, bcopy, zcopy, fragmented; the thresholds forced
//! too), borrowed and owned buffers, headers, order, reply endpoints.

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{AmFlags, AmProto, Issued};

use crate::harness::{pattern, Setup};
use crate::ucp_test;

/// Sizes around every limit of the usual lanes, up to 8 MiB (64 MiB in `am_large`).
const SIZES: &[usize] = &[
    0,
    1,
    7,
    8,
    100,
    900,
    1000,
    1024,
    2000,
    4000,
    8100,
    8192,
    8193,
    9000,
    16384,
    65536,
    65537,
    200_000,
    1 << 20,
    (8 << 20) + 3,
];

fn sizes(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let inbox = p.inbox(7);
    for (i, &n) in SIZES.iter().enumerate() {
        let data = pattern(n, i);
        let hdr = pattern(i % 3 * 8, 100 + i);
        p.send(7, &hdr, &data, AmFlags::default());
        p.wait_for(&format!("{n}-byte message"), || inbox.borrow().len() > i);
        let got = &inbox.borrow()[i];
        assert_eq!(got.0, hdr, "[{}] header of the {n}-byte message", p.name);
        assert!(
            got.1 == data,
            "[{}] {n}-byte message arrived different ({} bytes)",
            p.name,
            got.1.len()
        );
    }
}

/// Each size class forced with the thresholds: the endpoint reports the protocol the
/// configuration asks for, and messages of that class arrive intact (copied and owned sends).
fn forced_protocols(s: &Setup) {
    type Case = (&'static str, &'static str, bool, fn(AmProto) -> bool);
    let cases: &[Case] = &[
        // copied sends: everything leaves am_short
        ("BCOPY_THRESH", "0", false, |p| {
            matches!(p, AmProto::Bcopy | AmProto::Fragments(_))
        }),
        // owned sends: zero-copy from 1 byte (where the lane has AM zcopy)
        ("ZCOPY_THRESH", "1", true, |p| {
            matches!(p, AmProto::Zcopy | AmProto::Fragments(_))
        }),
        // zero-copy never: owned sends copy
        ("ZCOPY_THRESH", "inf", true, |p| !matches!(p, AmProto::Zcopy)),
    ];
    for &(var, value, owned, ok) in cases {
        let Some(p) = s.with(var, value).with("RNDV_THRESH", "inf").pair() else {
            return;
        };
        let inbox = p.inbox(4);
        let mut sent = 0;
        for (i, &n) in SIZES.iter().enumerate().filter(|(_, &n)| n > 0 && n <= 65537) {
            let proto = p.ep.am_protocol(0, n, AmFlags::default(), owned);
            let no_zcopy = !s.t.am_zcopy && var == "ZCOPY_THRESH" && proto == AmProto::Bcopy;
            assert!(
                ok(proto) || no_zcopy,
                "[{}] {var}={value}: {n} bytes go {proto:?}",
                p.name
            );
            let data = pattern(n, i);
            if owned {
                match p
                    .ep
                    .am_send_owned(4, &[], data.clone(), AmFlags::default())
                    .unwrap()
                {
                    Issued::Done(_) => {}
                    Issued::Pending(mut r) => {
                        p.wait_for("an owned send", || r.is_done());
                        r.take().unwrap().unwrap();
                    }
                }
            } else {
                p.send(4, &[], &data, AmFlags::default());
            }
            sent += 1;
            p.wait_for(&format!("{n} bytes with {var}={value}"), || {
                inbox.borrow().len() == sent
            });
            assert!(
                inbox.borrow()[sent - 1].1 == data,
                "[{}] {var}={value}: {n} bytes changed",
                p.name
            );
        }
    }
    // without a forced threshold, small copied messages go am_short on every target
    let Some(p) = s.pair() else { return };
    assert_eq!(
        p.ep.am_protocol(0, 8, AmFlags::default(), false),
        AmProto::Short,
        "[{}]",
        p.name
    );
    let big = p.ep.am_protocol(0, 8 << 20, AmFlags::EAGER, false);
    assert!(
        matches!(big, AmProto::Fragments(n) if n > 1),
        "[{}] 8 MiB go {big:?}",
        p.name
    );
}

/// Owned buffers come back after the send, whatever protocol took them (zero-copy from the
/// threshold up).
fn owned(s: &Setup) {
    for thresh in ["auto", "0"] {
        let Some(p) = s.with("ZCOPY_THRESH", thresh).pair() else {
            return;
        };
        let inbox = p.inbox(3);
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            let back = match p.ep.am_send_owned(3, b"hdr", data.clone(), AmFlags::default()) {
                Ok(Issued::Done(v)) => v,
                Ok(Issued::Pending(mut r)) => {
                    p.wait_for("an owned send", || r.is_done());
                    r.take()
                        .unwrap()
                        .unwrap_or_else(|e| panic!("[{}] owned send of {n}: {e}", p.name))
                }
                Err(e) => panic!("[{}] owned send of {n}: {e}", p.name),
            };
            assert_eq!(
                back, data,
                "[{}] the buffer came back changed ({n} bytes)",
                p.name
            );
            p.wait_for(&format!("owned {n}-byte message"), || inbox.borrow().len() > i);
            assert!(
                inbox.borrow()[i].1 == data,
                "[{}] owned {n}-byte message (ZCOPY_THRESH={thresh})",
                p.name
            );
        }
    }
}

/// Messages sent without waiting (many in flight, fragments among them) arrive complete and
/// in order.
fn order(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let inbox = p.inbox(1);
    let n = 300;
    let mut reqs = Vec::new();
    for i in 0..n {
        let len = [8, 3000, 20_000][i % 3];
        let mut d = pattern(len, i);
        d[..4].copy_from_slice(&(i as u32).to_le_bytes()[..4.min(len)]);
        match p.ep.am_send(1, &[], &d, AmFlags::default()).unwrap() {
            Issued::Done(()) => {}
            Issued::Pending(r) => reqs.push(r),
        }
    }
    p.wait_for("every message", || inbox.borrow().len() == n);
    for (i, (_, d, _)) in inbox.borrow().iter().enumerate() {
        assert_eq!(
            u32::from_le_bytes(d[..4].try_into().unwrap()) as usize,
            i,
            "[{}] message {i} out of order",
            p.name
        );
    }
    for mut r in reqs {
        p.wait_for("requests", || r.is_done());
        r.take().unwrap().unwrap();
    }
}

/// The handler answers through the reply endpoint; the sender's handler gets the answer.
fn reply(s: &Setup) {
    // Eager: the handler reads the data in place (rendezvous has its own tests).
    let Some(p) = s.with("RNDV_THRESH", "inf").pair() else {
        return;
    };
    let answers = p_inbox_a(&p, 2);
    p.b.set_am_handler(1, |m| {
        let ep = m.reply_ep().expect("sent with REPLY: a reply endpoint");
        let mut d = m.data().to_vec();
        d.reverse();
        let r = ep.am_send(2, m.header(), &d, AmFlags::default()).expect("reply");
        r.on_complete(|r| r.expect("reply sent"));
    })
    .unwrap();
    for (i, n) in [5usize, 5000, 70_000].into_iter().enumerate() {
        let d = pattern(n, i);
        p.send(1, b"q", &d, AmFlags::REPLY);
        p.wait_for("the answer", || answers.borrow().len() > i);
        let mut rev = d.clone();
        rev.reverse();
        assert!(
            answers.borrow()[i].1 == rev,
            "[{}] answer to a {n}-byte question",
            p.name
        );
    }
    // Without REPLY there is no endpoint back.
    let got = p.inbox(4);
    p.send(4, &[], b"x", AmFlags::default());
    p.wait_for("a message", || !got.borrow().is_empty());
    assert!(!got.borrow()[0].2, "[{}] a reply endpoint without REPLY", p.name);
}

fn p_inbox_a(p: &crate::harness::Pair, id: u16) -> crate::harness::Inbox {
    let inbox: crate::harness::Inbox = Rc::default();
    let i = inbox.clone();
    p.a.set_am_handler(id, move |m| {
        i.borrow_mut()
            .push((m.header().to_vec(), m.data().to_vec(), false))
    })
    .unwrap();
    inbox
}

/// A handler keeps a message's data beyond its call.
fn keep(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "inf").pair() else {
        return;
    };
    let kept = Rc::new(RefCell::new(Vec::new()));
    let k = kept.clone();
    p.b.set_am_handler(9, move |m| k.borrow_mut().push(m.keep()))
        .unwrap();
    let msgs: Vec<Vec<u8>> = [10usize, 4000, 100_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i))
        .collect();
    for m in &msgs {
        p.send(9, &[], m, AmFlags::default());
    }
    p.wait_for("three kept messages", || kept.borrow().len() == 3);
    for _ in 0..50 {
        p.progress();
    }
    for (m, k) in msgs.iter().zip(kept.borrow().iter()) {
        assert!(k[..] == m[..], "[{}] kept data changed", p.name);
    }
}

/// Rendezvous is refused, saying so.
/// 64 MiB in one message (fragmented everywhere).
fn large(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let inbox = p.inbox(5);
    let data = pattern(64 << 20, 9);
    let back = match p.ep.am_send_owned(5, &[], data, AmFlags::EAGER).unwrap() {
        Issued::Done(v) => v,
        Issued::Pending(mut r) => {
            p.wait_for("the 64 MiB send", || r.is_done());
            r.take().unwrap().unwrap()
        }
    };
    p.wait_for("64 MiB", || !inbox.borrow().is_empty());
    assert!(inbox.borrow()[0].1 == back, "[{}] 64 MiB message", p.name);
}

ucp_test!(sizes, forced_protocols, owned, order, reply, keep, large);
