//! Opening the transport for a test and connecting to the peer, as UCX's `uct_perf_setup` and
//! `uct_perf_test_setup_endpoints` do: worker, memory domain that has the transport/device,
//! interface, capability check (agreed with the peer), registered send/receive buffers,
//! address + rkey exchange, endpoint connection (to iface or to ep), flush and barrier.

use std::cell::Cell;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct::{
    AmCbFlags, AsyncMode, Context, Ep, FlushFlags, Iface, IfaceAttr, IfaceFlags, IfaceParams, Md, MdFlags,
    Mem, MemAccess, Rkey, Worker,
};

use super::params::{cmd, layout, AsyncKind, Params, MAX_FC_WINDOW};
use super::rte::{self, Rte};
use super::watch::PeerWatch;

/// The AM id of the tests (UCX's `UCT_PERF_TEST_AM_ID`).
pub const AM_ID: u8 = 5;

/// The connected peer.
pub struct Peer {
    pub ep: Ep,
    /// Address of the peer's receive buffer (target of put/get/atomics).
    pub remote_addr: u64,
    pub rkey: Option<Rkey>,
}

/// Everything one side of a test uses.
pub struct Setup {
    pub worker: Worker,
    pub md: Md,
    pub iface: Iface,
    pub attr: IfaceAttr,
    pub send_mem: Option<Mem>,
    pub recv_mem: Option<Mem>,
    pub peer: Option<Peer>,
    /// The AM handler's sequence number and the loop's send count.
    pub counters: Rc<LoopCounters>,
    /// AM payloads that failed validation (`-V`).
    pub am_bad: Rc<Cell<u64>>,
    /// Ends every wait once the peer is gone (the interface's error handler feeds it).
    pub watch: PeerWatch,
}

/// What the test loop writes every iteration besides its measurement, as UCX keeps both in
/// its runner object: one allocation, so that the two stores share a cache line. In a
/// bandwidth test each store after the message copy waits for the store queue to drain, and
/// stores spread over lines drain slower.
#[derive(Debug, Default)]
pub struct LoopCounters {
    /// Set by the AM handler: the first byte of the last message (UCX's `m_last_recvd_sn`).
    pub am_sn: Cell<u8>,
    /// Sends `send_b` completed, for its progress pacing (UCX's `m_send_b_count`).
    pub send_b_count: Cell<u32>,
}

/// The byte at offset `i` of a sender's buffer under `-V`.
pub fn send_pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// The byte at offset `i` of a receive buffer under `-V` (differs from [`send_pattern`], so a
/// put that did not land is caught).
pub fn recv_pattern(i: usize) -> u8 {
    !((i % 241) as u8)
}

/// The flag name UCX prints for a missing capability.
fn op_name(f: IfaceFlags) -> &'static str {
    for (flag, name) in [
        (IfaceFlags::AM_SHORT, "am short"),
        (IfaceFlags::AM_BCOPY, "am bcopy"),
        (IfaceFlags::AM_ZCOPY, "am zcopy"),
        (IfaceFlags::PUT_SHORT, "put short"),
        (IfaceFlags::PUT_BCOPY, "put bcopy"),
        (IfaceFlags::PUT_ZCOPY, "put zcopy"),
        (IfaceFlags::GET_SHORT, "get short"),
        (IfaceFlags::GET_BCOPY, "get bcopy"),
        (IfaceFlags::GET_ZCOPY, "get zcopy"),
        (IfaceFlags::CB_SYNC, "sync callback"),
    ] {
        if f.contains(flag) {
            return name;
        }
    }
    "(unknown)"
}

