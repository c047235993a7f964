//! What an AM handler sees at every size: the plain handler (the README's) gets all the data
//! in `data()` whatever the protocol, rendezvous included (the worker fetches it first); a
//! handler installed with `AmHandlerFlags::RNDV_DESC` gets rendezvous messages as
//! descriptors, at the announcement, in the sender's order.

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{AmFlags, AmHandlerFlags, AmProto, Issued};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

/// The sizes: one eager everywhere, one rendezvous over shared memory, one large.
const SIZES: &[usize] = &[16, 100_000, 8 << 20];

/// Waits until the send `r` finished.
fn sent<T>(p: &Pair, r: Issued<T>) {
    if let Issued::Pending(mut req) = r {
        p.wait_for("the send to finish", || req.is_done());
        if let Some(Err(e)) = req.take() {
            panic!("[{}] send: {e}", p.name);
        }
    }
}

/// The README's handler shape (`m.data()`, a reply through `m.reply_ep()`) at 16 B, 100 KB and
/// 8 MiB, by the protocol the endpoint picks and, where that is eager, by forced rendezvous.
fn readme_handler_every_size(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    p.b.set_am_handler(1, move |m| {
        *g.borrow_mut() = Some((m.header().to_vec(), m.data().to_vec()));
        let _ = m
            .reply_ep()
            .unwrap()
            .am_send(2, &[], b"hello back", AmFlags::default());
    })
    .unwrap();
    let replies = Rc::new(RefCell::new(0usize));
    let r = replies.clone();
    p.a.set_am_handler(2, move |_| *r.borrow_mut() += 1).unwrap();
    let mut rounds = 0;
    for (i, &n) in SIZES.iter().enumerate() {
        for flags in [AmFlags::REPLY, AmFlags::REPLY | AmFlags::RNDV] {
            // Forcing what the thresholds already pick would only repeat the transfer (8 MiB
            // costs minutes on the emulated verbs VM).
            let picked = p.ep.am_protocol(3, n, AmFlags::REPLY, false);
            if flags.contains(AmFlags::RNDV) && picked == AmProto::Rndv {
                continue;
            }
            let data = pattern(n, i);
            let proto = p.ep.am_protocol(3, n, flags, false);
            let r = p.ep.am_send(1, b"hdr", &data, flags).unwrap();
            rounds += 1;
            p.wait_for(&format!("the reply to {n} bytes ({proto})"), || {
                *replies.borrow() == rounds
            });
            let (h, d) = got.borrow_mut().take().expect("the handler ran");
            assert_eq!(h, b"hdr", "[{}] header of {n} bytes ({proto})", p.name);
            assert!(
                d == data,
                "[{}] {n} bytes by {proto}: the handler got {} bytes",
                p.name,
                d.len()
            );
            sent(&p, r);
        }
    }
    // Over shared memory 100 KB is a rendezvous by the thresholds alone.
    if s.t.name == "posix" {
        let proto = p.ep.am_protocol(0, 100_000, AmFlags::default(), false);
        assert_eq!(proto, AmProto::Rndv, "[{}] 100 KB over posix", p.name);
    }
}

/// `keep` on a fetched rendezvous message takes its buffer; `is_rndv` is false and
/// `take_data_desc` `None` for a plain handler.
fn plain_handler_keeps_fetched_data(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let kept = Rc::new(RefCell::new(Vec::new()));
    let k = kept.clone();
    p.b.set_am_handler(3, move |m| {
        assert!(!m.is_rndv() && m.take_data_desc().is_none());
        assert_eq!(m.len(), m.data().len());
        k.borrow_mut().push(m.keep());
        assert!(m.data().is_empty(), "keep takes the fetched buffer");
    })
    .unwrap();
    let data = pattern(1 << 20, 3);
    p.send(3, &[], &data, AmFlags::RNDV);
    p.wait_for("the kept message", || kept.borrow().len() == 1);
    assert!(kept.borrow()[0][..] == data[..], "[{}] kept 1 MiB", p.name);
}

/// A descriptor handler: rendezvous messages at the announcement (`is_rndv`, no data), fetched
/// into the application's buffer; eager ones with their data.
fn rndv_desc_handler(s: &Setup) {
    let Some(p) = s.pair() else { return };
    type Got = Rc<RefCell<Vec<(bool, Vec<u8>)>>>;
    let got: Got = Rc::default();
    let g = got.clone();
    let w = p.b.downgrade();
    let name = p.name;
    p.b.set_am_handler_with(4, AmHandlerFlags::RNDV_DESC, move |m| {
        let Some(desc) = m.take_data_desc() else {
            g.borrow_mut().push((false, m.data().to_vec()));
            return;
        };
        assert!(m.is_rndv() && m.data().is_empty() && m.len() == desc.len());
        let g = g.clone();
        let w = w.upgrade().unwrap();
        w.am_recv_data(desc, Vec::with_capacity(16))
            .unwrap_or_else(|e| panic!("[{name}] am_recv_data: {e}"))
            .on_complete(move |r| g.borrow_mut().push((true, r.expect("the fetch"))));
    })
    .unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        for (j, flags) in [AmFlags::EAGER, AmFlags::RNDV].into_iter().enumerate() {
            let data = pattern(n, i);
            p.send(4, &[], &data, flags);
            let k = 2 * i + j;
            p.wait_for("the message", || got.borrow().len() > k);
            let (rndv, d) = &got.borrow()[k];
            assert_eq!(*rndv, j == 1, "[{}] {n} bytes with {flags:?}", p.name);
            assert!(*d == data, "[{}] {n} bytes with {flags:?}", p.name);
        }
    }
}

/// Order: a descriptor handler sees a rendezvous message before the small one sent after it;
/// a plain handler gets both, complete (the rendezvous one when its data is in, which may be
/// after the small one).
fn rndv_order(s: &Setup) {
    let Some(p) = s.pair() else { return };
    for flags in [AmHandlerFlags::RNDV_DESC, AmHandlerFlags::default()] {
        let seen: Rc<RefCell<Vec<(usize, bool)>>> = Rc::default();
        let sn = seen.clone();
        let descs = Rc::new(RefCell::new(Vec::new()));
        let ds = descs.clone();
        p.b.set_am_handler_with(5, flags, move |m| {
            sn.borrow_mut()
                .push((m.len(), m.data() == pattern(m.len(), m.len()).as_slice()));
            ds.borrow_mut().extend(m.take_data_desc());
        })
        .unwrap();
        let big = 1 << 20;
        let r1 = p.ep.am_send(5, &[], &pattern(big, big), AmFlags::RNDV).unwrap();
        let r2 = p.ep.am_send(5, &[], &pattern(16, 16), AmFlags::EAGER).unwrap();
        p.wait_for("both messages", || seen.borrow().len() == 2);
        descs.borrow_mut().clear(); // releases the sender
        sent(&p, r1);
        sent(&p, r2);
        let seen = seen.borrow();
        if flags.contains(AmHandlerFlags::RNDV_DESC) {
            assert_eq!(
                *seen,
                [(big, false), (16, true)],
                "[{}] descriptor handler: announcement first",
                p.name
            );
        } else {
            let mut s = seen.clone();
            s.sort();
            assert_eq!(s, [(16, true), (big, true)], "[{}] plain handler", p.name);
        }
    }
}

ucp_test!(
    readme_handler_every_size,
    plain_handler_keeps_fetched_data,
    rndv_desc_handler,
    rndv_order
);
