//! A sender entity with an endpoint to a receiver entity (and the receiver's endpoint back, in
//! the connect-to-ep model), on one worker or two, and what tests do with it: progress both,
//! wait, retry, check completions, flush, register memory on either side, record messages.

use std::rc::Rc;
use std::time::Duration;

use uct::{
    AmCbFlags, Completion, Ep, EpKey, FlushFlags, IfaceAttr, IfaceFlags, Mem, MemAccess, Outcome, Rkey,
    Status,
};

use crate::am::{self, Recorder};
use crate::entity::Entity;
use crate::wait::{self, Progress};

/// Connection model (`UCT_IFACE_FLAG_CONNECT_TO_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connect {
    ToIface,
    ToEp,
}

/// Whether sender and receiver interfaces share a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    Shared,
    Separate,
}

/// `tl/dev` of an entity, for messages.
fn label(e: &Entity) -> String {
    format!("{}/{}", e.iface.tl_name(), e.iface.dev_name())
}

/// An endpoint of `tx` connected to `rx`'s interface (connect-to-iface), which must be
/// reachable.
pub fn connect_to_iface(tx: &Entity, rx: &Entity) -> Ep {
    let n = label(tx);
    assert!(
        tx.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE),
        "[{n}] connecting to an interface, but the transport lacks CONNECT_TO_IFACE"
    );
    let dev = rx
        .iface
        .device_address()
        .unwrap_or_else(|e| panic!("[{n}] device_address: {e}"));
    let addr = rx
        .iface
        .address()
        .unwrap_or_else(|e| panic!("[{n}] iface address: {e}"));
    assert!(
        tx.iface.is_reachable(&dev, &addr),
        "[{n}] receiver not reachable from sender"
    );
    tx.iface
        .ep_create_connected(&dev, &addr)
        .unwrap_or_else(|e| panic!("[{n}] ep_create_connected: {e}"))
}

/// An endpoint of `tx` and one of `rx`, connected to each other (connect-to-ep).
pub fn connect_to_ep(tx: &Entity, rx: &Entity) -> (Ep, Ep) {
    let n = label(tx);
    assert!(
        tx.attr().flags.contains(IfaceFlags::CONNECT_TO_EP),
        "[{n}] connecting endpoints, but the transport lacks CONNECT_TO_EP"
    );
    let addr = |e: &Entity| {
        let dev = e
            .iface
            .device_address()
            .unwrap_or_else(|err| panic!("[{n}] device_address: {err}"));
        let iface = e
            .iface
            .address()
            .unwrap_or_else(|err| panic!("[{n}] iface address: {err}"));
        (dev, iface)
    };
    let (tx_dev, _) = addr(tx);
    let (rx_dev, rx_iface) = addr(rx);
    assert!(
        tx.iface.is_reachable(&rx_dev, &rx_iface),
        "[{n}] receiver not reachable from sender"
    );
    let a = tx
        .iface
        .ep_create()
        .unwrap_or_else(|e| panic!("[{n}] ep_create (sender): {e}"));
    let b = rx
        .iface
        .ep_create()
        .unwrap_or_else(|e| panic!("[{n}] ep_create (receiver): {e}"));
    let a_addr = a.address().unwrap_or_else(|e| panic!("[{n}] ep address: {e}"));
    let b_addr = b.address().unwrap_or_else(|e| panic!("[{n}] ep address: {e}"));
    a.connect_to_ep(&rx_dev, &b_addr)
        .unwrap_or_else(|e| panic!("[{n}] connect_to_ep (sender): {e}"));
    b.connect_to_ep(&tx_dev, &a_addr)
        .unwrap_or_else(|e| panic!("[{n}] connect_to_ep (receiver): {e}"));
    (a, b)
}

/// An endpoint of `tx` to `rx` in model `connect`, and `rx`'s endpoint back for connect-to-ep.
pub fn connect(tx: &Entity, rx: &Entity, connect: Connect) -> (Ep, Option<Ep>) {
    match connect {
        Connect::ToIface => (connect_to_iface(tx, rx), None),
        Connect::ToEp => {
            let (a, b) = connect_to_ep(tx, rx);
            (a, Some(b))
        }
    }
}

