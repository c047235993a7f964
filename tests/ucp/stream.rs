//! Streams: bytes sent in random pieces arrive in order and are received in other random
//! pieces, both directions; receives posted before anything arrived (even before the
//! endpoint is wired); a closed endpoint ends its pending receives.

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{CloseMode, Ep, Features, Issued};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

/// xorshift64: the same pieces on every run.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Sends `data` in random pieces from `tx`, receives it in random pieces on `rx`.
fn transfer(p: &Pair, tx: &Ep, rx: &Ep, data: &[u8], seed: u64) {
    let mut r = rng(seed);
    let mut sends = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let n = ((r() % 70_000) as usize + 1).min(data.len() - at);
        sends.push(tx.stream_send(&data[at..at + n]).unwrap());
        at += n;
    }
    let mut got = Vec::with_capacity(data.len());
    while got.len() < data.len() {
        let want = ((r() % 100_000) as usize + 1).min(data.len() - got.len());
        let wait_all = r() & 1 == 0;
        let piece = match rx.stream_recv(vec![0; want], wait_all).unwrap() {
            Issued::Done(v) => v,
            Issued::Pending(mut q) => {
                p.wait_for("stream bytes", || q.is_done());
                q.take().unwrap().unwrap()
            }
        };
        assert!(
            !piece.is_empty() && piece.len() <= want,
            "[{}] {} of {want}",
            p.name,
            piece.len()
        );
        if wait_all {
            assert_eq!(piece.len(), want, "[{}] wait_all", p.name);
        }
        got.extend_from_slice(&piece);
    }
    assert!(got == data, "[{}] stream bytes changed", p.name);
    for s in sends {
        if let Issued::Pending(mut s) = s {
            p.wait_for("the stream sends", || s.is_done());
            s.take().unwrap().unwrap();
        }
    }
}

/// The peer's endpoint toward `p.a`, from a message with a reply endpoint.
pub(crate) fn back_ep(p: &Pair) -> Ep {
    let back: Rc<RefCell<Option<Ep>>> = Rc::default();
    let b2 = back.clone();
    p.b.set_am_handler(30, move |m| *b2.borrow_mut() = m.reply_ep().cloned())
        .unwrap();
    let _ = p.ep.am_send(30, &[], &[], ucp::AmFlags::REPLY).unwrap();
    p.wait_for("the reply endpoint", || back.borrow().is_some());
    let ep = back.borrow_mut().take().unwrap();
    ep
}

fn stream_random_splits(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM | Features::STREAM) else {
        return;
    };
    if p.a.id() == p.b.id() {
        // self: one worker, the endpoint streams to itself
        let ep = p.ep.clone();
        transfer(&p, &ep, &ep, &pattern(3 << 20, 1), 7);
        return;
    }
    let back = back_ep(&p);
    transfer(&p, &p.ep, &back, &pattern(3 << 20, 1), 7);
    transfer(&p, &back, &p.ep, &pattern(1 << 20, 2), 8);
}

/// A receive posted before the peer sent anything (on a fresh endpoint, before wireup
/// finished) gets the first bytes.
fn stream_recv_first(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM | Features::STREAM) else {
        return;
    };
    if p.a.id() == p.b.id() {
        return;
    }
    let early = p.ep.stream_recv(vec![0; 5], true).unwrap();
    let back = back_ep(&p);
    let _ = back.stream_send(b"hello").unwrap();
    let Issued::Pending(mut early) = early else {
        panic!("[{}] nothing was sent yet", p.name)
    };
    p.wait_for("the early receive", || early.is_done());
    assert_eq!(early.take().unwrap().unwrap(), b"hello");
    // a pending receive ends with the endpoint
    let Issued::Pending(mut r) = p.ep.stream_recv(vec![0; 5], false).unwrap() else {
        panic!("[{}] nothing more was sent", p.name)
    };
    let _ = p.ep.close(CloseMode::Force);
    p.wait_for("the canceled receive", || r.is_done());
    assert!(r.take().unwrap().is_err());
    assert!(p.ep.stream_recv(vec![0; 1], false).is_err());
    // an empty receive would never complete: refused
    let e = back.stream_recv(Vec::new(), false).unwrap_err();
    assert_eq!(e, ucp::Status::InvalidParam);
}

/// The sender closes right after its last send: every byte that arrived is still read on the
/// receiver, then the endpoint's end is reported (as a socket's end of file).
fn stream_close_keeps_arrived_bytes(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM | Features::STREAM) else {
        return;
    };
    if p.a.id() == p.b.id() {
        return;
    }
    let back = back_ep(&p);
    let data = pattern(100 * 16, 5);
    for c in data.chunks(16) {
        let _ = p.ep.stream_send(c).unwrap();
    }
    let closed = p.ep.close(CloseMode::Flush);
    if let Issued::Pending(c) = closed {
        p.wait_for("the close", || c.is_done());
    }
    // The receiver's endpoint learnt of the close: it failed, and still reads every byte.
    p.wait_for("the peer's close", || back.error().is_some());
    let mut got = Vec::new();
    loop {
        match back.stream_recv(vec![0; 16], false) {
            Ok(Issued::Done(v)) => got.extend_from_slice(&v),
            Ok(Issued::Pending(_)) => panic!("[{}] a receive waits on a closed endpoint", p.name),
            Err(e) => {
                assert_eq!(e, ucp::Status::ConnectionReset, "[{}] {e}", p.name);
                break;
            }
        }
    }
    assert!(
        got == data,
        "[{}] {} of {} bytes read after the close",
        p.name,
        got.len(),
        data.len()
    );
}

ucp_test!(
    stream_random_splits,
    stream_recv_first,
    stream_close_keeps_arrived_bytes
);
