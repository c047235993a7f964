//! `RUCX_TCP_DIRECT_READS` (`uct-tcp/src/read_tuner.rs`): request/reply exchanges arrive
//! complete and in order whether progress reads the lone connection directly, after epoll, or
//! as measured (auto: timed trials with both ways drawn at random, then a choice, then another
//! trial). One test function: it changes the process environment.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use uct::*;

const REQ: u8 = 7;
const REP: u8 = 8;

/// More exchanges than one trial and the waits between two (128 + 4096), so auto runs a
/// trial, keeps a way, and starts the next trial.
const EXCHANGES: u64 = 4400;

fn recorder(iface: &Iface, id: u8) -> Rc<RefCell<Vec<Vec<u8>>>> {
    let rec: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let r = rec.clone();
    iface
        .set_am_handler(id, AmCbFlags::SYNC, move |m| {
            r.borrow_mut().push(m.data().to_vec())
        })
        .unwrap();
    rec
}

/// Request `i`: sizes from 0 to 8000 bytes, short and bcopy.
fn send(p: &Pair, ep: &Ep, id: u8, i: u64) {
    let len = [0usize, 8, 100, 2000, 8000][(i % 5) as usize];
    let data = pattern(len, i ^ u64::from(id));
    if len <= 2000 {
        p.retry("am_short", || ep.am_short(id, i, &data)).unwrap();
    } else {
        p.retry("am_bcopy", || {
            ep.am_bcopy(id, |b| {
                b[..8].copy_from_slice(&i.to_le_bytes());
                b[8..8 + len].copy_from_slice(&data);
                8 + len
            })
        })
        .unwrap();
    }
}

fn check(m: &[u8], id: u8, i: u64) {
    let len = [0usize, 8, 100, 2000, 8000][(i % 5) as usize];
    assert_eq!(m[..8], i.to_le_bytes(), "message {i} out of order");
    assert_eq!(
        &m[8..],
        &pattern(len, i ^ u64::from(id))[..],
        "message {i} corrupt"
    );
}

fn ping_pong(setting: &str) {
    std::env::set_var("RUCX_TCP_DIRECT_READS", setting);
    // Two interfaces, one connection each: the case direct reads are for.
    let p = Pair::new(Model::Ep, false);
    let back = p.back.clone().unwrap();
    let reqs = recorder(&p.b.iface, REQ);
    let reps = recorder(&p.a.iface, REP);
    for i in 0..EXCHANGES {
        send(&p, &p.ep, REQ, i);
        p.wait("request", || reqs.borrow().len() == 1);
        check(&reqs.borrow_mut().pop().unwrap(), REQ, i);
        send(&p, &back, REP, i);
        p.wait("reply", || reps.borrow().len() == 1);
        check(&reps.borrow_mut().pop().unwrap(), REP, i);
    }
    assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
    std::env::remove_var("RUCX_TCP_DIRECT_READS");
}

#[test]
fn exchanges_arrive_with_every_setting() {
    for setting in ["y", "n", "auto"] {
        ping_pong(setting);
    }
}