/// Registered memory on the receiver and the rkey the sender uses for it.
pub struct Remote {
    pub mem: Mem,
    pub rkey: Rkey,
}

impl Remote {
    /// Remote address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.mem.addr() + off as u64
    }
}

/// A connected sender and receiver (made by [`crate::Setup::pair`]).
pub struct Pair {
    name: &'static str,
    pub tx: Entity,
    pub rx: Entity,
    connect: Connect,
    workers: Workers,
    deadline: Duration,
    ep: Option<Rc<Ep>>,
    back: Option<Rc<Ep>>,
}

impl Progress for Pair {
    /// One round of progress on both workers (once when they are shared).
    fn progress(&self) -> u32 {
        let mut n = self.tx.worker.progress();
        if self.workers == Workers::Separate {
            n += self.rx.worker.progress();
        }
        n
    }
}

impl Pair {
    /// Connects `tx` to `rx` in model `connect`; `workers` says whether they share a worker.
    pub fn new(
        name: &'static str,
        tx: Entity,
        rx: Entity,
        connect: Connect,
        workers: Workers,
        deadline: Duration,
    ) -> Pair {
        let mut p = Pair {
            name,
            tx,
            rx,
            connect,
            workers,
            deadline,
            ep: None,
            back: None,
        };
        let (ep, back) = p.connect();
        p.ep = Some(ep);
        p.back = back;
        p
    }

    /// The sender's endpoint.
    pub fn ep(&self) -> &Rc<Ep> {
        self.ep.as_ref().expect("connected")
    }

    /// The receiver's endpoint back to the sender (connect-to-ep model only).
    pub fn back(&self) -> Option<&Rc<Ep>> {
        self.back.as_ref()
    }

