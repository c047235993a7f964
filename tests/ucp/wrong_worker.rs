//! Something made on one worker handed to another: an `InvalidParam` error at once, never a
//! wait that another worker's progress would have to end.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use ucp::{AmFlags, AmHandlerFlags, Features, Issued, Status, Worker};
use uct::AsyncMode;

use crate::harness::{pattern, Setup, DEADLINE};
use crate::ucp_test;

/// `Issued::wait` and `Request::wait` on another worker than the request's return
/// `InvalidParam` (saying so) instead of progressing it for ever; on its own worker the same
/// kind of request still completes.
fn wait_on_other_worker(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM | Features::TAG) else {
        return;
    };
    let ctx = s.context(Features::AM | Features::TAG).unwrap();
    let other = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let start = Instant::now();
    let r = p.b.tag_recv(7, u64::MAX, vec![0; 16]).unwrap();
    assert!(!r.is_done(), "[{}] nothing was sent", p.name);
    let e = r.wait(&other).expect_err("waited on another worker");
    assert_eq!(e.status(), Status::InvalidParam, "[{}] {e}", p.name);
    assert!(e.to_string().contains("another worker"), "[{}] {e}", p.name);
    // `Request::wait` directly, and a request that belongs to the sender's worker.
    let Issued::Pending(r) = p.b.tag_recv(8, u64::MAX, vec![0; 16]).unwrap() else {
        panic!("[{}] nothing was sent", p.name)
    };
    assert!(r.belongs_to(&p.b) && !r.belongs_to(&other));
    assert_eq!(r.wait(&other).unwrap_err().status(), Status::InvalidParam);
    assert!(start.elapsed() < DEADLINE, "[{}] the errors came at once", p.name);
    // The right worker: completes (the pair's two workers progress in turn).
    let Issued::Pending(mut r) = p.b.tag_recv(9, u64::MAX, vec![0; 16]).unwrap() else {
        panic!("[{}] nothing was sent", p.name)
    };
    if let Issued::Pending(mut sent) = p.ep.tag_send(9, b"hello").unwrap() {
        assert!(sent.belongs_to(&p.a));
        p.wait_for("the send", || sent.is_done());
        sent.take().unwrap().unwrap();
    }
    p.wait_for("the receive", || r.is_done());
    assert_eq!(r.take().unwrap().unwrap().data, b"hello");
}

/// `am_recv_data` of a descriptor another worker's handler took: `InvalidParam`, the message
/// discarded and the sender released (its send completes).
fn am_recv_data_on_other_worker(s: &Setup) {
    let Some(p) = s.with("RNDV_THRESH", "0").pair() else {
        return;
    };
    let ctx = s.with("RNDV_THRESH", "0").context(Features::AM).unwrap();
    let other = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    p.b.set_am_handler_with(3, AmHandlerFlags::RNDV_DESC, move |m| {
        let desc = m.take_data_desc().expect("a rendezvous message");
        g.borrow_mut()
            .push(other.am_recv_data(desc, Vec::new()).map(|_| ()));
    })
    .unwrap();
    let sent =
        p.ep.am_send(3, &[], &pattern(50_000, 1), AmFlags::default())
            .unwrap();
    p.wait_for("the announcement", || !got.borrow().is_empty());
    let e = got.borrow_mut().pop().unwrap().unwrap_err();
    assert_eq!(e.status(), Status::InvalidParam, "[{}] {e}", p.name);
    assert!(e.to_string().contains("another worker"), "[{}] {e}", p.name);
    if let Issued::Pending(mut sent) = sent {
        p.wait_for("the sender's release", || sent.is_done());
        sent.take().unwrap().unwrap();
    }
}

/// `tag_msg_recv` of a message another worker's probe removed: `InvalidParam`.
fn tag_msg_recv_on_other_worker(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM | Features::TAG) else {
        return;
    };
    let ctx = s.context(Features::AM | Features::TAG).unwrap();
    let other = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    if let Issued::Pending(mut sent) = p.ep.tag_send(4, b"probe me").unwrap() {
        p.wait_for("the send", || sent.is_done());
        sent.take().unwrap().unwrap();
    }
    let mut probed = None;
    p.wait_for("the message", || {
        probed = p.b.tag_probe(4, u64::MAX, true).unwrap();
        probed.is_some()
    });
    let msg = probed.unwrap().msg.unwrap();
    let e = other.tag_msg_recv(msg, vec![0; 16]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidParam, "[{}] {e}", p.name);
}

ucp_test!(
    wait_on_other_worker,
    am_recv_data_on_other_worker,
    tag_msg_recv_on_other_worker
);
