//! Address vectors and address handles (`ibv_create_ah`): the destination of UD sends and,
//! as `AhAttr`, the path of a connected QP (RTR). On RoCE every path needs a GRH.

use crate::error::{fail, last_errno, rc_errno, CallKind};
use crate::gid::Gid;
use crate::pd::ProtectionDomain;
use rdma_sys::*;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::Result;

/// Global routing header fields (mandatory on RoCE, optional across IB subnets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    pub flow_label: u32,
    /// Local GID table index to send from (picks RoCE v1/v2 and IPv4/IPv6 on RoCE).
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// An address vector (`struct ibv_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    /// Local port (1-based).
    pub port_num: u8,
    /// `Some` sets `is_global`; required on RoCE.
    pub grh: Option<GlobalRoute>,
}

impl AhAttr {
    /// A RoCE path to `dgid` from local GID `sgid_index` on `port_num`, with UCX's defaults
    /// (hop limit 255, traffic class 0, SL 0).
    pub fn roce(port_num: u8, dgid: Gid, sgid_index: u8) -> AhAttr {
        AhAttr {
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port_num,
            grh: Some(GlobalRoute {
                dgid,
                flow_label: 0,
                sgid_index,
                hop_limit: 255,
                traffic_class: 0,
            }),
        }
    }

    /// An InfiniBand path to `dlid` within the subnet (no GRH).
    pub fn ib(port_num: u8, dlid: u16) -> AhAttr {
        AhAttr {
            dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port_num,
            grh: None,
        }
    }

    pub(crate) fn to_raw(self) -> ibv_ah_attr {
        // SAFETY: ibv_ah_attr is plain C data; all-zero is valid.
        let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.dlid = self.dlid;
        a.sl = self.sl;
        a.src_path_bits = self.src_path_bits;
        a.static_rate = self.static_rate;
        a.port_num = self.port_num;
        if let Some(g) = self.grh {
            a.is_global = 1;
            a.grh.dgid = ibv_gid { raw: g.dgid.0 };
            a.grh.flow_label = g.flow_label;
            a.grh.sgid_index = g.sgid_index;
            a.grh.hop_limit = g.hop_limit;
            a.grh.traffic_class = g.traffic_class;
        }
        a
    }
}

/// An address handle for UD sends; destroyed on drop (before its PD, which it holds).
pub struct AddressHandle {
    ah: NonNull<ibv_ah>,
    attr: AhAttr,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: AH handles are usable from any thread; create/destroy are thread-safe and posts
// only read the handle.
unsafe impl Send for AddressHandle {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// Creates an AH for `attr`. On RoCE this resolves the peer's MAC through the kernel's
    /// neighbour table and fails with `Unreachable` when there is no route.
    pub fn new(pd: &Arc<ProtectionDomain>, attr: &AhAttr) -> Result<AddressHandle> {
        let mut raw = attr.to_raw();
        // SAFETY: valid PD and attribute struct.
        let ah = unsafe { ibv_create_ah(pd.as_ptr(), &mut raw) };
        match NonNull::new(ah) {
            Some(ah) => Ok(AddressHandle {
                ah,
                attr: *attr,
                _pd: pd.clone(),
            }),
            None => Err(fail(
                "ibv_create_ah",
                format_args!("{} {attr:?}", pd.context().name()),
                last_errno(),
                CallKind::Control,
            )),
        }
    }

    /// The address vector it was created from.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_ah {
        self.ah.as_ptr()
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: valid AH, destroyed exactly once; the PD is still alive.
        let rc = unsafe { ibv_destroy_ah(self.ah.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_destroy_ah",
                format_args!("{:?}", self.attr),
                rc_errno(rc),
                CallKind::Control,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_attr_sets_global_route() {
        let dgid = Gid::from("::ffff:192.0.2.1".parse::<std::net::Ipv6Addr>().unwrap());
        let raw = AhAttr::roce(1, dgid, 1).to_raw();
        assert_eq!((raw.is_global, raw.port_num, raw.dlid), (1, 1, 0));
        assert_eq!((raw.grh.sgid_index, raw.grh.hop_limit), (1, 255));
        // SAFETY: raw is the member written
        assert_eq!(unsafe { raw.grh.dgid.raw }, dgid.0);
        let ib = AhAttr::ib(1, 7).to_raw();
        assert_eq!((ib.is_global, ib.dlid), (0, 7));
    }
}
