//! Memory and remote memory access (UCP's RMA and AMO features): mapping memory
//! ([`MemHandle`]), remote keys ([`RemoteKey`]), put and get ([`crate::Ep::put`],
//! [`crate::Ep::get`]) and atomics ([`crate::Ep::atomic_post`], [`crate::Ep::atomic_fetch`],
//! [`crate::Ep::atomic_cswap`]).
//!
//! Every operation is an operation (`RmaOp`) in the endpoint's send queue: it waits there while the
//! lanes are not wired or out of resources, and goes in order with what was issued before it,
//! so a flush queued after it covers it.

pub(crate) mod atomic;
mod mem;
mod put_get;
pub(crate) mod rkey;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use ucs::{Error, Result};

use crate::ep::EpInner;

pub use atomic::{AtomicOp, AtomicWidth};
pub use mem::MemHandle;
pub use put_get::RmaProto;
pub use rkey::RemoteKey;

/// A queued RMA or atomic operation.
pub(crate) enum RmaOp {
    Xfer(put_get::Xfer),
    Amo(atomic::AmoOp),
}

impl RmaOp {
    /// The lane whose resources it waits for.
    pub fn lane(&self) -> usize {
        match self {
            RmaOp::Xfer(x) => x.lane,
            RmaOp::Amo(a) => a.lane,
        }
    }

    /// Issues what it can: `Ok(true)` when all of it was handed to the lane, `Ok(false)` when
    /// the lane is out of resources.
    pub fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        match self {
            RmaOp::Xfer(x) => x.progress(ep),
            RmaOp::Amo(a) => a.progress(ep),
        }
    }

    /// After the last `progress` (or instead, when the endpoint failed).
    pub fn finish(self, r: Result<()>) {
        match self {
            RmaOp::Xfer(x) => x.finish(r),
            RmaOp::Amo(a) => a.finish(r),
        }
    }
}

type Waiter = Rc<dyn Fn()>;

/// An endpoint's operations that complete in several rounds (emulated atomics): a flush
/// issued while one is between rounds waits for it.
#[derive(Default)]
pub(crate) struct EpRma {
    next: Cell<u64>,
    live: RefCell<HashMap<u64, Vec<Waiter>>>,
    /// Words an emulated op works on, with the ops waiting for them (in issue order).
    pub words: RefCell<HashMap<u64, std::collections::VecDeque<atomic::AmoOp>>>,
}

impl EpRma {
    /// Registers a multi-round operation; returns its id.
    pub fn start(&self) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        self.live.borrow_mut().insert(id, Vec::new());
        id
    }

    /// The operation `id` completed: runs the flushes waiting for it.
    pub fn end(&self, id: u64) {
        let waiters = self.live.borrow_mut().remove(&id).unwrap_or_default();
        for w in waiters {
            w();
        }
    }

    /// Makes `f` run when each operation now live completes; returns how many there are.
    pub fn watch(&self, f: Waiter) -> usize {
        let mut live = self.live.borrow_mut();
        for w in live.values_mut() {
            w.push(f.clone());
        }
        live.len()
    }
}

/// Counts the pieces of one operation in flight and finishes it once, when all were issued
/// and completed, with the first error.
pub(crate) struct Track {
    outstanding: Cell<usize>,
    all_issued: Cell<bool>,
    error: RefCell<Option<Error>>,
    done: RefCell<Option<TrackDone>>,
}

type TrackDone = Box<dyn FnOnce(Result<()>)>;

impl Track {
    pub fn new(done: impl FnOnce(Result<()>) + 'static) -> Rc<Track> {
        Rc::new(Track {
            outstanding: Cell::new(0),
            all_issued: Cell::new(false),
            error: RefCell::new(None),
            done: RefCell::new(Some(Box::new(done))),
        })
    }

    /// A completion for one piece; count it with [`Track::in_flight`] when it was accepted
    /// as `InProgress`.
    pub fn completion(self: &Rc<Self>) -> uct::Completion {
        let t = self.clone();
        uct::Completion::new(move |st| {
            if st.is_err() {
                t.error.borrow_mut().get_or_insert_with(|| st.into());
            }
            t.outstanding.set(t.outstanding.get() - 1);
            t.check();
        })
    }

    pub fn in_flight(&self) {
        self.outstanding.set(self.outstanding.get() + 1);
    }

    /// Nothing more will be issued (`Err`: the rest failed).
    pub fn issued(&self, r: Result<()>) {
        if let Err(e) = r {
            self.error.borrow_mut().get_or_insert(e);
        }
        self.all_issued.set(true);
        self.check();
    }

    fn check(&self) {
        if !self.all_issued.get() || self.outstanding.get() != 0 {
            return;
        }
        let Some(done) = self.done.borrow_mut().take() else {
            return;
        };
        match self.error.borrow_mut().take() {
            Some(e) => done(Err(e)),
            None => done(Ok(())),
        }
    }
}

/// The worker of `ep`, or the error an operation gets when it is gone.
pub(crate) fn worker_of(ep: &EpInner) -> Result<Rc<crate::worker::WorkerInner>> {
    ep.worker
        .upgrade()
        .ok_or_else(|| Error::new(ucs::Status::NotConnected, "ucp: the worker is gone"))
}

/// `Unsupported` unless the context was built with one of `features`.
pub(crate) fn require(
    w: &crate::worker::WorkerInner,
    features: &[crate::Features],
    names: &str,
    what: &str,
) -> Result<()> {
    let have = w.ctx.features();
    if features.iter().any(|f| have.contains(*f)) {
        return Ok(());
    }
    Err(Error::new(
        ucs::Status::Unsupported,
        format!("ucp: {what}: the context was built without {names} (ContextBuilder::features)"),
    ))
}

/// Queues `op` on `ep` and sends what the lanes take.
pub(crate) fn submit(ep: &Rc<EpInner>, op: RmaOp) {
    ep.queue.borrow_mut().push_back(crate::proto::op::SendOp::rma(op));
    ep.dispatch();
}
