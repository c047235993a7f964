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
    /// The tag bandwidth tests' one receive buffer, mapped: every receive of the `-O` window
    /// lands in it (as ucx_perftest's all use one buffer). `None` where no transport maps
    /// memory (or for empty messages): then receives take owned buffers, handed back and
    /// reused. Latency tests reuse one owned buffer.
    rmem: Option<ucp::MemHandle>,
    /// Owned tag receive buffers handed back (without `rmem`).
    spare: Spares,
    /// `-D iov`: the `-s` sizes, the entries of every message's scatter-gather list, on the
    /// send side and the receive side.
    send_iov: Option<Vec<usize>>,
    recv_iov: Option<Vec<usize>>,
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

/// A posted tag receive, into the mapped buffer or an owned one.
enum RecvReq {
    Mapped(Request<ucp::TagRecvd<ucp::MemHandle>>),
    Owned(Request<ucp::TagRecvd>),
    Iov(Request<ucp::TagRecvd<Vec<Vec<u8>>>>),
}

/// Receive buffers handed back, for the next receives.
#[derive(Default)]
struct Spares {
    bufs: Vec<Vec<u8>>,
    /// Segment lists (`-D ..,iov`).
    iovs: Vec<Vec<Vec<u8>>>,
}

impl RecvReq {
    fn take(&mut self) -> Option<Result<Got>> {
        match self {
            RecvReq::Mapped(q) => q.take().map(|r| r.map(|g| Got::Mapped(g.length))),
            RecvReq::Owned(q) => q.take().map(|r| r.map(|g| Got::Owned(g.data))),
            RecvReq::Iov(q) => q.take().map(|r| r.map(|g| Got::Iov(g.data))),
        }
    }
}

/// A finished tag receive: the length landed in the mapped buffer, or the owned buffer.
enum Got {
    Mapped(usize),
    Owned(Vec<u8>),
    Iov(Vec<Vec<u8>>),
}

/// A tag receive just posted.
enum Posting {
    Done(Got),
    Pending(RecvReq),
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
        let rmem = match op {
            Op::Tag | Op::TagSync if len > 0 => worker.mem_alloc(len).ok(),
            _ => None,
        };
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
            rmem,
            spare: Spares::default(),
            send_iov: p.ucp_send_iov.then(|| p.sizes.clone()),
            recv_iov: p.ucp_recv_iov.then(|| p.sizes.clone()),
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
        if let Some(sizes) = &self.send_iov {
            return self.send_iov(sizes);
        }
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

