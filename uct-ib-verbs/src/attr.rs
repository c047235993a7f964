//! Device and port attributes (`ibv_query_device`, `ibv_query_port`) as plain Rust values.

use rdma_sys::{ibv_atomic_cap, ibv_device_attr, ibv_mtu, ibv_port_attr, ibv_port_state};
use std::ffi::CStr;

/// Path MTU / port MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    /// From the verbs value (1..=5); `None` for anything else.
    pub fn from_raw(raw: u32) -> Option<Mtu> {
        Some(match raw {
            ibv_mtu::IBV_MTU_256 => Mtu::Mtu256,
            ibv_mtu::IBV_MTU_512 => Mtu::Mtu512,
            ibv_mtu::IBV_MTU_1024 => Mtu::Mtu1024,
            ibv_mtu::IBV_MTU_2048 => Mtu::Mtu2048,
            ibv_mtu::IBV_MTU_4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The verbs value.
    pub fn raw(self) -> u32 {
        match self {
            Mtu::Mtu256 => ibv_mtu::IBV_MTU_256,
            Mtu::Mtu512 => ibv_mtu::IBV_MTU_512,
            Mtu::Mtu1024 => ibv_mtu::IBV_MTU_1024,
            Mtu::Mtu2048 => ibv_mtu::IBV_MTU_2048,
            Mtu::Mtu4096 => ibv_mtu::IBV_MTU_4096,
        }
    }

    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << self.raw()
    }

    /// The largest MTU not above `bytes` (`None` below 256).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512, Mtu::Mtu256]
            .into_iter()
            .find(|m| m.bytes() <= bytes)
    }
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

impl PortState {
    fn from_raw(raw: u32) -> PortState {
        match raw {
            ibv_port_state::IBV_PORT_NOP => PortState::Nop,
            ibv_port_state::IBV_PORT_DOWN => PortState::Down,
            ibv_port_state::IBV_PORT_INIT => PortState::Init,
            ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
            ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
            ibv_port_state::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            r => PortState::Unknown(r),
        }
    }
}

/// Port link layer (the anonymous `IBV_LINK_LAYER_*` enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    Unspecified,
    InfiniBand,
    /// RoCE: address handles need a GRH (`is_global`), LIDs are 0.
    Ethernet,
    Unknown(u8),
}

impl LinkLayer {
    fn from_raw(raw: u8) -> LinkLayer {
        match raw {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            r => LinkLayer::Unknown(r),
        }
    }
}

/// Atomic operation support (`enum ibv_atomic_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic within this HCA only (what rxe reports).
    Hca,
    /// Atomic with respect to CPU and other HCAs too.
    Global,
}

/// The `ibv_query_device` fields the transports use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// Network byte order, as reported.
    pub node_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub device_cap_flags: u32,
    pub max_sge: i32,
    pub max_sge_rd: i32,
    pub max_cq: i32,
    pub max_cqe: i32,
    pub max_mr: i32,
    pub max_pd: i32,
    /// Max outstanding RDMA READ/atomic operations a QP can be the target of.
    pub max_qp_rd_atom: i32,
    /// Max outstanding RDMA READ/atomic operations a QP can initiate.
    pub max_qp_init_rd_atom: i32,
    pub atomic_cap: AtomicCap,
    pub max_ah: i32,
    pub max_srq: i32,
    pub max_srq_wr: i32,
    pub max_srq_sge: i32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl DeviceAttr {
    pub(crate) fn from_raw(a: &ibv_device_attr) -> DeviceAttr {
        // fw_ver is a NUL-terminated char[64]; never read past its end
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: a.node_guid,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            device_cap_flags: a.device_cap_flags,
            max_sge: a.max_sge,
            max_sge_rd: a.max_sge_rd,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            atomic_cap: match a.atomic_cap {
                ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCap::Hca,
                ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCap::Global,
                _ => AtomicCap::None,
            },
            max_ah: a.max_ah,
            max_srq: a.max_srq,
            max_srq_wr: a.max_srq_wr,
            max_srq_sge: a.max_srq_sge,
            max_pkeys: a.max_pkeys,
            local_ca_ack_delay: a.local_ca_ack_delay,
            phys_port_cnt: a.phys_port_cnt,
        }
    }
}

