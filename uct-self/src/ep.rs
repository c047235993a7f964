//! The self endpoint: every operation completes before it returns.

use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb, PendingReq, ResultPtr, UnpackCb};
use uct_transport::iov::{gather, total_len, Iov};
use uct_transport::rma::RegionTable;
use uct_transport::traits::{AtomicSize, TransportEp};
use uct_transport::types::{AtomicOp, FlushFlags, AM_ID_MAX};

use crate::iface::Shared;
use crate::md::regions;

/// Short messages up to 64 bytes, header included, are assembled on the sender's stack: no
/// shared buffer to borrow and write back, which on a ping-pong costs more than the copy. Two
/// sizes, because zeroing a 64-byte block shows on an 8-byte message.
#[repr(C, align(8))]
struct StackMsg<const N: usize>([u8; N]);

pub struct SelfEp {
    target: Rc<Shared>,
    /// The thread's registrations, kept here so RMA needs no thread-local lookup.
    regions: Rc<RegionTable>,
}

#[cold]
fn bad_id(id: u8) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("self: AM id {id} out of range 0..{}", AM_ID_MAX - 1),
    )
}

#[cold]
fn too_long(len: usize, max: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("self: message of {len} bytes exceeds the segment size {max} (RUCX_SELF_SEG_SIZE)"),
    )
}

impl SelfEp {
    pub(crate) fn new(target: Rc<Shared>) -> SelfEp {
        SelfEp {
            target,
            regions: regions(),
        }
    }

    #[inline]
    fn target(&self) -> Result<&Shared> {
        if self.target.closed.get() {
            return Err(Status::Unreachable.into());
        }
        Ok(&self.target)
    }

    /// Checks the AM id and the total length, then delivers what `fill` writes into a buffer.
    #[inline]
    fn deliver(&self, id: u8, len: usize, fill: impl FnOnce(&mut [u8]) -> Result<usize>) -> Result<usize> {
        if id >= AM_ID_MAX {
            return Err(bad_id(id));
        }
        let t = self.target()?;
        if len > t.seg_size {
            return Err(too_long(len, t.seg_size));
        }
        t.with_buf(|buf| {
            let n = fill(buf)?;
            t.am.invoke(id, &buf[..n], None)?;
            Ok(n)
        })
    }
}

impl SelfEp {
    #[cold]
    #[inline(never)]
    fn am_short_slow(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        self.deliver(id, 8 + payload.len(), |buf| {
            buf[..8].copy_from_slice(&header.to_le_bytes());
            buf[8..8 + payload.len()].copy_from_slice(payload);
            Ok(8 + payload.len())
        })
        .map(|_| ())
    }
}

/// Delivers a short message assembled in `block` (at least `8 + payload.len()` bytes).
#[inline(always)]
fn on_stack(block: &mut [u8], t: &Shared, id: u8, header: u64, payload: &[u8]) -> Result<()> {
    let buf = &mut block[..8 + payload.len()];
    buf[..8].copy_from_slice(&header.to_le_bytes());
    // no memcpy call for a header-only message (perftest's 8-byte am_lat)
    if !payload.is_empty() {
        buf[8..].copy_from_slice(payload);
    }
    t.am.invoke(id, buf, None).map(|_| ())
}

impl TransportEp for SelfEp {
    fn query(&self) -> uct_transport::types::EpAttr {
        uct_transport::types::EpAttr {
            peer_am_max: self.target.seg_size,
            connected: true,
        }
    }

