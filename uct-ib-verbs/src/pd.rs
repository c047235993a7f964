//! Protection domain (`ibv_alloc_pd` / `ibv_dealloc_pd`).

use crate::device::Context;
use crate::error::{fail, last_errno, rc_errno, CallKind};
use rdma_sys::*;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::Result;

/// A protection domain. Memory regions, queue pairs, SRQs and address handles created in
/// it hold an `Arc` to it, so it is deallocated after all of them.
pub struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: PD handles are usable from any thread; verbs calls taking a PD are thread-safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; &ProtectionDomain only allows thread-safe verbs calls.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a PD on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: valid context.
        let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        match NonNull::new(pd) {
            Some(pd) => Ok(Arc::new(ProtectionDomain { pd, ctx: ctx.clone() })),
            None => Err(fail(
                "ibv_alloc_pd",
                format_args!("{}", ctx.name()),
                last_errno(),
                CallKind::Control,
            )),
        }
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc<ProtectionDomain>, so none is alive; freed once.
        let rc = unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_dealloc_pd",
                format_args!("{}", self.ctx.name()),
                rc_errno(rc),
                CallKind::Control,
            );
        }
    }
}
