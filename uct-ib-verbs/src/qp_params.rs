//! Queue pair parameters: types, states, capabilities, the INIT/RTR/RTS attribute sets UCX
//! uses, and the IB timer encodings.

use crate::ah::AhAttr;
use crate::attr::Mtu;
use crate::mr::AccessFlags;
use rdma_sys::*;

/// Transport service type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected: SEND, RDMA WRITE/READ, atomics.
    Rc,
    /// Unreliable connected: SEND and RDMA WRITE.
    Uc,
    /// Unreliable datagram: SEND through an address handle, one MTU per message.
    Ud,
}

impl QpType {
    pub(crate) fn raw(self) -> ibv_qp_type::Type {
        match self {
            QpType::Rc => ibv_qp_type::IBV_QPT_RC,
            QpType::Uc => ibv_qp_type::IBV_QPT_UC,
            QpType::Ud => ibv_qp_type::IBV_QPT_UD,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Error,
    Unknown(u32),
}

impl QpState {
    pub(crate) fn from_raw(raw: u32) -> QpState {
        use ibv_qp_state::*;
        match raw {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            IBV_QPS_SQD => QpState::Sqd,
            IBV_QPS_SQE => QpState::Sqe,
            IBV_QPS_ERR => QpState::Error,
            r => QpState::Unknown(r),
        }
    }
}

/// Queue sizes asked for at creation; the granted ones come back in [`QueuePair::caps`](super::QueuePair::caps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    /// 0 when the QP receives through an SRQ.
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    /// UCX's rc defaults: TX queue 256, 5 send SGEs, 64 bytes inline, receives from an SRQ.
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 0,
            max_send_sge: 5,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// Creation parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub caps: QpCaps,
    /// Signal every send WR (UCX: only without TX moderation).
    pub sq_sig_all: bool,
}

/// RESET -> INIT parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitParams {
    pub port_num: u8,
    pub pkey_index: u16,
    /// RC/UC: what peers may do to this QP's memory (UCX: LOCAL_WRITE | REMOTE_WRITE |
    /// REMOTE_READ | REMOTE_ATOMIC). Ignored on UD.
    pub access: AccessFlags,
    /// UD: the Q_Key senders must use. Ignored on RC/UC.
    pub qkey: u32,
}

/// INIT -> RTR parameters of a connected QP (UC uses only `ah`, `path_mtu`, `dest_qp_num`,
/// `rq_psn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrParams {
    pub path_mtu: Mtu,
    pub dest_qp_num: u32,
    pub rq_psn: u32,
    /// Incoming RDMA READ/atomic operations in flight (<= device `max_qp_rd_atom`).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code, see [`rnr_timer_from_secs`] (UCX: 1 ms).
    pub min_rnr_timer: u8,
    /// Path to the peer (RoCE: with GRH).
    pub ah: AhAttr,
}

/// RTR -> RTS parameters of a connected QP (UC uses only `sq_psn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsParams {
    pub sq_psn: u32,
    /// Ack timeout code, see [`qp_timeout_from_secs`] (UCX: 1 s -> 18).
    pub timeout: u8,
    /// Transport retries, 0..=7 (UCX: 7).
    pub retry_cnt: u8,
    /// RNR retries, 0..=7, 7 = infinite (UCX: 7).
    pub rnr_retry: u8,
    /// Outgoing RDMA READ/atomic operations in flight (<= device `max_qp_init_rd_atom`).
    pub max_rd_atomic: u8,
}

/// The IB ack timeout code for `secs`: 4.096 us * 2^code, rounded to the nearest code
/// in 1..=31 (0 would mean "infinite").
pub fn qp_timeout_from_secs(secs: f64) -> u8 {
    if !secs.is_finite() || secs <= 0.0 {
        return 1;
    }
    (secs / 4.096e-6).log2().round().clamp(1.0, 31.0) as u8
}

/// RNR timer codes 1..=31 in milliseconds (IB spec table; code 0 means 655.36 ms).
const RNR_TIMER_MS: [f64; 32] = [
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56,
    3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68,
    491.52,
];

/// The RNR NAK timer code nearest to `secs` (0 for anything above 491.52 ms, which the
/// spec defines as the 655.36 ms maximum).
pub fn rnr_timer_from_secs(secs: f64) -> u8 {
    let ms = secs * 1e3;
    if ms.is_nan() || ms > RNR_TIMER_MS[31] {
        return if ms.is_nan() {
            1
        } else if ms >= (RNR_TIMER_MS[31] + RNR_TIMER_MS[0]) / 2.0 {
            0
        } else {
            31
        };
    }
    (1..32usize)
        .min_by(|&a, &b| {
            (RNR_TIMER_MS[a] - ms)
                .abs()
                .total_cmp(&(RNR_TIMER_MS[b] - ms).abs())
        })
        .unwrap_or(1) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_codes() {
        assert_eq!(qp_timeout_from_secs(1.0), 18); // UCX's default RC timeout
        assert_eq!(qp_timeout_from_secs(4.096e-6), 1);
        assert_eq!(qp_timeout_from_secs(0.0), 1);
        assert_eq!(qp_timeout_from_secs(1e9), 31);
        assert_eq!(qp_timeout_from_secs(f64::NAN), 1);
    }

    #[test]
    fn rnr_timer_codes() {
        assert_eq!(rnr_timer_from_secs(1e-3), 13); // UCX's default 1 ms -> 0.96 ms
        assert_eq!(rnr_timer_from_secs(0.01e-3), 1);
        assert_eq!(rnr_timer_from_secs(0.0), 1);
        assert_eq!(rnr_timer_from_secs(0.49152), 31);
        assert_eq!(rnr_timer_from_secs(0.7), 0);
        assert_eq!(rnr_timer_from_secs(10.24e-3), 20);
    }

    #[test]
    fn default_caps_follow_ucx() {
        let c = QpCaps::default();
        assert_eq!(
            (c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_inline_data),
            (256, 0, 5, 64)
        );
    }
}
