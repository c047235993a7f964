//! Rendezvous active messages: forced by threshold and by flag, both schemes (get_zcopy where
//! the lanes have it, the AM pipeline everywhere), copied and owned buffers, the receiver
//! fetching later or never, flush waiting for fetches, 64 MiB.

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{AmDataDesc, AmFlags, AmHandlerFlags, AmProto, Issued};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

const SIZES: &[usize] = &[0, 1, 1000, 8193, 65537, 1 << 20, (8 << 20) + 3];

/// Sends owned `data` and waits for the buffer to come back.
fn send_owned(p: &Pair, id: u16, hdr: &[u8], data: Vec<u8>, flags: AmFlags) -> Vec<u8> {
    match p.ep.am_send_owned(id, hdr, data, flags).unwrap() {
        Issued::Done(v) => v,
        Issued::Pending(mut r) => {
            p.wait_for("an owned rendezvous send", || r.is_done());
            r.take()
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] owned send: {e}", p.name))
        }
    }
}

/// Every size, copied and owned, with rendezvous from 0 bytes; each scheme.
fn rndv_sizes(s: &Setup) {
    for scheme in ["auto", "am"] {
        let Some(p) = s.with("RNDV_THRESH", "0").with("RNDV_SCHEME", scheme).pair() else {
            return;
        };
        let desc = p.ep.describe_protocols();
        // ud_verbs has no zero-copy get: the pipeline there whatever the scheme.
        if scheme == "am" || p.name == "ud_verbs" {
            assert!(desc.contains("AM pipeline"), "[{}] {desc}", p.name);
        } else {
            assert!(desc.contains("get_zcopy"), "[{}] {desc}", p.name);
        }
        let inbox = p.inbox(3);
        let mut n_in = 0;
        for (i, &n) in SIZES.iter().enumerate() {
            assert_eq!(
                p.ep.am_protocol(5, n, AmFlags::default(), false),
                AmProto::Rndv,
                "[{}] {n} bytes",
                p.name
            );
            let data = pattern(n, i);
            let hdr = pattern(5, i + 50);
            p.send(3, &hdr, &data, AmFlags::default());
            n_in += 1;
            p.wait_for(&format!("{n} bytes by rendezvous ({scheme})"), || {
                inbox.borrow().len() == n_in
            });
            assert_eq!(inbox.borrow()[n_in - 1].0, hdr, "[{}] header", p.name);
            assert!(
                inbox.borrow()[n_in - 1].1 == data,
                "[{}] {n} bytes ({scheme})",
                p.name
            );
            let back = send_owned(&p, 3, &hdr, data.clone(), AmFlags::REPLY);
            assert!(back == data, "[{}] the owned buffer came back changed", p.name);
            n_in += 1;
            p.wait_for("an owned rendezvous message", || inbox.borrow().len() == n_in);
            let got = &inbox.borrow()[n_in - 1];
            assert!(got.1 == data && got.2, "[{}] owned {n} bytes ({scheme})", p.name);
        }
    }
}

/// `RNDV` forces rendezvous for any size, `EAGER` forbids it, both together are refused.
fn rndv_flags(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "0").pair() else {
        return;
    };
    assert_ne!(
        p.ep.am_protocol(0, 100, AmFlags::EAGER, false),
        AmProto::Rndv,
        "[{}]",
        p.name
    );
    let e =
        p.ep.am_send(1, &[], b"x", AmFlags::RNDV | AmFlags::EAGER)
            .unwrap_err();
    assert_eq!(e, ucs::Status::InvalidParam);
    let inbox = p.inbox(1);
    p.send(1, &[], b"eager", AmFlags::EAGER);
    p.wait_for("an eager message", || inbox.borrow().len() == 1);
    let Some(p) = s.pair() else { return };
    assert_eq!(p.ep.am_protocol(0, 3, AmFlags::RNDV, false), AmProto::Rndv);
    let inbox = p.inbox(1);
    p.send(1, b"h", b"abc", AmFlags::RNDV);
    p.wait_for("a forced rendezvous", || inbox.borrow().len() == 1);
    assert_eq!(inbox.borrow()[0].1, b"abc");
    // An RTS has to fit one segment: a header too long for it is refused with RNDV.
    let big_hdr = vec![0u8; 1 << 20];
    let e = p.ep.am_send(1, &big_hdr, b"x", AmFlags::RNDV).unwrap_err();
    assert_eq!(e, ucs::Status::InvalidParam, "[{}] {e}", p.name);
}

type Stash = Rc<RefCell<Vec<AmDataDesc>>>;

