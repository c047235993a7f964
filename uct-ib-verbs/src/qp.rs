//! Queue pairs (`ibv_create_qp`, `ibv_modify_qp`, `ibv_post_send`, `ibv_post_recv`) and the
//! state transitions UCX's rc/ud transports use (parameters in `qp_params`).

use crate::cq::CompletionQueue;
use crate::error::{fail, invalid, last_errno, rc_errno, CallKind};
use crate::pd::ProtectionDomain;
use crate::qp_params::{InitParams, QpCaps, QpInitAttr, QpState, QpType, RtrParams, RtsParams};
use crate::recv_chain::RecvChain;
use crate::srq::{post_recv_chain, SharedReceiveQueue};
use crate::wr::{
    fill_send_wr, zeroed_send_wr, RecvPostError, RecvRequest, SendFlags, SendOp, SendRequest, Sge, UdDest,
    UdInlineWr, MAX_INLINE_PIECES,
};
use rdma_sys::*;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::{Result, Status};

/// A queue pair. Holds its PD, CQs and SRQ, so they are destroyed after it.
pub struct QueuePair {
    qp: NonNull<ibv_qp>,
    qp_num: u32,
    qp_type: QpType,
    caps: QpCaps,
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
}

// SAFETY: QP verbs (post, modify, query, destroy) are thread-safe in libibverbs providers.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates a QP in RESET state. With an `srq`, `caps.max_recv_wr` must be 0.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        attr: &QpInitAttr,
    ) -> Result<QueuePair> {
        if srq.is_some() && attr.caps.max_recv_wr != 0 {
            return Err(invalid(
                "QueuePair::new",
                format_args!("max_recv_wr must be 0 when the QP receives from an SRQ"),
                Status::InvalidParam,
            ));
        }
        let c = attr.caps;
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_ptr(),
            recv_cq: recv_cq.as_ptr(),
            srq: srq.map_or(std::ptr::null_mut(), |s| s.as_ptr()),
            cap: ibv_qp_cap {
                max_send_wr: c.max_send_wr,
                max_recv_wr: c.max_recv_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
            qp_type: attr.qp_type.raw(),
            sq_sig_all: attr.sq_sig_all as i32,
        };
        // SAFETY: valid PD, CQs and SRQ (kept alive by the Arcs we store); the provider
        // writes the granted capabilities back into `init.cap`.
        let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let Some(qp) = NonNull::new(qp) else {
            return Err(fail(
                "ibv_create_qp",
                format_args!("{} {attr:?}", pd.context().name()),
                last_errno(),
                CallKind::Control,
            ));
        };
        let g = init.cap;
        // SAFETY: freshly created, valid QP.
        let qp_num = unsafe { (*qp.as_ptr()).qp_num };
        Ok(QueuePair {
            qp,
            qp_num,
            qp_type: attr.qp_type,
            caps: QpCaps {
                max_send_wr: g.max_send_wr,
                max_recv_wr: g.max_recv_wr,
                max_send_sge: g.max_send_sge,
                max_recv_sge: g.max_recv_sge,
                max_inline_data: g.max_inline_data,
            },
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            srq: srq.cloned(),
        })
    }

    /// The provider's QP (for calls made elsewhere in this module tree, e.g. a send batch).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut ibv_qp {
        self.qp.as_ptr()
    }

    /// QP number (what the peer puts in `dest_qp_num` / `remote_qpn`).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Granted capabilities (may exceed what was asked; `max_inline_data` is the limit for
    /// [`QueuePair::post_send_inline`]).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: std::fmt::Arguments<'_>,
    ) -> Result<()> {
        // SAFETY: valid QP and attribute struct; `mask` names the fields we filled.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        if rc != 0 {
            return Err(fail(
                "ibv_modify_qp",
                format_args!("qp {:#x} {what}", self.qp_num),
                rc_errno(rc),
                CallKind::Control,
            ));
        }
        Ok(())
    }

    fn zeroed_attr(state: ibv_qp_state::Type) -> ibv_qp_attr {
        // SAFETY: ibv_qp_attr is plain C data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        a
    }

    /// RESET -> INIT.
    pub fn modify_to_init(&self, p: &InitParams) -> Result<()> {
        use ibv_qp_attr_mask as m;
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_INIT);
        a.port_num = p.port_num;
        a.pkey_index = p.pkey_index;
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT;
        if self.qp_type == QpType::Ud {
            a.qkey = p.qkey;
            mask |= m::IBV_QP_QKEY;
        } else {
            a.qp_access_flags = p.access.bits();
            mask |= m::IBV_QP_ACCESS_FLAGS;
        }
        self.modify(&mut a, mask, format_args!("-> INIT {p:?}"))
    }

    /// INIT -> RTR of a connected (RC/UC) QP.
    pub fn modify_to_rtr(&self, p: &RtrParams) -> Result<()> {
        use ibv_qp_attr_mask as m;
        self.require_connected("modify_to_rtr")?;
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_RTR);
        a.path_mtu = p.path_mtu.raw();
        a.dest_qp_num = p.dest_qp_num;
        a.rq_psn = p.rq_psn;
        a.ah_attr = p.ah.to_raw();
        let mut mask =
            m::IBV_QP_STATE | m::IBV_QP_AV | m::IBV_QP_PATH_MTU | m::IBV_QP_DEST_QPN | m::IBV_QP_RQ_PSN;
        if self.qp_type == QpType::Rc {
            a.max_dest_rd_atomic = p.max_dest_rd_atomic;
            a.min_rnr_timer = p.min_rnr_timer;
            mask |= m::IBV_QP_MAX_DEST_RD_ATOMIC | m::IBV_QP_MIN_RNR_TIMER;
        }
        self.modify(&mut a, mask, format_args!("-> RTR {p:?}"))
    }

    /// RTR -> RTS of a connected (RC/UC) QP.
    pub fn modify_to_rts(&self, p: &RtsParams) -> Result<()> {
        use ibv_qp_attr_mask as m;
        self.require_connected("modify_to_rts")?;
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_RTS);
        a.sq_psn = p.sq_psn;
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_SQ_PSN;
        if self.qp_type == QpType::Rc {
            a.timeout = p.timeout;
            a.retry_cnt = p.retry_cnt;
            a.rnr_retry = p.rnr_retry;
            a.max_rd_atomic = p.max_rd_atomic;
            mask = mask
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC;
        }
        self.modify(&mut a, mask, format_args!("-> RTS {p:?}"))
    }

    /// INIT -> RTR -> RTS of a UD QP (no peer: datagrams carry their address).
    pub fn modify_ud_to_rts(&self, sq_psn: u32) -> Result<()> {
        use ibv_qp_attr_mask as m;
        if self.qp_type != QpType::Ud {
            return Err(invalid(
                "QueuePair::modify_ud_to_rts",
                format_args!("qp is {:?}, not UD", self.qp_type),
                Status::InvalidParam,
            ));
        }
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_RTR);
        self.modify(&mut a, m::IBV_QP_STATE, format_args!("-> RTR (UD)"))?;
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_RTS);
        a.sq_psn = sq_psn;
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_SQ_PSN,
            format_args!("-> RTS (UD)"),
        )
    }

    /// Any state -> ERROR: outstanding WRs complete with `WrFlushErr` (how UCX flushes/
    /// cancels before destroying).
    pub fn modify_to_error(&self) -> Result<()> {
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_ERR);
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, format_args!("-> ERR"))
    }

    /// Any state -> RESET (the QP can be connected again).
    pub fn modify_to_reset(&self) -> Result<()> {
        let mut a = Self::zeroed_attr(ibv_qp_state::IBV_QPS_RESET);
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, format_args!("-> RESET"))
    }

    /// Current state (`ibv_query_qp`).
    pub fn state(&self) -> Result<QpState> {
        let mut a = Self::zeroed_attr(0);
        // SAFETY: ibv_qp_init_attr is plain C data; all-zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe {
            ibv_query_qp(
                self.qp.as_ptr(),
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(fail(
                "ibv_query_qp",
                format_args!("qp {:#x}", self.qp_num),
                rc_errno(rc),
                CallKind::Control,
            ));
        }
        Ok(QpState::from_raw(a.qp_state))
    }

    fn require_connected(&self, what: &str) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return Err(invalid(
                what,
                format_args!("UD QPs have no peer; use modify_ud_to_rts"),
                Status::InvalidParam,
            ));
        }
        Ok(())
    }

    #[inline]
    fn check_dest(&self, ud: &Option<UdDest<'_>>) -> Result<()> {
        if (self.qp_type == QpType::Ud) != ud.is_some() {
            return Err(invalid(
                "QueuePair::post_send",
                format_args!(
                    "a {:?} QP needs `ud: {}`",
                    self.qp_type,
                    if ud.is_some() { "None" } else { "Some(UdDest)" }
                ),
                Status::InvalidParam,
            ));
        }
        Ok(())
    }

    #[inline]
    fn post_raw(&self, wr: &mut ibv_send_wr) -> Result<()> {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `wr` is a single well-formed WR whose SGE array and AH outlive
        // the call; non-inline SGEs are checked by the HCA against their lkey.
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(fail(
                "ibv_post_send",
                format_args!("qp {:#x} opcode {}", self.qp_num, wr.opcode),
                rc_errno(rc),
                CallKind::Post,
            ));
        }
        Ok(())
    }

    /// Posts one send work request. `Err(NoResource)` when the send queue is full.
    #[inline]
    pub fn post_send(&self, req: &SendRequest<'_>) -> Result<()> {
        self.check_dest(&req.ud)?;
        let mut wr = zeroed_send_wr();
        wr.wr_id = req.wr_id;
        // the provider only reads the SGE array (the C API just lacks const)
        wr.sg_list = req.sges.as_ptr() as *mut ibv_sge;
        wr.num_sge = req.sges.len() as i32;
        wr.send_flags = req.flags.bits();
        fill_send_wr(&mut wr, req.op, req.ud);
        self.post_raw(&mut wr)
    }

    /// Posts an inline SEND or RDMA WRITE: the CPU copies `data` (the concatenation of the
    /// pieces, at most [`QueuePair::caps`]`.max_inline_data` bytes) into the WQE, so it needs
    /// no registration and can be reused as soon as this returns.
    #[inline]
    pub fn post_send_inline(
        &self,
        wr_id: u64,
        data: &[&[u8]],
        op: SendOp,
        flags: SendFlags,
        ud: Option<UdDest<'_>>,
    ) -> Result<()> {
        self.check_dest(&ud)?;
        if !matches!(
            op,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
        ) {
            return Err(invalid(
                "QueuePair::post_send_inline",
                format_args!("{op:?} cannot be inline"),
                Status::InvalidParam,
            ));
        }
        if data.len() > MAX_INLINE_PIECES {
            return Err(invalid(
                "QueuePair::post_send_inline",
                format_args!("{} pieces; at most {MAX_INLINE_PIECES}", data.len()),
                Status::InvalidParam,
            ));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        self.check_inline_len("QueuePair::post_send_inline", total)?;
        let mut sges = [Sge::new(0, 0, 0); MAX_INLINE_PIECES];
        for (s, d) in sges.iter_mut().zip(data) {
            *s = Sge::new(d.as_ptr() as u64, d.len() as u32, 0);
        }
        let mut wr = inline_wr(wr_id, &mut sges, data.len(), flags);
        fill_send_wr(&mut wr, op, ud);
        // the provider reads the inline pieces during the call; they are live slices
        self.post_raw(&mut wr)
    }

    /// `Err(ExceedsLimit)` (its context naming `call`) when `total` inline bytes exceed what the QP
    /// was granted.
    #[inline]
    fn check_inline_len(&self, call: &str, total: usize) -> Result<()> {
        if total > self.caps.max_inline_data as usize {
            return Err(invalid(
                call,
                format_args!(
                    "{total} bytes exceed max_inline_data {}; use a registered buffer",
                    self.caps.max_inline_data
                ),
                Status::ExceedsLimit,
            ));
        }
        Ok(())
    }

    /// Posts an inline SEND of `head` followed by `payload` (which may be empty) on a connected
    /// QP: [`QueuePair::post_send_inline`] for the commonest case, an AM with its header,
    /// with only the checks that case needs (the size) and no opcode dispatch.
    #[inline]
    pub fn post_inline_send(&self, wr_id: u64, head: &[u8], payload: &[u8], flags: SendFlags) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return self.post_send_inline(wr_id, &[head, payload], SendOp::Send, flags, None);
        }
        self.check_inline_len("QueuePair::post_inline_send", head.len() + payload.len())?;
        let mut sges = [
            Sge::new(head.as_ptr() as u64, head.len() as u32, 0),
            Sge::new(payload.as_ptr() as u64, payload.len() as u32, 0),
        ];
        // an empty payload is no piece at all (a zero-length SGE is legal but costs a loop)
        let mut wr = inline_wr(wr_id, &mut sges, 1 + !payload.is_empty() as usize, flags);
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        // the provider reads the inline pieces during the call; they are live slices
        self.post_raw(&mut wr)
    }

    /// Posts an inline SEND of one piece on a UD QP: [`QueuePair::post_send_inline`] for
    /// ud_verbs' packets, with only the checks that case needs.
    #[inline]
    pub fn post_ud_send_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        flags: SendFlags,
        dest: UdDest<'_>,
    ) -> Result<()> {
        self.post_ud_inline_prepared(&mut UdInlineWr::default(), wr_id, data, flags, dest)
    }

    /// [`QueuePair::post_ud_send_inline`] through a request kept filled between posts
    /// ([`UdInlineWr`], ud_verbs' AM fast path): only the per-packet fields are written.
    #[inline]
    pub fn post_ud_inline_prepared(
        &self,
        t: &mut UdInlineWr,
        wr_id: u64,
        data: &[u8],
        flags: SendFlags,
        dest: UdDest<'_>,
    ) -> Result<()> {
        if self.qp_type != QpType::Ud {
            // always the error (a UD destination on another QP type), with its context
            return self.check_dest(&Some(dest));
        }
        self.check_inline_len("QueuePair::post_ud_send_inline", data.len())?;
        t.sge.addr = data.as_ptr() as u64;
        t.sge.length = data.len() as u32;
        t.wr.sg_list = &mut t.sge;
        t.wr.wr_id = wr_id;
        t.wr.send_flags = flags.bits() | ibv_send_flags::IBV_SEND_INLINE.0;
        t.wr.wr.ud = ud_t {
            ah: dest.ah.as_ptr(),
            remote_qpn: dest.remote_qpn,
            remote_qkey: dest.remote_qkey,
        };
        // the provider reads the request and the inline piece during the call only
        self.post_raw(&mut t.wr)
    }

    /// Receives are posted to the QP itself only when it has no SRQ.
    #[inline]
    fn check_own_recv_queue(&self, call: &str) -> std::result::Result<(), RecvPostError> {
        if self.srq.is_none() {
            return Ok(());
        }
        Err(RecvPostError {
            posted: 0,
            error: invalid(
                call,
                format_args!("qp {:#x} receives from an SRQ; post to the SRQ", self.qp_num),
                Status::InvalidParam,
            ),
        })
    }

    /// Posts one receive (QPs without an SRQ). `Err(NoResource)` when the queue is full.
    #[inline]
    pub fn post_recv(&self, req: &RecvRequest<'_>) -> Result<()> {
        Ok(self.post_recv_batch(std::slice::from_ref(req))?)
    }

    /// Posts up to [`MAX_RECV_BATCH`](super::MAX_RECV_BATCH) receives in one call. On error
    /// the requests before the failing one are posted ([`RecvPostError::posted`]).
    pub fn post_recv_batch(&self, reqs: &[RecvRequest<'_>]) -> std::result::Result<(), RecvPostError> {
        self.check_own_recv_queue("QueuePair::post_recv")?;
        post_recv_chain(reqs, "ibv_post_recv", |wr, bad| {
            // SAFETY: valid QP; `wr` is a well-formed chain whose SGE arrays outlive the call.
            unsafe { ibv_post_recv(self.qp.as_ptr(), wr, bad) }
        })
    }

    /// Posts the filled entries of `chain` with one call (the receive refill's path); like
    /// [`post_recv_batch`](Self::post_recv_batch), not on a QP that receives from an SRQ.
    #[inline]
    pub fn post_recv_chain(&self, chain: &mut RecvChain) -> std::result::Result<(), RecvPostError> {
        self.check_own_recv_queue("QueuePair::post_recv_chain")?;
        chain.post("ibv_post_recv", |wr, bad| {
            // SAFETY: valid QP; `wr` is the chain's null-terminated list of registered SGEs.
            unsafe { ibv_post_recv(self.qp.as_ptr(), wr, bad) }
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: valid QP, destroyed exactly once, before the PD/CQs/SRQ it holds.
        let rc = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_destroy_qp",
                format_args!("qp {:#x}", self.qp_num),
                rc_errno(rc),
                CallKind::Control,
            );
        }
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num)
            .field("type", &self.qp_type)
            .field("caps", &self.caps)
            .finish()
    }
}

/// An inline send WR (opcode still to set) over the first `n` of `sges`, which the caller keeps
/// alive until the post returns.
#[inline]
fn inline_wr(wr_id: u64, sges: &mut [Sge], n: usize, flags: SendFlags) -> ibv_send_wr {
    let mut wr = zeroed_send_wr();
    wr.wr_id = wr_id;
    wr.sg_list = sges.as_mut_ptr().cast::<ibv_sge>();
    wr.num_sge = n as i32;
    wr.send_flags = flags.bits() | ibv_send_flags::IBV_SEND_INLINE.0;
    wr
}
