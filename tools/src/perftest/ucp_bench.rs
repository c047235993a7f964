//! `ucx_perftest`'s UCP tests on rucx's protocol layer: the same patterns as UCX's
//! `ucp_tests.cc` — ping-pong (side 0 sends first, side 1 answers) and uni-directional streams
//! (side 1 sends with up to `-O` operations outstanding, side 0 receives with up to `-O`
//! receives posted) — over one `ucp::Ep` whose transports `RUCX_TLS` chooses.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use ucp::{AmFlags, Context, Ep, Features, Issued, Request, Worker};
use ucs::{Error, Result, Status};

use super::measure::Perf;
use super::params::{AsyncKind, Params, TestType};
use super::rte::{self, Rte};
use super::ucp_rma::{Pending, Rma, RmaOp};
use super::watch::PeerWatch;

/// UCX's tag for the tag tests.
const TAG: u64 = 0x1337_a880;
/// The AM id of the AM tests.
const AM_ID: u16 = 1;

/// What a test moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Tag,
    TagSync,
    Am,
    Stream,
    Rma(RmaOp),
}

impl Op {
    fn of(name: &str) -> Option<Op> {
        Some(match name {
            "tag_lat" | "tag_bw" => Op::Tag,
            "tag_sync_lat" | "tag_sync_bw" => Op::TagSync,
            "ucp_am_lat" | "ucp_am_bw" => Op::Am,
            "stream_lat" | "stream_bw" => Op::Stream,
            _ => return RmaOp::of(name).map(Op::Rma),
        })
    }

    /// What the context needs (atomics by width: `-s 4` or `-s 8`; the sentinel is a put).
    fn features(self, len: usize) -> Features {
        match self {
            Op::Tag | Op::TagSync => Features::TAG,
            Op::Am => Features::AM,
            Op::Stream => Features::STREAM,
            Op::Rma(r) if r.is_atomic() => {
                Features::RMA
                    | if len == 4 {
                        Features::AMO32
                    } else {
                        Features::AMO64
                    }
            }
            Op::Rma(_) => Features::RMA,
        }
    }
}

/// Whether rucx-perftest runs UCP test `name`.
pub fn supported(name: &str) -> bool {
    Op::of(name).is_some()
}

/// Tag messages from this size are sent from the one lent send buffer (as ucx_perftest sends
/// from its buffer: read in place, zero-copy where the lane allows, no copy into a request).
const OWNED_MIN: usize = 8192;

/// The connected endpoint and the test's state.
pub struct UcpBench {
    op: Op,
    worker: Worker,
    ep: Ep,
    len: usize,
    window: usize,
    loopback: bool,
    sbuf: Vec<u8>,
    /// `sbuf` lent to every tag send in flight at once (messages of at least [`OWNED_MIN`]
    /// bytes).
    lent: std::sync::Arc<[u8]>,
    /// A spare receive buffer (tag and stream receives hand theirs back).
    rbuf: Option<Vec<u8>>,
    /// AM arrivals (eager, or rendezvous fetched), and payloads that failed `-V`.
    am_count: Rc<Cell<u64>>,
    /// AM arrivals waited for so far, over all runs (a message may arrive during the barrier
    /// before a run).
    am_seen: u64,
    bad: Rc<Cell<u64>>,
    validate: bool,
    /// The mapped buffers and the peer's key (RMA and atomic tests).
    rma: Option<Rma>,
    /// Ends every wait once the peer is gone.
    watch: PeerWatch,
}

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(13).wrapping_add(7)
}

