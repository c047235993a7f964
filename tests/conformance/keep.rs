//! Handlers that keep received data beyond the handler (`m.keep()`, UCX's INPROGRESS + later
//! `uct_iface_release_desc`): kept data stays intact while later messages arrive and after other
//! kept data is released (UCX `am_*_keep_data`, `many2one_am`).

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::data::{assert_bytes, pattern};
use rucx_testkit::{Pair, Recorder, Setup};
use uct::{IfaceFlags, RxDesc};

const ID: u8 = 9;

type Kept = Rc<RefCell<Vec<(usize, RxDesc)>>>;
/// Contract violations seen inside the handler (a panic there would only drop the message).
type Problems = Rc<RefCell<Vec<String>>>;

/// Installs a handler that keeps every third message (and checks that keeping twice hands out
/// a copy of the same bytes) and copies the others.
fn keeper(p: &Pair) -> (Kept, Recorder, Problems) {
    let kept: Kept = Rc::default();
    let all: Recorder = Rc::default();
    let problems: Problems = Rc::default();
    let (k, a, pr) = (kept.clone(), all.clone(), problems.clone());
    p.rx.iface
        .set_am_handler(ID, p.am_flags(), move |m| {
            let i = a.borrow().len();
            a.borrow_mut().push(m.data().to_vec());
            if i % 3 == 0 {
                let d = m.keep();
                if i % 6 == 0 {
                    let again = m.keep();
                    if again.is_zero_copy() {
                        pr.borrow_mut()
                            .push(format!("message {i}: a second keep() lent the descriptor again"));
                    }
                    if *again != *d {
                        pr.borrow_mut()
                            .push(format!("message {i}: a second keep() returned other bytes"));
                    }
                }
                k.borrow_mut().push((i, d));
            }
        })
        .unwrap();
    (kept, all, problems)
}

fn check_kept(p: &Pair, kept: &Kept, want: &dyn Fn(usize) -> Vec<u8>, when: &str) {
    for (i, d) in kept.borrow().iter() {
        assert_bytes(&format!("[{}] kept message {i} {when}", p.name()), d, &want(*i));
    }
}

/// Sends `count` messages with `send(i)`, releasing every other kept message halfway through;
/// checks kept data after later messages arrived and after releases.
fn run(p: &Pair, count: usize, send: &dyn Fn(usize), want: &dyn Fn(usize) -> Vec<u8>) {
    let (kept, all, problems) = keeper(p);
    for i in 0..count / 2 {
        send(i);
    }
    p.wait_msgs(&all, count / 2, "kept");
    check_kept(p, &kept, want, "after later messages");
    // Release every other kept descriptor, out of arrival order.
    let mut k = kept.borrow_mut();
    let mut j = 0;
    k.retain(|_| {
        j += 1;
        j % 2 == 0
    });
    drop(k);
    for i in count / 2..count {
        send(i);
    }
    p.wait_msgs(&all, count, "kept");
    check_kept(p, &kept, want, "after releases and more messages");
    for (i, m) in all.borrow().iter().enumerate() {
        assert_bytes(&format!("[{}] message {i}", p.name()), m, &want(i));
    }
    assert!(
        problems.borrow().is_empty(),
        "[{}] {:?}",
        p.name(),
        problems.borrow()
    );
    // Release everything while the interface is still open (a kept descriptor must not
    // outlive its interface).
    kept.borrow_mut().clear();
}

fn am_short_keep_data(s: &Setup) {
    let p = s.pair();
    if !p.attr().flags.contains(IfaceFlags::AM_SHORT) {
        p.skip("am_short_keep_data: no AM_SHORT");
        return;
    }
    let max = (p.attr().am.max_short - 8).min(256);
    let want = move |i: usize| {
        let mut v = (i as u64).to_le_bytes().to_vec();
        v.extend(pattern(i % (max + 1), i as u64));
        v
    };
    let ep = p.ep().clone();
    let send = |i: usize| {
        let w = want(i);
        p.retry("am_short", || ep.am_short(ID, i as u64, &w[8..]))
            .unwrap();
    };
    run(&p, 60, &send, &want);
}

fn am_bcopy_keep_data(s: &Setup) {
    let p = s.pair();
    if !p.attr().flags.contains(IfaceFlags::AM_BCOPY) {
        p.skip("am_bcopy_keep_data: no AM_BCOPY");
        return;
    }
    let max = p.attr().am.max_bcopy;
    let want = move |i: usize| pattern((i * 997) % (max + 1), i as u64);
    let ep = p.ep().clone();
    let send = |i: usize| {
        let w = want(i);
        let r = p.retry("am_bcopy", || {
            ep.am_bcopy(ID, |b| {
                b[..w.len()].copy_from_slice(&w);
                w.len()
            })
        });
        assert_eq!(r, Ok(w.len()), "[{}] am_bcopy {i}", p.name());
    };
    run(&p, 90, &send, &want);
}

conformance_test!(am_short_keep_data, am_bcopy_keep_data);
