//! Lent buffers: one `Arc<[u8]>` lent to many sends at once, through every protocol (short,
//! bcopy, zero-copy, fragments, rendezvous; with rendezvous from 4 KiB too), for active
//! messages and tag messages. Every message arrives intact, every send gives back the same
//! allocation, and once all finished nothing holds it any more.
//!
//! Receives into lent memory (`tag_recv_into`, `am_recv_data_into`), posted before the message
//! and after it (unexpected), through the same protocols: the message lands in the buffer's
//! first bytes, the bytes after it keep their contents, the same allocation comes back, and a
//! longer message fails with `MessageTruncated`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use ucp::{AmFlags, AmHandlerFlags, Features, Issued, Request, Status};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

const SIZES: &[usize] = &[1, 100, 4000, 9000, 65_537, 300_000];
/// Sends of one buffer in flight at once.
const WINDOW: usize = 8;

fn back(p: &Pair, r: Issued<Arc<[u8]>>) -> Arc<[u8]> {
    match r {
        Issued::Done(b) => b,
        Issued::Pending(mut r) => {
            p.wait_for("a lent send", || r.is_done());
            r.take()
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] lent send: {e}", p.name))
        }
    }
}

fn tag_lent(s: &Setup) {
    for rndv in ["auto", "4096"] {
        let Some(p) = s.with("RNDV_THRESH", rndv).pair_with(Features::TAG) else {
            return;
        };
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            let buf: Arc<[u8]> = Arc::from(data.clone());
            let recvs: Vec<Request<ucp::TagRecvd>> = (0..WINDOW)
                .map(|k| match p.b.tag_recv(k as u64, u64::MAX, vec![0; n]).unwrap() {
                    Issued::Pending(r) => r,
                    Issued::Done(_) => panic!("[{}] nothing was sent yet", p.name),
                })
                .collect();
            let sends: Vec<_> = (0..WINDOW)
                .map(|k| p.ep.tag_send_owned(k as u64, buf.clone()).unwrap())
                .collect();
            for s in sends {
                let b = back(&p, s);
                assert!(
                    Arc::ptr_eq(&b, &buf),
                    "[{}] {n} B: another buffer came back",
                    p.name
                );
            }
            for (k, mut r) in recvs.into_iter().enumerate() {
                p.wait_for("a tag receive", || r.is_done());
                let got = r.take().unwrap().unwrap();
                assert_eq!(got.tag, k as u64);
                assert!(got.data == data, "[{}] {n} B (rndv {rndv}) changed", p.name);
            }
            assert_eq!(Arc::strong_count(&buf), 1, "[{}] {n} B: still held", p.name);
        }
    }
}

fn am_lent(s: &Setup) {
    for rndv in ["auto", "4096"] {
        let Some(p) = s.with("RNDV_THRESH", rndv).pair() else {
            return;
        };
        let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
        let g = got.clone();
        p.b.set_am_handler(5, move |m| g.borrow_mut().push(m.data().to_vec()))
            .unwrap();
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            let buf: Arc<[u8]> = Arc::from(data.clone());
            let sends: Vec<_> = (0..WINDOW)
                .map(|_| {
                    p.ep.am_send_owned(5, b"hdr", buf.clone(), AmFlags::default())
                        .unwrap()
                })
                .collect();
            for s in sends {
                assert!(Arc::ptr_eq(&back(&p, s), &buf), "[{}] {n} B", p.name);
            }
            p.wait_for("the active messages", || got.borrow().len() == WINDOW);
            for m in got.borrow_mut().drain(..) {
                assert!(m == data, "[{}] {n} B (rndv {rndv}) changed", p.name);
            }
            assert_eq!(Arc::strong_count(&buf), 1, "[{}] {n} B: still held", p.name);
        }
    }
}

/// Room past the message in each lent receive buffer, filled with this byte.
const SLACK: usize = 64;
const FILL: u8 = 0xa5;

fn recvd<B>(p: &Pair, r: Issued<ucp::TagRecvd<B>>) -> ucp::Result<ucp::TagRecvd<B>> {
    match r {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            p.wait_for("a lent receive", || r.is_done());
            r.take().unwrap()
        }
    }
}

