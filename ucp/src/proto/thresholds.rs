//! Protocol thresholds: from which message size an endpoint switches from am_short to bcopy,
//! from bcopy to zcopy, and from eager to rendezvous, and how large a single message or a
//! fragment may be. UCX's v1 rules (`ucp_ep_config_init`, ucx-notes §4.3):
//!
//! - Size limits come from the AM lane, and every message must fit both the local send limit
//!   and what the peer receives (the larger of its AM segment and, with zcopy, its zcopy
//!   limit: a transport's zcopy never exceeds what its own kind receives — tcp's zcopy is its
//!   receive segment, rc/ud/self's equal their segment). UCP's header is subtracted: the
//!   single-message header from single sends, the fragment header from fragments. am_short
//!   counts uct's 8-byte header, which carries UCP's header when that fits.
//! - zcopy (auto): from `reg_cost.c / (1/bcopy_bw - 1/bw - reg_cost.m)` bytes, where a copy at
//!   `bcopy_bw` stops paying against registering; never when that is not positive.
//! - rendezvous (auto): UCX's multi-lane formula (below), with the RMA_BW lanes (get/put
//!   zcopy: the receiver registers too) or, without them, the AM_BW lanes (AM rendezvous);
//!   at least the AM segment; `rndv_thresh_fallback` when it has no positive solution. One
//!   departure: over RMA lanes, eager is charged the receiver's copy out of its receive
//!   segments, which rendezvous saves (UCX's formula omits it).
//! - A forced threshold (`Some`) wins, and am_short then stops below it, as in UCX.
//!
//! The sender decides its protocol alone, so thresholds need not match between the peers.
//! Decision order for a payload of `n` bytes: `n <= max_short` → short; `n >= rndv_thresh` →
//! rendezvous; `n >= zcopy_thresh` → zcopy (single up to `max_zcopy_single`, else fragments of
//! `zcopy_frag_size`); else bcopy (single up to `max_bcopy`, else fragments of `frag_size`).

use uct::{IfaceFlags, LinearFunc};

use crate::tl::{TlAttr, TlInfo};

/// uct's am_short header, counted in `am_max_short`.
const UCT_AM_SHORT_HDR: usize = 8;
/// Memory-copy bandwidth when not configured (UCX's `BCOPY_BW` default, 5800 MB/s).
pub const DEFAULT_BCOPY_BW: f64 = 5800.0 * 1024.0 * 1024.0;

/// One lane as the thresholds see it.
#[derive(Clone, Copy, Debug)]
pub struct LanePerf<'a> {
    /// The local resource.
    pub local: &'a TlInfo,
    /// The peer's address entry.
    pub remote: &'a TlInfo,
    /// Registration cost of the local resource's memory domain (`uct::MdAttr::reg_cost`);
    /// the peer's is assumed equal.
    pub reg_cost: LinearFunc,
}

/// What UCP's own headers take out of each transport message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UcpHeaders {
    /// Header of a single (unfragmented) message.
    pub single: usize,
    /// Header of a fragment (the largest of first / middle).
    pub frag: usize,
}

impl Default for UcpHeaders {
    fn default() -> UcpHeaders {
        UcpHeaders { single: 8, frag: 32 }
    }
}

/// The `RUCX_*` thresholds and models; `None` = auto.
#[derive(Clone, Debug, PartialEq)]
pub struct ThresholdConfig {
    /// Payloads from this size leave am_short (`BCOPY_THRESH`).
    pub bcopy_thresh: Option<usize>,
    /// Payloads from this size go zcopy (`ZCOPY_THRESH`).
    pub zcopy_thresh: Option<usize>,
    /// Payloads from this size go rendezvous (`RNDV_THRESH`).
    pub rndv_thresh: Option<usize>,
    /// Percent by which rendezvous may be slower than eager where it takes over
    /// (`RNDV_PERF_DIFF`, 1): larger values lower the auto threshold.
    pub rndv_perf_diff: f64,
    /// The rendezvous threshold when the formula has no positive solution
    /// (`RNDV_THRESH_FALLBACK`, default never).
    pub rndv_thresh_fallback: usize,
    /// Memory-copy bandwidth, bytes/s (`BCOPY_BW`; `None` = [`DEFAULT_BCOPY_BW`]).
    pub bcopy_bw: Option<f64>,
    /// Expected endpoints per worker and processes per node (latency and bandwidth models).
    pub est_num_eps: usize,
    /// Expected processes per node.
    pub est_num_ppn: usize,
}

