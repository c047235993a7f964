//! The send fast path: resource checks, posting with moderation, and every operation
//! (AMs, RDMA WRITE/READ, atomics, flush, pure grants).

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb, ResultPtr, UnpackCb};
use uct_transport::iov::Iov;
use uct_transport::traits::AtomicSize;
use uct_transport::types::{AtomicOp, FlushFlags, AM_ID_MAX};

use super::ep::{Conn, EpState};
use super::fc::FcState;
use super::tx::TxOp;
use super::wire::{am_hdr, AM_HDR_LEN, FC_PURE_GRANT};
use crate::iface_common::{buf_sge, BUF_DATA_OFFSET as OFF};
use crate::md::lkey_of_memh;
use uct_ib_verbs::{SendFlags, SendOp, SendRequest, Sge};

/// Most SGEs of one work request (stack arrays).
pub(crate) const MAX_SGE: usize = uct_ib_verbs::MAX_INLINE_PIECES;

/// API misuse: `InvalidParam` saying what was wrong (allocates, but only on this error path).
#[cold]
fn invalid(what: std::fmt::Arguments<'_>) -> Error {
    Error::new(Status::InvalidParam, format!("rc_verbs: {what}"))
}

#[inline]
fn check_id(id: u8) -> Result<()> {
    if id >= AM_ID_MAX {
        return Err(invalid(format_args!(
            "AM id {id} out of range 0..{}",
            AM_ID_MAX - 1
        )));
    }
    Ok(())
}

impl EpState {
    /// True when one work request can be posted now.
    #[inline]
    pub fn has_tx_resources(&self) -> bool {
        self.conn.get() == Conn::Connected && self.tx.has_room() && self.iface.cq_available.get() > 0
    }

    /// Connected, not behind its pending queue, and room for one work request.
    #[inline]
    fn check(&self) -> Result<()> {
        match self.conn.get() {
            Conn::Connected => {}
            Conn::Failed(s) => return Err(s.into()),
            Conn::Idle => return Err(Status::NoResource.into()),
        }
        // `|`, not `||`: Cell reads only, one branch
        if self.pending_blocks() | !self.tx.has_room() | (self.iface.cq_available.get() == 0) {
            self.iface.tx_wanted.set(true);
            return Err(Status::NoResource.into());
        }
        Ok(())
    }

    /// [`EpState::check`] plus a flow-control credit.
    #[inline]
    fn check_am(&self) -> Result<FcState> {
        self.check()?;
        let fc = self.fc.get();
        if !fc.can_send(&self.iface.fc) {
            return Err(Status::NoResource.into());
        }
        Ok(fc)
    }

    /// Posts one work request through `post(wr_id, flags)` and commits the accounting.
    #[inline]
    fn post(
        &self,
        force: bool,
        extra: SendFlags,
        post: impl FnOnce(u64, SendFlags) -> Result<()>,
    ) -> Result<()> {
        if self.iface.db.waiting() {
            // collected sends go first (order on this QP; prompt delivery on another)
            self.iface.ring();
            if let Conn::Failed(st) = self.conn.get() {
                return Err(st.into());
            }
        }
        self.post_accounted(force, extra, post)
    }

    /// [`EpState::post`] without posting collected sends first: the flags (signaled by
    /// moderation or `force`, fenced after `fence`), then `post(wr_id, flags)`, then the
    /// accounting (also for a request that `post` only collects, see `doorbell`).
    #[inline]
    pub(crate) fn post_accounted(
        &self,
        force: bool,
        extra: SendFlags,
        post: impl FnOnce(u64, SendFlags) -> Result<()>,
    ) -> Result<()> {
        let (sn, sig) = self.tx.next(force);
        let mut flags = extra;
        if sig {
            flags = flags | SendFlags::SIGNALED;
        }
        if self.fence.get() {
            flags = flags | SendFlags::FENCE;
        }
        post(sn, flags)?;
        self.fence.set(false);
        self.tx.posted(sig);
        let s = &self.iface;
        s.cq_available.set(s.cq_available.get() - 1);
        Ok(())
    }

    #[inline]
    fn push_op(&self, op: TxOp) {
        self.tx.push_op(op);
    }

    #[inline]
    fn fc_sent(&self, flags: u8) {
        let mut fc = self.fc.get();
        fc.sent(&self.iface.fc, flags);
        self.fc.set(fc);
    }

