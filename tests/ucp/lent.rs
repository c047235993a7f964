//! Lent buffers: one `Arc<[u8]>` lent to many sends at once, through every protocol (short,
//! bcopy, zero-copy, fragments, rendezvous; with rendezvous from 4 KiB too), for active
//! messages and tag messages. Every message arrives intact, every send gives back the same
//! allocation, and once all finished nothing holds it any more.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use ucp::{AmFlags, Features, Issued, Request};

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

ucp_test!(tag_lent, am_lent);