/// UCX's `uct_perf_test_check_capabilities`: `Ok` or why this transport cannot run the test.
pub fn check_capabilities(p: &Params, attr: &IfaceAttr, md: &Md) -> Status {
    let t = p.desc();
    let size = p.message_size();
    fn pick<T>(l: u8, short: T, bcopy: T, zcopy: T) -> T {
        match l {
            layout::SHORT | layout::SHORT_IOV => short,
            layout::BCOPY => bcopy,
            _ => zcopy,
        }
    }
    let l = p.layout;
    let (required, min, max, max_iov) = match t.cmd {
        cmd::AM => {
            let c = &attr.am;
            let f = pick(
                l,
                IfaceFlags::AM_SHORT,
                IfaceFlags::AM_BCOPY,
                IfaceFlags::AM_ZCOPY,
            ) | IfaceFlags::CB_SYNC;
            (
                f,
                pick(l, 0, 0, c.min_zcopy),
                pick(l, c.max_short, c.max_bcopy, c.max_zcopy),
                c.max_iov,
            )
        }
        cmd::PUT | cmd::GET => {
            let c = if t.cmd == cmd::PUT { &attr.put } else { &attr.get };
            let f = if t.cmd == cmd::PUT {
                pick(
                    l,
                    IfaceFlags::PUT_SHORT,
                    IfaceFlags::PUT_BCOPY,
                    IfaceFlags::PUT_ZCOPY,
                )
            } else {
                pick(
                    l,
                    IfaceFlags::GET_SHORT,
                    IfaceFlags::GET_BCOPY,
                    IfaceFlags::GET_ZCOPY,
                )
            };
            (
                f,
                pick(l, 0, 0, c.min_zcopy),
                pick(l, c.max_short, c.max_bcopy, c.max_zcopy),
                c.max_iov,
            )
        }
        _ => (IfaceFlags::EMPTY, 0, 8, 1),
    };
    if size < 1 {
        ucs::error!("Message size too small, need to be at least 1");
        return Status::InvalidParam;
    }
    if p.max_outstanding < 1 {
        ucs::error!("max_outstanding, need to be at least 1");
        return Status::InvalidParam;
    }
    if p.iov_stride > 0 && p.sizes.iter().any(|&s| s > p.iov_stride) {
        ucs::error!(stride = p.iov_stride, "Buffer size bigger than stride");
        return Status::InvalidParam;
    }
    if matches!(t.cmd, cmd::ADD | cmd::FADD | cmd::SWAP | cmd::CSWAP) {
        let op = match t.cmd {
            cmd::ADD | cmd::FADD => uct::AtomicOp::Add,
            cmd::SWAP => uct::AtomicOp::Swap,
            _ => uct::AtomicOp::Cswap,
        };
        let caps = match size {
            4 => &attr.atomic32,
            8 => &attr.atomic64,
            _ => {
                ucs::error!(
                    size,
                    "atomic tests need a message size of 4 or 8 bytes (-s 4 or -s 8)"
                );
                return Status::Unsupported;
            }
        };
        let ops = if t.cmd == cmd::ADD {
            caps.op_flags
        } else {
            caps.fop_flags
        };
        if !ops.contains(op.flag()) {
            ucs::error!(
                "{}/{} does not support {}-bit atomic {:?}",
                p.tl,
                p.dev,
                size * 8,
                op
            );
            return Status::Unsupported;
        }
    } else if !attr.flags.contains(required) {
        ucs::error!(
            "{}/{} does not support operation {}",
            p.tl,
            p.dev,
            op_name(required & !attr.flags)
        );
        return Status::Unsupported;
    }
    if size < min {
        ucs::error!("Message size ({size}) is smaller than min supported ({min})");
        return Status::Unsupported;
    }
    if size > max {
        ucs::error!("Message size ({size}) is larger than max supported ({max})");
        return Status::Unsupported;
    }
    if t.cmd == cmd::AM {
        if p.layout == layout::SHORT && p.am_hdr_size != 8 {
            ucs::error!("Short AM header size must be 8 bytes");
            return Status::InvalidParam;
        }
        if p.layout == layout::ZCOPY && p.am_hdr_size > attr.am.max_hdr {
            ucs::error!(
                "AM header size ({}) is larger than max supported ({})",
                p.am_hdr_size,
                attr.am.max_hdr
            );
            return Status::Unsupported;
        }
        if p.am_hdr_size > size {
            ucs::error!(
                "AM header size ({}) is larger than message size ({size})",
                p.am_hdr_size
            );
            return Status::InvalidParam;
        }
        if p.fc_window > MAX_FC_WINDOW {
            ucs::error!(
                "AM flow-control window ({}) too large (should be <= {MAX_FC_WINDOW})",
                p.fc_window
            );
            return Status::InvalidParam;
        }
        if p.layout == layout::ZCOPY && p.sizes.len() > 1 && p.am_hdr_size > p.sizes[0] {
            ucs::error!("AM header size larger than the first IOV message size");
            return Status::InvalidParam;
        }
    }
    if matches!(p.layout, layout::ZCOPY | layout::SHORT_IOV) && p.sizes.len() > max_iov.max(1) {
        ucs::error!(
            "Wrong number of IOV entries. Requested is {}, should be in the range 1...{max_iov}",
            p.sizes.len()
        );
        return Status::Unsupported;
    }
    if p.layout == layout::SHORT_IOV && t.cmd != cmd::AM {
        ucs::error!("-D shortiov is only for active messages");
        return Status::Unsupported;
    }
    let needs_mem = t.cmd != cmd::AM || p.layout == layout::ZCOPY;
    if needs_mem && !md.attr().flags.contains(MdFlags::REG) {
        ucs::error!(
            "memory domain {} cannot register memory, which this test needs",
            md.name()
        );
        return Status::Unsupported;
    }
    Status::Ok
}

