//! How endpoints reach one peer: the lanes selected, what each lane connects to, the message
//! limits and the rendezvous lane. All of it follows from the two workers' addresses and the
//! error mode, so it is computed once and shared (`Rc`) by every endpoint toward that peer in
//! that mode: a thousand endpoints to one server hold one route, not a thousand copies.

use ucs::{Error, Result, Status};
use uct::IfaceFlags;

use crate::address::WorkerAddress;
use crate::lanes::{LaneSet, LaneUsage};
use crate::worker::WorkerInner;

use super::{endpoint_thresholds, Limits};

pub(crate) struct Route {
    pub lanes: LaneSet,
    /// Message size limits of the AM lane, and the protocol thresholds.
    pub limits: Limits,
    /// The lane rendezvous pulls the data on (`get_zcopy`); `None`: the AM pipeline.
    pub rndv_lane: Option<usize>,
    /// Bit `i`: lane `i` connects endpoint to endpoint (its peer side comes with the wireup
    /// reply); the others connect to the peer's interface.
    pub p2p: u64,
    /// Bit `i`: the worker's interface `i` carries a lane other than wireup (activation).
    pub used_ifaces: u64,
}

impl Route {
    /// The route over `lanes` toward `remote`.
    pub(crate) fn new(w: &WorkerInner, remote: &WorkerAddress, lanes: LaneSet) -> Result<Route> {
        // Lanes and interfaces are bits of a u64 (a selection has at most a few dozen lanes:
        // one per usage, MAX_LANES_PER_OP per multi-lane usage).
        if lanes.lanes.len() > 64 {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: {} lanes selected; an endpoint has at most 64",
                    lanes.lanes.len()
                ),
            ));
        }
        let mut p2p = 0u64;
        let mut used_ifaces = 0u64;
        for (i, l) in lanes.lanes.iter().enumerate() {
            let wi = &w.ifaces[l.local];
            let f = wi.iface.attr().flags;
            let to_iface =
                f.contains(IfaceFlags::CONNECT_TO_IFACE) && !remote.entries[l.remote].iface_addr.is_empty();
            if !to_iface {
                if !f.contains(IfaceFlags::CONNECT_TO_EP) {
                    return Err(Error::new(
                        Status::Unreachable,
                        format!(
                            "ucp: {}/{} can connect neither to an interface nor to an endpoint",
                            wi.info.tl_name, wi.info.dev_name
                        ),
                    ));
                }
                p2p |= 1 << i;
            }
            if l.usage.bits() & !LaneUsage::WIREUP.bits() != 0 {
                used_ifaces |= 1 << l.local;
            }
        }
        let am = &lanes.lanes[lanes.am];
        let thr = endpoint_thresholds(w, &lanes, remote);
        let mut limits = Limits::new(
            &w.ifaces[am.local].info.attr,
            &remote.entries[am.remote].tl.attr,
            &thr,
        );
        let rndv_lane = crate::rndv::get_lane(w, &lanes, remote);
        limits.rkey_max = rndv_lane.map_or(0, |l| w.ifaces[lanes.lanes[l].local].md.attr().rkey_packed_size);
        Ok(Route {
            lanes,
            limits,
            rndv_lane,
            p2p,
            used_ifaces,
        })
    }

    /// Lane `i` connects endpoint to endpoint.
    pub(crate) fn is_p2p(&self, i: usize) -> bool {
        self.p2p & (1 << i) != 0
    }

    /// How rendezvous moves the data, for the protocol description.
    pub(crate) fn rndv_scheme(&self) -> String {
        match self.rndv_lane {
            Some(l) => format!("get_zcopy on lane {l}"),
            None => "AM pipeline".to_owned(),
        }
    }
}