impl Default for ThresholdConfig {
    fn default() -> ThresholdConfig {
        ThresholdConfig {
            bcopy_thresh: None,
            zcopy_thresh: None,
            rndv_thresh: None,
            rndv_perf_diff: 1.0,
            rndv_thresh_fallback: usize::MAX,
            bcopy_bw: None,
            est_num_eps: 1,
            est_num_ppn: 1,
        }
    }
}

impl From<&crate::config::UcpConfig> for ThresholdConfig {
    fn from(c: &crate::config::UcpConfig) -> ThresholdConfig {
        use crate::config::Threshold;
        let forced = |t: Threshold| match t {
            Threshold::Auto => None,
            Threshold::Bytes(b) => Some(b),
        };
        ThresholdConfig {
            bcopy_thresh: forced(c.bcopy_thresh),
            zcopy_thresh: forced(c.zcopy_thresh),
            rndv_thresh: forced(c.rndv_thresh),
            rndv_perf_diff: c.rndv_perf_diff,
            est_num_eps: c.num_eps.unwrap_or(1),
            est_num_ppn: c.num_ppn.unwrap_or(1),
            ..ThresholdConfig::default()
        }
    }
}

/// Sizes are payload bytes after UCP's header; `usize::MAX` = never.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Largest payload sent with am_short; `None`: am_short is not used.
    pub max_short: Option<usize>,
    /// Largest single bcopy payload.
    pub max_bcopy: usize,
    /// Payloads from this size go zcopy (`usize::MAX` without AM zcopy).
    pub zcopy_thresh: usize,
    /// Largest single zcopy payload (0 without AM zcopy).
    pub max_zcopy_single: usize,
    /// Payload per fragment of a multi-fragment bcopy send (fits every AM_BW lane).
    pub frag_size: usize,
    /// Payload per fragment of a multi-fragment zcopy send; 0: fragments go bcopy.
    pub zcopy_frag_size: usize,
    /// Payloads from this size go rendezvous.
    pub rndv_thresh: usize,
}

/// Thresholds for an endpoint. `am` is the AM lane; `am_bw` the AM_BW lanes as in
/// `LaneSet::am_bw` (the AM lane first; empty = the AM lane alone); `rma_bw` the RMA_BW lanes
/// (empty: rendezvous over AM).
pub fn thresholds(
    am: &LanePerf,
    am_bw: &[LanePerf],
    rma_bw: &[LanePerf],
    hdr: UcpHeaders,
    cfg: &ThresholdConfig,
) -> Thresholds {
    let eager = if am_bw.is_empty() {
        std::slice::from_ref(am)
    } else {
        am_bw
    };
    let (l, r) = (&am.local.attr, &am.remote.attr);

    let mut max_short = if l.flags.contains(IfaceFlags::AM_SHORT) {
        l.am_max_short
            .min(recv_limit(r))
            .checked_sub(hdr.single.max(UCT_AM_SHORT_HDR))
    } else {
        None
    };
    let max_bcopy = bcopy_seg(am).saturating_sub(hdr.single);
    let frag_size = eager
        .iter()
        .map(|x| bcopy_seg(x).saturating_sub(hdr.frag))
        .min()
        .unwrap_or(0);

    let zcopy = has_zcopy(l, hdr.single);
    let max_zcopy_single = if zcopy {
        zcopy_seg(am).saturating_sub(hdr.single)
    } else {
        0
    };
    // every rail must take zcopy fragments, else they go bcopy
    let zcopy_frag_size = if eager.iter().all(|x| has_zcopy(&x.local.attr, hdr.frag)) {
        eager
            .iter()
            .map(|x| zcopy_seg(x).saturating_sub(hdr.frag))
            .min()
            .unwrap_or(0)
    } else {
        0
    };

    let bcopy_bw = cfg.bcopy_bw.unwrap_or(DEFAULT_BCOPY_BW);
    let zcopy_thresh = match (zcopy, cfg.zcopy_thresh) {
        (false, _) => usize::MAX,
        (true, Some(t)) => t,
        (true, None) => zcopy_auto_thresh(am, bcopy_bw, cfg),
    };
    let rndv_thresh = match cfg.rndv_thresh {
        Some(t) => t,
        None => rndv_auto_thresh(am, eager, rma_bw, bcopy_bw, cfg),
    };

    // a forced threshold also ends am_short below it
    for forced in [cfg.bcopy_thresh, cfg.zcopy_thresh, cfg.rndv_thresh]
        .into_iter()
        .flatten()
    {
        max_short = max_short.and_then(|m| forced.checked_sub(1).map(|f| m.min(f)));
    }

    Thresholds {
        max_short,
        max_bcopy,
        zcopy_thresh,
        max_zcopy_single,
        frag_size,
        zcopy_frag_size,
        rndv_thresh,
    }
}