/// Size of each of the send and receive buffers (`uct_perf_test_alloc_mem`).
pub fn buffer_size(p: &Params) -> usize {
    if p.layout == layout::ZCOPY && p.iov_stride > 0 {
        p.sizes.len().saturating_mul(p.iov_stride)
    } else {
        p.message_size()
    }
}

/// Opens everything up to the capability check; the status is agreed with the peer before
/// anything else happens, so both sides fail together.
fn open(ctx: &Context, p: &Params, watch: &PeerWatch) -> Result<(Worker, Md, Iface)> {
    let mode = if p.async_mode == AsyncKind::Poll {
        AsyncMode::Poll
    } else {
        AsyncMode::Thread
    };
    let worker = Worker::with_async_mode(mode)?;
    let (md, _) = ctx.find_resource(&p.tl, &p.dev).inspect_err(|_| {
        ucs::error!(
            "Cannot use {}/{} (list transports and devices with rucx-info -d)",
            p.tl,
            p.dev
        );
    })?;
    let (tl, dev) = (p.tl.clone(), p.dev.clone());
    let slot = watch.failure_slot();
    let params = IfaceParams::new(&p.tl, &p.dev).err_handler(move |_, st| {
        PeerWatch::fail(
            &slot,
            Error::new(st, format!("{tl}/{dev}: endpoint failed, the peer is gone")),
        )
    });
    let iface = Iface::open(&md, &worker, params).inspect_err(|e| {
        ucs::error!("Failed to open iface: {e}");
    })?;
    Ok((worker, md, iface))
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if b.len() < n {
        ucs::error!("peer address blob is truncated: the peer is not a matching rucx-perftest");
        return Err(Status::InvalidParam.into());
    }
    let (h, t) = b.split_at(n);
    *b = t;
    Ok(h)
}

fn take_bytes<'a>(b: &mut &'a [u8]) -> Result<&'a [u8]> {
    let n = u32::from_le_bytes(take(b, 4)?.try_into().expect("4 bytes")) as usize;
    take(b, n)
}

