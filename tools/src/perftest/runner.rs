//! The measured loops, step for step those of UCX's `uct_tests.cc`: ping-pong (`*_lat`) and
//! unidirectional stream (`*_bw`, `get`, fetching atomics) with AM flow control, the send window
//! (`-O`), retry on `NoResource` with progress, and the sentinel that ends RMA streams.
//!
//! The operation and layout are const generics, so each test's loop is compiled for it alone
//! (UCX uses a template for the same reason): inside the loop there is no allocation, no
//! logging, no formatting, only the send call, a worker progress and the counters.

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct::{AtomicOp, AtomicResult, AtomicWidth, Completion, Ep, Mem, MemIov, Rkey, Worker, MAX_IOV};

use super::clock;
use super::measure::Perf;
use super::params::{cmd, layout, Params, TestType};
use super::rte::Rte;
use super::setup::{buffer_size, recv_pattern, send_pattern, LoopCounters, Setup, AM_ID};

/// How many successful sends between two progress calls (UCX's `N_SEND_B_PER_PROGRESS`).
const SENDS_PER_PROGRESS: u32 = 16;

/// UCX's `UCS_CIRCULAR_COMPARE8(a, >, b)`.
#[inline(always)]
fn after(a: u8, b: u8) -> bool {
    (a.wrapping_sub(b) as i8) > 0
}

/// Page-aligned plain memory, as UCX aligns its test buffers (`ucx_perf_params_t::alignment`):
/// the speed of large copies depends on the alignment of source and destination.
pub struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

const PAGE: usize = 4096;

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + PAGE];
        let off = v.as_ptr().align_offset(PAGE).min(PAGE);
        AlignedBuf { v, off, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// Where a side reads the sequence number it waits for.
#[derive(Clone, Copy)]
enum SnSrc {
    /// The AM handler's last byte 0.
    Am,
    /// A byte of the local receive buffer (written by the peer's put/atomic).
    Recv(usize),
    /// Byte 0 of the local destination of gets.
    Local,
}

/// One side's state for running a test (UCX's `uct_perf_test_runner`).
pub struct Bench<'s> {
    worker: Worker,
    setup: &'s Setup,
    ep: &'s Ep,
    remote_addr: u64,
    rkey: Option<&'s Rkey>,
    send_mem: Option<&'s Mem>,
    recv_mem: Option<&'s Mem>,
    /// The send buffer as plain memory: short/bcopy payloads and AM zcopy headers come from it.
    host: AlignedBuf,
    /// Zero-copy entries over `send_mem` (after the AM header for AM zcopy).
    iov: Vec<MemIov>,
    /// A copy of `host[8..length]` (refreshed by `prepare_buffers`; am_short never changes
    /// it): the payload without bounds checks in the loop, as UCX passes a pointer.
    short_payload: Box<[u8]>,
    /// `(start, end)` of each entry of `-D shortiov`, over `host`.
    iov_ranges: Vec<(usize, usize)>,
    /// Destination of `get_bcopy`.
    get_buf: Rc<RefCell<AlignedBuf>>,
    result: AtomicResult,
    comp: Completion,
    counters: Rc<LoopCounters>,
    test_cmd: u8,
    data: u8,
    ty: TestType,
    length: usize,
    extent: usize,
    hdr: usize,
    width: AtomicWidth,
    one_sided: bool,
    loopback: bool,
    validate: bool,
    max_outstanding: i32,
    fc_window: u8,
}

fn read_byte(m: Option<&Mem>, off: usize) -> u8 {
    m.and_then(|m| m.load_u8(off)).unwrap_or(0)
}

fn write_byte(m: Option<&Mem>, off: usize, v: u8) {
    if let Some(m) = m {
        let _ = m.write(off, &[v]);
    }
}