/// A handler that keeps the descriptors for later.
fn stash(p: &Pair, id: u16) -> Stash {
    let st: Stash = Rc::default();
    let s2 = st.clone();
    p.b.set_am_handler_with(id, AmHandlerFlags::RNDV_DESC, move |m| {
        assert!(m.is_rndv() && m.data().is_empty());
        s2.borrow_mut().push(m.take_data_desc().unwrap());
    })
    .unwrap();
    st
}

/// The receiver fetches after its handler returned, into a buffer of another size; a
/// descriptor dropped or never taken releases the sender.
fn rndv_later(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "0").pair() else {
        return;
    };
    let st = stash(&p, 2);
    let data = pattern(100_000, 3);
    let Issued::Pending(mut sent) = p.ep.am_send(2, &[], &data, AmFlags::default()).unwrap() else {
        panic!(
            "[{}] a rendezvous send completes when the receiver has the data",
            p.name
        );
    };
    p.wait_for("the announcement", || st.borrow().len() == 1);
    for _ in 0..100 {
        p.progress();
    }
    assert!(
        !sent.is_done(),
        "[{}] the sender finished before the receiver fetched",
        p.name
    );
    let desc = st.borrow_mut().pop().unwrap();
    assert_eq!(desc.len(), data.len());
    let got = match p.b.am_recv_data(desc, vec![7; 10]).unwrap() {
        Issued::Done(v) => v,
        Issued::Pending(mut r) => {
            p.wait_for("the fetch", || r.is_done());
            r.take().unwrap().unwrap()
        }
    };
    assert!(got == data, "[{}] fetched data", p.name);
    p.wait_for("the sender's completion", || sent.is_done());
    sent.take().unwrap().unwrap();
    // Dropped without fetching: the sender completes all the same.
    let Issued::Pending(mut sent) = p.ep.am_send(2, &[], &data, AmFlags::default()).unwrap() else {
        panic!("[{}] pending", p.name)
    };
    p.wait_for("the announcement", || st.borrow().len() == 1);
    st.borrow_mut().clear();
    p.wait_for("the sender's completion after a drop", || sent.is_done());
    sent.take().unwrap().unwrap();
    // A handler that ignores the descriptor: the same.
    // (On self the whole exchange runs inside the send.)
    p.b.set_am_handler(2, |_| {}).unwrap();
    if let Issued::Pending(mut sent) = p.ep.am_send(2, &[], &data, AmFlags::default()).unwrap() {
        p.wait_for("the sender's completion when ignored", || sent.is_done());
        sent.take().unwrap().unwrap();
    }
}

/// `flush` completes only once the peer fetched every rendezvous message sent before it.
fn rndv_flush(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "0").pair() else {
        return;
    };
    let st = stash(&p, 2);
    let data = pattern(50_000, 1);
    let sent = p.ep.am_send(2, &[], &data, AmFlags::default()).unwrap();
    let Issued::Pending(mut flushed) = p.ep.flush().unwrap() else {
        panic!("[{}] a flush with a fetch outstanding is pending", p.name)
    };
    p.wait_for("the announcement", || st.borrow().len() == 1);
    for _ in 0..100 {
        p.progress();
    }
    assert!(!flushed.is_done(), "[{}] flush finished before the fetch", p.name);
    let desc = st.borrow_mut().pop().unwrap();
    // (On self and shared memory the fetch may finish inside the call.)
    let got = p.b.am_recv_data(desc, Vec::new()).unwrap();
    p.wait_for("the flush", || flushed.is_done());
    flushed.take().unwrap().unwrap();
    let got = match got {
        Issued::Done(v) => v,
        Issued::Pending(mut r) => {
            p.wait_for("the fetch", || r.is_done());
            r.take().unwrap().unwrap()
        }
    };
    assert!(got == data);
    drop(sent);
}

/// 64 MiB by rendezvous (default threshold, or forced).
fn rndv_large(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let inbox = p.inbox(5);
    let data = pattern(64 << 20, 9);
    let back = send_owned(&p, 5, &[], data, AmFlags::RNDV);
    p.wait_for("64 MiB", || !inbox.borrow().is_empty());
    assert!(inbox.borrow()[0].1 == back, "[{}] 64 MiB by rendezvous", p.name);
}

/// The put_zcopy scheme is refused at context creation, with the choices that work.
fn rndv_put_unsupported(s: &Setup) {
    let b = ucp::Context::builder(crate::harness::uct_context(s.t))
        .config("TLS", s.t.tls)
        .config("RNDV_SCHEME", "put_zcopy");
    let Err(e) = b.build() else {
        panic!("[{}] RNDV_SCHEME=put_zcopy was accepted", s.t.name)
    };
    assert_eq!(e, ucs::Status::Unsupported);
    assert!(e.to_string().contains("get_zcopy"), "{e}");
}

ucp_test!(
    rndv_put_unsupported,
    rndv_sizes,
    rndv_flags,
    rndv_later,
    rndv_flush,
    rndv_large
);