fn check_lent(p: &Pair, what: &str, got: &[u8], data: &[u8], addr: *const u8) {
    let n = data.len();
    assert_eq!(
        got.as_ptr(),
        addr,
        "[{}] {what}: another buffer came back",
        p.name
    );
    assert_eq!(
        got.len(),
        n + SLACK,
        "[{}] {what}: the buffer changed size",
        p.name
    );
    assert!(&got[..n] == data, "[{}] {what}: the message changed", p.name);
    assert!(
        got[n..].iter().all(|&b| b == FILL),
        "[{}] {what}: bytes past the message were written",
        p.name
    );
}

fn tag_recv_lent(s: &Setup) {
    for rndv in ["auto", "4096"] {
        let Some(p) = s.with("RNDV_THRESH", rndv).pair_with(Features::TAG) else {
            return;
        };
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            // Posted first (expected), a boxed slice.
            let buf: Box<[u8]> = vec![FILL; n + SLACK].into_boxed_slice();
            let addr = buf.as_ptr();
            let r = p.b.tag_recv_into(1, u64::MAX, buf).unwrap();
            let s = p.ep.tag_send(1, &data).unwrap();
            let got = recvd(&p, r).unwrap_or_else(|e| panic!("[{}] {n} B expected: {e}", p.name));
            if let Issued::Pending(s) = s {
                p.wait_for("the send", || s.is_done());
            }
            assert_eq!((got.tag, got.length), (1, n));
            check_lent(
                &p,
                &format!("{n} B expected (rndv {rndv})"),
                &got.data,
                &data,
                addr,
            );

            // Sent first (unexpected; a rendezvous send finishes only once matched), a
            // vector; then a vector too short.
            let s = p.ep.tag_send(2, &data).unwrap();
            p.wait_for("the message to arrive", || {
                p.b.tag_probe(2, u64::MAX, false).unwrap().is_some()
            });
            let v = vec![FILL; n + SLACK];
            let addr = v.as_ptr();
            let got = recvd(&p, p.b.tag_recv_into(2, u64::MAX, v).unwrap())
                .unwrap_or_else(|e| panic!("[{}] {n} B unexpected: {e}", p.name));
            if let Issued::Pending(s) = s {
                p.wait_for("the send", || s.is_done());
            }
            assert_eq!((got.tag, got.length), (2, n));
            check_lent(
                &p,
                &format!("{n} B unexpected (rndv {rndv})"),
                &got.data,
                &data,
                addr,
            );

            let r = p.b.tag_recv_into(3, u64::MAX, vec![FILL; n - 1]).unwrap();
            let _ = p.ep.tag_send(3, &data).unwrap();
            let e = recvd(&p, r).expect_err("a message longer than the buffer");
            assert_eq!(e.status(), Status::MessageTruncated, "[{}] {n} B: {e}", p.name);
        }
    }
}

fn am_recv_lent(s: &Setup) {
    let Some(p) = s.pair() else { return };
    type Got = Rc<RefCell<Vec<ucp::Result<Vec<u8>>>>>;
    let got: Got = Rc::default();
    let g = got.clone();
    let w = p.b.downgrade();
    let room = Rc::new(std::cell::Cell::new(0usize));
    let r = room.clone();
    p.b.set_am_handler_with(6, AmHandlerFlags::RNDV_DESC, move |m| {
        let Some(desc) = m.take_data_desc() else {
            g.borrow_mut().push(Ok(m.data().to_vec()));
            return;
        };
        let g = g.clone();
        let buf = vec![FILL; r.get()];
        match w.upgrade().unwrap().am_recv_data_into(desc, buf) {
            Ok(i) => i.on_complete(move |r| g.borrow_mut().push(r)),
            Err(e) => g.borrow_mut().push(Err(e)),
        }
    })
    .unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        let data = pattern(n, i);
        room.set(n + SLACK);
        p.send(6, &[], &data, AmFlags::RNDV);
        p.wait_for("the message", || !got.borrow().is_empty());
        let v = got
            .borrow_mut()
            .pop()
            .unwrap()
            .unwrap_or_else(|e| panic!("[{}] {n} B: {e}", p.name));
        check_lent(&p, &format!("{n} B active message"), &v, &data, v.as_ptr());

        // The receiver discards it; the sender is released as for a dropped descriptor.
        room.set(n - 1);
        p.send(6, &[], &data, AmFlags::RNDV);
        p.wait_for("the message", || !got.borrow().is_empty());
        let e = got
            .borrow_mut()
            .pop()
            .unwrap()
            .expect_err("a message longer than the buffer");
        assert_eq!(e.status(), Status::MessageTruncated, "[{}] {n} B: {e}", p.name);
    }
}

