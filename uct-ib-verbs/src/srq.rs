//! Shared receive queue (`ibv_create_srq`, `ibv_post_srq_recv`).

use crate::error::{fail, invalid, last_errno, rc_errno, CallKind};
use crate::pd::ProtectionDomain;
use crate::recv_chain::{recv_post_failed, RecvChain};
use crate::wr::{RecvPostError, RecvRequest, MAX_RECV_BATCH};
use rdma_sys::*;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::{Result, Status};

/// A shared receive queue: one pool of receive WRs for many QPs (UCX: one per iface).
pub struct SharedReceiveQueue {
    srq: NonNull<ibv_srq>,
    max_wr: u32,
    max_sge: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: SRQ posts and destroy are thread-safe in libibverbs providers.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// Creates an SRQ for `max_wr` receives of up to `max_sge` entries each (UCX: 4095 and
    /// 1, limit 0).
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    ) -> Result<Arc<SharedReceiveQueue>> {
        let mut attr = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit,
            },
        };
        // SAFETY: valid PD and attribute struct; the provider writes back granted sizes.
        let srq = unsafe { ibv_create_srq(pd.as_ptr(), &mut attr) };
        let Some(srq) = NonNull::new(srq) else {
            return Err(fail(
                "ibv_create_srq",
                format_args!("{} max_wr={max_wr} max_sge={max_sge}", pd.context().name()),
                last_errno(),
                CallKind::Control,
            ));
        };
        Ok(Arc::new(SharedReceiveQueue {
            srq,
            max_wr: attr.attr.max_wr,
            max_sge: attr.attr.max_sge,
            pd: pd.clone(),
        }))
    }

    /// Granted queue depth.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Granted SGEs per receive.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_srq {
        self.srq.as_ptr()
    }

    /// Posts one receive. `Err(NoResource)` when the SRQ is full.
    #[inline]
    pub fn post_recv(&self, req: &RecvRequest<'_>) -> Result<()> {
        Ok(self.post_recv_batch(std::slice::from_ref(req))?)
    }

    /// Posts up to [`MAX_RECV_BATCH`] receives with one call (a chained list built on the
    /// stack). On error the requests before the failing one are posted, the rest are not
    /// ([`RecvPostError::posted`] says how many).
    pub fn post_recv_batch(&self, reqs: &[RecvRequest<'_>]) -> std::result::Result<(), RecvPostError> {
        post_recv_chain(reqs, "ibv_post_srq_recv", |wr, bad| {
            // SAFETY: valid SRQ; `wr` is a well-formed chain whose SGE arrays outlive the call.
            unsafe { ibv_post_srq_recv(self.srq.as_ptr(), wr, bad) }
        })
    }

    /// Posts the filled entries of `chain` with one call (the receive refill's path).
    #[inline]
    pub fn post_chain(&self, chain: &mut RecvChain) -> std::result::Result<(), RecvPostError> {
        chain.post("ibv_post_srq_recv", |wr, bad| {
            // SAFETY: valid SRQ; `wr` is the chain's null-terminated list of registered SGEs.
            unsafe { ibv_post_srq_recv(self.srq.as_ptr(), wr, bad) }
        })
    }
}

/// Builds a chain of `ibv_recv_wr` for `reqs` on the stack and hands it to `post`.
/// Shared by SRQ and QP receive posting.
pub(crate) fn post_recv_chain(
    reqs: &[RecvRequest<'_>],
    call: &str,
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> std::result::Result<(), RecvPostError> {
    let none = |error| RecvPostError { posted: 0, error };
    if reqs.is_empty() {
        return Ok(());
    }
    if reqs.len() > MAX_RECV_BATCH {
        return Err(none(invalid(
            call,
            format_args!(
                "{} receive WRs in one batch; post at most {MAX_RECV_BATCH} at a time",
                reqs.len()
            ),
            Status::InvalidParam,
        )));
    }
    let mut wrs = [ibv_recv_wr {
        wr_id: 0,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
    }; MAX_RECV_BATCH];
    for (i, r) in reqs.iter().enumerate() {
        wrs[i].wr_id = r.wr_id;
        // the provider only reads the SGE array (the C API just lacks const)
        wrs[i].sg_list = r.sges.as_ptr() as *mut ibv_sge;
        wrs[i].num_sge = r.sges.len() as i32;
    }
    // link the chain through the raw pointer only, so `base` stays valid for the post
    let base = wrs.as_mut_ptr();
    for i in 0..reqs.len() - 1 {
        // SAFETY: i + 1 < reqs.len() <= MAX_RECV_BATCH: both entries are inside `wrs`.
        unsafe { (*base.add(i)).next = base.add(i + 1) };
    }
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    let rc = post(base, &mut bad);
    if rc != 0 {
        return Err(recv_post_failed(call, base, bad, reqs.len(), rc));
    }
    Ok(())
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: QPs attached to the SRQ hold an Arc to it, so none is alive; destroyed once.
        let rc = unsafe { ibv_destroy_srq(self.srq.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_destroy_srq",
                format_args!("{}", self.pd.context().name()),
                rc_errno(rc),
                CallKind::Control,
            );
        }
    }
}