impl UcpBench {
    /// Context, worker, address exchange and wireup (both sides wired before the barrier).
    pub fn new(p: &Params, rte: &mut Rte) -> Result<UcpBench> {
        let name = p.desc().name;
        let op = Op::of(name).ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                format!("rucx-perftest: UCP test {name} is not implemented yet"),
            )
        })?;
        let len = p.message_size();
        if op == Op::Stream && len == 0 {
            return Err(Error::new(
                Status::InvalidParam,
                "rucx-perftest: stream tests need a message size of at least 1 (-s)",
            ));
        }
        let ctx = Context::builder(rucx::context())
            .features(op.features(len))
            .build()?;
        let mode = match p.async_mode {
            AsyncKind::Thread => uct::AsyncMode::Thread,
            AsyncKind::Poll => uct::AsyncMode::Poll,
        };
        let worker = Worker::with_async_mode(&ctx, mode)?;
        rte.post(worker.address())?;
        let peer = rte.recv(1 << 20, &mut || {
            worker.progress();
        })?;
        let ep = worker.connect(&peer)?;
        let watch = rte.watch()?;
        let slot = watch.failure_slot();
        ep.set_error_handler(move |_, e| {
            let what = e.context().unwrap_or("the endpoint failed").to_owned();
            PeerWatch::fail(&slot, Error::new(e.status(), what))
        });
        let rma = match op {
            Op::Rma(r) => Some(Rma::new(r, len, &worker, &ep, rte)?),
            _ => None,
        };
        let am_count = Rc::new(Cell::new(0u64));
        let bad = Rc::new(Cell::new(0u64));
        if op == Op::Am {
            install_am_handler(&worker, len, p.validate, &am_count, &bad)?;
        }
        let b = UcpBench {
            op,
            worker,
            ep,
            len,
            window: p.max_outstanding.max(1) as usize,
            loopback: p.loopback,
            sbuf: (0..len).map(pattern).collect(),
            lent: (0..len).map(pattern).collect(),
            rbuf: Some(vec![0; len]),
            am_count,
            am_seen: 0,
            bad,
            validate: p.validate,
            rma,
            watch,
        };
        // Wired both ways before anything is measured: a message each way.
        b.wait(b.ep.flush())?;
        rte.barrier(&mut || {
            b.worker.progress();
        })?;
        Ok(b)
    }

    pub fn progress(&self) {
        self.worker.progress();
    }

    /// One turn of a loop that waits for the peer: progress, and an error once it is gone.
    #[inline(always)]
    fn turn(&self) -> Result<()> {
        self.worker.progress();
        self.watch.tick()
    }

    /// One measured (or warm-up) run of `perf`'s iterations.
    pub fn run(&mut self, p: &Params, perf: &mut Perf, rte: &mut Rte) -> Result<()> {
        let me = rte.group_index();
        if let Some(rma) = &mut self.rma {
            // Before the barrier: the peer writes only after it.
            rma.next_run();
            rma.set_last_byte(u8::MAX);
        }
        rte.barrier(&mut || self.progress())?;
        perf.start_clock();
        if self.rma.is_some() {
            let r = match p.desc().ty {
                TestType::PingPong => self.rma_pingpong(perf, me),
                TestType::StreamUni if self.loopback || me == 1 => self.rma_initiator(perf),
                TestType::StreamUni => self.rma_responder(),
            };
            perf.get_time();
            return r;
        }
        let r = match p.desc().ty {
            TestType::PingPong => self.pingpong(perf, me),
            TestType::StreamUni if self.loopback => self.stream_loopback(perf),
            TestType::StreamUni if me == 1 => self.stream_send(perf),
            TestType::StreamUni => self.stream_recv(perf),
        };
        perf.get_time();
        r
    }

    /// `-V`: the payloads that arrived different.
    pub fn validation_status(&self) -> Status {
        if self.bad.get() == 0 {
            Status::Ok
        } else {
            ucs::error!(bad = self.bad.get(), "received data differs from what was sent");
            Status::IoError
        }
    }

    fn wait<T>(&self, r: Result<Issued<T>>) -> Result<T> {
        match r? {
            Issued::Done(v) => Ok(v),
            Issued::Pending(mut q) => loop {
                if let Some(v) = q.take() {
                    return v;
                }
                self.turn()?;
            },
        }
    }

    /// Sends one message; `Some(request)` while it is still in flight.
    fn send(&self) -> Result<Option<Pending>> {
        let r = match self.op {
            Op::Tag if self.len >= OWNED_MIN => return self.send_owned(),
            Op::Tag => self.ep.tag_send(TAG, &self.sbuf),
            Op::TagSync => self.ep.tag_send_sync(TAG, &self.sbuf),
            Op::Am => self.ep.am_send(AM_ID, &[], &self.sbuf, AmFlags::default()),
            Op::Stream => self.ep.stream_send(&self.sbuf),
            Op::Rma(_) => return Err(not_messages()),
        }?;
        Ok(match r {
            Issued::Done(()) => None,
            Issued::Pending(q) => Some(Pending::Unit(q)),
        })
    }

    /// A tag send that lends the send buffer (as ucx_perftest sends from its own buffer,
    /// without a copy): every send in flight reads the same one.
    fn send_owned(&self) -> Result<Option<Pending>> {
        Ok(match self.ep.tag_send_owned(TAG, self.lent.clone())? {
            Issued::Done(_) => None,
            Issued::Pending(q) => Some(Pending::Lent(q)),
        })
    }

    fn send_wait(&self) -> Result<()> {
        match self.send()? {
            Some(q) => self.wait_pending(q),
            None => Ok(()),
        }
    }

    /// Progresses until `q` finished.
    fn wait_pending(&self, mut q: Pending) -> Result<()> {
        loop {
            if let Some(r) = q.take() {
                return r;
            }
            self.turn()?;
        }
    }

    fn check(&self, data: &[u8]) {
        if self.validate && (data.len() != self.len || data.iter().enumerate().any(|(i, &b)| b != pattern(i)))
        {
            self.bad.set(self.bad.get() + 1);
        }
    }

    /// Receives one whole message.
    fn recv_wait(&mut self) -> Result<()> {
        match self.op {
            Op::Tag | Op::TagSync => {
                let buf = self.rbuf.take().unwrap_or_else(|| vec![0; self.len]);
                let got = self.wait(self.worker.tag_recv(TAG, u64::MAX, buf))?;
                self.check(&got.data);
                self.rbuf = Some(got.data);
            }
            Op::Am => {
                self.am_seen += 1;
                while self.am_count.get() < self.am_seen {
                    self.turn()?;
                }
            }
            Op::Rma(_) => return Err(not_messages()),
            Op::Stream => {
                let mut left = self.len;
                while left > 0 {
                    let mut buf = self.rbuf.take().unwrap_or_default();
                    buf.resize(left, 0);
                    let got = self.wait(self.ep.stream_recv(buf, false))?;
                    left -= got.len();
                    self.rbuf = Some(got);
                }
            }
        }
        Ok(())
    }

    fn pingpong(&mut self, perf: &mut Perf, me: usize) -> Result<()> {
        let len = self.len as u64;
        while !perf.done() {
            if self.loopback {
                self.send_wait_or_recv()?;
                perf.update(1, len);
            } else if me == 0 {
                self.send_wait()?;
                perf.update(1, len);
                self.recv_wait()?;
            } else {
                self.recv_wait()?;
                self.send_wait()?;
                perf.update(1, len);
            }
        }
        Ok(())
    }

    /// Side 1: sends with at most `-O` in flight, then waits for all and flushes.
    fn stream_send(&mut self, perf: &mut Perf) -> Result<()> {
        let len = self.len as u64;
        let mut inflight: VecDeque<Pending> = VecDeque::new();
        while !perf.done() {
            self.reap(&mut inflight, self.window - 1)?;
            if let Some(q) = self.send()? {
                inflight.push_back(q);
            }
            perf.update(1, len);
        }
        self.reap(&mut inflight, 0)?;
        self.wait(self.ep.flush())
    }

    /// Side 0: receives the iterations' messages, up to `-O` receives posted.
    fn stream_recv(&mut self, perf: &mut Perf) -> Result<()> {
        let len = self.len as u64;
        match self.op {
            Op::Tag | Op::TagSync => {
                let mut posted: VecDeque<Request<ucp::TagRecvd>> = VecDeque::new();
                let mut spare: Vec<Vec<u8>> = Vec::new();
                let mut issued = 0u64;
                while !perf.done() {
                    while posted.len() < self.window && issued < perf.max_iter() {
                        let buf = spare.pop().unwrap_or_else(|| vec![0; self.len]);
                        issued += 1;
                        match self.worker.tag_recv(TAG, u64::MAX, buf)? {
                            Issued::Done(got) => {
                                self.check(&got.data);
                                spare.push(got.data);
                                perf.update(1, len);
                            }
                            Issued::Pending(q) => posted.push_back(q),
                        }
                    }
                    self.turn()?;
                    while let Some(q) = posted.front_mut() {
                        let Some(r) = q.take() else { break };
                        let got = r?;
                        self.check(&got.data);
                        spare.push(got.data);
                        posted.pop_front();
                        perf.update(1, len);
                    }
                }
            }
            Op::Rma(_) => return Err(not_messages()),
            Op::Am | Op::Stream => {
                while !perf.done() {
                    self.recv_wait()?;
                    perf.update(1, len);
                }
            }
        }
        Ok(())
    }

    /// Loopback (`-l`): one process sends and receives each message in turn.
    fn stream_loopback(&mut self, perf: &mut Perf) -> Result<()> {
        let len = self.len as u64;
        while !perf.done() {
            self.send_wait_or_recv()?;
            perf.update(1, len);
        }
        Ok(())
    }

    fn send_wait_or_recv(&mut self) -> Result<()> {
        // A synchronous or rendezvous send completes only once received: post the receive
        // first for tags, so that the send can complete.
        match self.op {
            Op::Tag | Op::TagSync => {
                let buf = self.rbuf.take().unwrap_or_else(|| vec![0; self.len]);
                let r = self.worker.tag_recv(TAG, u64::MAX, buf)?;
                self.send_wait()?;
                let got = self.wait(Ok(r))?;
                self.check(&got.data);
                self.rbuf = Some(got.data);
                Ok(())
            }
            _ => {
                self.send_wait()?;
                self.recv_wait()
            }
        }
    }

    fn rma(&self) -> &Rma {
        self.rma.as_ref().expect("an RMA test")
    }

    /// `ucp_put_lat`: a put whose last byte is the sequence number; the peer waits for it in
    /// its own buffer, then answers alike.
    fn rma_pingpong(&mut self, perf: &mut Perf, me: usize) -> Result<()> {
        let len = self.len as u64;
        let mut sn: u8 = 0;
        while !perf.done() {
            if me == 0 || self.loopback {
                self.rma_issue_wait(sn)?;
                perf.update(1, len);
                self.wait_last_byte(sn)?;
            } else {
                self.wait_last_byte(sn)?;
                self.rma_issue_wait(sn)?;
                perf.update(1, len);
            }
            sn = sn.wrapping_add(1);
        }
        Ok(())
    }

    fn wait_last_byte(&self, sn: u8) -> Result<()> {
        while self.rma().last_byte() != sn {
            self.turn()?;
        }
        Ok(())
    }

    fn rma_issue_wait(&mut self, sn: u8) -> Result<()> {
        let rma = self.rma.as_ref().expect("an RMA test");
        match rma.issue(&self.ep, &mut self.sbuf, sn)? {
            Some(q) => self.wait_pending(q),
            None => Ok(()),
        }
    }

    /// The initiator of `ucp_put_bw`, `ucp_get` and the atomics: `-O` in flight, then the
    /// sentinel and a flush.
    fn rma_initiator(&mut self, perf: &mut Perf) -> Result<()> {
        let len = self.len as u64;
        let mut inflight: VecDeque<Pending> = VecDeque::new();
        while !perf.done() {
            self.reap(&mut inflight, self.window - 1)?;
            let rma = self.rma.as_ref().expect("an RMA test");
            if let Some(q) = rma.issue(&self.ep, &mut self.sbuf, 0)? {
                inflight.push_back(q);
            }
            perf.update(1, len);
        }
        self.reap(&mut inflight, 0)?;
        if !self.loopback {
            if let Some(q) = self.rma().send_sentinel(&self.ep)? {
                inflight.push_back(q);
            }
            self.reap(&mut inflight, 0)?;
        }
        self.wait(self.ep.flush())
    }

    fn reap(&self, inflight: &mut VecDeque<Pending>, keep: usize) -> Result<()> {
        while inflight.len() > keep {
            while let Some(q) = inflight.front_mut() {
                match q.take() {
                    Some(r) => {
                        r?;
                        inflight.pop_front();
                    }
                    None => break,
                }
            }
            if inflight.len() > keep {
                self.turn()?;
            }
        }
        Ok(())
    }

    /// The responder: progresses (software RMA needs it) until the initiator's sentinel.
    fn rma_responder(&self) -> Result<()> {
        while !self.rma().sentinel_seen() {
            self.turn()?;
        }
        Ok(())
    }

    /// Ends the test: both sides stop at the barrier, the endpoint closes.
    pub fn cleanup(self, rte: &mut Rte) -> Result<()> {
        let r = rte.barrier(&mut || {
            self.worker.progress();
        });
        let _ = self.ep.close(ucp::CloseMode::Force);
        r
    }
}

