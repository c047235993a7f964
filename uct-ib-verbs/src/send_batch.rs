//! Send work requests collected for one doorbell: a chain posted by one `ibv_post_send`.
//!
//! Each `ibv_post_send` call rings the doorbell once (a BlueFlame/doorbell write on an HCA; on
//! Soft-RoCE a `write()` to the uverbs device, in whose context the kernel runs the requester).
//! A stream of sends posted as chains of a few requests pays that once per chain.

use crate::ah::AddressHandle;
use crate::error::{fail, rc_errno, CallKind};
use crate::qp::QueuePair;
use crate::wr::{fill_send_wr, zeroed_send_wr, SendFlags, SendOp, Sge, UdDest};
use rdma_sys::*;
use std::sync::Arc;
use ucs::Status;

/// A chain the provider refused ([`SendBatch::post`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainRefused {
    /// The last requests of the chain, from the refused one on: not posted.
    pub unposted: usize,
    pub status: Status,
}

/// Most requests one batch holds.
pub const SEND_BATCH_MAX: usize = 16;

/// Up to [`SEND_BATCH_MAX`] one-SGE send requests of one QP, waiting for
/// [`SendBatch::post`]: of a connected QP, or of a UD QP to one destination, whose address
/// handle the batch holds until posted. The requests are kept unlinked: their SGE and `next`
/// pointers are set only inside `post`, so the batch may move in between.
pub struct SendBatch {
    wrs: [ibv_send_wr; SEND_BATCH_MAX],
    sges: [Sge; SEND_BATCH_MAX],
    len: usize,
    /// The UD destination of every request (the address handle their WRs point to).
    ud: Option<(Arc<AddressHandle>, u32, u32)>,
}

impl Default for SendBatch {
    fn default() -> Self {
        SendBatch {
            wrs: std::array::from_fn(|_| zeroed_send_wr()),
            sges: [Sge::new(0, 0, 0); SEND_BATCH_MAX],
            len: 0,
            ud: None,
        }
    }
}

impl SendBatch {
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a request reading one registered SGE (SEND or RDMA WRITE of a connected QP).
    /// Returns false, adding nothing, when the batch is full or `op` needs more than that.
    #[inline]
    pub fn push(&mut self, wr_id: u64, sge: Sge, op: SendOp, flags: SendFlags) -> bool {
        if self.len == SEND_BATCH_MAX
            || self.ud.is_some()
            || !matches!(op, SendOp::Send | SendOp::RdmaWrite { .. })
        {
            return false;
        }
        let wr = &mut self.wrs[self.len];
        *wr = zeroed_send_wr();
        wr.wr_id = wr_id;
        wr.num_sge = 1;
        wr.send_flags = flags.bits();
        fill_send_wr(wr, op, None);
        self.sges[self.len] = sge;
        self.len += 1;
        true
    }

    /// Adds a SEND of one registered SGE on a UD QP to `ah`, `remote_qpn`, `remote_qkey`.
    /// Returns false, adding nothing, when the batch is full or holds requests of a connected
    /// QP or to another destination (post it first).
    #[inline]
    pub fn push_ud(
        &mut self,
        wr_id: u64,
        sge: Sge,
        flags: SendFlags,
        ah: &Arc<AddressHandle>,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> bool {
        if self.len == SEND_BATCH_MAX {
            return false;
        }
        match &self.ud {
            Some((a, q, k)) if Arc::ptr_eq(a, ah) && *q == remote_qpn && *k == remote_qkey => {}
            Some(_) => return false,
            None if self.len > 0 => return false,
            None => self.ud = Some((ah.clone(), remote_qpn, remote_qkey)),
        }
        let wr = &mut self.wrs[self.len];
        *wr = zeroed_send_wr();
        wr.wr_id = wr_id;
        wr.num_sge = 1;
        wr.send_flags = flags.bits();
        let dest = UdDest {
            ah,
            remote_qpn,
            remote_qkey,
        };
        fill_send_wr(wr, SendOp::Send, Some(dest));
        self.sges[self.len] = sge;
        self.len += 1;
        true
    }

    /// True when [`SendBatch::push_ud`] to this destination would add to what the batch
    /// holds (it is empty or holds requests to the same destination).
    #[inline]
    pub fn fits_ud(&self, ah: &Arc<AddressHandle>, remote_qpn: u32, remote_qkey: u32) -> bool {
        match &self.ud {
            Some((a, q, k)) => Arc::ptr_eq(a, ah) && *q == remote_qpn && *k == remote_qkey,
            None => self.len == 0,
        }
    }

    /// Posts every request with one `ibv_post_send` on `qp` (the QP all of them were meant
    /// for) and empties the batch, also when posting fails: then the provider refused one
    /// request, and it and all after it were not posted (logged, counted in the error).
    pub fn post(&mut self, qp: &QueuePair) -> std::result::Result<(), ChainRefused> {
        let n = std::mem::take(&mut self.len);
        // the batch's address handle stays alive at least until the call returns
        let _ud = self.ud.take();
        if n == 0 {
            return Ok(());
        }
        let base = self.wrs.as_mut_ptr();
        for i in 0..n {
            // the provider only reads the SGEs (the C API just lacks const)
            self.wrs[i].sg_list = &mut self.sges[i].0;
            // SAFETY: `i + 1 <= n <= SEND_BATCH_MAX`: one past the last used entry at most,
            // stored only when a next entry exists
            self.wrs[i].next = if i + 1 < n {
                unsafe { base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            };
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP (borrowed for the call); `wrs[..n]` is a well-formed chain of
        // one-SGE SEND/RDMA WRITE requests (of a connected QP, or UD SENDs whose address
        // handle `_ud` keeps alive across the call) whose SGEs live in `self`, which is
        // borrowed mutably across the call; the HCA checks the SGEs against their lkeys.
        let rc = unsafe { ibv_post_send(qp.as_ptr(), base, &mut bad) };
        if rc != 0 {
            let first_bad = if bad.is_null() {
                0
            } else {
                // SAFETY: the provider points `bad` into the chain it was given
                (unsafe { bad.offset_from(base) }).clamp(0, n as isize) as usize
            };
            let status = fail(
                "ibv_post_send",
                format_args!(
                    "qp {:#x}, chain of {n}, refused from entry {first_bad}",
                    qp.qp_num()
                ),
                rc_errno(rc),
                CallKind::Post,
            )
            .status();
            return Err(ChainRefused {
                unposted: n - first_bad,
                status,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_refuses_when_full_or_not_one_sge_op() {
        let mut b = SendBatch::default();
        let sge = Sge::new(0x1000, 8, 7);
        assert!(!b.push(
            1,
            sge,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0
            },
            SendFlags::NONE
        ));
        for i in 0..SEND_BATCH_MAX {
            assert!(b.push(i as u64, sge, SendOp::Send, SendFlags::NONE));
        }
        assert_eq!(b.len(), SEND_BATCH_MAX);
        assert!(!b.push(99, sge, SendOp::Send, SendFlags::NONE));
        assert_eq!(b.wrs[3].wr_id, 3);
        assert_eq!(b.wrs[3].opcode, ibv_wr_opcode::IBV_WR_SEND);
    }
}
