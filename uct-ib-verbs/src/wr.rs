//! Work requests: scatter/gather entries, send operations and flags, receive requests, and
//! their translation into `ibv_send_wr` / `ibv_recv_wr` on the caller's stack.

use crate::ah::AddressHandle;
use rdma_sys::*;
use ucs::Error;

/// One scatter/gather entry (`struct ibv_sge`, same layout).
///
/// Plain numbers: the HCA checks every non-inline SGE against the lkey's registration, so a
/// wrong address is a completion error, never a wild access.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Sge(pub(crate) ibv_sge);

impl Sge {
    /// An SGE for `[addr, addr + length)` in the region with local key `lkey`.
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge(ibv_sge { addr, length, lkey })
    }

    pub fn addr(&self) -> u64 {
        self.0.addr
    }

    pub fn length(&self) -> u32 {
        self.0.length
    }

    pub fn lkey(&self) -> u32 {
        self.0.lkey
    }
}

impl std::fmt::Debug for Sge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sge({:#x}+{}, lkey={:#x})",
            self.0.addr, self.0.length, self.0.lkey
        )
    }
}

/// Send flags (`enum ibv_send_flags`). Inline sends have their own call
/// ([`QueuePair::post_send_inline`](super::QueuePair::post_send_inline)), because the CPU,
/// not the HCA, reads inline data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(u32);

impl SendFlags {
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a completion for this WR (UCX signals every Nth WR, see CQ moderation).
    pub const SIGNALED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SIGNALED.0);
    /// Wake a receiver that armed its CQ with `solicited_only`.
    pub const SOLICITED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SOLICITED.0);
    /// Wait for earlier RDMA READ/atomics of this QP before starting.
    pub const FENCE: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_FENCE.0);

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// What a send work request does. Remote addresses/keys come from the peer; immediate data
/// is given in host order and sent in network order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes a receive WR at the peer.
    Send,
    /// SEND with 32-bit immediate data (reported in the peer's receive completion).
    SendWithImm(u32),
    /// RDMA WRITE of the SGEs to `remote_addr`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// RDMA WRITE that also consumes a receive WR at the peer carrying `imm`.
    RdmaWriteWithImm { remote_addr: u64, rkey: u32, imm: u32 },
    /// RDMA READ from `remote_addr` into the SGEs.
    RdmaRead { remote_addr: u64, rkey: u32 },
    /// 64-bit fetch-and-add at `remote_addr` (8-byte aligned); the old value lands in the
    /// single 8-byte SGE.
    FetchAdd { remote_addr: u64, rkey: u32, add: u64 },
    /// 64-bit compare-and-swap at `remote_addr`; the old value lands in the 8-byte SGE.
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
}

/// Destination of a UD send: an address handle plus the remote QP number and Q_Key.
/// Keep the address handle alive until the send completes.
#[derive(Clone, Copy)]
pub struct UdDest<'a> {
    pub ah: &'a AddressHandle,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// One send work request.
#[derive(Clone, Copy)]
pub struct SendRequest<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local buffers (registered; for READ/atomics they receive the data).
    pub sges: &'a [Sge],
    pub op: SendOp,
    pub flags: SendFlags,
    /// Required on UD QPs, must be `None` on connected ones.
    pub ud: Option<UdDest<'a>>,
}

/// One receive work request.
#[derive(Clone, Copy)]
pub struct RecvRequest<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Registered buffers with LOCAL_WRITE (on UD the first 40 bytes receive the GRH).
    pub sges: &'a [Sge],
}

/// A batch of receives failed at request `posted`: the ones before it are posted (the
/// provider owns their buffers now), that one and the rest are not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvPostError {
    pub posted: usize,
    pub error: Error,
}

impl From<RecvPostError> for Error {
    fn from(e: RecvPostError) -> Error {
        e.error
    }
}

/// Largest number of receive WRs one `post_*_recv_batch` call chains (on the stack).
pub const MAX_RECV_BATCH: usize = 64;

/// Largest number of pieces an inline send may gather (on the stack).
pub const MAX_INLINE_PIECES: usize = 8;

