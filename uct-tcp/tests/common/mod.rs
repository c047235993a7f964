//! Helpers of the tcp transport's tests: contexts with the tcp module linked in, entities on
//! `lo`, connected pairs in both connection models, and progress-until with a deadline.
#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use uct::*;

pub const DEADLINE: Duration = Duration::from_secs(20);

pub fn ctx() -> Context {
    Context::builder()
        .builtin(uct_tcp::module())
        .plugins(false)
        .build()
}

pub type Errors = Rc<RefCell<Vec<(EpKey, Status)>>>;

pub struct Side {
    pub md: Md,
    pub worker: Worker,
    pub iface: Iface,
    pub errors: Errors,
}

pub fn worker() -> Worker {
    Worker::new(AsyncMode::Poll, ThreadMode::Single).unwrap()
}

pub fn side(ctx: &Context, worker: &Worker) -> Side {
    let (md0, _) = ctx.find_resource("tcp", "lo").expect("tcp on lo");
    let md = md0.component().md_open(md0.name()).unwrap();
    let errors: Errors = Rc::default();
    let e = errors.clone();
    let params = IfaceParams::new("tcp", "lo").err_handler(move |k, s| e.borrow_mut().push((k, s)));
    let iface = Iface::open(&md, worker, params).unwrap();
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    Side {
        md,
        worker: worker.clone(),
        iface,
        errors,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Model {
    Iface,
    Ep,
}

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub ep: Rc<Ep>,
    pub back: Option<Rc<Ep>>,
    pub shared: bool,
}

impl Pair {
    pub fn new(model: Model, shared_worker: bool) -> Pair {
        let c = ctx();
        let w1 = worker();
        let w2 = if shared_worker { w1.clone() } else { worker() };
        let a = side(&c, &w1);
        let b = side(&c, &w2);
        let (ep, back) = connect(&a, &b, model);
        Pair {
            a,
            b,
            ep,
            back,
            shared: shared_worker,
        }
    }

    pub fn progress(&self) -> u32 {
        let mut n = self.a.worker.progress();
        if !self.shared {
            n += self.b.worker.progress();
        }
        n
    }

    pub fn wait(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            self.progress();
        }
    }

    pub fn retry<T>(&self, what: &str, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        loop {
            match op() {
                Err(Status::NoResource) => {
                    assert!(start.elapsed() < DEADLINE, "{what}: NoResource for too long");
                    self.progress();
                }
                r => return r,
            }
        }
    }

    /// Waits for an operation that returned `r` with `comp`; returns the final status.
    pub fn finish(&self, r: Result<Status>, comp: &Completion) -> Status {
        match r {
            Ok(Status::Ok) => Status::Ok,
            Ok(Status::InProgress) => {
                self.wait("completion", || comp.fired() > 0);
                comp.last_status()
            }
            Ok(s) => s,
            Err(e) => e,
        }
    }

    pub fn record(&self, id: u8) -> Rc<RefCell<Vec<Vec<u8>>>> {
        let rec: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
        let r = rec.clone();
        self.b
            .iface
            .set_am_handler(id, AmCbFlags::SYNC, move |m| {
                r.borrow_mut().push(m.data().to_vec())
            })
            .unwrap();
        rec
    }

    /// Registered memory on `b` and `a`'s rkey for it.
    pub fn remote(&self, len: usize, fill: u8) -> (Mem, Rkey) {
        let mem = Mem::alloc(&self.b.md, len, MemAccess::ALL).unwrap();
        mem.fill(fill);
        let rkey = self
            .a
            .md
            .component()
            .rkey_unpack(&mem.pack_rkey().unwrap())
            .unwrap();
        (mem, rkey)
    }

    pub fn local(&self, len: usize, fill: u8) -> Mem {
        let mem = Mem::alloc(&self.a.md, len, MemAccess::ALL).unwrap();
        mem.fill(fill);
        mem
    }

    pub fn flush(&self) {
        let c = Completion::counter();
        let r = self.retry("flush", || self.ep.flush(FlushFlags::LOCAL, Some(&c)));
        assert_eq!(self.finish(r, &c), Status::Ok);
    }
}

/// Connects `a` to `b` in `model`; returns a's endpoint (and b's, for connect-to-ep).
pub fn connect(a: &Side, b: &Side, model: Model) -> (Rc<Ep>, Option<Rc<Ep>>) {
    let bdev = b.iface.device_address().unwrap();
    assert!(a.iface.is_reachable(&bdev, &b.iface.address().unwrap()));
    match model {
        Model::Iface => (
            Rc::new(
                a.iface
                    .ep_create_connected(&bdev, &b.iface.address().unwrap())
                    .unwrap(),
            ),
            None,
        ),
        Model::Ep => {
            let adev = a.iface.device_address().unwrap();
            let ea = a.iface.ep_create().unwrap();
            let eb = b.iface.ep_create().unwrap();
            let (aa, ba) = (ea.address().unwrap(), eb.address().unwrap());
            ea.connect_to_ep(&bdev, &ba).unwrap();
            eb.connect_to_ep(&adev, &aa).unwrap();
            (Rc::new(ea), Some(Rc::new(eb)))
        }
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (len as u64) ^ 0x5555;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