    /// The fast path, written out: no closure between the send and the handler call. A message
    /// of up to 64 bytes is assembled on the stack ([`StackMsg`]), a longer one in the
    /// interface's delivery buffer. Anything unusual (bad AM id, closed target, too long, a
    /// long send from inside a handler of the same interface) goes through `deliver`.
    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        let t = &*self.target;
        let len = 8 + payload.len();
        // A valid id here leaves `invoke` no error to return: the result needs no merging.
        if id < AM_ID_MAX && !t.closed.get() && len <= t.seg_size {
            if len <= 16 {
                return on_stack(&mut StackMsg([0; 16]).0, t, id, header, payload);
            }
            if len <= 64 {
                return on_stack(&mut StackMsg([0; 64]).0, t, id, header, payload);
            }
            if let Ok(mut b) = t.buf.try_borrow_mut() {
                if let Some(buf) = b.get().get_mut(..len) {
                    buf[..8].copy_from_slice(&header.to_le_bytes());
                    buf[8..].copy_from_slice(payload);
                    return t.am.invoke(id, buf, None).map(|_| ());
                }
            }
        }
        self.am_short_slow(id, header, payload)
    }

    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        self.deliver(id, total_len(iov), |buf| Ok(gather(buf, iov)))
            .map(|_| ())
    }

    /// Inlined into the ABI export, with `deliver` and the pack call: one frame from the export
    /// to the copy. After a long copy the CPU's store queue is full, and every store the path
    /// makes after it (calls' return addresses, pushes, spills) waits its turn; stores that hop
    /// between cache lines drain slower than stores within one.
    #[inline]
    fn am_bcopy(&self, id: u8, pack: PackCb, _flags: u32) -> Result<usize> {
        self.deliver(id, 0, |buf| pack.pack(buf))
    }

    fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], _flags: u32, _comp: Comp) -> Result<Outcome> {
        let hl = header.len();
        self.deliver(id, hl + total_len(iov), |buf| {
            buf[..hl].copy_from_slice(header);
            Ok(hl + gather(&mut buf[hl..], iov))
        })?;
        Ok(Outcome::Done)
    }

    #[inline]
    fn put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        self.regions.write(rkey, raddr, data)
    }

    fn put_bcopy(&self, pack: PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        let t = self.target()?;
        t.with_buf(|buf| {
            let n = pack.pack(buf)?;
            self.regions.write(rkey, raddr, &buf[..n])?;
            Ok(n)
        })
    }

    fn put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, _comp: Comp) -> Result<Outcome> {
        let mut addr = raddr;
        for e in iov {
            self.regions.write(rkey, addr, e.bytes())?;
            addr += e.len() as u64;
        }
        Ok(Outcome::Done)
    }

    fn get_short(&self, buf: &mut [u8], raddr: u64, rkey: u64) -> Result<()> {
        self.regions.read(rkey, raddr, buf)
    }

    fn get_bcopy(&self, unpack: UnpackCb, len: usize, raddr: u64, rkey: u64, _comp: Comp) -> Result<Outcome> {
        let t = self.target()?;
        if len > t.seg_size {
            ucs::error!(
                len,
                max = t.seg_size,
                "self: get_bcopy longer than the segment size (RUCX_SELF_SEG_SIZE)"
            );
            unpack.cancel();
            return Err(Status::InvalidParam.into());
        }
        // The unpack callback runs while the buffer is lent to it; a nested send from inside it
        // gets a temporary buffer (see `with_buf`).
        t.with_buf(|buf| match self.regions.read(rkey, raddr, &mut buf[..len]) {
            Ok(()) => {
                unpack.deliver(&buf[..len]);
                Ok(Outcome::Done)
            }
            Err(e) => {
                unpack.cancel();
                Err(e)
            }
        })
    }

    fn get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, _comp: Comp) -> Result<Outcome> {
        let mut addr = raddr;
        for e in iov {
            self.regions
                .with_source(rkey, addr, e.len(), |src| e.write_at(0, src))?;
            addr += e.len() as u64;
        }
        Ok(Outcome::Done)
    }

    fn atomic_post(&self, size: AtomicSize, op: AtomicOp, value: u64, raddr: u64, rkey: u64) -> Result<()> {
        if matches!(op, AtomicOp::Swap | AtomicOp::Cswap) {
            ucs::error!(
                ?op,
                "atomic_post supports add/and/or/xor; use atomic_fetch/atomic_cswap"
            );
            return Err(Status::InvalidParam.into());
        }
        self.regions.atomic(rkey, raddr, size, op, value, 0).map(|_| ())
    }

    fn atomic_fetch(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        _comp: Comp,
    ) -> Result<Outcome> {
        if op == AtomicOp::Cswap {
            return Err(Status::InvalidParam.into());
        }
        result.set(self.regions.atomic(rkey, raddr, size, op, value, 0)?);
        Ok(Outcome::Done)
    }

    fn atomic_cswap(
        &self,
        size: AtomicSize,
        compare: u64,
        swap: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        _comp: Comp,
    ) -> Result<Outcome> {
        result.set(
            self.regions
                .atomic(rkey, raddr, size, AtomicOp::Cswap, swap, compare)?,
        );
        Ok(Outcome::Done)
    }

    /// Resources are always available: the caller should just send (UCX's self does the same).
    fn pending_add(&self, _req: PendingReq, _flags: u32) -> Result<()> {
        Err(Status::Busy.into())
    }

    fn pending_purge(&self, _purge: uct_transport::callbacks::PurgeCb) {}

    fn flush(&self, _flags: FlushFlags, _comp: Comp) -> Result<Outcome> {
        Ok(Outcome::Done)
    }
}