/// The `ibv_query_port` fields the transports use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Option<Mtu>,
    pub active_mtu: Option<Mtu>,
    pub gid_tbl_len: i32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    /// Raw `active_width` (1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x); see [`PortAttr::width_lanes`].
    pub active_width: u8,
    /// Raw `active_speed` (IB speed code); see [`PortAttr::lane_speed_gbps`].
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: LinkLayer,
}

impl PortAttr {
    pub(crate) fn from_raw(a: &ibv_port_attr) -> PortAttr {
        PortAttr {
            state: PortState::from_raw(a.state),
            max_mtu: Mtu::from_raw(a.max_mtu),
            active_mtu: Mtu::from_raw(a.active_mtu),
            gid_tbl_len: a.gid_tbl_len,
            port_cap_flags: a.port_cap_flags,
            max_msg_sz: a.max_msg_sz,
            pkey_tbl_len: a.pkey_tbl_len,
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            max_vl_num: a.max_vl_num,
            active_width: a.active_width,
            active_speed: a.active_speed,
            phys_state: a.phys_state,
            link_layer: LinkLayer::from_raw(a.link_layer),
        }
    }

    /// Lanes of the active link width, `None` for an unknown code.
    pub fn width_lanes(&self) -> Option<u32> {
        Some(match self.active_width {
            1 => 1,
            2 => 4,
            4 => 8,
            8 => 12,
            16 => 2,
            _ => return None,
        })
    }

    /// Signalling rate of one lane in Gb/s (SDR 2.5 ... NDR 100), `None` for an unknown code.
    pub fn lane_speed_gbps(&self) -> Option<f64> {
        Some(match self.active_speed {
            1 => 2.5,
            2 => 5.0,
            4 | 8 => 10.0,  // QDR, FDR10
            16 => 14.0625,  // FDR
            32 => 25.78125, // EDR
            64 => 53.125,   // HDR
            128 => 106.25,  // NDR
            _ => return None,
        })
    }

    /// True when the port is ACTIVE.
    pub fn is_active(&self) -> bool {
        self.state == PortState::Active
    }

    /// True for RoCE ports: address handles must carry a GRH.
    pub fn is_roce(&self) -> bool {
        self.link_layer == LinkLayer::Ethernet
    }
}

/// Reads a NUL-terminated C string owned by libibverbs into a `String`.
pub(crate) fn c_str_lossy(s: &CStr) -> String {
    s.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_round_trips_and_sizes() {
        for raw in 1..=5 {
            let m = Mtu::from_raw(raw).unwrap();
            assert_eq!(m.raw(), raw);
        }
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(Mtu::from_raw(6), None);
        assert_eq!(Mtu::from_bytes(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_bytes(255), None);
    }

    #[test]
    fn port_speed_and_width_decode() {
        let mut raw: ibv_port_attr = unsafe_zeroed_port_attr();
        raw.state = ibv_port_state::IBV_PORT_ACTIVE;
        raw.active_mtu = ibv_mtu::IBV_MTU_1024;
        raw.active_width = 1;
        raw.active_speed = 8;
        raw.link_layer = 2;
        let p = PortAttr::from_raw(&raw);
        assert!(p.is_active() && p.is_roce());
        assert_eq!(p.active_mtu, Some(Mtu::Mtu1024));
        assert_eq!(p.width_lanes(), Some(1));
        assert_eq!(p.lane_speed_gbps(), Some(10.0));
        raw.active_width = 3;
        raw.active_speed = 3;
        raw.link_layer = 1;
        let p = PortAttr::from_raw(&raw);
        assert_eq!((p.width_lanes(), p.lane_speed_gbps()), (None, None));
        assert_eq!(p.link_layer, LinkLayer::InfiniBand);
    }

    fn unsafe_zeroed_port_attr() -> ibv_port_attr {
        // SAFETY: ibv_port_attr is a C struct of integers; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}