impl Setup {
    /// Opens, checks, allocates and connects; on error both sides have been told.
    pub fn new(ctx: &Context, p: &Params, rte: &mut Rte) -> Result<Setup> {
        let watch = rte.watch()?;
        let opened = open(ctx, p, &watch);
        let own = match &opened {
            Ok((_, md, iface)) => check_capabilities(p, iface.attr(), md),
            Err(e) => e.status(),
        };
        let mut idle = || {};
        let st = rte.exchange_status(own, &mut idle)?;
        let (worker, md, iface) = opened?;
        if st != Status::Ok {
            return Err(rte::status_error(st));
        }
        let attr = *iface.attr();
        let size = buffer_size(p);
        let (send_mem, recv_mem) = if md.attr().flags.contains(MdFlags::REG) {
            (
                Some(Mem::alloc(&md, size, MemAccess::ALL)?),
                Some(Mem::alloc(&md, size, MemAccess::ALL)?),
            )
        } else {
            (None, None)
        };
        let counters = Rc::new(LoopCounters::default());
        let am_bad = Rc::new(Cell::new(0u64));
        install_am_handler(&iface, p, &counters, &am_bad)?;
        let mut s = Setup {
            worker,
            md,
            iface,
            attr,
            send_mem,
            recv_mem,
            peer: None,
            counters,
            am_bad,
            watch,
        };
        s.connect(rte)?;
        Ok(s)
    }

    fn progress_fn(&self) -> impl FnMut() + '_ {
        move || {
            self.worker.progress();
        }
    }

    /// Exchanges addresses and rkeys with the peer and connects (UCX's endpoint setup).
    fn connect(&mut self, rte: &mut Rte) -> Result<()> {
        let to_ep = self.attr.flags.contains(IfaceFlags::CONNECT_TO_EP);
        if !to_ep && !self.attr.flags.contains(IfaceFlags::CONNECT_TO_IFACE) {
            ucs::error!(
                "{}: the transport connects neither to an iface nor to an ep",
                self.iface.tl_name()
            );
            return Err(Status::Unsupported.into());
        }
        let ep = if to_ep {
            Some(self.iface.ep_create()?)
        } else {
            None
        };
        let rkey = match &self.recv_mem {
            Some(m) => m.pack_rkey()?,
            None => Vec::new(),
        };
        let mut blob = Vec::new();
        blob.extend_from_slice(&self.recv_mem.as_ref().map_or(0, |m| m.addr()).to_le_bytes());
        put_bytes(&mut blob, &rkey);
        put_bytes(&mut blob, &self.iface.device_address()?);
        put_bytes(&mut blob, &self.iface.address()?);
        put_bytes(
            &mut blob,
            &ep.as_ref().map(|e| e.address()).transpose()?.unwrap_or_default(),
        );
        rte.post(&blob)?;
        let remote = rte.recv(64 * 1024, &mut self.progress_fn())?;
        let mut r = &remote[..];
        let remote_addr = u64::from_le_bytes(take(&mut r, 8)?.try_into().expect("8 bytes"));
        let rkey = take_bytes(&mut r)?;
        let dev = take_bytes(&mut r)?;
        let iface_addr = take_bytes(&mut r)?;
        let ep_addr = take_bytes(&mut r)?;
        if !self.iface.is_reachable(dev, iface_addr) {
            ucs::error!("Destination is unreachable");
            return Err(Status::Unreachable.into());
        }
        let rkey = if !rkey.is_empty() && self.md.attr().flags.contains(MdFlags::REG) {
            Some(self.md.component().rkey_unpack(rkey).inspect_err(|e| {
                ucs::error!("Failed to uct_rkey_unpack: {e}");
            })?)
        } else {
            None
        };
        let ep = match ep {
            Some(ep) => {
                ep.connect_to_ep(dev, ep_addr).inspect_err(|e| {
                    ucs::error!("Failed to connect endpoint: {e}");
                })?;
                ep
            }
            None => self.iface.ep_create_connected(dev, iface_addr).inspect_err(|e| {
                ucs::error!("Failed to connect endpoint: {e}");
            })?,
        };
        self.peer = Some(Peer {
            ep,
            remote_addr,
            rkey,
        });
        self.flush_iface()?;
        rte.barrier(&mut self.progress_fn())
    }

    /// Flushes the interface, progressing until done (`uct_perf_iface_flush_b`); an error
    /// only when the peer is gone (a failed flush is logged, as UCX does).
    pub fn flush_iface(&self) -> Result<()> {
        loop {
            let st = self.iface.flush(FlushFlags::LOCAL, None);
            self.worker.progress();
            match st {
                Ok(Outcome::InProgress) => {}
                Err(e) if e == Status::NoResource => {}
                Ok(Outcome::Done) => return Ok(()),
                Err(e) => {
                    ucs::error!("uct_iface_flush() failed: {e}");
                    return Ok(());
                }
            }
            self.watch.tick()?;
        }
    }

    /// Tears down like `uct_perf_test_cleanup_endpoints`: barrier, handler removed, eps gone.
    pub fn cleanup(mut self, rte: &mut Rte) -> Result<()> {
        let r = rte.barrier(&mut self.progress_fn());
        let _ = self.iface.clear_am_handler(AM_ID);
        self.peer = None;
        r
    }
}