    /// `-D iov`: the send buffer as one scatter-gather entry per `-s` size.
    fn send_iov(&self, sizes: &[usize]) -> Result<Option<Pending>> {
        let mut segs: Vec<&[u8]> = Vec::with_capacity(sizes.len());
        let mut at = 0;
        for &n in sizes {
            segs.push(&self.sbuf[at..at + n]);
            at += n;
        }
        let r = match self.op {
            Op::Tag => self.ep.tag_send_iov(TAG, &segs),
            Op::TagSync => self.ep.tag_send_sync_iov(TAG, &segs),
            Op::Am => self.ep.am_send_iov(AM_ID, &[], &segs, AmFlags::default()),
            _ => {
                return Err(Error::new(
                    Status::Unsupported,
                    "rucx-perftest: -D iov for this test",
                ))
            }
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

    /// Posts one tag receive: into the mapped buffer when `window` receives are posted at once
    /// (they all share it) and messages are of at least [`OWNED_MIN`] bytes (where `-O`
    /// buffers of their own would crowd the caches), else into `spare`'s last buffer (or a
    /// new one): the cheaper path for small messages, and one receive at a time reuses one.
    fn post_tag(&self, spare: &mut Spares, window: bool) -> Result<Posting> {
        if let Some(sizes) = &self.recv_iov {
            let segs = spare
                .iovs
                .pop()
                .unwrap_or_else(|| sizes.iter().map(|&n| vec![0; n]).collect());
            return Ok(match self.worker.tag_recv_iov(TAG, u64::MAX, segs)? {
                Issued::Done(got) => Posting::Done(Got::Iov(got.data)),
                Issued::Pending(q) => Posting::Pending(RecvReq::Iov(q)),
            });
        }
        let shared = window && self.len >= OWNED_MIN;
        Ok(match self.rmem.as_ref().filter(|_| shared) {
            Some(m) => match self.worker.tag_recv_mapped(TAG, u64::MAX, m, 0, self.len)? {
                Issued::Done(got) => Posting::Done(Got::Mapped(got.length)),
                Issued::Pending(q) => Posting::Pending(RecvReq::Mapped(q)),
            },
            None => {
                let buf = spare.bufs.pop().unwrap_or_else(|| vec![0; self.len]);
                match self.worker.tag_recv(TAG, u64::MAX, buf)? {
                    Issued::Done(got) => Posting::Done(Got::Owned(got.data)),
                    Issued::Pending(q) => Posting::Pending(RecvReq::Owned(q)),
                }
            }
        })
    }

    /// A finished receive: checked (`-V`), its owned buffer back to `spare`.
    fn received(&self, got: Got, spare: &mut Spares) {
        match got {
            Got::Owned(v) => {
                self.check(&v);
                spare.bufs.push(v);
            }
            Got::Iov(segs) => {
                if self.validate {
                    self.check(&segs.concat());
                }
                spare.iovs.push(segs);
            }
            Got::Mapped(n) if self.validate => {
                let mut v = vec![0; n];
                match self.rmem.as_ref().map(|m| m.read(0, &mut v)) {
                    Some(Ok(())) => self.check(&v),
                    _ => self.bad.set(self.bad.get() + 1),
                }
            }
            Got::Mapped(n) => {
                if n != self.len {
                    self.bad.set(self.bad.get() + 1);
                }
            }
        }
    }

    /// Progresses until the posted receive finished.
    fn wait_posting(&self, posted: Posting) -> Result<Got> {
        match posted {
            Posting::Done(g) => Ok(g),
            Posting::Pending(mut q) => loop {
                if let Some(r) = q.take() {
                    return r;
                }
                self.turn()?;
            },
        }
    }

    /// A latency test's tag receive into the one owned buffer `rbuf` (handed back by each
    /// receive), with `then_send`: the message sent once the receive is posted (loopback).
    /// `-D iov` receives take [`UcpBench::post_tag`].
    fn tag_recv_lat(&mut self, then_send: bool) -> Result<()> {
        let buf = self.rbuf.take().unwrap_or_else(|| vec![0; self.len]);
        let posted = self.worker.tag_recv(TAG, u64::MAX, buf)?;
        if then_send {
            self.send_wait()?;
        }
        let got = self.wait(Ok(posted))?;
        self.check(&got.data);
        self.rbuf = Some(got.data);
        Ok(())
    }

    /// One tag receive, waited for.
    fn tag_recv_wait(&mut self) -> Result<()> {
        if self.recv_iov.is_none() {
            return self.tag_recv_lat(false);
        }
        // Taken and put back: no allocation.
        let mut spare = std::mem::take(&mut self.spare);
        let posted = self.post_tag(&mut spare, false)?;
        let got = self.wait_posting(posted)?;
        self.received(got, &mut spare);
        self.spare = spare;
        Ok(())
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
            Op::Tag | Op::TagSync => self.tag_recv_wait()?,
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
                let mut posted: VecDeque<RecvReq> = VecDeque::new();
                let mut spare = Spares::default();
                let mut issued = 0u64;
                while !perf.done() {
                    while posted.len() < self.window && issued < perf.max_iter() {
                        issued += 1;
                        match self.post_tag(&mut spare, true)? {
                            Posting::Done(got) => {
                                self.received(got, &mut spare);
                                perf.update(1, len);
                            }
                            Posting::Pending(q) => posted.push_back(q),
                        }
                    }
                    self.turn()?;
                    while let Some(q) = posted.front_mut() {
                        let Some(r) = q.take() else { break };
                        let got = r?;
                        self.received(got, &mut spare);
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
            Op::Tag | Op::TagSync if self.recv_iov.is_none() => self.tag_recv_lat(true),
            Op::Tag | Op::TagSync => {
                let mut spare = std::mem::take(&mut self.spare);
                let posted = self.post_tag(&mut spare, false)?;
                self.send_wait()?;
                let got = self.wait_posting(posted)?;
                self.received(got, &mut spare);
                self.spare = spare;
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