impl<'s> Bench<'s> {
    /// Prepares the buffers and I/O vectors of `setup` for the test in `p`.
    pub fn new(p: &Params, setup: &'s Setup) -> Result<Bench<'s>> {
        let Some(peer) = setup.peer.as_ref() else {
            ucs::error!("not connected");
            return Err(Status::NotConnected.into());
        };
        let t = p.desc();
        if t.cmd != cmd::AM && peer.rkey.is_none() {
            ucs::error!("the peer sent no remote key; this test needs one");
            return Err(Status::Unsupported.into());
        }
        let size = buffer_size(p);
        let length = p.message_size();
        let am_zcopy = t.cmd == cmd::AM && p.layout == layout::ZCOPY;
        let hdr = if am_zcopy { p.am_hdr_size } else { 0 };
        // UCX's uct_perf_get_buffer_iov: entries follow each other or start every `stride`.
        let mut ranges = Vec::with_capacity(p.sizes.len());
        let (mut off, mut skip) = (0usize, hdr);
        for &s in &p.sizes {
            let len = s.saturating_sub(skip);
            ranges.push((off + skip, off + skip + len));
            off = off.saturating_add(if p.iov_stride > 0 { p.iov_stride } else { s });
            skip = 0;
        }
        if ranges.len() > MAX_IOV && matches!(p.layout, layout::ZCOPY | layout::SHORT_IOV) {
            ucs::error!("at most {MAX_IOV} scatter-gather entries");
            return Err(Status::Unsupported.into());
        }
        let mut iov = Vec::new();
        if p.layout == layout::ZCOPY {
            let m = setup.send_mem.as_ref().ok_or(Status::Unsupported)?;
            for &(a, b) in &ranges {
                iov.push(m.iov(a, b - a)?);
            }
        }
        let extent = if p.layout == layout::ZCOPY && p.iov_stride > 0 {
            (p.sizes.len() - 1)
                .saturating_mul(p.iov_stride)
                .saturating_add(p.sizes[p.sizes.len() - 1])
        } else {
            length
        };
        let b = Bench {
            worker: setup.worker.clone(),
            setup,
            ep: &peer.ep,
            remote_addr: peer.remote_addr,
            rkey: peer.rkey.as_ref(),
            send_mem: setup.send_mem.as_ref(),
            recv_mem: setup.recv_mem.as_ref(),
            short_payload: Box::default(),
            host: AlignedBuf::new(size.max(1)),
            iov,
            iov_ranges: ranges,
            get_buf: Rc::new(RefCell::new(AlignedBuf::new(size.max(1)))),
            result: AtomicResult::new(),
            comp: Completion::counter(),
            counters: setup.counters.clone(),
            test_cmd: t.cmd,
            data: p.layout,
            ty: t.ty,
            length,
            extent,
            hdr,
            width: if length == 4 {
                AtomicWidth::U32
            } else {
                AtomicWidth::U64
            },
            one_sided: p.one_sided,
            loopback: p.loopback,
            validate: p.validate,
            max_outstanding: p.max_outstanding.min(i32::MAX as u32) as i32,
            fc_window: p.fc_window.min(255) as u8,
        };
        Ok(b)
    }

    /// Runs the test once (`uct_perf_test_dispatch`): `perf.max_iter` iterations.
    pub fn run(&mut self, perf: &mut Perf, rte: &mut Rte) -> Result<()> {
        macro_rules! by_layout {
            ($c:expr, $o:expr) => {
                match self.data {
                    layout::SHORT => self.run_typed::<{ $c }, { layout::SHORT }, $o>(perf, rte),
                    layout::SHORT_IOV => self.run_typed::<{ $c }, { layout::SHORT_IOV }, $o>(perf, rte),
                    layout::BCOPY => self.run_typed::<{ $c }, { layout::BCOPY }, $o>(perf, rte),
                    _ => self.run_typed::<{ $c }, { layout::ZCOPY }, $o>(perf, rte),
                }
            };
        }
        macro_rules! by_cmd {
            ($o:expr) => {
                match self.test_cmd {
                    cmd::AM => by_layout!(cmd::AM, $o),
                    cmd::PUT => by_layout!(cmd::PUT, $o),
                    cmd::GET => by_layout!(cmd::GET, $o),
                    cmd::ADD => by_layout!(cmd::ADD, $o),
                    cmd::FADD => by_layout!(cmd::FADD, $o),
                    cmd::SWAP => by_layout!(cmd::SWAP, $o),
                    cmd::CSWAP => by_layout!(cmd::CSWAP, $o),
                    _ => Err(Status::InvalidParam.into()),
                }
            };
        }
        // A new runner in UCX: last received sn and send counter start from zero.
        self.counters.am_sn.set(0);
        self.counters.send_b_count.set(0);
        if self.one_sided {
            by_cmd!(true)
        } else {
            by_cmd!(false)
        }
    }

    /// One loop per (operation, layout, one-sided), as UCX's template: no test of the options
    /// inside the loops.
    fn run_typed<const CMD: u8, const DATA: u8, const ONESIDED: bool>(
        &mut self,
        perf: &mut Perf,
        rte: &mut Rte,
    ) -> Result<()> {
        let zcopy = DATA == layout::ZCOPY;
        match (self.ty, CMD) {
            (TestType::PingPong, _) => self.pingpong::<CMD, DATA, ONESIDED>(perf, rte),
            (TestType::StreamUni, cmd::PUT) => {
                self.stream::<CMD, DATA, ONESIDED>(perf, rte, false, zcopy, true)
            }
            (TestType::StreamUni, cmd::ADD) => {
                self.stream::<CMD, DATA, ONESIDED>(perf, rte, false, false, true)
            }
            (TestType::StreamUni, cmd::AM) => {
                self.stream::<CMD, DATA, ONESIDED>(perf, rte, true, zcopy, true)
            }
            (TestType::StreamUni, cmd::GET) => {
                self.stream::<CMD, DATA, ONESIDED>(perf, rte, false, true, false)
            }
            (TestType::StreamUni, _) => self.stream::<CMD, DATA, ONESIDED>(perf, rte, false, true, true),
        }
    }

    #[cold]
    #[inline(never)]
    fn progress_out_of_line(&self) -> Result<()> {
        self.progress()
    }

    /// A progress that also ticks the peer watch: an error once the peer is gone.
    #[inline(always)]
    fn progress(&self) -> Result<()> {
        self.worker.progress();
        self.setup.watch.tick()
    }

    /// UCX's `progress_responder`: nothing in one-sided tests (`-o`) but the peer watch.
    #[inline(always)]
    fn progress_responder<const ONESIDED: bool>(&self) -> Result<()> {
        if !ONESIDED {
            self.worker.progress();
        }
        self.setup.watch.tick()
    }

    #[inline(always)]
    fn read_sn<const DATA: u8>(&self, src: SnSrc) -> u8 {
        match src {
            SnSrc::Am => self.counters.am_sn.get(),
            SnSrc::Recv(off) => read_byte(self.recv_mem, off),
            SnSrc::Local => match DATA {
                layout::ZCOPY => read_byte(self.send_mem, 0),
                layout::BCOPY => self.get_buf.borrow()[0],
                _ => self.host[0],
            },
        }
    }

    fn set_recv_sn(&self, src: SnSrc, v: u8) {
        match src {
            SnSrc::Am => self.counters.am_sn.set(v),
            SnSrc::Recv(off) => write_byte(self.recv_mem, off, v),
            SnSrc::Local => {}
        }
    }

    /// Byte 0 of the send buffer (`set_sn(buffer, ..)`).
    fn set_send_sn(&mut self, v: u8) {
        self.host[0] = v;
        write_byte(self.send_mem, 0, v);
    }

    /// One operation (UCX's `send`), `Ok(Outcome::InProgress)` when it completes later.
    #[inline(always)]
    fn send<const CMD: u8, const DATA: u8>(
        &mut self,
        sn: u8,
        prev_sn: u8,
        with_comp: bool,
    ) -> Result<Outcome> {
        let len = self.length;
        let comp = if with_comp { Some(&self.comp) } else { None };
        let ok = |r: Result<()>| r.map(|()| Outcome::Done);
        // UCX passes `sn - prev_sn` computed in int: a negative step wraps in the atomic width.
        let step = (sn as i64 - prev_sn as i64) as u64;
        match CMD {
            cmd::AM => match DATA {
                layout::SHORT => ok(self.ep.am_short(AM_ID, sn as u64, &self.short_payload)),
                layout::SHORT_IOV => {
                    self.host[0] = sn;
                    let mut parts: [&[u8]; MAX_IOV] = [&[]; MAX_IOV];
                    for (p, &(a, b)) in parts.iter_mut().zip(&self.iov_ranges) {
                        *p = &self.host[a..b];
                    }
                    ok(self.ep.am_short_iov(AM_ID, &parts[..self.iov_ranges.len()]))
                }
                layout::BCOPY => {
                    self.host[0] = sn;
                    let src = &self.host[..len];
                    self.ep
                        .am_bcopy(AM_ID, |buf| {
                            let n = src.len().min(buf.len());
                            buf[..n].copy_from_slice(&src[..n]);
                            n
                        })
                        .map(|_| Outcome::Done)
                }
                _ => {
                    self.host[0] = sn;
                    self.ep.am_zcopy(AM_ID, &self.host[..self.hdr], &self.iov, comp)
                }
            },
            cmd::PUT => {
                let Some(rkey) = self.rkey else {
                    return Err(Status::InvalidParam.into());
                };
                if self.ty == TestType::PingPong {
                    // The responder polls the last byte of the message.
                    self.host[self.extent - 1] = sn;
                    if DATA == layout::ZCOPY {
                        write_byte(self.send_mem, self.extent - 1, sn);
                    }
                }
                match DATA {
                    layout::BCOPY => {
                        let src = &self.host[..len];
                        self.ep
                            .put_bcopy(
                                |buf| {
                                    let n = src.len().min(buf.len());
                                    buf[..n].copy_from_slice(&src[..n]);
                                    n
                                },
                                self.remote_addr,
                                rkey,
                            )
                            .map(|_| Outcome::Done)
                    }
                    layout::ZCOPY => self.ep.put_zcopy(&self.iov, self.remote_addr, rkey, comp),
                    _ => ok(self.ep.put_short(&self.host[..len], self.remote_addr, rkey)),
                }
            }
            cmd::GET => {
                let Some(rkey) = self.rkey else {
                    return Err(Status::InvalidParam.into());
                };
                match DATA {
                    layout::BCOPY => {
                        let dst = self.get_buf.clone();
                        let unpack = move |d: &[u8]| {
                            let mut g = dst.borrow_mut();
                            let n = d.len().min(g.len());
                            g[..n].copy_from_slice(&d[..n]);
                        };
                        self.ep.get_bcopy(len, self.remote_addr, rkey, unpack, comp)
                    }
                    layout::ZCOPY => self.ep.get_zcopy(&self.iov, self.remote_addr, rkey, comp),
                    _ => ok(self.ep.get_short(&mut self.host[..len], self.remote_addr, rkey)),
                }
            }
            _ => {
                let Some(rkey) = self.rkey else {
                    return Err(Status::InvalidParam.into());
                };
                let (w, a, r) = (self.width, self.remote_addr, &self.result);
                match CMD {
                    cmd::ADD => ok(self.ep.atomic_post(w, AtomicOp::Add, step, a, rkey)),
                    cmd::FADD => self.ep.atomic_fetch(w, AtomicOp::Add, step, r, a, rkey, comp),
                    cmd::SWAP => self
                        .ep
                        .atomic_fetch(w, AtomicOp::Swap, sn as u64, r, a, rkey, comp),
                    _ => self
                        .ep
                        .atomic_cswap(w, prev_sn as u64, sn as u64, r, a, rkey, comp),
                }
            }
        }
    }

    /// Sends until accepted (UCX's `send_b`): progress every 16 sends, after an operation in
    /// flight, and before retrying on `NoResource`.
    #[inline(always)]
    fn send_b<const CMD: u8, const DATA: u8>(&mut self, sn: u8, prev_sn: u8, with_comp: bool) -> Result<()> {
        let r = self.send::<CMD, DATA>(sn, prev_sn, with_comp);
        self.sent(r)
            .or_else(|e| self.send_b_retry::<CMD, DATA>(e, sn, prev_sn, with_comp))
    }

    /// After an accepted send: progress once the operation is in flight, and every
    /// [`SENDS_PER_PROGRESS`] sends that completed at once.
    #[inline(always)]
    fn sent(&mut self, r: Result<Outcome>) -> Result<()> {
        match r? {
            Outcome::InProgress => self.progress()?,
            Outcome::Done => {
                let c = self.counters.send_b_count.get();
                self.counters.send_b_count.set(c.wrapping_add(1));
                if c.is_multiple_of(SENDS_PER_PROGRESS) {
                    // 1 in 16: kept out of the loop's straight line, as in UCX's build.
                    self.progress_out_of_line()?;
                }
            }
        }
        Ok(())
    }

    /// The send was refused: progress and retry while it is `NoResource`. Out of line, so the
    /// loops' straight line is the accepted send.
    #[cold]
    #[inline(never)]
    fn send_b_retry<const CMD: u8, const DATA: u8>(
        &mut self,
        mut err: Error,
        sn: u8,
        prev_sn: u8,
        with_comp: bool,
    ) -> Result<()> {
        loop {
            if err != Status::NoResource {
                return Err(send_failed(err));
            }
            self.progress()?;
            match self.send::<CMD, DATA>(sn, prev_sn, with_comp) {
                Ok(st) => return self.sent(Ok(st)),
                Err(e) => err = e,
            }
        }
    }

    #[inline(always)]
    fn wait_for_window(&self, send_window: bool) -> Result<()> {
        while send_window && self.comp.outstanding() >= self.max_outstanding {
            self.progress()?;
        }
        Ok(())
    }

    /// Fills the buffers before a run: zeros for streams as UCX does, patterns under `-V`.
    fn prepare_buffers(&mut self, stream: bool) {
        let n = self.length.min(self.host.len());
        if self.validate {
            for (i, b) in self.host.iter_mut().enumerate() {
                *b = send_pattern(i);
            }
            let recv: Vec<u8> = (0..self.host.len()).map(recv_pattern).collect();
            self.fill(&recv);
        } else if stream {
            self.host[..n].fill(0);
            self.fill(&vec![0; self.host.len()]);
        }
        self.short_payload = self.host[8.min(n)..n].into();
    }

    fn fill(&mut self, recv: &[u8]) {
        if let Some(m) = self.send_mem {
            let _ = m.write(0, &self.host[..m.len().min(self.host.len())]);
        }
        if let Some(m) = self.recv_mem {
            let _ = m.write(0, &recv[..m.len().min(recv.len())]);
        }
        let mut g = self.get_buf.borrow_mut();
        let n = g.len().min(self.host.len());
        g[..n].copy_from_slice(&self.host[..n]);
    }

    fn pingpong<const CMD: u8, const DATA: u8, const ONESIDED: bool>(
        &mut self,
        perf: &mut Perf,
        rte: &mut Rte,
    ) -> Result<()> {
        let length = self.length as u64;
        let src = match CMD {
            cmd::AM => SnSrc::Am,
            cmd::ADD => SnSrc::Recv(0),
            cmd::PUT => SnSrc::Recv(self.length - 1),
            _ => {
                ucs::error!("Cannot run this test in ping-pong mode");
                return Err(Status::InvalidParam.into());
            }
        };
        self.prepare_buffers(false);
        self.set_recv_sn(src, u8::MAX);
        rte.barrier(&mut || {
            self.worker.progress();
        })?;
        let my_index = rte.group_index();
        perf.start_clock();
        let mut send_sn: u8 = 0;
        if my_index == 0 {
            while !perf.done() {
                self.send_b::<CMD, DATA>(send_sn, send_sn.wrapping_sub(1), false)?;
                perf.update(1, length);
                loop {
                    self.progress_responder::<ONESIDED>()?;
                    if self.read_sn::<DATA>(src) == send_sn {
                        break;
                    }
                }
                send_sn = send_sn.wrapping_add(1);
            }
        } else {
            while !perf.done() {
                loop {
                    self.progress_responder::<ONESIDED>()?;
                    if self.read_sn::<DATA>(src) == send_sn {
                        break;
                    }
                }
                self.send_b::<CMD, DATA>(send_sn, send_sn.wrapping_sub(1), false)?;
                perf.update(1, length);
                send_sn = send_sn.wrapping_add(1);
            }
        }
        self.setup.flush_iface()?;
        perf.get_time();
        Ok(())
    }

    fn stream<const CMD: u8, const DATA: u8, const ONESIDED: bool>(
        &mut self,
        perf: &mut Perf,
        rte: &mut Rte,
        flow_control: bool,
        send_window: bool,
        to_responder: bool,
    ) -> Result<()> {
        self.prepare_buffers(true);
        let src = match (CMD, to_responder) {
            (cmd::AM, true) => SnSrc::Am,
            (_, true) => SnSrc::Recv(0),
            (_, false) => SnSrc::Local,
        };
        let my_index = rte.group_index();
        rte.barrier(&mut || {
            self.worker.progress();
        })?;
        perf.start_clock();
        if self.loopback || my_index == 1 {
            self.stream_send::<CMD, DATA, ONESIDED>(perf, flow_control, send_window, to_responder, src)?;
        } else {
            self.stream_recv::<CMD, DATA, ONESIDED>(perf, flow_control, send_window, to_responder, src)?;
        }
        self.setup.flush_iface()?;
        perf.get_time();
        if my_index == 1 {
            perf.update(0, 0);
        }
        Ok(())
    }

    fn stream_send<const CMD: u8, const DATA: u8, const ONESIDED: bool>(
        &mut self,
        perf: &mut Perf,
        flow_control: bool,
        send_window: bool,
        to_responder: bool,
        src: SnSrc,
    ) -> Result<()> {
        let length = self.length as u64;
        let fc_window = self.fc_window;
        // The next sn to send; without flow control the remote buffer stays 0 until the end.
        let mut send_sn: u8 = if flow_control { 1 } else { 0 };
        self.set_send_sn(send_sn);
        while !perf.done() {
            if flow_control {
                let mut sn = self.read_sn::<DATA>(src);
                while after(send_sn, sn.wrapping_add(fc_window)) {
                    self.progress_responder::<ONESIDED>()?;
                    sn = self.read_sn::<DATA>(src);
                }
            }
            self.wait_for_window(send_window)?;
            if flow_control {
                self.send_b::<CMD, DATA>(send_sn, send_sn.wrapping_sub(1), true)?;
                send_sn = send_sn.wrapping_add(1);
            } else {
                self.send_b::<CMD, DATA>(send_sn, send_sn, true)?;
            }
            perf.update(1, length);
        }
        if !flow_control {
            // The sentinel: the responder waits for a 2.
            if to_responder {
                self.wait_for_window(send_window)?;
                self.set_send_sn(2);
                self.send_b::<CMD, DATA>(2, send_sn, true)?;
            } else {
                write_byte(self.recv_mem, 0, 2);
            }
        } else {
            // Wait for the last ack, so that no more messages arrive.
            loop {
                self.progress_responder::<ONESIDED>()?;
                let sn = self.read_sn::<DATA>(src);
                if !after(send_sn.wrapping_sub(1), sn) {
                    break;
                }
            }
        }
        Ok(())
    }

    fn stream_recv<const CMD: u8, const DATA: u8, const ONESIDED: bool>(
        &mut self,
        perf: &mut Perf,
        flow_control: bool,
        send_window: bool,
        to_responder: bool,
        src: SnSrc,
    ) -> Result<()> {
        if flow_control {
            let half = self.fc_window / 2;
            // The last sn acknowledged.
            let mut send_sn: u8 = u8::MAX;
            while !perf.done() {
                self.progress_responder::<ONESIDED>()?;
                let sn = self.read_sn::<DATA>(src);
                if after(sn, send_sn.wrapping_add(half)) {
                    // Ack every half window.
                    self.wait_for_window(send_window)?;
                    self.send_b::<CMD, DATA>(sn, send_sn, true)?;
                    send_sn = sn;
                }
                perf.current.iters += sn.wrapping_sub(perf.current.iters as u8) as u64;
            }
            let sn = self.read_sn::<DATA>(src);
            if after(sn, send_sn) {
                self.wait_for_window(send_window)?;
                let sn = self.read_sn::<DATA>(src);
                self.send_b::<CMD, DATA>(sn, send_sn, true)?;
            }
        } else {
            let poll_every = clock::ticks_from_sec(1e-3);
            let mut poll_time = clock::ticks();
            loop {
                self.progress_responder::<ONESIDED>()?;
                let sn = self.read_sn::<DATA>(src);
                if !to_responder && clock::ticks().wrapping_sub(poll_time) > poll_every {
                    // Gets: fetch the requester's buffer until its sentinel shows.
                    self.wait_for_window(send_window)?;
                    self.send_b::<CMD, DATA>(0, 0, true)?;
                    poll_time = clock::ticks();
                }
                if sn == 2 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Checks the data after the last run under `-V`: AM payloads (counted by the handler),
    /// put targets on the side that received them, get destinations on the requester.
    pub fn validation_status(&self, my_index: usize) -> Status {
        let bad_am = self.setup.am_bad.get();
        if bad_am > 0 {
            ucs::error!(
                bad_am,
                "data validation failed: {bad_am} active messages with a wrong length or payload"
            );
            return Status::IoError;
        }
        let inner = 1..self.length.saturating_sub(1).max(1);
        let check = |got: &[u8], want: fn(usize) -> u8, what: &str| {
            let wrong = inner.clone().filter(|&i| got.get(i) != Some(&want(i))).count();
            if wrong > 0 {
                ucs::error!(wrong, "data validation failed: {wrong} wrong bytes in the {what}");
                Status::IoError
            } else {
                Status::Ok
            }
        };
        let receives = self.ty == TestType::PingPong || self.loopback || my_index == 0;
        let requests = self.loopback || my_index == 1;
        match self.test_cmd {
            cmd::PUT if receives => check(
                &self.recv_mem.map_or_else(Vec::new, |m| m.to_vec()),
                send_pattern,
                "put target",
            ),
            cmd::GET if requests => {
                let got = match self.data {
                    layout::ZCOPY => self.send_mem.map_or_else(Vec::new, |m| m.to_vec()),
                    layout::BCOPY => self.get_buf.borrow().to_vec(),
                    _ => self.host.to_vec(),
                };
                check(&got, recv_pattern, "get destination")
            }
            _ => Status::Ok,
        }
    }
}

#[cold]
fn send_failed(e: Error) -> Error {
    ucs::error!("Failed to send: {e}");
    e
}

#[cfg(test)]
mod tests {
    use super::after;

    #[test]
    fn circular_compare_wraps_like_ucx() {
        assert!(after(1, 0));
        assert!(after(0, 255));
        assert!(!after(0, 0));
        assert!(!after(100, 200));
        assert!(after(100, 229));
        assert!(!after(100, 228));
    }
}