/// The largest AM the peer receives.
fn recv_limit(r: &TlAttr) -> usize {
    let zcopy = if r.flags.contains(IfaceFlags::AM_ZCOPY) {
        r.am_max_zcopy
    } else {
        0
    };
    r.am_max_bcopy.max(zcopy)
}

fn bcopy_seg(x: &LanePerf) -> usize {
    x.local.attr.am_max_bcopy.min(recv_limit(&x.remote.attr))
}

fn zcopy_seg(x: &LanePerf) -> usize {
    x.local.attr.am_max_zcopy.min(recv_limit(&x.remote.attr))
}

/// AM zcopy with room for a UCP header of `hdr` bytes in its header.
fn has_zcopy(l: &TlAttr, hdr: usize) -> bool {
    l.flags.contains(IfaceFlags::AM_ZCOPY) && l.am_max_hdr >= hdr && l.am_max_zcopy > hdr
}

fn pair_bw(x: &LanePerf, cfg: &ThresholdConfig) -> f64 {
    let ppn = cfg.est_num_ppn.max(1) as f64;
    x.local.attr.bandwidth(ppn).min(x.remote.attr.bandwidth(ppn))
}

/// Where registering (once, one iov) starts to beat copying (`ucp_ep_config_get_zcopy_auto_thresh`).
fn zcopy_auto_thresh(am: &LanePerf, bcopy_bw: f64, cfg: &ThresholdConfig) -> usize {
    let reg = am.reg_cost;
    let t = reg.c / (1.0 / bcopy_bw - 1.0 / pair_bw(am, cfg) - reg.m);
    if t.is_finite() && t >= 0.0 {
        t as usize // saturates
    } else {
        usize::MAX
    }
}

/// Sums over a set of lanes, registration/overhead/latency once per memory domain
/// (`ucp_ep_config_calc_params`).
#[derive(Default)]
struct LanesPerf {
    bw: f64,
    reg_growth: f64,
    reg_overhead: f64,
    overhead: f64,
    latency: f64,
}

fn lanes_perf(lanes: &[LanePerf], cfg: &ThresholdConfig) -> LanesPerf {
    let eps = cfg.est_num_eps.max(1) as f64;
    let mut seen: Vec<&str> = Vec::new();
    let mut p = LanesPerf::default();
    for x in lanes {
        if !seen.contains(&x.local.component.as_str()) {
            seen.push(&x.local.component);
            p.reg_growth += x.reg_cost.m;
            p.reg_overhead += x.reg_cost.c;
            p.overhead += x.local.attr.overhead;
            p.latency += x.local.attr.latency(eps);
        }
        p.bw += pair_bw(x, cfg);
    }
    p
}