    /// The sender's interface attributes.
    pub fn attr(&self) -> &IfaceAttr {
        self.tx.attr()
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How long its waits may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Prints why (part of) a test does not run here.
    pub fn skip(&self, what: &str) {
        println!("SKIP [{}] {what}", self.name);
    }

    /// True when the sender advertises `flag`; prints a skip note otherwise.
    pub fn supports(&self, flag: IfaceFlags, what: &str) -> bool {
        let yes = self.attr().flags.contains(flag);
        if !yes {
            self.skip(&format!("{what}: no {flag:?}; checking it returns Unsupported"));
        }
        yes
    }

    /// Handler flags the receiver accepts: sync when it has `CB_SYNC`.
    pub fn am_flags(&self) -> AmCbFlags {
        am::cb_flags(self.rx.attr())
    }

    /// Connects a new endpoint from the sender to the receiver (and back, for connect-to-ep).
    pub fn connect(&self) -> (Rc<Ep>, Option<Rc<Ep>>) {
        let (ep, back) = connect(&self.tx, &self.rx, self.connect);
        (Rc::new(ep), back.map(Rc::new))
    }

    /// One round of progress on both workers (once when they are shared).
    pub fn progress(&self) -> u32 {
        Progress::progress(self)
    }

    /// Progresses until `cond` holds; fails after the deadline.
    pub fn wait_for(&self, what: &str, cond: impl FnMut() -> bool) {
        wait::wait_for(self, self.deadline, &format!("[{}] {what}", self.name), cond)
    }

    /// Runs `op` until it returns anything but `Err(NoResource)`, progressing in between.
    pub fn retry<T>(&self, what: &str, op: impl FnMut() -> uct::Result<T>) -> uct::Result<T> {
        wait::retry(self, self.deadline, &format!("[{}] {what}", self.name), op)
    }

    /// Runs an operation that takes a completion (retrying `NoResource`), requires success and
    /// waits for it: `Ok(Done)` must leave the completion untouched, `Ok(InProgress)` must fire
    /// it once with `Ok`.
    pub fn complete(&self, what: &str, op: impl FnMut(&Completion) -> uct::Result<Outcome>) {
        wait::complete(self, self.deadline, &format!("[{}] {what}", self.name), op)
    }

    /// The completion contract for one operation's result `r` on a fresh `comp`.
    pub fn check_completion(&self, what: &str, comp: &Completion, r: uct::Result<Outcome>) {
        wait::check_completion(self, self.deadline, &format!("[{}] {what}", self.name), comp, r)
    }

    /// What an operation that returned `r` with `comp` ended with (see [`wait::outcome`]).
    pub fn outcome(&self, r: uct::Result<Outcome>, comp: &Completion) -> Status {
        wait::outcome(self, self.deadline, r, comp)
    }

    /// Flushes the sender's endpoint (local completion) and waits for it.
    pub fn flush_ep(&self) {
        let ep = self.ep().clone();
        self.complete("ep flush", |c| ep.flush(FlushFlags::LOCAL, Some(c)));
    }

    /// Waits until everything the sender's endpoint started has completed at the target
    /// (`FlushFlags::REMOTE`; a plain local flush where remote flush is Unsupported).
    pub fn quiesce(&self) {
        let ep = self.ep().clone();
        let c = Completion::counter();
        let r = self.retry("ep flush (remote)", || ep.flush(FlushFlags::REMOTE, Some(&c)));
        if r == Err(Status::Unsupported.into()) {
            self.flush_ep();
        } else {
            self.check_completion("ep flush (remote)", &c, r);
        }
    }

    /// `len` bytes registered on the receiver (filled with `fill`), with the sender's rkey.
    pub fn remote_mem(&self, len: usize, fill: u8) -> Remote {
        let n = self.name;
        let mem =
            Mem::alloc(&self.rx.md, len, MemAccess::ALL).unwrap_or_else(|e| panic!("[{n}] Mem::alloc: {e}"));
        mem.fill(fill);
        let packed = mem.pack_rkey().unwrap_or_else(|e| panic!("[{n}] pack_rkey: {e}"));
        let rkey = self
            .tx
            .md
            .component()
            .rkey_unpack(&packed)
            .unwrap_or_else(|e| panic!("[{n}] rkey_unpack: {e}"));
        Remote { mem, rkey }
    }

    /// `len` bytes registered on the sender, filled with `fill`.
    pub fn local_mem(&self, len: usize, fill: u8) -> Mem {
        let mem = Mem::alloc(&self.tx.md, len, MemAccess::ALL)
            .unwrap_or_else(|e| panic!("[{}] Mem::alloc: {e}", self.name));
        mem.fill(fill);
        mem
    }

    /// Installs a handler for AM `id` on the receiver that records every message.
    pub fn record_am(&self, id: u8) -> Recorder {
        am::record(&self.rx.iface, id)
    }

    /// Waits until `rec` holds `n` messages; more is a failure.
    pub fn wait_msgs(&self, rec: &Recorder, n: usize, what: &str) {
        self.wait_for(
            &format!("{n} {what} messages (have {})", rec.borrow().len()),
            || rec.borrow().len() >= n,
        );
        assert_eq!(
            rec.borrow().len(),
            n,
            "[{}] {what}: more messages than sent",
            self.name
        );
    }

    /// Everything the error handlers of both sides received.
    pub fn errors(&self) -> Vec<(EpKey, Status)> {
        let mut v = self.tx.errors.borrow().clone();
        v.extend(self.rx.errors.borrow().iter().copied());
        v
    }

    /// Fails the test when either side's error handler was called.
    pub fn no_errors(&self) {
        assert_eq!(self.errors(), vec![], "[{}] error handler called", self.name);
    }

    /// The sender, the receiver, the sender's endpoint and the receiver's endpoint back.
    pub fn into_parts(mut self) -> (Entity, Entity, Rc<Ep>, Option<Rc<Ep>>) {
        let (ep, back) = (self.ep.take().expect("connected"), self.back.take());
        (self.tx, self.rx, ep, back)
    }

    /// Destroys the receiver side (its endpoint, interface and, if separate, worker) and returns
    /// the sender with its endpoint, to observe peer failure.
    pub fn into_sender(self) -> (Entity, Rc<Ep>) {
        let (tx, rx, ep, back) = self.into_parts();
        drop(back);
        drop(rx);
        (tx, ep)
    }
}