/// The message paths were asked to move an RMA test's data (a bug in this tool).
fn not_messages() -> Error {
    Error::new(
        Status::InvalidParam,
        "rucx-perftest: an RMA test has no messages to send or receive",
    )
}

/// AM id 1: counts arrivals; a rendezvous one is fetched first, into the buffer of the last
/// one (descriptor mode: no allocation per message).
fn install_am_handler(
    w: &Worker,
    len: usize,
    validate: bool,
    count: &Rc<Cell<u64>>,
    bad: &Rc<Cell<u64>>,
) -> Result<()> {
    let (c, b) = (count.clone(), bad.clone());
    let wk = w.downgrade();
    let spare: Rc<RefCell<Vec<u8>>> = Rc::default();
    w.set_am_handler_with(AM_ID, ucp::AmHandlerFlags::RNDV_DESC, move |m| {
        let check = {
            let b = b.clone();
            move |d: &[u8]| {
                if validate && (d.len() != len || d.iter().enumerate().any(|(i, &x)| x != pattern(i))) {
                    b.set(b.get() + 1);
                }
            }
        };
        match m.take_data_desc() {
            None => {
                check(m.data());
                c.set(c.get() + 1);
            }
            Some(desc) => {
                let Some(w) = wk.upgrade() else { return };
                let buf = std::mem::take(&mut *spare.borrow_mut());
                let (c, spare, b) = (c.clone(), spare.clone(), b.clone());
                let done = move |r: ucs::Result<Vec<u8>>| {
                    match r {
                        Ok(v) => {
                            check(&v);
                            *spare.borrow_mut() = v;
                        }
                        Err(e) => {
                            ucs::error!("am_recv_data: {e}");
                            b.set(b.get() + 1);
                        }
                    }
                    c.set(c.get() + 1);
                };
                match w.am_recv_data(desc, buf) {
                    Ok(issued) => issued.on_complete(done),
                    Err(e) => done(Err(e)),
                }
            }
        }
    })?;
    Ok(())
}

/// The status both sides agree on at the end of a `-V` run.
pub fn exchange_validation(b: &UcpBench, rte: &mut Rte) -> Result<()> {
    let own = b.validation_status();
    match rte.exchange_status(own, &mut || {
        b.progress();
    })? {
        Status::Ok => Ok(()),
        e => Err(rte::status_error(e)),
    }
}
