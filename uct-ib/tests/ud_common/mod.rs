//! Shared by the ud_verbs tests (`tests/ud_*.rs`): opening interfaces on the first RDMA
//! device, connecting them both ways, progressing, recording messages.
#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use uct::*;

pub const TL: &str = "ud_verbs";
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Sets environment variables until dropped (the interfaces read them when they open).
pub struct Env(Vec<(String, Option<String>)>);

impl Env {
    pub fn set(vars: &[(&str, &str)]) -> Env {
        let saved = vars
            .iter()
            .map(|(k, v)| {
                let old = std::env::var(k).ok();
                std::env::set_var(k, v);
                (k.to_string(), old)
            })
            .collect();
        Env(saved)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}

/// The context and the ud_verbs device to use, or `None` (and "skipped") without one.
pub fn context() -> Option<(Context, String)> {
    let ctx = Context::builder()
        .builtin(uct_ib::module())
        .plugins(false)
        .build();
    let want = std::env::var("RUCX_IB_DEVICE").ok();
    let res = ctx.resources().expect("resources");
    let dev = res
        .iter()
        .filter(|(_, r)| r.tl_name.as_str() == TL)
        .map(|(_, r)| r.dev_name.as_str().to_owned())
        .find(|d| want.as_ref().is_none_or(|w| d.starts_with(&format!("{w}:"))));
    match dev {
        Some(d) => Some((ctx, d)),
        None => {
            println!("skipped: no RDMA device");
            None
        }
    }
}

pub type Errors = Rc<RefCell<Vec<(EpKey, Status)>>>;

/// One interface with its worker.
pub struct Side {
    pub md: Md,
    pub worker: Worker,
    pub iface: Iface,
    pub errors: Errors,
}

pub fn side(ctx: &Context, dev: &str) -> Side {
    let (md, _) = ctx.find_resource(TL, dev).expect("find resource");
    let worker = Worker::new(AsyncMode::Poll, ThreadMode::Single).expect("worker");
    let errors: Errors = Rc::default();
    let log = errors.clone();
    let params = IfaceParams::new(TL, dev).err_handler(move |k, s| log.borrow_mut().push((k, s)));
    let iface = Iface::open(&md, &worker, params).expect("iface open");
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    Side {
        md,
        worker,
        iface,
        errors,
    }
}

/// Endpoint to endpoint, both ways.
pub fn connect_ep(a: &Side, b: &Side) -> (Ep, Ep) {
    let ab = a.iface.ep_create().expect("ep_create a");
    let ba = b.iface.ep_create().expect("ep_create b");
    let (da, db) = (
        a.iface.device_address().unwrap(),
        b.iface.device_address().unwrap(),
    );
    assert!(a.iface.is_reachable(&db, &b.iface.address().unwrap()));
    ab.connect_to_ep(&db, &ba.address().unwrap())
        .expect("connect a->b");
    ba.connect_to_ep(&da, &ab.address().unwrap())
        .expect("connect b->a");
    (ab, ba)
}

/// Endpoint to interface (the peer creates its side from the connection request).
pub fn connect_iface(a: &Side, b: &Side) -> Ep {
    a.iface
        .ep_create_connected(&b.iface.device_address().unwrap(), &b.iface.address().unwrap())
        .expect("ep_create_connected")
}

/// Progresses `sides` until `cond` holds (panics after [`DEADLINE`]).
pub fn wait(sides: &[&Side], what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        for s in sides {
            s.worker.progress();
        }
    }
}

/// Runs `op` until it stops returning `NoResource`, progressing `sides` in between.
pub fn retry<T>(sides: &[&Side], what: &str, mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        match op() {
            Err(Status::NoResource) => {
                assert!(start.elapsed() < DEADLINE, "{what}: NoResource for {DEADLINE:?}");
                for s in sides {
                    s.worker.progress();
                }
            }
            r => return r,
        }
    }
}

pub type Rec = Rc<RefCell<Vec<Vec<u8>>>>;

/// Records every message of AM `id` arriving at `s`.
pub fn record(s: &Side, id: u8) -> Rec {
    let rec: Rec = Rc::default();
    let r = rec.clone();
    s.iface
        .set_am_handler(id, AmCbFlags::SYNC, move |m| {
            r.borrow_mut().push(m.data().to_vec())
        })
        .unwrap();
    rec
}

/// Flushes `ep` and waits for the completion.
pub fn flush(sides: &[&Side], ep: &Ep) {
    let c = Completion::counter();
    match retry(sides, "flush", || ep.flush(FlushFlags::LOCAL, Some(&c))) {
        Ok(Status::Ok) => assert_eq!(c.fired(), 0),
        Ok(Status::InProgress) => {
            wait(sides, "flush completion", || c.fired() > 0);
            assert_eq!(c.last_status(), Status::Ok);
        }
        other => panic!("flush: {other:?}"),
    }
}

/// Sends `n` numbered messages on `ep` (am_short and am_bcopy alternately, some of them
/// long), retrying on `NoResource`.
pub fn send_numbered(sides: &[&Side], ep: &Ep, id: u8, n: u64, max_bcopy: usize) {
    for i in 0..n {
        let long = (i % 7) as usize * (max_bcopy / 8);
        if i % 2 == 0 {
            let payload = vec![(i % 251) as u8; long.saturating_sub(8)];
            retry(sides, "am_short", || ep.am_short(id, i, &payload)).unwrap();
        } else {
            retry(sides, "am_bcopy", || {
                ep.am_bcopy(id, |b| {
                    let len = long.clamp(8, b.len());
                    b[..8].copy_from_slice(&i.to_le_bytes());
                    b[8..len].fill((i % 251) as u8);
                    len
                })
            })
            .unwrap();
        }
    }
}

/// Checks that `rec` holds exactly the messages 0..n of [`send_numbered`], in order.
pub fn check_numbered(rec: &Rec, n: u64, max_bcopy: usize) {
    let got = rec.borrow();
    assert_eq!(got.len() as u64, n, "message count");
    for (i, m) in got.iter().enumerate() {
        let i = i as u64;
        let seq = u64::from_le_bytes(m[..8].try_into().unwrap());
        assert_eq!(seq, i, "message {i} out of order or duplicated");
        let long = (i % 7) as usize * (max_bcopy / 8);
        assert_eq!(m.len(), long.max(8), "message {i} length");
        assert!(
            m[8..].iter().all(|&b| b == (i % 251) as u8),
            "message {i} payload"
        );
    }
}