    /// SGEs of registered user memory (empty entries skipped).
    fn iov_sges<'a>(
        &self,
        iov: &[Iov],
        out: &'a mut [Sge; MAX_SGE],
        first: usize,
        max: usize,
    ) -> Result<&'a [Sge]> {
        let mut n = first;
        for e in iov.iter().filter(|e| !e.is_empty()) {
            if n >= max {
                return Err(invalid(format_args!(
                    "{} iov entries; at most {}",
                    iov.len(),
                    max - first
                )));
            }
            let Some(lkey) = lkey_of_memh(e.memh() as usize) else {
                return Err(invalid(format_args!(
                    "zcopy iov entry without a memory handle of an ib memory domain; register it with \
                     Mem::alloc/mem_reg on this interface's memory domain"
                )));
            };
            out[n] = Sge::new(e.addr() as u64, e.len() as u32, lkey);
            n += 1;
        }
        Ok(&out[..n])
    }

    #[inline]
    pub fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        let fc = self.check_am()?;
        check_id(id)?;
        let s = &self.iface;
        if AM_HDR_LEN + 8 + payload.len() > s.caps.max_inline {
            return Err(invalid(format_args!(
                "am_short of {} bytes exceeds am.max_short {}; use am_bcopy",
                8 + payload.len(),
                s.caps.max_inline - AM_HDR_LEN
            )));
        }
        let flags = fc.tx_flags(&s.fc);
        // AM header and user header in one piece, the payload (if any) in a second: the
        // provider copies inline data piece by piece (UCX posts two pieces always).
        let mut head = [0u8; AM_HDR_LEN + 8];
        head[0] = am_hdr(id, flags);
        head[AM_HDR_LEN..].copy_from_slice(&header.to_le_bytes());
        self.post(false, SendFlags::SOLICITED, |wr_id, f| {
            self.qp.post_inline_send(wr_id, &head, payload, f)
        })?;
        self.fc_sent(flags);
        Ok(())
    }

    pub fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        let fc = self.check_am()?;
        check_id(id)?;
        let s = &self.iface;
        let total: usize = iov.iter().map(|e| e.len()).sum();
        if iov.len() >= MAX_SGE || AM_HDR_LEN + total > s.caps.max_inline {
            return Err(invalid(format_args!(
                "am_short_iov of {total} bytes in {} pieces; at most {} bytes in {} pieces",
                iov.len(),
                s.caps.max_inline - AM_HDR_LEN,
                MAX_SGE - 1
            )));
        }
        let flags = fc.tx_flags(&s.fc);
        let hdr = [am_hdr(id, flags)];
        let mut pieces: [&[u8]; MAX_SGE] = [&[]; MAX_SGE];
        pieces[0] = &hdr;
        for (p, e) in pieces[1..].iter_mut().zip(iov) {
            *p = e.bytes();
        }
        self.post(false, SendFlags::SOLICITED, |wr_id, f| {
            self.qp
                .post_send_inline(wr_id, &pieces[..1 + iov.len()], SendOp::Send, f, None)
        })?;
        self.fc_sent(flags);
        Ok(())
    }

    pub fn am_bcopy(&self, id: u8, pack: PackCb) -> Result<usize> {
        self.check_am()?;
        check_id(id)?;
        let s = &self.iface;
        let mut buf = s.tx_pool.get()?;
        let n = pack.pack(&mut buf[OFF + AM_HDR_LEN..OFF + s.caps.seg_size])?;
        // read the window after packing: the pack callback is user code
        let flags = self.fc.get().tx_flags(&s.fc);
        buf[OFF] = am_hdr(id, flags);
        let len = AM_HDR_LEN + n;
        if len <= s.caps.max_inline {
            self.post(false, SendFlags::SOLICITED, |wr_id, f| {
                self.qp
                    .post_send_inline(wr_id, &[&buf[OFF..OFF + len]], SendOp::Send, f, None)
            })?;
        } else if s.db.collects(self.qp.qp_num()) {
            let sge = buf_sge(&buf, OFF, len);
            self.collect(sge, SendFlags::SOLICITED, TxOp::Buf(buf))?;
        } else {
            let sge = [buf_sge(&buf, OFF, len)];
            self.post(false, SendFlags::SOLICITED, |wr_id, f| {
                self.qp.post_send(&SendRequest {
                    wr_id,
                    sges: &sge,
                    op: SendOp::Send,
                    flags: f,
                    ud: None,
                })
            })?;
            self.push_op(TxOp::Buf(buf));
        }
        self.fc_sent(flags);
        Ok(n)
    }

    pub fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], comp: Comp) -> Result<Outcome> {
        let fc = self.check_am()?;
        check_id(id)?;
        let s = &self.iface;
        let total = header.len() + iov.iter().map(|e| e.len()).sum::<usize>();
        let max_hdr = 127.min(s.caps.seg_size - AM_HDR_LEN);
        if header.len() > max_hdr || AM_HDR_LEN + total > s.caps.seg_size {
            return Err(invalid(format_args!(
                "am_zcopy: header {} bytes (max {max_hdr}), total {total} bytes (max am.max_zcopy {})",
                header.len(),
                s.caps.seg_size - AM_HDR_LEN
            )));
        }
        let mut buf = s.tx_pool.get()?;
        let flags = fc.tx_flags(&s.fc);
        buf[OFF] = am_hdr(id, flags);
        buf[OFF + AM_HDR_LEN..OFF + AM_HDR_LEN + header.len()].copy_from_slice(header);
        let mut sges = [Sge::new(0, 0, 0); MAX_SGE];
        sges[0] = buf_sge(&buf, OFF, AM_HDR_LEN + header.len());
        let sges = self.iov_sges(iov, &mut sges, 1, s.caps.max_send_sge)?;
        self.post(true, SendFlags::SOLICITED, |wr_id, f| {
            self.qp.post_send(&SendRequest {
                wr_id,
                sges,
                op: SendOp::Send,
                flags: f,
                ud: None,
            })
        })?;
        self.push_op(TxOp::BufComp(buf, comp));
        self.fc_sent(flags);
        Ok(Outcome::InProgress)
    }

    #[inline]
    pub fn put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        self.check()?;
        if data.len() > self.iface.caps.max_inline {
            return Err(invalid(format_args!(
                "put_short of {} bytes exceeds put.max_short {}; use put_bcopy",
                data.len(),
                self.iface.caps.max_inline
            )));
        }
        let op = SendOp::RdmaWrite {
            remote_addr: raddr,
            rkey: rkey as u32,
        };
        self.post(false, SendFlags::NONE, |wr_id, f| {
            self.qp.post_send_inline(wr_id, &[data], op, f, None)
        })
    }

    pub fn put_bcopy(&self, pack: PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        self.check()?;
        let s = &self.iface;
        let mut buf = s.tx_pool.get()?;
        let n = pack.pack(&mut buf[OFF..OFF + s.caps.seg_size])?;
        let op = SendOp::RdmaWrite {
            remote_addr: raddr,
            rkey: rkey as u32,
        };
        if n <= s.caps.max_inline {
            self.post(false, SendFlags::NONE, |wr_id, f| {
                self.qp
                    .post_send_inline(wr_id, &[&buf[OFF..OFF + n]], op, f, None)
            })?;
        } else {
            let sge = [buf_sge(&buf, OFF, n)];
            self.post(false, SendFlags::NONE, |wr_id, f| {
                self.qp.post_send(&SendRequest {
                    wr_id,
                    sges: &sge,
                    op,
                    flags: f,
                    ud: None,
                })
            })?;
            self.push_op(TxOp::Buf(buf));
        }
        Ok(n)
    }

    /// put_zcopy (`read` false: RDMA WRITE) or get_zcopy (RDMA READ) of registered memory.
    pub fn rdma_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp, read: bool) -> Result<Outcome> {
        self.check()?;
        let s = &self.iface;
        let total: usize = iov.iter().map(|e| e.len()).sum();
        if total > s.caps.max_msg {
            return Err(invalid(format_args!(
                "zcopy of {total} bytes exceeds the port's {}",
                s.caps.max_msg
            )));
        }
        let max = if read {
            s.caps.max_get_sge
        } else {
            s.caps.max_send_sge
        };
        let mut sges = [Sge::new(0, 0, 0); MAX_SGE];
        let sges = self.iov_sges(iov, &mut sges, 0, max)?;
        let (remote_addr, rkey) = (raddr, rkey as u32);
        let op = if read {
            SendOp::RdmaRead { remote_addr, rkey }
        } else {
            SendOp::RdmaWrite { remote_addr, rkey }
        };
        self.post(true, SendFlags::NONE, |wr_id, f| {
            self.qp.post_send(&SendRequest {
                wr_id,
                sges,
                op,
                flags: f,
                ud: None,
            })
        })?;
        self.push_op(TxOp::Comp(comp));
        Ok(Outcome::InProgress)
    }

    pub fn get_bcopy(
        &self,
        unpack: UnpackCb,
        len: usize,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        let s = &self.iface;
        let r = (|| {
            self.check()?;
            if len > s.caps.seg_size {
                return Err(invalid(format_args!(
                    "get_bcopy of {len} bytes exceeds get.max_bcopy {}",
                    s.caps.seg_size
                )));
            }
            let buf = s.tx_pool.get()?;
            let sge = [buf_sge(&buf, OFF, len)];
            let op = SendOp::RdmaRead {
                remote_addr: raddr,
                rkey: rkey as u32,
            };
            self.post(true, SendFlags::NONE, |wr_id, f| {
                self.qp.post_send(&SendRequest {
                    wr_id,
                    sges: &sge,
                    op,
                    flags: f,
                    ud: None,
                })
            })?;
            Ok(buf)
        })();
        match r {
            Ok(buf) => {
                self.push_op(TxOp::GetBcopy {
                    buf,
                    len,
                    unpack,
                    comp,
                });
                Ok(Outcome::InProgress)
            }
            Err(e) => {
                unpack.cancel();
                Err(e)
            }
        }
    }

    /// 64-bit fetch-add (`Add`) and compare-swap (`Cswap`, `compare`/`value` = swap); with a
    /// `result` the old value is fetched.
    #[allow(clippy::too_many_arguments)]
    pub fn atomic(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        compare: u64,
        result: Option<ResultPtr>,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        let s = &self.iface;
        let ok_op = match op {
            AtomicOp::Add => true,
            AtomicOp::Cswap => result.is_some(),
            _ => false,
        };
        if !s.caps.atomics || size != AtomicSize::U64 || !ok_op {
            ucs::debug!(
                ?size,
                ?op,
                "rc_verbs atomics: 64-bit add (post, fetch) and cswap only"
            );
            return Err(Status::Unsupported.into());
        }
        if !raddr.is_multiple_of(8) {
            return Err(invalid(format_args!(
                "atomic target {raddr:#x} is not 8-byte aligned"
            )));
        }
        self.check()?;
        let buf = s.tx_pool.get()?;
        let sge = [buf_sge(&buf, OFF, 8)];
        let (remote_addr, rkey) = (raddr, rkey as u32);
        let sop = match op {
            AtomicOp::Cswap => SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap: value,
            },
            _ => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: value,
            },
        };
        self.post(result.is_some(), SendFlags::NONE, |wr_id, f| {
            self.qp.post_send(&SendRequest {
                wr_id,
                sges: &sge,
                op: sop,
                flags: f,
                ud: None,
            })
        })?;
        match result {
            Some(result) => {
                self.push_op(TxOp::Fetch { buf, result, comp });
                Ok(Outcome::InProgress)
            }
            None => {
                self.push_op(TxOp::Buf(buf));
                Ok(Outcome::Done)
            }
        }
    }

    /// Flush: `op` completes once everything posted so far completed.
    pub fn flush(&self, flags: FlushFlags, op: TxOp) -> Result<Outcome> {
        // collected sends are posted (and counted below as outstanding)
        self.iface.ring();
        match self.conn.get() {
            Conn::Failed(st) => return Err(st.into()),
            Conn::Idle if self.pending.is_empty() => return Ok(Outcome::Done),
            Conn::Idle => return Err(Status::NoResource.into()),
            Conn::Connected => {}
        }
        if flags.contains(FlushFlags::CANCEL) {
            if self.tx.outstanding() == 0 {
                return Ok(Outcome::Done);
            }
            self.canceled.set(true);
            self.conn.set(Conn::Failed(Status::Canceled));
            let _ = self.qp.modify_to_error();
            self.push_op(op);
            return Ok(Outcome::InProgress);
        }
        if self.pending_blocks() {
            return Err(Status::NoResource.into());
        }
        let (outstanding, unsignaled) = (self.tx.outstanding(), self.tx.unsignaled());
        if outstanding == 0 {
            return Ok(Outcome::Done);
        }
        if unsignaled > 0 {
            // a signaled zero-length RDMA WRITE: its completion covers everything before it
            if !self.has_tx_resources() {
                return Err(Status::NoResource.into());
            }
            let op = SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            };
            self.post(true, SendFlags::NONE, |wr_id, f| {
                self.qp.post_send(&SendRequest {
                    wr_id,
                    sges: &[],
                    op,
                    flags: f,
                    ud: None,
                })
            })?;
        }
        self.push_op(op);
        Ok(Outcome::InProgress)
    }

    /// Sends a grant without an AM (the peer asked for one now). Not flow-controlled.
    pub fn send_pure_grant(&self) -> Result<()> {
        if !self.has_tx_resources() {
            return Err(Status::NoResource.into());
        }
        let hdr = [am_hdr(0, FC_PURE_GRANT)];
        self.post(false, SendFlags::NONE, |wr_id, f| {
            self.qp.post_send_inline(wr_id, &[&hdr], SendOp::Send, f, None)
        })?;
        let mut fc = self.fc.get();
        fc.pure_grant_sent();
        self.fc.set(fc);
        Ok(())
    }
}
