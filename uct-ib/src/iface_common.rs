//! Interface building blocks shared by the ib transports: opening the port of a resource name,
//! registered buffer pools, the receive ring (`rx_ring`, re-exported here), completion
//! queues with a completion channel (event fd, arm with `Busy` detection), zero-copy AM
//! delivery of receive buffers, and when progress polls the send CQ.

use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::sync::Arc;

use ucs::mpool::{MemPool, MemPoolParams, PoolBuf};
use ucs::{Error, Result, Status};
use uct_transport::am::{AmDisposition, AmTable};
use uct_transport::types::ArmEvents;

use crate::config::IbConfig;
use crate::device::{parse_dev_name, PortInfo};
use crate::md::IbMd;
use uct_ib_verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, MrChunkAllocator, ProtectionDomain, RxLoan, Sge,
    WcBatch, WorkCompletion, RX_DESC_HDR,
};

pub use crate::rx_ring::RxRing;

/// Offset of the payload in receive and send buffers: after the lending header, 64-byte
/// aligned (UD places its 40-byte GRH here, before the payload).
pub const BUF_DATA_OFFSET: usize = 64;
const _: () = assert!(BUF_DATA_OFFSET >= RX_DESC_HDR);

/// Opens the port named by a resource (`rxe0:1`) of `md`'s device.
pub fn open_port(md: &IbMd, dev_name: &str, cfg: &IbConfig) -> Result<PortInfo> {
    let dev = md.device();
    match parse_dev_name(dev_name) {
        Some((name, port)) if name == dev.name() => PortInfo::open(dev, port, cfg.gid_index),
        _ => Err(Error::new(
            Status::NoDevice,
            format!(
                "ib: no device {dev_name} in memory domain {}; use <device>:<port>, e.g. {}:1",
                dev.name(),
                dev.name()
            ),
        )),
    }
}

/// A pool of registered buffers of `BUF_DATA_OFFSET + seg_size` bytes (chunk key = lkey),
/// about `per_chunk` per chunk. With `thp` (`RUCX_IB_THP`) and the kernel's THP, a chunk of at
/// least one huge page becomes the whole huge pages it rounds down to, filled with buffers;
/// smaller pools stay on the heap (a huge page would multiply their memory).
pub fn buffer_pool(
    pd: &Arc<ProtectionDomain>,
    name: &str,
    seg_size: usize,
    per_chunk: usize,
    max: usize,
    thp: bool,
) -> Result<MemPool> {
    let mut p = MemPoolParams::new(name, BUF_DATA_OFFSET + seg_size);
    p.alignment = 64;
    p.elems_per_chunk = per_chunk.max(1);
    let huge = match (thp, ucs::mpool::thp_size()) {
        (true, Some(hp)) => p.elems_filling_pages(hp),
        _ => None,
    };
    if let Some(n) = huge {
        p.elems_per_chunk = n;
    }
    p.max_elems = max.max(1);
    p.allocator = Some(Box::new(MrChunkAllocator::new(
        pd,
        AccessFlags::LOCAL_WRITE,
        huge.is_some(),
    )));
    MemPool::new(p)
}

/// A pool of one registered array of `bytes` bytes (for [`RxHeads`](uct_ib_verbs::RxHeads)).
pub fn array_pool(pd: &Arc<ProtectionDomain>, name: &str, bytes: usize) -> Result<MemPool> {
    let mut p = MemPoolParams::new(name, bytes);
    p.alignment = 64;
    p.elems_per_chunk = 1;
    p.max_elems = 1;
    p.allocator = Some(Box::new(MrChunkAllocator::new(
        pd,
        AccessFlags::LOCAL_WRITE,
        false,
    )));
    MemPool::new(p)
}

/// An SGE over `len` bytes at `off` of a pool buffer (the lkey is its chunk key).
#[inline]
pub fn buf_sge(buf: &PoolBuf, off: usize, len: usize) -> Sge {
    Sge::new(
        buf.as_ptr() as u64 + off as u64,
        len as u32,
        buf.chunk_key() as u32,
    )
}

/// Progress calls in a row that may leave the send CQ unpolled because messages arrived.
const SEND_CQ_SKIP_MAX: u8 = 8;

/// When progress polls the send CQ (rc and ud alike). As UCX (`UCX_RC_TX_POLL_ALWAYS=n`): only
/// when the receive CQ gave nothing, so a handler's caller (waiting for that message) gets
/// control back one poll sooner; and whenever sends wait for its completions, and at least
/// every `SEND_CQ_SKIP_MAX + 1`th call (so flushes complete while messages keep arriving).
#[derive(Default)]
pub struct SendCqPacing {
    skipped: Cell<u8>,
}

impl SendCqPacing {
    /// Whether to poll the send CQ now, after a receive poll that found `received`
    /// completions; `wanted`: sends wait for send completions.
    #[inline]
    pub fn poll_now(&self, received: u32, wanted: bool) -> bool {
        let skipped = self.skipped.get();
        if (received == 0) | wanted | (skipped >= SEND_CQ_SKIP_MAX) {
            self.skipped.set(0);
            true
        } else {
            self.skipped.set(skipped + 1);
            false
        }
    }
}

