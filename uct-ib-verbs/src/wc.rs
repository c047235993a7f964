//! Work completions (`struct ibv_wc`) as returned by [`CompletionQueue::poll`](super::CompletionQueue::poll).

use rdma_sys::*;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use ucs::Status;

/// Status of a work completion (`enum ibv_wc_status`, the common ones named).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    /// The QP went to the error state; outstanding WRs are flushed with this.
    WrFlushErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    /// Transport retries exhausted: the peer is gone or unreachable.
    RetryExcErr,
    /// The peer had no receive WR posted for too long.
    RnrRetryExcErr,
    GeneralErr,
    Other(u32),
}

impl WcStatus {
    fn from_raw(raw: u32) -> WcStatus {
        use ibv_wc_status::*;
        match raw {
            IBV_WC_SUCCESS => WcStatus::Success,
            IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
            IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
            IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
            IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
            IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
            IBV_WC_LOC_ACCESS_ERR => WcStatus::LocAccessErr,
            IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
            IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
            IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
            IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
            IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
            IBV_WC_GENERAL_ERR => WcStatus::GeneralErr,
            r => WcStatus::Other(r),
        }
    }

    /// The UCX status a transport reports for this completion: retries exhausted ->
    /// `EndpointTimeout`, flushed -> `Canceled`, any other error -> `IoError`.
    pub fn to_status(self) -> Status {
        match self {
            WcStatus::Success => Status::Ok,
            WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr => Status::EndpointTimeout,
            WcStatus::WrFlushErr => Status::Canceled,
            _ => Status::IoError,
        }
    }
}

/// Opcode of a work completion (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
    Other(u32),
}

/// One work completion (`struct ibv_wc`, same layout). Make arrays of them with
/// [`WorkCompletion::EMPTY`]: `[WorkCompletion::EMPTY; 16]`.
#[repr(transparent)]
pub struct WorkCompletion(ibv_wc);

/// Room for up to `N` completions, left uninitialised (UCX polls into an uninitialised stack
/// array too): [`CompletionQueue::poll_into`](super::CompletionQueue::poll_into) fills a prefix
/// and hands out only that, so a progress call does not zero `N` × 48 bytes first.
pub struct WcBatch<const N: usize>(pub(super) [MaybeUninit<WorkCompletion>; N]);

impl<const N: usize> WcBatch<N> {
    #[inline(always)]
    pub fn new() -> Self {
        WcBatch([const { MaybeUninit::uninit() }; N])
    }
}

impl<const N: usize> WcBatch<N> {
    /// Moves up to `max` (at most `N`) completions out of `src` (leaving zeroed entries) into
    /// the batch and returns them.
    pub fn take_from(&mut self, src: &mut [WorkCompletion], max: usize) -> &[WorkCompletion] {
        let n = src.len().min(max).min(N);
        for (d, s) in self.0.iter_mut().zip(src[..n].iter_mut()) {
            d.write(std::mem::replace(s, WorkCompletion::EMPTY));
        }
        // SAFETY: the first `n` entries were just written.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<WorkCompletion>(), n) }
    }
}

impl<const N: usize> Default for WcBatch<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkCompletion {
    /// An all-zero entry to fill arrays for [`CompletionQueue::poll`](super::CompletionQueue::poll).
    // SAFETY: ibv_wc is plain C data (integers and a union of integers); zero is valid.
    pub const EMPTY: WorkCompletion = WorkCompletion(unsafe { std::mem::zeroed() });

    /// The `wr_id` of the work request.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }

    #[inline]
    pub fn is_success(&self) -> bool {
        self.0.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// libibverbs' text for the status (`ibv_wc_status_str`).
    pub fn status_str(&self) -> String {
        // SAFETY: returns a pointer to a static NUL-terminated string (or "unknown").
        let p = unsafe { ibv_wc_status_str(self.0.status) };
        if p.is_null() {
            return format!("status {}", self.0.status);
        }
        // SAFETY: non-NULL static C string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Vendor error syndrome (diagnostics for failed completions).
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// Only meaningful for successful completions.
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        use ibv_wc_opcode::*;
        match self.0.opcode {
            IBV_WC_SEND => WcOpcode::Send,
            IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
            IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            IBV_WC_RECV => WcOpcode::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            r => WcOpcode::Other(r),
        }
    }

    /// Bytes received (receive completions; includes the 40-byte GRH on UD).
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data in host order, when the sender attached some.
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data; any bits are a valid u32.
            Some(u32::from_be(unsafe {
                self.0.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        }
    }

    /// Local QP number the completion belongs to.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// Source QP number (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// True when the first 40 bytes of a UD receive buffer hold a valid GRH.
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0
    }

    pub fn slid(&self) -> u16 {
        self.0.slid
    }

    pub fn sl(&self) -> u8 {
        self.0.sl
    }

    pub fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_wc_reads_as_success_with_zero_fields() {
        let wcs = [WorkCompletion::EMPTY; 4];
        assert!(wcs
            .iter()
            .all(|w| w.is_success() && w.wr_id() == 0 && w.imm_data().is_none()));
        assert_eq!(wcs[0].opcode(), WcOpcode::Send);
    }

    #[test]
    fn wc_fields_and_status_mapping() {
        let mut w = WorkCompletion::EMPTY;
        w.0.status = ibv_wc_status::IBV_WC_RETRY_EXC_ERR;
        w.0.opcode = ibv_wc_opcode::IBV_WC_RECV;
        w.0.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0 | ibv_wc_flags::IBV_WC_GRH.0;
        w.0.imm_data_invalidated_rkey_union.imm_data = 0xdead_beefu32.to_be();
        assert_eq!(w.status(), WcStatus::RetryExcErr);
        assert_eq!(w.status().to_status(), Status::EndpointTimeout);
        assert_eq!(w.opcode(), WcOpcode::Recv);
        assert_eq!(w.imm_data(), Some(0xdead_beef));
        assert!(w.has_grh() && !w.is_success());
        assert_eq!(
            WcStatus::from_raw(ibv_wc_status::IBV_WC_WR_FLUSH_ERR).to_status(),
            Status::Canceled
        );
        assert_eq!(WcStatus::from_raw(99), WcStatus::Other(99));
        assert_eq!(WcStatus::Success.to_status(), Status::Ok);
    }
}