/// A window of receives into one mapped buffer at once (as ucx_perftest posts them), and
/// receives into disjoint ranges of it, through every protocol.
fn tag_recv_mapped(s: &Setup) {
    for rndv in ["auto", "4096"] {
        let Some(p) = s.with("RNDV_THRESH", rndv).pair_with(Features::TAG) else {
            return;
        };
        // Ranges a byte apart, to see that none is written past.
        let max = *SIZES.iter().max().unwrap() + 1;
        let mem = match p.b.mem_alloc(WINDOW * max + SLACK) {
            Ok(m) => m,
            // No transport here maps memory (ud_verbs alone).
            Err(e) if e == Status::Unsupported => return,
            Err(e) => panic!("[{}] mem_alloc: {e}", p.name),
        };
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            // The same range for every receive of the window: all carry the same bytes.
            mem.fill(FILL);
            let recvs: Vec<_> = (0..WINDOW)
                .map(|k| p.b.tag_recv_mapped(k as u64, u64::MAX, &mem, 0, n).unwrap())
                .collect();
            let sends: Vec<_> = (0..WINDOW)
                .map(|k| p.ep.tag_send(k as u64, &data).unwrap())
                .collect();
            for (k, r) in recvs.into_iter().enumerate() {
                let got = recvd(&p, r).unwrap_or_else(|e| panic!("[{}] {n} B shared: {e}", p.name));
                assert_eq!((got.tag, got.length), (k as u64, n));
            }
            for s in sends {
                if let Issued::Pending(s) = s {
                    p.wait_for("the send", || s.is_done());
                }
            }
            let mut out = vec![0; n + SLACK];
            mem.read(0, &mut out).unwrap();
            check_lent(
                &p,
                &format!("{n} B shared (rndv {rndv})"),
                &out,
                &data,
                out.as_ptr(),
            );

            // Disjoint ranges, each its own message, posted after the messages arrived.
            mem.fill(FILL);
            let msgs: Vec<Vec<u8>> = (0..WINDOW).map(|k| pattern(n, i + k)).collect();
            let sends: Vec<_> = (0..WINDOW).map(|k| p.ep.tag_send(9, &msgs[k]).unwrap()).collect();
            p.wait_for("the messages", || {
                p.b.tag_probe(9, u64::MAX, false).unwrap().is_some()
            });
            for k in 0..WINDOW {
                let r = p.b.tag_recv_mapped(9, u64::MAX, &mem, k * max, n).unwrap();
                let got = recvd(&p, r).unwrap_or_else(|e| panic!("[{}] {n} B disjoint: {e}", p.name));
                assert_eq!(got.length, n);
            }
            for s in sends {
                if let Issued::Pending(s) = s {
                    p.wait_for("the send", || s.is_done());
                }
            }
            for (k, m) in msgs.iter().enumerate() {
                let mut out = vec![0; n];
                mem.read(k * max, &mut out).unwrap();
                assert!(&out == m, "[{}] {n} B disjoint #{k} (rndv {rndv})", p.name);
                let mut after = [0u8; 1];
                mem.read(k * max + n, &mut after).unwrap();
                assert_eq!(after[0], FILL, "[{}] {n} B disjoint #{k}: written past", p.name);
            }
            let e =
                p.b.tag_recv_mapped(1, u64::MAX, &mem, mem.len() - 1, 2)
                    .unwrap_err();
            assert_eq!(e.status(), Status::OutOfRange);
        }
    }
}

ucp_test!(tag_lent, am_lent, tag_recv_lent, am_recv_lent, tag_recv_mapped);