/// Hands `len` received bytes at `off` of `buf` to the AM handler of `id`, lending the buffer
/// (it returns to its pool when the handler is done, or when the host releases it).
/// `Err(InvalidParam)` for a malformed message (bad id or length): drop the connection.
#[inline]
pub fn deliver_am(am: &AmTable, id: u8, buf: PoolBuf, off: usize, len: usize) -> Result<AmDisposition> {
    let loan = match RxLoan::new(buf) {
        Ok(l) => l,
        Err(_) => return Err(Status::InvalidParam.into()),
    };
    let Some(data) = loan.bytes(off, len) else {
        ucs::error!(off, len, "ib: received message exceeds its buffer; dropped");
        return Err(Status::InvalidParam.into());
    };
    match am.invoke(id, data, Some(loan.desc())) {
        Ok(AmDisposition::Kept) => {
            loan.hand_over();
            Ok(AmDisposition::Kept)
        }
        Ok(d) => {
            drop(loan.reclaim());
            Ok(d)
        }
        Err(e) => Err(e),
    }
}

/// A completion queue plus completions already taken off it while arming (see [`Cq::arm`]),
/// which the next [`Cq::poll_into`] returns first.
pub struct Cq {
    cq: Arc<CompletionQueue>,
    stash: RefCell<[WorkCompletion; STASH]>,
    stash_len: Cell<usize>,
    stash_pos: Cell<usize>,
}

const STASH: usize = 16;

impl Cq {
    /// A CQ of at least `cqe` entries on `channel`.
    pub fn new(md: &IbMd, cqe: u32, channel: &Arc<CompletionChannel>) -> Result<Cq> {
        let cq = CompletionQueue::new(&md.device().ctx, cqe, Some(channel), 0)?;
        Ok(Cq {
            cq,
            stash: RefCell::new([const { WorkCompletion::EMPTY }; STASH]),
            stash_len: Cell::new(0),
            stash_pos: Cell::new(0),
        })
    }

    /// The verbs CQ (to create QPs on).
    pub fn raw(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// Polls up to `max` completions into `batch` (no zeroing of the batch first).
    #[inline]
    pub fn poll_into<'b, const N: usize>(
        &self,
        max: usize,
        batch: &'b mut WcBatch<N>,
    ) -> Result<&'b [WorkCompletion]> {
        if self.stash_len.get() == 0 {
            return self.cq.poll_into(max, batch);
        }
        Ok(self.drain_stash_into(max, batch))
    }

    #[cold]
    fn drain_stash_into<'b, const N: usize>(
        &self,
        max: usize,
        batch: &'b mut WcBatch<N>,
    ) -> &'b [WorkCompletion] {
        let mut stash = self.stash.borrow_mut();
        let (pos, len) = (self.stash_pos.get(), self.stash_len.get());
        let got = batch.take_from(&mut stash[pos..len], max);
        let n = got.len();
        if pos + n == len {
            self.stash_len.set(0);
            self.stash_pos.set(0);
        } else {
            self.stash_pos.set(pos + n);
        }
        got
    }

    /// Requests an event for the next completion, then checks for completions that arrived
    /// before the request (they would raise no event): `Err(Busy)` when there are some (they
    /// are kept for the next poll).
    pub fn arm(&self, solicited_only: bool) -> Result<()> {
        if self.stash_len.get() != 0 {
            return Err(Status::Busy.into());
        }
        self.cq.req_notify(solicited_only)?;
        let n = self.cq.poll(&mut self.stash.borrow_mut()[..])?;
        if n != 0 {
            self.stash_len.set(n);
            self.stash_pos.set(0);
            return Err(Status::Busy.into());
        }
        Ok(())
    }
}

/// A completion channel with a send and a receive CQ on it: the interface's event fd.
pub struct EventCqs {
    pub channel: Arc<CompletionChannel>,
    pub tx: Cq,
    pub rx: Cq,
}

impl EventCqs {
    /// Creates the channel (non-blocking fd) and both CQs.
    pub fn new(md: &IbMd, tx_cqe: u32, rx_cqe: u32) -> Result<EventCqs> {
        let channel = CompletionChannel::new(&md.device().ctx)?;
        channel.set_nonblocking(true)?;
        let tx = Cq::new(md, tx_cqe, &channel)?;
        let rx = Cq::new(md, rx_cqe, &channel)?;
        Ok(EventCqs { channel, tx, rx })
    }

    /// The fd to wait on (readable when an armed CQ got a completion).
    pub fn event_fd(&self) -> RawFd {
        self.channel.fd()
    }

    /// Arms the CQs for `events` (`SEND_COMP`: send CQ; `RECV`: receive CQ; `RECV_SIG`: receive
    /// CQ, solicited completions only). `Err(Busy)` when an event was already pending or
    /// completions are waiting: progress instead of sleeping.
    pub fn arm(&self, events: ArmEvents) -> Result<()> {
        // events that fired since the last arm: consume (ack) them and report Busy
        let mut fired = false;
        while self.channel.get_event()?.is_some() {
            fired = true;
        }
        if fired {
            return Err(Status::Busy.into());
        }
        if events.contains(ArmEvents::SEND_COMP) {
            self.tx.arm(false)?;
        }
        if events.intersects(ArmEvents::RECV | ArmEvents::RECV_SIG) {
            let solicited = !events.contains(ArmEvents::RECV);
            self.rx.arm(solicited)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send CQ is polled after an empty receive poll, when sends wait, and otherwise after
    /// at most `SEND_CQ_SKIP_MAX` busy calls in a row.
    #[test]
    fn send_cq_pacing_skips_only_busy_calls_and_not_for_long() {
        let p = SendCqPacing::default();
        assert!(p.poll_now(0, false));
        assert!(p.poll_now(3, true));
        let skipped = (0..100).take_while(|_| !p.poll_now(5, false)).count();
        assert_eq!(skipped, SEND_CQ_SKIP_MAX as usize);
        assert!(!p.poll_now(5, false), "the count starts again after a poll");
        assert!(p.poll_now(0, false));
        assert!(!p.poll_now(1, false));
    }
}