/// The handler: remembers the first byte (the sequence number); under `-V` also checks the
/// length and the payload against [`send_pattern`]. It takes shared data: over shared memory
/// the message is read where it lies (one byte, as ucx_perftest's handler reads it).
fn install_am_handler(
    iface: &Iface,
    p: &Params,
    counters: &Rc<LoopCounters>,
    bad: &Rc<Cell<u64>>,
) -> Result<()> {
    let c = counters.clone();
    if !p.validate {
        return iface.set_am_handler(AM_ID, AmCbFlags::SHARED_DATA, move |m| {
            let mut b = [0u8; 1];
            if m.copy_to(0, &mut b) == 1 {
                c.am_sn.set(b[0]);
            }
        });
    }
    let len = p.message_size();
    // am_short carries the sequence number in an 8-byte header; other layouts in byte 0.
    let skip = if p.layout == layout::SHORT { 8 } else { 1 }.min(len);
    let expect: Vec<u8> = (skip..len).map(send_pattern).collect();
    let bad = bad.clone();
    iface.set_am_handler(AM_ID, AmCbFlags::SHARED_DATA, move |m| {
        let d = m.data();
        if let Some(&b) = d.first() {
            c.am_sn.set(b);
        }
        if d.len() != len || d[skip..] != expect[..] {
            bad.set(bad.get() + 1);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer's address blob is read with `take`/`take_bytes`: random, truncated and
    /// oversized length fields are refused, never read past the end.
    #[test]
    fn address_blob_fields_survive_random_input() {
        let mut blob = 7u64.to_le_bytes().to_vec();
        for f in [&b"rkey"[..], b"", b"device-addr", b"if"] {
            put_bytes(&mut blob, f);
        }
        let mut r = &blob[..];
        assert_eq!(take(&mut r, 8).unwrap(), 7u64.to_le_bytes());
        let got: Vec<&[u8]> = (0..4).map(|_| take_bytes(&mut r).unwrap()).collect();
        assert_eq!(got, [&b"rkey"[..], b"", b"device-addr", b"if"]);
        assert!(r.is_empty() && take_bytes(&mut r).is_err());
        let mut rng: u64 = 0xdead_beef_cafe_f00d;
        for _ in 0..3000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut v = blob.clone();
            let i = (rng % v.len() as u64) as usize;
            v[i] = (rng >> 32) as u8;
            v.truncate(((rng >> 40) % (v.len() as u64 + 1)) as usize);
            let mut r = &v[..];
            let fields =
                take(&mut r, 8).and_then(|_| (0..4).map(|_| take_bytes(&mut r)).collect::<Result<Vec<_>>>());
            if let Ok(f) = fields {
                assert_eq!(
                    8 + f.iter().map(|x| 4 + x.len()).sum::<usize>() + r.len(),
                    v.len()
                );
            }
        }
        let mut huge = &[0xff, 0xff, 0xff, 0xff, 1, 2][..];
        assert_eq!(take_bytes(&mut huge), Err(Status::InvalidParam.into()));
    }
}