/// UCX's `ucp_ep_config_calc_rndv_thresh`: the size from which rendezvous (RTS, the peer's
/// registration and fetch, ATS), its time scaled by `1 - rndv_perf_diff/100`, beats eager zcopy
/// and the receiver's copy out of its receive segments (which UCX does not count).
fn rndv_auto_thresh(
    am: &LanePerf,
    eager: &[LanePerf],
    rma_bw: &[LanePerf],
    bcopy_bw: f64,
    cfg: &ThresholdConfig,
) -> usize {
    let (rndv_lanes, recv_reg) = if rma_bw.is_empty() {
        (eager, 0.0)
    } else {
        (rma_bw, 1.0)
    };
    let e = lanes_perf(eager, cfg);
    let r = lanes_perf(rndv_lanes, cfg);
    let p = 1.0 - cfg.rndv_perf_diff / 100.0;
    let rts_lat = am.local.attr.latency(cfg.est_num_eps.max(1) as f64);
    let num = p
        * (r.reg_overhead * (1.0 + recv_reg)
            + 2.0 * rts_lat
            + 2.0 * r.latency
            + 2.0 * e.overhead
            + r.overhead)
        - e.reg_overhead
        - e.overhead;
    // Eager's receiver copies each byte out of its receive segment, an RMA rendezvous lands it
    // in place (AM rendezvous copies too: `recv_reg` is 0 then): UCX's formula leaves that copy out, which over one lane serving both (tcp) leaves
    // the two differing by `rndv_perf_diff` alone and puts the threshold in the megabytes,
    // where measured rendezvous is 1.5x eager's bandwidth at 1 MiB.
    let den = e.reg_growth + 1.0 / e.bw.min(bcopy_bw) + recv_reg / bcopy_bw
        - p * (r.reg_growth * (1.0 + recv_reg) + 1.0 / r.bw);
    let t = num / den;
    if e.bw > 0.0 && r.bw > 0.0 && num > 0.0 && den > 0.0 && t.is_finite() {
        (t as usize).max(am.local.attr.am_max_bcopy)
    } else {
        cfg.rndv_thresh_fallback
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::fixtures::{rc, self_tl, tcp, ud};

    /// uct's registration costs: tcp, self, and the IB memory domain.
    fn reg(t: &TlInfo) -> LinearFunc {
        match t.component.as_str() {
            "tcp" => LinearFunc { c: 20e-9, m: 0.0 },
            "self" => LinearFunc { c: 5e-9, m: 0.0 },
            _ => LinearFunc { c: 16e-6, m: 0.06e-9 },
        }
    }

    fn lane<'a>(local: &'a TlInfo, remote: &'a TlInfo) -> LanePerf<'a> {
        LanePerf {
            local,
            remote,
            reg_cost: reg(local),
        }
    }

    /// One lane that is AM, AM_BW and (when it has zcopy RMA) RMA_BW, as lane selection
    /// picks for a single transport.
    fn single(t: &TlInfo, cfg: &ThresholdConfig) -> Thresholds {
        let l = lane(t, t);
        let rma_bw = if t
            .attr
            .flags
            .intersects(IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY)
        {
            vec![l]
        } else {
            vec![]
        };
        thresholds(&l, &[l], &rma_bw, UcpHeaders::default(), cfg)
    }

    #[test]
    fn tcp_lo() {
        let t = single(&tcp("lo"), &ThresholdConfig::default());
        assert_eq!(t.max_short, Some(8192 - 8));
        assert_eq!(t.max_bcopy, 8192 - 8);
        assert_eq!(t.frag_size, 8192 - 32);
        // the peer receives tcp's 64 KiB receive segment
        assert_eq!(t.max_zcopy_single, 65536 - 8);
        assert_eq!(t.zcopy_frag_size, 65536 - 32);
        // 5 GB/s is slower than a 5.8 GB/s copy: registering never pays
        assert_eq!(t.zcopy_thresh, usize::MAX);
        // 0.99 * (2*20ns + 4*3us + 3*2us) - 20ns - 2us over 1% of 1/(5 GB/s) plus the
        // receiver's copy at 5.8 GB/s: ~95 KB (UCX's formula without that copy: ~7.9 MB)
        assert!((90_000..100_000).contains(&t.rndv_thresh), "{t:?}");
    }

    #[test]
    fn rc_verbs() {
        // soft RoCE: 8 KiB segment, 63-byte inline
        let t = single(&rc("rxe0:1"), &ThresholdConfig::default());
        assert_eq!(t.max_short, Some(63 - 8));
        assert_eq!((t.max_bcopy, t.max_zcopy_single), (8191 - 8, 8191 - 8));
        assert_eq!((t.frag_size, t.zcopy_frag_size), (8191 - 32, 8191 - 32));
        assert_eq!(
            t.zcopy_thresh,
            usize::MAX,
            "1.18 GB/s never pays 16 us of registration"
        );
        // the receiver's copy saved pays for the peer's 16 us registration from ~170 KB
        assert!((160_000..180_000).contains(&t.rndv_thresh), "{t:?}");

        // EDR 4x (12.4 GB/s): zcopy from ~670 KB, rendezvous from ~96 KB (UCX's formula: ~700 KB)
        let t = single(&rc("mlx5_0:1"), &ThresholdConfig::default());
        assert!((600_000..700_000).contains(&t.zcopy_thresh), "{t:?}");
        assert!((90_000..100_000).contains(&t.rndv_thresh), "{t:?}");
    }

    #[test]
    fn ud_verbs_fragments_above_one_kib() {
        let u = ud("rxe0:1");
        let t = single(&u, &ThresholdConfig::default());
        assert_eq!(t.max_short, Some(1012 - 8));
        assert_eq!((t.max_bcopy, t.frag_size), (1012 - 8, 1012 - 32));
        assert_eq!((t.max_zcopy_single, t.zcopy_frag_size), (1012 - 8, 1012 - 32));
        assert_eq!(t.zcopy_thresh, usize::MAX);
        // no RMA: AM rendezvous, the receiver registers nothing: ~400 KB
        assert!((380_000..420_000).contains(&t.rndv_thresh), "{t:?}");
    }

    #[test]
    fn self_transport() {
        let t = single(&self_tl(), &ThresholdConfig::default());
        assert_eq!(t.max_short, Some(8192 - 8));
        assert_eq!((t.max_bcopy, t.max_zcopy_single, t.frag_size), (8184, 8184, 8160));
        // 5 ns of registration pays from ~78 bytes (short still goes first)
        assert!((70..90).contains(&t.zcopy_thresh), "{t:?}");
        // the formula gives a few hundred bytes: at least one segment
        assert_eq!(t.rndv_thresh, 8192);
    }

    #[test]
    fn both_peers_limits_count() {
        // a peer whose ud runs on a 1 KiB MTU receives 1012 bytes, whatever ours sends
        let (big, small) = (ud("mlx5_0:1"), ud("rxe0:1"));
        let t = thresholds(
            &lane(&big, &small),
            &[],
            &[],
            UcpHeaders::default(),
            &ThresholdConfig::default(),
        );
        assert_eq!((t.max_short, t.max_bcopy, t.frag_size), (Some(1004), 1004, 980));
        let t = thresholds(
            &lane(&small, &big),
            &[],
            &[],
            UcpHeaders::default(),
            &ThresholdConfig::default(),
        );
        assert_eq!((t.max_short, t.max_bcopy, t.frag_size), (Some(1004), 1004, 980));

        // a tcp peer with a 4 KiB send and 16 KiB receive segment takes our 8 KiB bcopy but
        // not our 64 KiB zcopy
        let mut peer = tcp("eth0");
        (
            peer.attr.am_max_bcopy,
            peer.attr.am_max_short,
            peer.attr.am_max_zcopy,
        ) = (4096, 4096, 16384);
        let ours = tcp("eth0");
        let t = thresholds(
            &lane(&ours, &peer),
            &[],
            &[],
            UcpHeaders::default(),
            &ThresholdConfig::default(),
        );
        assert_eq!((t.max_bcopy, t.max_zcopy_single), (8184, 16384 - 8));

        // fragments fit every AM_BW rail
        let (a, mut b) = (rc("mlx5_0:1"), rc("mlx5_1:1"));
        (b.attr.am_max_bcopy, b.attr.am_max_zcopy) = (4095, 4095);
        let rails = [lane(&a, &a), lane(&b, &b)];
        let t = thresholds(
            &rails[0],
            &rails,
            &rails,
            UcpHeaders::default(),
            &ThresholdConfig::default(),
        );
        assert_eq!(
            (t.max_bcopy, t.frag_size, t.zcopy_frag_size),
            (8191 - 8, 4095 - 32, 4095 - 32)
        );
        // a rail without zcopy: zcopy fragments go bcopy
        b.attr.flags = b.attr.flags & !IfaceFlags::AM_ZCOPY;
        let rails = [lane(&a, &a), lane(&b, &b)];
        let t = thresholds(
            &rails[0],
            &rails,
            &rails,
            UcpHeaders::default(),
            &ThresholdConfig::default(),
        );
        assert_eq!((t.max_zcopy_single, t.zcopy_frag_size), (8191 - 8, 0));
    }

    #[test]
    fn headers_are_parameters() {
        let t = tcp("lo");
        let l = lane(&t, &t);
        let hdr = UcpHeaders { single: 16, frag: 48 };
        let th = thresholds(&l, &[], &[], hdr, &ThresholdConfig::default());
        // a 16-byte header fills uct's 8-byte short header and 8 bytes of payload
        assert_eq!(
            (th.max_short, th.max_bcopy, th.frag_size),
            (Some(8192 - 16), 8192 - 16, 8192 - 48)
        );
        // a 4-byte header still costs uct's whole 8-byte short header
        let hdr = UcpHeaders { single: 4, frag: 4 };
        let th = thresholds(&l, &[], &[], hdr, &ThresholdConfig::default());
        assert_eq!((th.max_short, th.max_bcopy), (Some(8192 - 8), 8192 - 4));
        // no am_short, or too little room for the header
        let mut no_short = tcp("lo");
        no_short.attr.flags = no_short.attr.flags & !IfaceFlags::AM_SHORT;
        assert_eq!(single(&no_short, &ThresholdConfig::default()).max_short, None);
        no_short.attr.flags |= IfaceFlags::AM_SHORT;
        no_short.attr.am_max_short = 7;
        assert_eq!(single(&no_short, &ThresholdConfig::default()).max_short, None);
    }

    #[test]
    fn forced_thresholds() {
        let t = tcp("lo");
        let cfg = ThresholdConfig {
            zcopy_thresh: Some(1024),
            rndv_thresh: Some(65536),
            ..ThresholdConfig::default()
        };
        let th = single(&t, &cfg);
        assert_eq!((th.zcopy_thresh, th.rndv_thresh), (1024, 65536));
        assert_eq!(
            th.max_short,
            Some(1023),
            "short stops below a forced zcopy threshold"
        );

        let th = single(
            &t,
            &ThresholdConfig {
                rndv_thresh: Some(100),
                ..cfg.clone()
            },
        );
        assert_eq!((th.max_short, th.rndv_thresh), (Some(99), 100));

        let th = single(
            &t,
            &ThresholdConfig {
                bcopy_thresh: Some(0),
                ..cfg.clone()
            },
        );
        assert_eq!(th.max_short, None, "BCOPY_THRESH=0: no am_short at all");

        // a forced zcopy threshold means nothing without AM zcopy
        let mut no_zcopy = tcp("lo");
        no_zcopy.attr.flags = no_zcopy.attr.flags & !IfaceFlags::AM_ZCOPY;
        let th = single(&no_zcopy, &cfg);
        assert_eq!(
            (th.zcopy_thresh, th.max_zcopy_single, th.zcopy_frag_size),
            (usize::MAX, 0, 0)
        );
    }

    #[test]
    fn rndv_fallback_without_positive_solution() {
        let cfg = ThresholdConfig {
            rndv_thresh_fallback: 262144,
            ..ThresholdConfig::default()
        };
        // RNDV_PERF_DIFF=0 over the same lanes: eager and rendezvous cost the same per byte
        let cfg0 = ThresholdConfig {
            rndv_perf_diff: 0.0,
            ..cfg.clone()
        };
        let u = ud("rxe0:1");
        assert_eq!(single(&u, &cfg0).rndv_thresh, 262144);
        // a lane without bandwidth
        let mut dead = tcp("eth0");
        (dead.attr.bw_dedicated, dead.attr.bw_shared) = (0.0, 0.0);
        assert_eq!(single(&dead, &cfg).rndv_thresh, 262144);
        // a larger RNDV_PERF_DIFF tolerates a slower rendezvous: a smaller threshold
        let lo = tcp("lo");
        let t1 = single(&lo, &ThresholdConfig::default()).rndv_thresh;
        let t10 = single(
            &lo,
            &ThresholdConfig {
                rndv_perf_diff: 10.0,
                ..ThresholdConfig::default()
            },
        )
        .rndv_thresh;
        assert!(t10 < t1, "{t10} {t1}");
    }
}
