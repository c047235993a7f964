//! An endpoint's size limits and protocol thresholds (from its lanes and the configuration),
//! and their description for `RUCX_PROTO_INFO` / `rucx-info -e`.

use uct::IfaceFlags;

use crate::address::WorkerAddress;
use crate::lanes::LaneSet;
use crate::proto::thresholds::{thresholds, LanePerf, ThresholdConfig, Thresholds, UcpHeaders};
use crate::wire::AmHeader;
use crate::worker::WorkerInner;

/// Size limits and thresholds of the AM lane toward this peer (both sides' limits count).
/// Limits count whole transport messages (UCP's prefix included); thresholds count payload
/// (the application's header and data), as `RUCX_*_THRESH` do.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Largest message (all of it) sent with `am_short`; 0: none.
    pub max_short: usize,
    /// Largest message sent with one `am_bcopy`.
    pub max_bcopy: usize,
    /// Largest message sent with one `am_zcopy` (0: no zcopy), and its largest header part.
    pub max_zcopy: usize,
    pub max_zcopy_hdr: usize,
    /// Payloads from this size up go zero-copy when the buffer is the application's to lend.
    pub zcopy_thresh: usize,
    /// Payloads from this size up go rendezvous (unless `AmFlags::EAGER`).
    pub rndv_thresh: usize,
    /// The largest rkey a rendezvous announcement carries (the rendezvous lane's memory
    /// domain's; 0 for the AM pipeline).
    pub rkey_max: usize,
}

impl Limits {
    pub(crate) fn new(l: &crate::tl::TlAttr, r: &crate::tl::TlAttr, t: &Thresholds) -> Limits {
        let max_bcopy = l.am_max_bcopy.min(r.am_max_bcopy);
        let zcopy = l.flags.contains(IfaceFlags::AM_ZCOPY) && l.am_max_iov >= 1;
        let max_zcopy = if zcopy {
            l.am_max_zcopy.min(r.am_max_zcopy)
        } else {
            0
        };
        let short_payload = t.max_short.map_or(0, |p| p.saturating_add(AmHeader::LEN));
        Limits {
            max_short: l.am_max_short.min(max_bcopy).min(short_payload),
            max_bcopy,
            max_zcopy,
            max_zcopy_hdr: if zcopy { l.am_max_hdr } else { 0 },
            zcopy_thresh: t.zcopy_thresh,
            rndv_thresh: t.rndv_thresh,
            rkey_max: 0,
        }
    }
}

impl Limits {
    /// One line per range of payload sizes and send call, with the protocol the send path
    /// takes for it ([`crate::proto::select::describe`]).
    pub(crate) fn describe(&self, rndv_scheme: &str) -> String {
        use crate::proto::select::{describe, Op};
        let mut out = String::new();
        for (api, op, lent) in [
            ("am_send", Op::Am { reply: false }, false),
            ("am_send_owned", Op::Am { reply: false }, true),
            ("tag_send", Op::Tag, false),
            ("tag_send_owned", Op::Tag, true),
            ("stream_send", Op::Stream, false),
        ] {
            out += &describe(self, api, op, 0, lent);
        }
        out += &format!("  rendezvous: RTS, then {rndv_scheme}\n");
        out
    }
}

/// The thresholds of an endpoint with `lanes` toward `remote` (UCX's formulas, forced values
/// from the context's configuration).
pub(crate) fn endpoint_thresholds(w: &WorkerInner, lanes: &LaneSet, remote: &WorkerAddress) -> Thresholds {
    let perf = |i: usize| {
        let l = &lanes.lanes[i];
        let wi = &w.ifaces[l.local];
        LanePerf {
            local: &wi.info,
            remote: &remote.entries[l.remote].tl,
            reg_cost: wi.md.attr().reg_cost,
        }
    };
    let am = perf(lanes.am);
    let am_bw: Vec<_> = lanes.am_bw.iter().map(|&i| perf(i)).collect();
    let rma_bw: Vec<_> = lanes.rma_bw.iter().map(|&i| perf(i)).collect();
    let headers = UcpHeaders {
        single: AmHeader::LEN,
        frag: crate::wire::first_prefix_len(false),
    };
    thresholds(
        &am,
        &am_bw,
        &rma_bw,
        headers,
        &ThresholdConfig::from(&w.ctx.inner.cfg),
    )
}