/// A UD inline SEND of one piece kept filled between posts: ud_verbs' AM fast path writes only
/// the per-packet fields (id, flags, the piece and its SGE, the destination) instead of
/// building a 128-byte request each time, as UCX keeps its `wr_inl`.
pub struct UdInlineWr {
    pub(crate) wr: ibv_send_wr,
    pub(crate) sge: ibv_sge,
}

impl Default for UdInlineWr {
    fn default() -> UdInlineWr {
        let mut wr = zeroed_send_wr();
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.num_sge = 1;
        UdInlineWr {
            wr,
            sge: ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
        }
    }
}

/// An all-zero `ibv_send_wr` (every field is an integer, pointer or union of those).
pub(crate) fn zeroed_send_wr() -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data; all-zero (NULL pointers, 0 counts) is valid.
    unsafe { std::mem::zeroed() }
}

/// Fills opcode, immediate and remote fields of `wr` from `op` and `ud`.
pub(crate) fn fill_send_wr(wr: &mut ibv_send_wr, op: SendOp, ud: Option<UdDest<'_>>) {
    use ibv_wr_opcode::*;
    match op {
        SendOp::Send => wr.opcode = IBV_WR_SEND,
        SendOp::SendWithImm(imm) => {
            wr.opcode = IBV_WR_SEND_WITH_IMM;
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOp::RdmaWrite { remote_addr, rkey } => {
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.wr.rdma = rdma_t { remote_addr, rkey };
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.wr.rdma = rdma_t { remote_addr, rkey };
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            wr.opcode = IBV_WR_RDMA_READ;
            wr.wr.rdma = rdma_t { remote_addr, rkey };
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr.atomic = atomic_t {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr.atomic = atomic_t {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
        }
    }
    if let Some(d) = ud {
        wr.wr.ud = ud_t {
            ah: d.ah.as_ptr(),
            remote_qpn: d.remote_qpn,
            remote_qkey: d.remote_qkey,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes_match_libibverbs() {
        // rdma-sys hand-writes these (unions); a size mismatch would corrupt posts/polls
        assert_eq!(std::mem::size_of::<ibv_sge>(), 16);
        assert_eq!(std::mem::size_of::<Sge>(), 16);
        assert_eq!(std::mem::size_of::<ibv_send_wr>(), 128);
        assert_eq!(std::mem::size_of::<ibv_recv_wr>(), 32);
        assert_eq!(std::mem::size_of::<ibv_wc>(), 48);
        assert_eq!(std::mem::size_of::<ibv_ah_attr>(), 32);
        assert_eq!(std::mem::size_of::<ibv_gid>(), 16);
        assert_eq!(std::mem::offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(std::mem::offset_of!(ibv_wc, qp_num), 28);
    }

    #[test]
    fn ops_fill_the_right_fields() {
        let mut wr = zeroed_send_wr();
        fill_send_wr(
            &mut wr,
            SendOp::CompareSwap {
                remote_addr: 0x1000,
                rkey: 7,
                compare: 3,
                swap: 9,
            },
            None,
        );
        assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP);
        // SAFETY: the atomic member was the one written
        let a = unsafe { wr.wr.atomic };
        assert_eq!((a.remote_addr, a.rkey, a.compare_add, a.swap), (0x1000, 7, 3, 9));

        let mut wr = zeroed_send_wr();
        fill_send_wr(&mut wr, SendOp::SendWithImm(0x0102_0304), None);
        assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
        // SAFETY: imm_data was the member written
        assert_eq!(
            unsafe { wr.imm_data_invalidated_rkey_union.imm_data },
            0x0102_0304u32.to_be()
        );

        let mut wr = zeroed_send_wr();
        fill_send_wr(
            &mut wr,
            SendOp::RdmaRead {
                remote_addr: 0x2000,
                rkey: 5,
            },
            None,
        );
        assert_eq!(wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_READ);
        // SAFETY: the rdma member was the one written
        let r = unsafe { wr.wr.rdma };
        assert_eq!((r.remote_addr, r.rkey), (0x2000, 5));
    }

    #[test]
    fn flags_combine() {
        let f = SendFlags::SIGNALED | SendFlags::SOLICITED;
        assert!(f.contains(SendFlags::SIGNALED) && !f.contains(SendFlags::FENCE));
        assert_eq!(SendFlags::SIGNALED.bits(), 2);
    }
}
