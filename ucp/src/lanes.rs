//! Lane selection: which (local resource, peer address entry) pairs an endpoint uses, and for
//! what. A pure function of both workers' resources, so both peers compute it.
//!
//! Each role picks the pair with the best score among the pairs that meet its criteria (UCX's
//! `ucp_wireup_select_transport`, ucx-notes §4.2). Every criterion is checked on *both* sides
//! and every score is symmetric in the two sides (mean latency, summed overheads, the smaller
//! bandwidth), so `select(A, B)` and `select(B, A)` pick mirrored pairs, in the same order and
//! with the same lane indices. Ties, in this order:
//! 1. the score, compared on a 28-bit mantissa (relative 4e-9), so float noise cannot decide;
//! 2. the higher sum of both sides' `priority`;
//! 3. the smaller unordered pair of names `{(tl, dev) of one side, (tl, dev) of the other}`;
//! 4. the smaller pair of names ordered by worker uuid (the side with the smaller uuid first),
//!    which separates `(X→Y)` from `(Y→X)`; with equal uuids (an endpoint to its own worker)
//!    the local name comes first;
//! 5. the local and remote indices (only reached when a worker lists one name twice).
//!
//! Roles, in selection order (the lane list grows in this order; a pair that wins several
//! roles is one lane with several usages):
//! - AM: AM bcopy with a segment of at least [`MIN_BCOPY`] bytes; score
//!   `1e-3 / (lat + ovh)`. Required: no such pair is an [`Status::Unreachable`] error saying
//!   why each pair was rejected.
//! - AM_BW: the AM lane first, then up to `max_am_bw_lanes - 1` more AM-capable pairs on
//!   devices not yet used (local and remote); score `size / (size/bw + ovh + lat) * 1e-5` with
//!   `size` the smaller segment.
//! - RMA (feature wanted): some put and some get (short, bcopy or zcopy); score
//!   `1e-3 / (lat + ovh + 4096/bw)`.
//! - RMA_BW: the same zcopy op (put or get, as `rma_bw_ops` allows) on both sides, up to
//!   `max_rma_bw_lanes` on distinct devices; score `1 / (256KiB/bw + lat + ovh)` (UCX also
//!   adds the registration cost of 256 KiB, which the address does not carry).
//! - AMO (AMO32/AMO64 wanted): both sides coherent with the same kind of atomics (CPU or
//!   device) and supporting the wanted ops of each wanted width (with `amo32_on_64`, 64-bit
//!   ones serve 32 bit too; UCP asks for 64-bit cswap only and emulates the rest with it);
//!   score `1e-3 / (lat + ovh)`.
//!   No such pair leaves `amo` empty (atomics on the endpoint are then `Unsupported`).
//! - WIREUP: the AM lane if it connects to an interface, else the best connect-to-iface AM
//!   pair (an auxiliary transport, e.g. ud_verbs next to rc_verbs); score as AM. None is an
//!   error.
//! - KEEPALIVE (peer-failure mode): a pair with built-in keepalive, `ep_check`, or
//!   connect-to-iface AM (for AM-based keepalive); score as AM. The AM lane is preferred, then
//!   the other lanes already chosen (a check on a lane in use), then any pair; none leaves
//!   `keepalive` empty.
//!
//! Multi-rail stops after a self or shared-memory lane (another device would be far slower)
//! and skips a rail whose score is below the first one's divided by `multi_lane_max_ratio`.
//! In peer-failure mode every role needs `ERRHANDLE_PEER_FAILURE` on both sides. A resource
//! `RUCX_TLS` allows only as auxiliary (`aux_only`) serves wireup and keepalive only.
//! Latency is `latency_c + latency_m * est_num_eps`, bandwidth `dedicated + shared /
//! est_num_ppn`: both peers should run with the same estimates, or scores may differ.
//! `reachable(i, j)` must be symmetric too (as uct's reachability checks are).

use std::cmp::Ordering;
use std::fmt::{self, Write as _};

use ucs::{Error, Result, Status};
use uct::{AtomicOps, DeviceType, IfaceFlags};

use crate::tl::{TlAttr, TlInfo};

/// Smallest AM segment a lane may have to carry UCP's headers (UCX's `UCP_MIN_BCOPY`).
pub const MIN_BCOPY: usize = 64;
/// Message size the RMA score is best for.
const RMA_SCORE_SIZE: f64 = 4096.0;
/// Message size the RMA_BW score is best for (UCX's `UCP_WIREUP_RMA_BW_TEST_MSG_SIZE`).
const RMA_BW_SCORE_SIZE: f64 = 262144.0;

/// The roles of a lane: a set of flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LaneUsage(u8);

impl LaneUsage {
    /// No role.
    pub const EMPTY: LaneUsage = LaneUsage(0);
    /// Active messages: short, bcopy and zcopy sends, and the first fragment of long ones.
    pub const AM: LaneUsage = LaneUsage(1 << 0);
    /// Bandwidth lanes for fragmented AM (multi-rail eager).
    pub const AM_BW: LaneUsage = LaneUsage(1 << 1);
    /// Small put/get.
    pub const RMA: LaneUsage = LaneUsage(1 << 2);
    /// Large put/get: rendezvous and multi-rail RMA.
    pub const RMA_BW: LaneUsage = LaneUsage(1 << 3);
    /// Atomic operations.
    pub const AMO: LaneUsage = LaneUsage(1 << 4);
    /// Carries the wireup messages (connects to the peer's interface).
    pub const WIREUP: LaneUsage = LaneUsage(1 << 5);
    /// Checks the peer's liveness in peer-failure mode.
    pub const KEEPALIVE: LaneUsage = LaneUsage(1 << 6);
    /// Number of distinct usages.
    pub const COUNT: usize = 7;
    /// Every usage with its name, in bit order.
    pub const NAMED: [(&'static str, LaneUsage); LaneUsage::COUNT] = [
        ("am", LaneUsage::AM),
        ("am_bw", LaneUsage::AM_BW),
        ("rma", LaneUsage::RMA),
        ("rma_bw", LaneUsage::RMA_BW),
        ("amo", LaneUsage::AMO),
        ("wireup", LaneUsage::WIREUP),
        ("keepalive", LaneUsage::KEEPALIVE),
    ];

    /// True when every role of `other` is in `self`.
    pub const fn contains(self, other: LaneUsage) -> bool {
        self.0 & other.0 == other.0
    }

    /// The roles as bits (bit `i` is [`LaneUsage::NAMED`]`[i]`).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// True when the lane has no role.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Position of a single usage in [`LaneUsage::NAMED`] and [`Lane::scores`].
    fn index(self) -> usize {
        debug_assert_eq!(self.0.count_ones(), 1);
        self.0.trailing_zeros() as usize
    }
}

impl std::ops::BitOr for LaneUsage {
    type Output = LaneUsage;
    fn bitor(self, o: LaneUsage) -> LaneUsage {
        LaneUsage(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for LaneUsage {
    fn bitor_assign(&mut self, o: LaneUsage) {
        self.0 |= o.0;
    }
}

impl fmt::Debug for LaneUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for LaneUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, u) in LaneUsage::NAMED {
            if self.contains(u) {
                f.write_str(if first { "" } else { "|" })?;
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

/// One lane: a local resource connected to one of the peer's address entries.
#[derive(Clone, Debug, PartialEq)]
pub struct Lane {
    /// Index into the local resources.
    pub local: usize,
    /// Index into the peer's address entries.
    pub remote: usize,
    /// The roles the lane won.
    pub usage: LaneUsage,
    /// The score with which the lane won each usage (bigger is better; 0 where unused),
    /// indexed like [`LaneUsage::NAMED`].
    pub scores: [f64; LaneUsage::COUNT],
}

impl Lane {
    /// The score with which this lane won `usage` (a single flag), if it did.
    pub fn score(&self, usage: LaneUsage) -> Option<f64> {
        self.usage.contains(usage).then(|| self.scores[usage.index()])
    }
}

/// The lanes of an endpoint and what each is for. All `usize` roles index [`LaneSet::lanes`];
/// multi-rail lists are ordered best first.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneSet {
    /// Every lane, each with its roles; the indices below point here.
    pub lanes: Vec<Lane>,
    /// The active-message lane.
    pub am: usize,
    /// Bandwidth lanes for fragmented AM; `am_bw[0] == am`.
    pub am_bw: Vec<usize>,
    /// Small put/get (empty when RMA was not wanted or no pair supports it).
    pub rma: Vec<usize>,
    /// Large put/get and rendezvous (empty when no pair has zcopy RMA).
    pub rma_bw: Vec<usize>,
    /// Atomics (`None` when not wanted or no pair supports them in hardware or CPU).
    pub amo: Option<usize>,
    /// Carries wireup messages; connects to the peer's interface.
    pub wireup: usize,
    /// Peer-failure mode only: the lane that checks the peer (`None`: no pair can).
    pub keepalive: Option<usize>,
}

/// What lane selection is asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectParams {
    /// Put/get wanted (UCP's RMA feature).
    pub rma: bool,
    /// 32-bit / 64-bit atomics wanted (AMO32, AMO64).
    pub amo32: bool,
    /// 64-bit atomics wanted (AMO64).
    pub amo64: bool,
    /// Atomic ops an AMO lane must post without a result, and with one (per wanted width).
    /// Default: UCP's full sets, add/and/or/xor and those plus swap/cswap.
    pub amo_post_ops: AtomicOps,
    /// Atomic ops an AMO lane must do with a result (fetching).
    pub amo_fetch_ops: AtomicOps,
    /// A lane whose 64-bit fetch ops include `amo_fetch_ops` also serves AMO32 (UCP emulates
    /// 32-bit atomics with 64-bit compare-and-swap on the enclosing word).
    pub amo32_on_64: bool,
    /// Error mode "peer": only resources that report peer failure.
    pub peer_failure: bool,
    /// AM_BW lanes, the AM lane included (UCX's `MAX_EAGER_RAILS`; default 1: no multi-rail
    /// eager).
    pub max_am_bw_lanes: usize,
    /// RMA_BW lanes (UCX's `MAX_RNDV_RAILS`; default 2; 0 selects none).
    pub max_rma_bw_lanes: usize,
    /// The zcopy ops an RMA_BW pair may share (both sides must have one of them): put and get
    /// for `RNDV_SCHEME=auto`, one of them for `get_zcopy` / `put_zcopy`.
    pub rma_bw_ops: IfaceFlags,
    /// A further rail must score at least the first one's divided by this (UCX's
    /// `MULTI_LANE_MAX_RATIO`, default 4).
    pub multi_lane_max_ratio: f64,
    /// Expected endpoints per worker and processes per node (latency and bandwidth models).
    pub est_num_eps: usize,
    /// Expected processes per node.
    pub est_num_ppn: usize,
    /// Both workers' uuids: the last symmetric tie-break (see the module doc).
    pub local_uuid: u64,
    /// The peer worker's uuid.
    pub remote_uuid: u64,
    /// Per local resource: allowed by `RUCX_TLS` only as an auxiliary transport, so it may
    /// carry wireup and keepalive only (missing entries: false).
    pub aux_only: Vec<bool>,
    /// The same per peer entry, where its address tells (missing entries: false). With only
    /// `aux_only` known, both peers must run with the same `RUCX_TLS` to stay symmetric.
    pub remote_aux_only: Vec<bool>,
}

impl Default for SelectParams {
    fn default() -> SelectParams {
        SelectParams {
            rma: false,
            amo32: false,
            amo64: false,
            amo_post_ops: AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR,
            amo_fetch_ops: AtomicOps::ADD
                | AtomicOps::AND
                | AtomicOps::OR
                | AtomicOps::XOR
                | AtomicOps::SWAP
                | AtomicOps::CSWAP,
            amo32_on_64: false,
            peer_failure: false,
            max_am_bw_lanes: 1,
            max_rma_bw_lanes: 2,
            rma_bw_ops: IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY,
            multi_lane_max_ratio: 4.0,
            est_num_eps: 1,
            est_num_ppn: 1,
            local_uuid: 0,
            remote_uuid: 0,
            aux_only: Vec::new(),
            remote_aux_only: Vec::new(),
        }
    }
}

impl SelectParams {
    /// The context's features and `RUCX_*` lane settings. Per endpoint the caller still sets
    /// `peer_failure` and the two uuids.
    pub(crate) fn from_context(ctx: &crate::Context, aux_only: Vec<bool>) -> SelectParams {
        use crate::config::RndvScheme;
        use crate::Features;
        let f = ctx.features();
        let cfg = &ctx.inner.cfg;
        let rma = f.contains(Features::RMA);
        let (rma_bw_ops, max_rma_bw_lanes) = match cfg.rndv_scheme {
            RndvScheme::GetZcopy => (IfaceFlags::GET_ZCOPY, cfg.max_rndv_lanes),
            RndvScheme::PutZcopy => (IfaceFlags::PUT_ZCOPY, cfg.max_rndv_lanes),
            // rendezvous over AM needs no RMA_BW lane, large put/get still do
            RndvScheme::Am if !rma => (IfaceFlags::EMPTY, 0),
            _ => (IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY, cfg.max_rndv_lanes),
        };
        SelectParams {
            rma,
            amo32: f.contains(Features::AMO32),
            amo64: f.contains(Features::AMO64),
            // UCP emulates every op it lacks with compare-and-swap (ucp::rma::atomic)
            amo_post_ops: AtomicOps::EMPTY,
            amo_fetch_ops: AtomicOps::CSWAP,
            amo32_on_64: true,
            max_am_bw_lanes: cfg.max_eager_lanes,
            max_rma_bw_lanes,
            rma_bw_ops,
            est_num_eps: cfg.num_eps.unwrap_or(1),
            est_num_ppn: cfg.num_ppn.unwrap_or(1),
            aux_only,
            ..SelectParams::default()
        }
    }
}

/// Chooses the lanes of an endpoint from the local resources and the peer's address entries.
/// `reachable(i, j)`: local resource `i` reaches the peer's entry `j`.
pub fn select(
    local: &[TlInfo],
    remote: &[TlInfo],
    reachable: &dyn Fn(usize, usize) -> bool,
    p: &SelectParams,
) -> Result<LaneSet> {
    let mut s = Selector {
        local,
        remote,
        reachable,
        reach: vec![None; local.len() * remote.len()],
        p,
        eps: p.est_num_eps.max(1) as f64,
        ppn: p.est_num_ppn.max(1) as f64,
        lanes: Vec::new(),
    };

    let Some(am) = s.best(Role::Am, &|_, _| true) else {
        return Err(s.no_am_error());
    };
    let am_lane = s.add(am, Role::Am);

    let am_bw = s.add_rails(Role::AmBw, p.max_am_bw_lanes, Some(am_lane));

    let mut rma = Vec::new();
    if p.rma {
        if let Some(c) = s.best(Role::Rma, &|_, _| true) {
            rma.push(s.add(c, Role::Rma));
        }
    }

    let rma_bw = s.add_rails(Role::RmaBw, p.max_rma_bw_lanes, None);

    let mut amo = None;
    if p.amo32 || p.amo64 {
        if let Some(c) = s.best(Role::Amo, &|_, _| true) {
            amo = Some(s.add(c, Role::Amo));
        }
    }

    let wireup = match s.best_for(Role::Wireup, am_lane, false) {
        Some(c) => s.add(c, Role::Wireup),
        None => return Err(s.no_wireup_error(am_lane)),
    };

    let mut keepalive = None;
    if p.peer_failure {
        if let Some(c) = s.best_for(Role::Keepalive, am_lane, true) {
            keepalive = Some(s.add(c, Role::Keepalive));
        }
    }

    Ok(LaneSet {
        lanes: s.lanes,
        am: am_lane,
        am_bw,
        rma,
        rma_bw,
        amo,
        wireup,
        keepalive,
    })
}

impl LaneSet {
    /// One line per lane: index, local tl/dev → remote tl/dev, usages (multi-rail ones with
    /// their rank), and what each usage's score estimates: the time of one message in µs
    /// (`am=0.350us`; RMA for 4 KiB: `rma=1.200us@4KiB`) or a bandwidth in MB/s (10^6 B/s:
    /// `am_bw=`, at the AM segment size; `rma_bw=..MB/s@256KiB`). What `RUCX_PROTO_INFO=y`
    /// prints.
    pub fn describe(&self, local: &[TlInfo], remote: &[TlInfo]) -> String {
        self.display(local, remote).to_string()
    }

    /// [`LaneSet::describe`] as a `Display` value.
    pub fn display<'a>(&'a self, local: &'a [TlInfo], remote: &'a [TlInfo]) -> impl fmt::Display + 'a {
        DescribeLanes {
            set: self,
            local,
            remote,
        }
    }
}

struct DescribeLanes<'a> {
    set: &'a LaneSet,
    local: &'a [TlInfo],
    remote: &'a [TlInfo],
}

impl fmt::Display for DescribeLanes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.set;
        for (k, lane) in s.lanes.iter().enumerate() {
            let name = |v: &[TlInfo], i: usize| {
                v.get(i)
                    .map_or_else(|| format!("?[{i}]"), |t| format!("{}/{}", t.tl_name, t.dev_name))
            };
            let mut roles = String::new();
            let mut scores = String::new();
            for (uname, u) in LaneUsage::NAMED {
                let Some(score) = lane.score(u) else { continue };
                let rank = match u {
                    LaneUsage::AM_BW => s.am_bw.iter().position(|&l| l == k),
                    LaneUsage::RMA => s.rma.iter().position(|&l| l == k),
                    LaneUsage::RMA_BW => s.rma_bw.iter().position(|&l| l == k),
                    _ => None,
                };
                let sep = if roles.is_empty() { "" } else { " " };
                match rank {
                    Some(r) => write!(roles, "{sep}{uname}#{r}")?,
                    None => write!(roles, "{sep}{uname}")?,
                }
                write!(scores, "{sep}{uname}=")?;
                write_estimate(&mut scores, u, score)?;
            }
            writeln!(
                f,
                "lane[{k}]: {} -> {}  {roles}  (estimated {scores})",
                name(self.local, lane.local),
                name(self.remote, lane.remote)
            )?;
        }
        Ok(())
    }
}

/// Writes what a lane's `score` for `usage` estimates (see [`Selector::score`]), with its unit:
/// the time of one message (µs; for RMA of a [`RMA_SCORE_SIZE`] one) or the bandwidth (MB/s =
/// 10^6 B/s; for RMA_BW at [`RMA_BW_SCORE_SIZE`] bytes, for AM_BW at the AM segment size).
fn write_estimate(out: &mut String, usage: LaneUsage, score: f64) -> fmt::Result {
    if !(score.is_finite() && score > 0.0) {
        return write!(out, "?");
    }
    let kib = |size: f64| size / 1024.0;
    match usage {
        LaneUsage::AM_BW => write!(out, "{:.1}MB/s", score * 1e5 / 1e6),
        LaneUsage::RMA => write!(out, "{:.3}us@{}KiB", 1e3 / score, kib(RMA_SCORE_SIZE)),
        LaneUsage::RMA_BW => write!(
            out,
            "{:.1}MB/s@{}KiB",
            score * RMA_BW_SCORE_SIZE / 1e6,
            kib(RMA_BW_SCORE_SIZE)
        ),
        _ => write!(out, "{:.3}us", 1e3 / score),
    }
}

/// The roles with their own criteria and score.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Am,
    AmBw,
    Rma,
    RmaBw,
    Amo,
    Wireup,
    Keepalive,
}

impl Role {
    /// Roles an auxiliary-only transport may play (UCX's `UCP_TL_RSC_FLAG_AUX`).
    fn aux_ok(self) -> bool {
        matches!(self, Role::Wireup | Role::Keepalive)
    }

    fn usage(self) -> LaneUsage {
        match self {
            Role::Am => LaneUsage::AM,
            Role::AmBw => LaneUsage::AM_BW,
            Role::Rma => LaneUsage::RMA,
            Role::RmaBw => LaneUsage::RMA_BW,
            Role::Amo => LaneUsage::AMO,
            Role::Wireup => LaneUsage::WIREUP,
            Role::Keepalive => LaneUsage::KEEPALIVE,
        }
    }
}

/// A scored pair.
#[derive(Clone, Copy, Debug)]
struct Cand {
    local: usize,
    remote: usize,
    score: f64,
}

struct Selector<'a> {
    local: &'a [TlInfo],
    remote: &'a [TlInfo],
    reachable: &'a dyn Fn(usize, usize) -> bool,
    /// `reachable` answers, asked once per pair and only for pairs that pass a role's flags.
    reach: Vec<Option<bool>>,
    p: &'a SelectParams,
    eps: f64,
    ppn: f64,
    lanes: Vec<Lane>,
}

impl Selector<'_> {
    fn reach(&mut self, i: usize, j: usize) -> bool {
        let k = i * self.remote.len() + j;
        if let Some(r) = self.reach[k] {
            return r;
        }
        let r = (self.reachable)(i, j);
        self.reach[k] = Some(r);
        r
    }

    /// Either side is auxiliary-only.
    fn aux(&self, i: usize, j: usize) -> bool {
        self.p.aux_only.get(i).copied().unwrap_or(false)
            || self.p.remote_aux_only.get(j).copied().unwrap_or(false)
    }

    /// Whether one side's resource meets `role`'s criteria on its own (the pair needs both).
    fn side_ok(&self, role: Role, a: &TlAttr) -> bool {
        let f = a.flags;
        if self.p.peer_failure && !f.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE) {
            return false;
        }
        let am = f.contains(IfaceFlags::AM_BCOPY) && a.am_max_bcopy >= MIN_BCOPY;
        match role {
            Role::Am | Role::AmBw => am,
            Role::Rma => {
                f.intersects(IfaceFlags::PUT_SHORT | IfaceFlags::PUT_BCOPY | IfaceFlags::PUT_ZCOPY)
                    && f.intersects(IfaceFlags::GET_SHORT | IfaceFlags::GET_BCOPY | IfaceFlags::GET_ZCOPY)
            }
            Role::RmaBw => f.intersects(self.p.rma_bw_ops),
            Role::Amo => {
                let wants = |(post, fetch): (AtomicOps, AtomicOps)| {
                    post.contains(self.p.amo_post_ops) && fetch.contains(self.p.amo_fetch_ops)
                };
                f.intersects(IfaceFlags::ATOMIC_CPU | IfaceFlags::ATOMIC_DEVICE)
                    && (!self.p.amo32 || wants(a.atomic32) || (self.p.amo32_on_64 && wants(a.atomic64)))
                    && (!self.p.amo64 || wants(a.atomic64))
            }
            Role::Wireup => am && f.contains(IfaceFlags::CONNECT_TO_IFACE),
            Role::Keepalive => {
                f.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE)
                    && (f.intersects(IfaceFlags::EP_KEEPALIVE | IfaceFlags::EP_CHECK)
                        || (am && f.contains(IfaceFlags::CONNECT_TO_IFACE)))
            }
        }
    }

    /// Criteria that need both sides at once.
    fn pair_ok(&self, role: Role, a: &TlAttr, b: &TlAttr) -> bool {
        match role {
            // the same zcopy op on both sides, so either can drive it
            Role::RmaBw => (a.flags & b.flags).intersects(self.p.rma_bw_ops),
            // atomics coherent with the same kind of agent on both sides
            Role::Amo => (a.flags & b.flags).intersects(IfaceFlags::ATOMIC_CPU | IfaceFlags::ATOMIC_DEVICE),
            _ => true,
        }
    }

    fn lat(&self, a: &TlAttr, b: &TlAttr) -> f64 {
        (a.latency(self.eps) + b.latency(self.eps)) / 2.0
    }

    fn bw(&self, a: &TlAttr, b: &TlAttr) -> f64 {
        a.bandwidth(self.ppn).min(b.bandwidth(self.ppn))
    }

    /// Bigger is better; symmetric in `a` and `b`; 0 for nonsense attributes.
    fn score(&self, role: Role, a: &TlAttr, b: &TlAttr) -> f64 {
        let lat = self.lat(a, b);
        let ovh = a.overhead + b.overhead;
        let bw = self.bw(a, b);
        let s = match role {
            Role::Am | Role::Amo | Role::Wireup | Role::Keepalive => 1e-3 / (lat + ovh),
            Role::Rma => 1e-3 / (lat + ovh + RMA_SCORE_SIZE / bw),
            Role::RmaBw => 1.0 / (RMA_BW_SCORE_SIZE / bw + lat + ovh),
            Role::AmBw => {
                let size = a.am_max_bcopy.min(b.am_max_bcopy) as f64;
                size / (size / bw + ovh + lat) * 1e-5
            }
        };
        if s.is_finite() && s > 0.0 {
            s
        } else {
            0.0
        }
    }

    /// The best pair for `role` among those `allowed` (by index) that meet its criteria.
    fn best(&mut self, role: Role, allowed: &dyn Fn(usize, usize) -> bool) -> Option<Cand> {
        let mut best: Option<Cand> = None;
        for i in 0..self.local.len() {
            let a = &self.local[i].attr;
            if !self.side_ok(role, a) {
                continue;
            }
            for j in 0..self.remote.len() {
                let b = &self.remote[j].attr;
                if !allowed(i, j)
                    || (!role.aux_ok() && self.aux(i, j))
                    || !self.side_ok(role, b)
                    || !self.pair_ok(role, a, b)
                    || !self.reach(i, j)
                {
                    continue;
                }
                let c = Cand {
                    local: i,
                    remote: j,
                    score: self.score(role, a, b),
                };
                if best.is_none_or(|cur| self.cmp(&c, &cur) == Ordering::Less) {
                    best = Some(c);
                }
            }
        }
        best
    }

    /// Total order on candidates, best first, the same from both sides (module doc).
    fn cmp(&self, x: &Cand, y: &Cand) -> Ordering {
        let prio =
            |c: &Cand| self.local[c.local].attr.priority as u16 + self.remote[c.remote].attr.priority as u16;
        let names = |c: &Cand| (self.name_local(c.local), self.name_remote(c.remote));
        let unordered = |c: &Cand| {
            let (l, r) = names(c);
            if l <= r {
                (l, r)
            } else {
                (r, l)
            }
        };
        let oriented = |c: &Cand| {
            let (l, r) = names(c);
            if self.p.local_uuid <= self.p.remote_uuid {
                (l, r)
            } else {
                (r, l)
            }
        };
        score_bits(y.score)
            .cmp(&score_bits(x.score))
            .then_with(|| prio(y).cmp(&prio(x)))
            .then_with(|| unordered(x).cmp(&unordered(y)))
            .then_with(|| oriented(x).cmp(&oriented(y)))
            .then_with(|| (x.local, x.remote).cmp(&(y.local, y.remote)))
    }

    fn name_local(&self, i: usize) -> (&str, &str) {
        (&self.local[i].tl_name, &self.local[i].dev_name)
    }

    fn name_remote(&self, j: usize) -> (&str, &str) {
        (&self.remote[j].tl_name, &self.remote[j].dev_name)
    }

    /// Adds `c` for `role`, sharing the lane of the same pair if there is one; its index.
    fn add(&mut self, c: Cand, role: Role) -> usize {
        let u = role.usage();
        let k = match self
            .lanes
            .iter()
            .position(|l| l.local == c.local && l.remote == c.remote)
        {
            Some(k) => k,
            None => {
                self.lanes.push(Lane {
                    local: c.local,
                    remote: c.remote,
                    usage: LaneUsage::EMPTY,
                    scores: [0.0; LaneUsage::COUNT],
                });
                self.lanes.len() - 1
            }
        };
        self.lanes[k].usage |= u;
        self.lanes[k].scores[u.index()] = c.score;
        k
    }

    /// Multi-rail: up to `max` lanes for `role` on distinct devices of both sides, starting
    /// with `first` when given (the AM lane for AM_BW).
    fn add_rails(&mut self, role: Role, max: usize, first: Option<usize>) -> Vec<usize> {
        let mut rails = Vec::new();
        let mut used_local: Vec<&str> = Vec::new();
        let mut used_remote: Vec<&str> = Vec::new();
        let mut top = 0.0;
        let (local, remote) = (self.local, self.remote);
        if let Some(k) = first {
            let (i, j) = (self.lanes[k].local, self.lanes[k].remote);
            let c = Cand {
                local: i,
                remote: j,
                score: self.score(role, &local[i].attr, &remote[j].attr),
            };
            top = c.score;
            rails.push(self.add(c, role));
            used_local.push(&local[i].dev_name);
            used_remote.push(&remote[j].dev_name);
            if single_rail_device(&local[i]) || single_rail_device(&remote[j]) {
                return rails;
            }
        }
        while rails.len() < max {
            let allowed = |i: usize, j: usize| {
                !used_local.contains(&local[i].dev_name.as_str())
                    && !used_remote.contains(&remote[j].dev_name.as_str())
            };
            let Some(c) = self.best(role, &allowed) else { break };
            if rails.is_empty() {
                top = c.score;
            } else if score_bits(c.score) < score_bits(top / self.p.multi_lane_max_ratio) {
                break;
            }
            rails.push(self.add(c, role));
            used_local.push(&local[c.local].dev_name);
            used_remote.push(&remote[c.remote].dev_name);
            if single_rail_device(&local[c.local]) || single_rail_device(&remote[c.remote]) {
                break;
            }
        }
        rails
    }

    /// For wireup and keepalive: the AM lane if it qualifies, then (with `chosen_first`) the
    /// best lane already chosen that does, then the best pair overall.
    fn best_for(&mut self, role: Role, am_lane: usize, chosen_first: bool) -> Option<Cand> {
        let am = (self.lanes[am_lane].local, self.lanes[am_lane].remote);
        if let Some(c) = self.best(role, &|i, j| (i, j) == am) {
            return Some(c);
        }
        if chosen_first {
            let chosen: Vec<(usize, usize)> = self.lanes.iter().map(|l| (l.local, l.remote)).collect();
            if let Some(c) = self.best(role, &|i, j| chosen.contains(&(i, j))) {
                return Some(c);
            }
        }
        self.best(role, &|_, _| true)
    }

    /// Why no pair carries active messages, pair by pair, and what to change.
    fn no_am_error(&mut self) -> Error {
        let (local, remote) = (self.local, self.remote);
        let list = |v: &[TlInfo]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter()
                    .map(|t| format!("{}/{}", t.tl_name, t.dev_name))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let mut why = Vec::new();
        for (i, l) in local.iter().enumerate() {
            for (j, r) in remote.iter().enumerate() {
                let reason = self
                    .side_reason(&l.attr, "local")
                    .or_else(|| self.side_reason(&r.attr, "peer"))
                    .or_else(|| {
                        self.aux(i, j)
                            .then(|| "auxiliary only (RUCX_TLS allows it for wireup)".to_string())
                    })
                    .unwrap_or_else(|| {
                        if self.reach(i, j) {
                            "rejected"
                        } else {
                            "unreachable"
                        }
                        .to_string()
                    });
                why.push(format!(
                    "{}/{} -> {}/{}: {reason}",
                    l.tl_name, l.dev_name, r.tl_name, r.dev_name
                ));
            }
        }
        let pairs = if why.is_empty() {
            String::new()
        } else {
            format!(" ({})", why.join("; "))
        };
        Error::new(
            Status::Unreachable,
            format!(
                "no transport pair can carry active messages to the peer{pairs}; local transports: {}; \
                 peer transports: {}; set RUCX_TLS (and RUCX_NET_DEVICES) on both sides to include a \
                 transport both reach{}",
                list(local),
                list(remote),
                if self.p.peer_failure {
                    ", or use an error mode other than peer"
                } else {
                    ""
                }
            ),
        )
    }

    fn side_reason(&self, a: &TlAttr, side: &str) -> Option<String> {
        if self.p.peer_failure && !a.flags.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE) {
            Some(format!(
                "{side} side cannot report peer failure (error mode peer)"
            ))
        } else if !a.flags.contains(IfaceFlags::AM_BCOPY) {
            Some(format!("{side} side has no am bcopy"))
        } else if a.am_max_bcopy < MIN_BCOPY {
            Some(format!(
                "{side} side's am segment {} < {MIN_BCOPY} bytes",
                a.am_max_bcopy
            ))
        } else {
            None
        }
    }

    fn no_wireup_error(&self, am_lane: usize) -> Error {
        let l = &self.local[self.lanes[am_lane].local];
        Error::new(
            Status::Unreachable,
            format!(
                "no transport pair can carry wireup messages to the peer: the active-message lane \
                 {}/{} does not connect to an interface, and no reachable pair with am bcopy does{}; \
                 add a connect-to-iface transport (e.g. ud_verbs next to rc_verbs, or tcp) to RUCX_TLS \
                 on both sides",
                l.tl_name,
                l.dev_name,
                if self.p.peer_failure {
                    " and reports peer failure"
                } else {
                    ""
                }
            ),
        )
    }
}

/// Scores compared on their top bits (positive doubles order like their bit patterns), so
/// near-equal scores tie and fall to the priority and name rules on both sides alike.
fn score_bits(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        s.to_bits() >> 24
    } else {
        0
    }
}

/// Self and shared memory: a further rail on another device would only slow things down.
fn single_rail_device(t: &TlInfo) -> bool {
    matches!(
        DeviceType::from_raw(t.dev_type),
        DeviceType::SelfDev | DeviceType::Shm
    )
}

/// Resources with the attributes rucx's transports report (`rucx-info -d`, uct-ib's models),
/// for the lane and threshold tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use uct::{AtomicOps, DeviceType, IfaceFlags as F};

    use crate::tl::{TlAttr, TlInfo};

    const MB: f64 = 1024.0 * 1024.0;

    fn all_ops() -> (AtomicOps, AtomicOps) {
        let post = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        (post, post | AtomicOps::SWAP | AtomicOps::CSWAP)
    }

    fn info(tl: &str, dev: &str, component: &str, dev_type: DeviceType, attr: TlAttr) -> TlInfo {
        TlInfo {
            tl_name: tl.into(),
            dev_name: dev.into(),
            component: component.into(),
            dev_type: dev_type as u8,
            attr,
        }
    }

    /// `self/memory0`: 0 ns, 10 ns overhead, 9536.74 MB/s, 8 KiB segments, CPU atomics.
    pub fn self_tl() -> TlInfo {
        let attr = TlAttr {
            flags: F::AM_SHORT
                | F::AM_BCOPY
                | F::AM_ZCOPY
                | F::PENDING
                | F::PUT_SHORT
                | F::PUT_BCOPY
                | F::PUT_ZCOPY
                | F::GET_SHORT
                | F::GET_BCOPY
                | F::GET_ZCOPY
                | F::ATOMIC_CPU
                | F::ERRHANDLE_SHORT_BUF
                | F::ERRHANDLE_BCOPY_BUF
                | F::ERRHANDLE_ZCOPY_BUF
                | F::ERRHANDLE_AM_ID
                | F::ERRHANDLE_REMOTE_MEM
                | F::ERRHANDLE_BCOPY_LEN
                | F::CONNECT_TO_IFACE
                | F::CB_SYNC,
            latency_c: 0.0,
            latency_m: 0.0,
            overhead: 10e-9,
            bw_dedicated: 10e9,
            bw_shared: 0.0,
            priority: 0,
            am_max_bcopy: 8192,
            am_max_short: 8192,
            am_max_zcopy: 8192,
            am_max_hdr: 8192,
            am_max_iov: 16,
            put_max_zcopy: usize::MAX,
            get_max_zcopy: usize::MAX,
            atomic32: all_ops(),
            atomic64: all_ops(),
        };
        info("self", "memory0", "self", DeviceType::SelfDev, attr)
    }

    /// `tcp/<dev>`: lo 3 us / 4768 MB/s dedicated / priority 3; eth0 6.058 us / 1117 MB/s
    /// shared / priority 2; other devices like eth0 with priority 0. 2 us overhead, 8 KiB
    /// send segment, 64 KiB zcopy, CPU atomics, peer failure and keepalive.
    pub fn tcp(dev: &str) -> TlInfo {
        let (lat, ded, shared, prio) = match dev {
            "lo" => (3000e-9, 5e9, 0.0, 3),
            "eth0" => (6058e-9, 0.0, 1117.48 * MB, 2),
            _ => (6058e-9, 0.0, 1117.48 * MB, 0),
        };
        let attr = TlAttr {
            flags: F::AM_SHORT
                | F::AM_BCOPY
                | F::AM_ZCOPY
                | F::PENDING
                | F::PUT_SHORT
                | F::PUT_BCOPY
                | F::PUT_ZCOPY
                | F::GET_BCOPY
                | F::GET_ZCOPY
                | F::ATOMIC_CPU
                | F::ERRHANDLE_AM_ID
                | F::ERRHANDLE_REMOTE_MEM
                | F::ERRHANDLE_BCOPY_LEN
                | F::ERRHANDLE_PEER_FAILURE
                | F::CONNECT_TO_IFACE
                | F::CONNECT_TO_EP
                | F::CB_SYNC
                | F::EP_KEEPALIVE
                | F::INTER_NODE,
            latency_c: lat,
            latency_m: 0.0,
            overhead: 2000e-9,
            bw_dedicated: ded,
            bw_shared: shared,
            priority: prio,
            am_max_bcopy: 8192,
            am_max_short: 8192,
            am_max_zcopy: 65536,
            am_max_hdr: 8184,
            am_max_iov: 6,
            put_max_zcopy: usize::MAX,
            get_max_zcopy: usize::MAX,
            atomic32: all_ops(),
            atomic64: all_ops(),
        };
        info("tcp", dev, "tcp", DeviceType::Net, attr)
    }

    /// Latency, bandwidth and path MTU of an IB port, by uct-ib's link model: `rxe*` is soft
    /// RoCE (FDR10 1x, 1024-byte MTU, +200 ns), `*slow*` an SDR 1x port, anything else an EDR
    /// 4x InfiniBand port with a 4096-byte MTU.
    fn ib_port(dev: &str) -> (f64, f64, usize) {
        let bw = |lanes: f64, rate: f64, enc: f64, mtu: f64, hdr: f64| {
            lanes * rate * enc / 8.0 * mtu / (mtu + hdr)
        };
        if dev.starts_with("rxe") {
            (900e-9, bw(1.0, 10.3125e9, 64.0 / 66.0, 1024.0, 62.0), 1024)
        } else if dev.contains("slow") {
            (5000e-9, bw(1.0, 2.5e9, 0.8, 4096.0, 26.0), 4096)
        } else {
            (600e-9, bw(4.0, 25.78125e9, 64.0 / 66.0, 4096.0, 26.0), 4096)
        }
    }

    /// `rc_verbs/<dev>`: 64-byte inline (am_short 63), 8 KiB segment (am bcopy/zcopy 8191),
    /// 75 ns overhead, 1 ns per endpoint, device atomics (64-bit add, fetch-add, cswap),
    /// connects endpoint to endpoint only.
    pub fn rc(dev: &str) -> TlInfo {
        let (lat, bw, _) = ib_port(dev);
        let attr = TlAttr {
            flags: F::AM_SHORT
                | F::AM_BCOPY
                | F::AM_ZCOPY
                | F::PENDING
                | F::PUT_SHORT
                | F::PUT_BCOPY
                | F::PUT_ZCOPY
                | F::GET_BCOPY
                | F::GET_ZCOPY
                | F::ATOMIC_DEVICE
                | F::CONNECT_TO_EP
                | F::CB_SYNC
                | F::ERRHANDLE_PEER_FAILURE
                | F::INTER_NODE,
            latency_c: lat,
            latency_m: 1e-9,
            overhead: 75e-9,
            bw_dedicated: bw,
            bw_shared: 0.0,
            priority: 0,
            am_max_bcopy: 8191,
            am_max_short: 63,
            am_max_zcopy: 8191,
            am_max_hdr: 127,
            am_max_iov: 4,
            put_max_zcopy: 1 << 31,
            get_max_zcopy: 1 << 31,
            atomic32: (AtomicOps::EMPTY, AtomicOps::EMPTY),
            atomic64: (AtomicOps::ADD, AtomicOps::ADD | AtomicOps::CSWAP),
        };
        info("rc_verbs", dev, "ib", DeviceType::Net, attr)
    }

    /// `ud_verbs/<dev>`: one MTU per packet less its 12-byte header (1012 bytes on rxe),
    /// 105 ns overhead, connects to an interface, no RMA or atomics.
    pub fn ud(dev: &str) -> TlInfo {
        let (lat, bw, mtu) = ib_port(dev);
        let attr = TlAttr {
            flags: F::AM_SHORT
                | F::AM_BCOPY
                | F::AM_ZCOPY
                | F::PENDING
                | F::CONNECT_TO_IFACE
                | F::CONNECT_TO_EP
                | F::CB_SYNC
                | F::ERRHANDLE_PEER_FAILURE
                | F::ERRHANDLE_AM_ID
                | F::ERRHANDLE_BCOPY_LEN
                | F::ERRHANDLE_SHORT_BUF
                | F::ERRHANDLE_BCOPY_BUF
                | F::ERRHANDLE_ZCOPY_BUF,
            latency_c: lat,
            latency_m: 0.0,
            overhead: 105e-9,
            bw_dedicated: bw,
            bw_shared: 0.0,
            priority: 0,
            am_max_bcopy: mtu - 12,
            am_max_short: mtu - 12,
            am_max_zcopy: mtu - 12,
            am_max_hdr: mtu - 12,
            am_max_iov: 8,
            put_max_zcopy: 0,
            get_max_zcopy: 0,
            atomic32: (AtomicOps::EMPTY, AtomicOps::EMPTY),
            atomic64: (AtomicOps::EMPTY, AtomicOps::EMPTY),
        };
        info("ud_verbs", dev, "ib", DeviceType::Net, attr)
    }

    /// `posix/memory` and `sysv/memory` (uct-sm's FIFO transports): 80 ns, 10 ns overhead,
    /// 12179 MB/s, 8240-byte elements (am_short and am_bcopy), no RMA, peer failure.
    pub fn mm(tl: &str) -> TlInfo {
        let attr = TlAttr {
            flags: F::AM_SHORT
                | F::AM_BCOPY
                | F::PENDING
                | F::CONNECT_TO_IFACE
                | F::CB_SYNC
                | F::ERRHANDLE_PEER_FAILURE
                | F::ERRHANDLE_AM_ID
                | F::ERRHANDLE_BCOPY_LEN
                | F::ERRHANDLE_SHORT_BUF
                | F::ERRHANDLE_BCOPY_BUF,
            latency_c: 80e-9,
            latency_m: 0.0,
            overhead: 10e-9,
            bw_dedicated: 12179.0 * MB,
            bw_shared: 0.0,
            priority: 0,
            am_max_bcopy: 8240,
            am_max_short: 8240,
            am_max_zcopy: 0,
            am_max_hdr: 0,
            am_max_iov: 16,
            put_max_zcopy: 0,
            get_max_zcopy: 0,
            atomic32: (AtomicOps::EMPTY, AtomicOps::EMPTY),
            atomic64: (AtomicOps::EMPTY, AtomicOps::EMPTY),
        };
        info(tl, "memory", tl, DeviceType::Shm, attr)
    }

    /// `cma/memory`: put/get zcopy only, 80 ns, 2 us overhead, 11145 MB/s.
    pub fn cma() -> TlInfo {
        let attr = TlAttr {
            flags: F::PUT_ZCOPY
                | F::GET_ZCOPY
                | F::CONNECT_TO_IFACE
                | F::CB_SYNC
                | F::ERRHANDLE_PEER_FAILURE
                | F::ERRHANDLE_REMOTE_MEM
                | F::ERRHANDLE_ZCOPY_BUF,
            latency_c: 80e-9,
            latency_m: 0.0,
            overhead: 2000e-9,
            bw_dedicated: 11145.0 * MB,
            bw_shared: 0.0,
            priority: 0,
            am_max_bcopy: 0,
            am_max_short: 0,
            am_max_zcopy: 0,
            am_max_hdr: 0,
            am_max_iov: 0,
            put_max_zcopy: usize::MAX,
            get_max_zcopy: usize::MAX,
            atomic32: (AtomicOps::EMPTY, AtomicOps::EMPTY),
            atomic64: (AtomicOps::EMPTY, AtomicOps::EMPTY),
        };
        info("cma", "memory", "cma", DeviceType::Shm, attr)
    }

    /// A host with loopback and soft RoCE: self, tcp/lo, rc_verbs and ud_verbs on rxe0:1.
    pub fn lo_rxe_host() -> Vec<TlInfo> {
        vec![self_tl(), tcp("lo"), rc("rxe0:1"), ud("rxe0:1")]
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    /// Where a worker runs, for the reachability model.
    #[derive(Clone, Copy)]
    struct At {
        host: u32,
        process: u32,
    }

    /// uct's reachability in a small model: same transport; self only within one process;
    /// tcp/lo only within one host, other tcp devices on one network; IB ports on one fabric.
    fn reach<'a>(l: &'a [TlInfo], la: At, r: &'a [TlInfo], ra: At) -> impl Fn(usize, usize) -> bool + 'a {
        move |i, j| {
            let (a, b) = (&l[i], &r[j]);
            a.tl_name == b.tl_name
                && match a.tl_name.as_str() {
                    "self" => la.host == ra.host && la.process == ra.process,
                    "posix" | "sysv" | "cma" => la.host == ra.host,
                    "tcp" if a.dev_name == "lo" || b.dev_name == "lo" => {
                        a.dev_name == b.dev_name && la.host == ra.host
                    }
                    _ => true,
                }
        }
    }

    fn params(local_uuid: u64, remote_uuid: u64) -> SelectParams {
        SelectParams {
            local_uuid,
            remote_uuid,
            ..SelectParams::default()
        }
    }

    /// Selects from A's side and from B's, checks the two mirror each other, and returns A's.
    fn select_both(l: &[TlInfo], la: At, r: &[TlInfo], ra: At, p: &SelectParams) -> Result<LaneSet> {
        let a = select(l, r, &reach(l, la, r, ra), p);
        let b = select(r, l, &reach(r, ra, l, la), &swapped(p));
        assert_mirrored(&a, &b);
        a
    }

    /// The peer's view of `p`.
    fn swapped(p: &SelectParams) -> SelectParams {
        SelectParams {
            local_uuid: p.remote_uuid,
            remote_uuid: p.local_uuid,
            aux_only: p.remote_aux_only.clone(),
            remote_aux_only: p.aux_only.clone(),
            ..p.clone()
        }
    }

    fn assert_mirrored(a: &Result<LaneSet>, b: &Result<LaneSet>) {
        match (a, b) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.lanes.len(), b.lanes.len(), "{a:?}\n{b:?}");
                for (x, y) in a.lanes.iter().zip(&b.lanes) {
                    assert_eq!((x.local, x.remote), (y.remote, y.local), "{a:?}\n{b:?}");
                    assert_eq!(x.usage, y.usage, "{a:?}\n{b:?}");
                    assert_eq!(x.scores, y.scores, "{a:?}\n{b:?}");
                }
                assert_eq!(
                    (a.am, &a.am_bw, &a.rma, &a.rma_bw, a.amo, a.wireup, a.keepalive),
                    (b.am, &b.am_bw, &b.rma, &b.rma_bw, b.amo, b.wireup, b.keepalive)
                );
            }
            (Err(a), Err(b)) => assert_eq!(a.status(), b.status()),
            _ => panic!("one side selected lanes and the other did not:\n{a:?}\n{b:?}"),
        }
    }

    /// `tl/dev -> tl/dev` of a lane.
    fn pair(s: &LaneSet, k: usize, l: &[TlInfo], r: &[TlInfo]) -> String {
        let lane = &s.lanes[k];
        let (a, b) = (&l[lane.local], &r[lane.remote]);
        format!("{}/{} -> {}/{}", a.tl_name, a.dev_name, b.tl_name, b.dev_name)
    }

    fn pairs(s: &LaneSet, ks: &[usize], l: &[TlInfo], r: &[TlInfo]) -> Vec<String> {
        ks.iter().map(|&k| pair(s, k, l, r)).collect()
    }

    const P1: At = At { host: 1, process: 1 };
    const P2: At = At { host: 1, process: 2 };
    const H2: At = At { host: 2, process: 1 };

    #[test]
    fn lo_rxe_host_across_processes() {
        let h = lo_rxe_host();
        let p = SelectParams {
            rma: true,
            amo64: true,
            ..params(1, 2)
        };
        let s = select_both(&h, P1, &h, P2, &p).unwrap();
        let rc = "rc_verbs/rxe0:1 -> rc_verbs/rxe0:1";
        let lo = "tcp/lo -> tcp/lo";
        let ud = "ud_verbs/rxe0:1 -> ud_verbs/rxe0:1";
        assert_eq!(pair(&s, s.am, &h, &h), rc);
        assert_eq!(s.am_bw, vec![s.am]);
        assert_eq!(pairs(&s, &s.rma, &h, &h), [rc]);
        // 256 KiB: lo's 5 GB/s beats rxe's 1.18 GB/s, and rxe is within the 4x ratio
        assert_eq!(pairs(&s, &s.rma_bw, &h, &h), [lo, rc]);
        // rc_verbs lacks 64-bit and/or/xor/swap: CPU atomics over tcp
        assert_eq!(pair(&s, s.amo.unwrap(), &h, &h), lo);
        // rc_verbs connects endpoint to endpoint: wireup goes over ud_verbs
        assert_eq!(pair(&s, s.wireup, &h, &h), ud);
        assert_eq!(s.keepalive, None);
        assert_eq!(s.lanes.len(), 3);
        assert_eq!(
            s.lanes[s.am].usage,
            LaneUsage::AM | LaneUsage::AM_BW | LaneUsage::RMA | LaneUsage::RMA_BW
        );
        assert!(s.lanes.iter().all(|l| h[l.local].tl_name != "self"));
    }

    /// Two processes of one host with every default transport (RUCX_TLS unset): shared memory
    /// carries AM (posix, sysv by the tie-break) and cma the rendezvous; between hosts, tcp and
    /// verbs as before.
    #[test]
    fn shared_memory_between_processes_of_one_host() {
        let mut h = lo_rxe_host();
        h.extend([mm("posix"), mm("sysv"), cma(), tcp("eth0")]);
        let p = SelectParams {
            rma: true,
            max_am_bw_lanes: 1,
            max_rma_bw_lanes: 2,
            rma_bw_ops: IfaceFlags::GET_ZCOPY,
            ..params(3, 9)
        };
        let s = select_both(&h, P1, &h, P2, &p).unwrap();
        let am = pair(&s, s.am, &h, &h);
        assert!(
            am == "posix/memory -> posix/memory" || am == "sysv/memory -> sysv/memory",
            "AM lane {am}:\n{}",
            s.describe(&h, &h)
        );
        assert_eq!(
            pair(&s, s.rma_bw[0], &h, &h),
            "cma/memory -> cma/memory",
            "{}",
            s.describe(&h, &h)
        );
        let s = select_both(&h, P1, &h, H2, &p).unwrap();
        for l in &s.lanes {
            let tl = h[l.local].tl_name.as_str();
            assert!(
                !matches!(tl, "posix" | "sysv" | "cma" | "self"),
                "{tl} between hosts:\n{}",
                s.describe(&h, &h)
            );
        }
    }

    #[test]
    fn self_wins_within_a_process() {
        let h = lo_rxe_host();
        let p = SelectParams {
            rma: true,
            amo32: true,
            amo64: true,
            max_am_bw_lanes: 3,
            ..params(7, 7)
        };
        let s = select(&h, &h, &reach(&h, P1, &h, P1), &p).unwrap();
        // self wins everything, and no other rail is added next to it
        assert_eq!(s.lanes.len(), 1, "{}", s.describe(&h, &h));
        assert_eq!(pair(&s, 0, &h, &h), "self/memory0 -> self/memory0");
        assert_eq!((s.am, s.wireup, s.amo), (0, 0, Some(0)));
        assert_eq!(
            (&s.am_bw[..], &s.rma[..], &s.rma_bw[..]),
            (&[0][..], &[0][..], &[0][..])
        );
    }

    #[test]
    fn peer_failure_excludes_self() {
        let h = lo_rxe_host();
        let p = SelectParams {
            peer_failure: true,
            ..params(7, 7)
        };
        let s = select(&h, &h, &reach(&h, P1, &h, P1), &p).unwrap();
        assert!(
            s.lanes.iter().all(|l| h[l.local].tl_name != "self"),
            "{}",
            s.describe(&h, &h)
        );
        assert_eq!(pair(&s, s.am, &h, &h), "rc_verbs/rxe0:1 -> rc_verbs/rxe0:1");
        let ud = "ud_verbs/rxe0:1 -> ud_verbs/rxe0:1";
        assert_eq!(pair(&s, s.wireup, &h, &h), ud);
        // rc_verbs has no keepalive or ep_check: AM-based keepalive on the wireup lane
        assert_eq!(s.keepalive, Some(s.wireup));

        // only self: nothing left, and the error says why
        let only_self = [self_tl()];
        let e = select(&only_self, &only_self, &|_, _| true, &p).unwrap_err();
        assert_eq!(e.status(), Status::Unreachable);
        let msg = e.context().unwrap();
        assert!(
            msg.contains("self/memory0 -> self/memory0: local side cannot report peer failure"),
            "{msg}"
        );
        assert!(msg.contains("error mode other than peer"), "{msg}");
    }

    #[test]
    fn tcp_only_hosts() {
        let h = [tcp("lo"), tcp("eth0")];
        let p = SelectParams {
            peer_failure: true,
            ..params(1, 2)
        };
        // across hosts: lo reaches only its own host
        let s = select_both(&h, P1, &h, H2, &p).unwrap();
        let eth = "tcp/eth0 -> tcp/eth0";
        assert_eq!(s.lanes.len(), 1, "{}", s.describe(&h, &h));
        assert_eq!(pair(&s, 0, &h, &h), eth);
        assert_eq!((s.am, s.wireup, s.keepalive), (0, 0, Some(0)));
        assert_eq!((&s.am_bw[..], &s.rma_bw[..]), (&[0][..], &[0][..]));

        // within a host: lo (3 us) beats eth0 (6 us); both carry 256 KiB rendezvous
        let s = select_both(&h, P1, &h, P2, &params(1, 2)).unwrap();
        let lo = "tcp/lo -> tcp/lo";
        assert_eq!(pair(&s, s.am, &h, &h), lo);
        assert_eq!(s.wireup, s.am);
        assert_eq!(pairs(&s, &s.rma_bw, &h, &h), [lo, eth]);
        assert!(s.rma.is_empty() && s.amo.is_none() && s.keepalive.is_none());
    }

    #[test]
    fn unreachable_pairs() {
        let a = [tcp("eth0")];
        let b = [rc("mlx5_0:1"), ud("mlx5_0:1")];
        let e = select_both(&a, P1, &b, H2, &params(1, 2)).unwrap_err();
        assert_eq!(e.status(), Status::Unreachable);
        let msg = e.context().unwrap();
        for want in [
            "tcp/eth0 -> rc_verbs/mlx5_0:1: unreachable",
            "tcp/eth0 -> ud_verbs/mlx5_0:1: unreachable",
            "local transports: tcp/eth0",
            "peer transports: rc_verbs/mlx5_0:1, ud_verbs/mlx5_0:1",
            "RUCX_TLS",
        ] {
            assert!(msg.contains(want), "{want:?} not in {msg}");
        }

        // a transport that cannot carry AM is named with the reason
        let mut no_am = tcp("eth0");
        no_am.attr.flags = no_am.attr.flags & !IfaceFlags::AM_BCOPY;
        let e = select(&[no_am], &[tcp("eth0")], &|_, _| true, &params(1, 2)).unwrap_err();
        assert!(e
            .context()
            .unwrap()
            .contains("tcp/eth0 -> tcp/eth0: local side has no am bcopy"));

        // nothing at all
        let e = select(&[], &b, &|_, _| true, &params(1, 2)).unwrap_err();
        assert!(e.context().unwrap().contains("local transports: none"), "{e}");

        // rc_verbs alone has AM but cannot carry wireup (it connects endpoint to endpoint)
        let rc_only = [rc("mlx5_0:1")];
        let e = select_both(&rc_only, P1, &rc_only, H2, &params(1, 2)).unwrap_err();
        assert_eq!(e.status(), Status::Unreachable);
        let msg = e.context().unwrap();
        assert!(
            msg.contains("wireup") && msg.contains("rc_verbs/mlx5_0:1") && msg.contains("ud_verbs"),
            "{msg}"
        );
    }

    #[test]
    fn ties_broken_by_priority_then_names() {
        let dev = |name: &str, prio: u8| {
            let mut t = tcp(name);
            t.attr.priority = prio;
            t
        };
        // equal scores: the higher priority sum wins, whatever the order of the lists
        let a = [dev("eth0", 0), dev("eth1", 1)];
        let b = [dev("eth1", 1), dev("eth0", 0)];
        let s = select_both(&a, P1, &b, H2, &params(1, 2)).unwrap();
        assert_eq!(pair(&s, s.am, &a, &b), "tcp/eth1 -> tcp/eth1");

        // equal priorities: the smaller pair of names
        let a = [dev("eth1", 0), dev("eth0", 0)];
        let s = select_both(&a, P1, &a, H2, &params(1, 2)).unwrap();
        assert_eq!(pair(&s, s.am, &a, &a), "tcp/eth0 -> tcp/eth0");

        // only the crossed pairs reach: {eth0, eth1} both ways; the worker uuids decide
        let cross = |l: &[TlInfo], r: &[TlInfo], i: usize, j: usize| l[i].dev_name != r[j].dev_name;
        for (ua, ub, want) in [(1, 2, "tcp/eth0 -> tcp/eth1"), (2, 1, "tcp/eth1 -> tcp/eth0")] {
            let sa = select(&a, &a, &|i, j| cross(&a, &a, i, j), &params(ua, ub));
            let sb = select(&a, &a, &|i, j| cross(&a, &a, i, j), &params(ub, ua));
            assert_mirrored(&sa, &sb);
            let sa = sa.unwrap();
            assert_eq!(pair(&sa, sa.am, &a, &a), want);
        }
    }

    #[test]
    fn multi_rail_am_bw_on_two_devices() {
        let h = [rc("mlx5_0:1"), ud("mlx5_0:1"), rc("mlx5_1:1"), ud("mlx5_1:1")];
        let p = SelectParams {
            max_am_bw_lanes: 2,
            ..params(1, 2)
        };
        let s = select_both(&h, P1, &h, H2, &p).unwrap();
        let r0 = "rc_verbs/mlx5_0:1 -> rc_verbs/mlx5_0:1";
        let r1 = "rc_verbs/mlx5_1:1 -> rc_verbs/mlx5_1:1";
        assert_eq!(pair(&s, s.am, &h, &h), r0);
        assert_eq!(pairs(&s, &s.am_bw, &h, &h), [r0, r1]);
        assert_eq!(pairs(&s, &s.rma_bw, &h, &h), [r0, r1]);
        assert_eq!(
            pair(&s, s.wireup, &h, &h),
            "ud_verbs/mlx5_0:1 -> ud_verbs/mlx5_0:1"
        );
        assert!(
            s.describe(&h, &h).contains("am am_bw#0 rma_bw#0"),
            "{}",
            s.describe(&h, &h)
        );

        // the default (UCX's MAX_EAGER_RAILS=1): the AM lane alone
        let s = select_both(&h, P1, &h, H2, &params(1, 2)).unwrap();
        assert_eq!(s.am_bw, vec![s.am]);

        // a second device more than 4x slower is left out
        let h = [rc("mlx5_0:1"), ud("mlx5_0:1"), rc("slow0:1")];
        let s = select_both(&h, P1, &h, H2, &p).unwrap();
        assert_eq!(pairs(&s, &s.am_bw, &h, &h), [r0]);
        assert_eq!(pairs(&s, &s.rma_bw, &h, &h), [r0]);
    }

    #[test]
    fn rma_and_amo_by_capability() {
        let h = lo_rxe_host();
        let rc_rc = "rc_verbs/rxe0:1 -> rc_verbs/rxe0:1";
        let lo = "tcp/lo -> tcp/lo";
        // the ops rc_verbs has in hardware: its device atomics win on latency
        let few = SelectParams {
            amo64: true,
            amo_post_ops: AtomicOps::ADD,
            amo_fetch_ops: AtomicOps::ADD | AtomicOps::CSWAP,
            ..params(1, 2)
        };
        let s = select_both(&h, P1, &h, P2, &few).unwrap();
        assert_eq!(pair(&s, s.amo.unwrap(), &h, &h), rc_rc);
        assert!(s.rma.is_empty(), "RMA not wanted");
        // 32-bit too: rc_verbs has none
        let s = select_both(
            &h,
            P1,
            &h,
            P2,
            &SelectParams {
                amo32: true,
                ..few.clone()
            },
        )
        .unwrap();
        assert_eq!(pair(&s, s.amo.unwrap(), &h, &h), lo);
        // unless 64-bit ops may serve 32 bit (UCP's emulation): rc_verbs again
        let s = select_both(
            &h,
            P1,
            &h,
            P2,
            &SelectParams {
                amo32: true,
                amo32_on_64: true,
                ..few.clone()
            },
        )
        .unwrap();
        assert_eq!(pair(&s, s.amo.unwrap(), &h, &h), rc_rc);

        // ud_verbs has neither RMA nor atomics: nothing but AM
        let u = [ud("rxe0:1")];
        let p = SelectParams {
            rma: true,
            amo32: true,
            amo64: true,
            ..params(1, 2)
        };
        let s = select_both(&u, P1, &u, H2, &p).unwrap();
        assert_eq!(
            (s.lanes.len(), s.rma.len(), s.rma_bw.len(), s.amo),
            (1, 0, 0, None)
        );

        // CPU atomics on one side and device atomics on the other do not pair
        let mut cpu_rc = rc("rxe0:1");
        cpu_rc.attr.flags = (cpu_rc.attr.flags & !IfaceFlags::ATOMIC_DEVICE) | IfaceFlags::ATOMIC_CPU;
        let a = [rc("rxe0:1"), ud("rxe0:1")];
        let b = [cpu_rc, ud("rxe0:1")];
        let s = select_both(&a, P1, &b, H2, &few).unwrap();
        assert_eq!(s.amo, None);

        // RMA needs put and get on both sides
        let mut put_only = tcp("eth0");
        put_only.attr.flags = put_only.attr.flags & !(IfaceFlags::GET_BCOPY | IfaceFlags::GET_ZCOPY);
        let s = select_both(&[put_only], P1, &[tcp("eth0")], H2, &p).unwrap();
        assert!(s.rma.is_empty());
        assert_eq!(
            s.rma_bw.len(),
            1,
            "put zcopy on both sides is enough for rendezvous"
        );
    }

    #[test]
    fn auxiliary_transports_carry_wireup_only() {
        // RUCX_TLS=rc: rc_verbs, and ud_verbs for wireup only
        let h = [tcp("eth0"), rc("mlx5_0:1"), ud("mlx5_0:1")];
        let aux = vec![true, false, true];
        let p = SelectParams {
            aux_only: aux.clone(),
            remote_aux_only: aux,
            ..params(1, 2)
        };
        let s = select_both(&h, P1, &h, H2, &p).unwrap();
        assert_eq!(pair(&s, s.am, &h, &h), "rc_verbs/mlx5_0:1 -> rc_verbs/mlx5_0:1");
        assert_eq!(
            pair(&s, s.wireup, &h, &h),
            "ud_verbs/mlx5_0:1 -> ud_verbs/mlx5_0:1"
        );
        assert_eq!(s.lanes.len(), 2, "tcp is not used, not even for rendezvous");

        // ud_verbs would win AM over tcp, but may carry wireup only
        let h = [tcp("eth0"), ud("mlx5_0:1")];
        let p = SelectParams {
            aux_only: vec![false, true],
            remote_aux_only: vec![false, true],
            ..params(1, 2)
        };
        let s = select_both(&h, P1, &h, H2, &p).unwrap();
        assert_eq!(pair(&s, s.am, &h, &h), "tcp/eth0 -> tcp/eth0");
        assert_eq!(s.wireup, s.am);

        // only auxiliary transports: the error says so
        let h = [ud("mlx5_0:1")];
        let p = SelectParams {
            aux_only: vec![true],
            ..params(1, 2)
        };
        let e = select(&h, &h, &|_, _| true, &p).unwrap_err();
        assert!(
            e.context()
                .unwrap()
                .contains("ud_verbs/mlx5_0:1 -> ud_verbs/mlx5_0:1: auxiliary only"),
            "{e}"
        );
    }

    #[test]
    fn rndv_scheme_limits_rma_bw() {
        let h = [rc("mlx5_0:1"), ud("mlx5_0:1"), tcp("eth0")];
        let mut no_get = rc("mlx5_1:1");
        no_get.attr.flags = no_get.attr.flags & !IfaceFlags::GET_ZCOPY;
        let h2 = [h[0].clone(), h[1].clone(), h[2].clone(), no_get];
        let get = SelectParams {
            rma_bw_ops: IfaceFlags::GET_ZCOPY,
            ..params(1, 2)
        };
        let s = select_both(&h2, P1, &h2, H2, &get).unwrap();
        // mlx5_1:1 cannot get, and tcp is more than 4x slower: one rail
        assert_eq!(
            pairs(&s, &s.rma_bw, &h2, &h2),
            ["rc_verbs/mlx5_0:1 -> rc_verbs/mlx5_0:1"]
        );
        let s = select_both(&h2, P1, &h2, H2, &params(1, 2)).unwrap();
        assert_eq!(s.rma_bw.len(), 2, "put zcopy on both sides makes a rail");
        let none = SelectParams {
            rma_bw_ops: IfaceFlags::EMPTY,
            ..params(1, 2)
        };
        assert!(select_both(&h, P1, &h, H2, &none).unwrap().rma_bw.is_empty());
    }

    #[test]
    fn describe_lists_every_lane() {
        let h = lo_rxe_host();
        let p = SelectParams {
            rma: true,
            amo64: true,
            ..params(1, 2)
        };
        let s = select(&h, &h, &reach(&h, P1, &h, P2), &p).unwrap();
        let text = s.describe(&h, &h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with(
            "lane[0]: rc_verbs/rxe0:1 -> rc_verbs/rxe0:1  am am_bw#0 rma#0 rma_bw#1  (estimated am="
        ));
        assert!(
            lines[1].starts_with("lane[1]: tcp/lo -> tcp/lo  rma_bw#0 amo  (estimated rma_bw="),
            "{text}"
        );
        assert!(
            lines[2].starts_with("lane[2]: ud_verbs/rxe0:1 -> ud_verbs/rxe0:1  wireup  (estimated wireup=")
        );
        assert_eq!(format!("{}", LaneUsage::AM | LaneUsage::WIREUP), "am|wireup");
        assert_eq!(s.lanes[0].score(LaneUsage::AMO), None);
        assert!(s.lanes[0].score(LaneUsage::AM).unwrap() > 900.0);
        // Each number carries its unit, and is what the score estimates.
        let am = 1e3 / s.lanes[0].score(LaneUsage::AM).unwrap();
        assert!(lines[0].contains(&format!(" am={am:.3}us ")), "{text}");
        assert!(
            lines[0].contains("us@4KiB") && lines[0].contains("MB/s@256KiB"),
            "{text}"
        );
        let am_bw = s.lanes[0].score(LaneUsage::AM_BW).unwrap() * 0.1;
        assert!(lines[0].contains(&format!(" am_bw={am_bw:.1}MB/s ")), "{text}");
    }

    /// xorshift64*: a fixed sequence, so failures reproduce.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    /// A random worker: some of the template resources, each perhaps with other numbers,
    /// priority or a missing capability.
    fn random_worker(rng: &mut Rng) -> Vec<TlInfo> {
        let pool = [
            self_tl(),
            tcp("lo"),
            tcp("eth0"),
            tcp("eth1"),
            rc("mlx5_0:1"),
            ud("mlx5_0:1"),
            rc("mlx5_1:1"),
            ud("mlx5_1:1"),
            rc("rxe0:1"),
            ud("rxe0:1"),
        ];
        let drop = [
            IfaceFlags::AM_BCOPY,
            IfaceFlags::CONNECT_TO_IFACE,
            IfaceFlags::ERRHANDLE_PEER_FAILURE,
            IfaceFlags::PUT_ZCOPY,
            IfaceFlags::GET_ZCOPY,
            IfaceFlags::ATOMIC_CPU,
        ];
        let mut w = Vec::new();
        for t in pool {
            if !rng.chance(50) {
                continue;
            }
            let mut t = t;
            if rng.chance(30) {
                // the same transport tuned differently; sometimes equal to another's numbers
                let f = [0.5, 1.0, 2.0][rng.below(3) as usize];
                t.attr.latency_c *= f;
                t.attr.bw_dedicated /= f;
                t.attr.bw_shared /= f;
            }
            if rng.chance(30) {
                t.attr.priority = rng.below(4) as u8;
            }
            if rng.chance(20) {
                t.attr.flags = t.attr.flags & !drop[rng.below(drop.len() as u64) as usize];
            }
            w.push(t);
        }
        // the list order of a worker is its own business
        for k in (1..w.len()).rev() {
            w.swap(k, rng.below(k as u64 + 1) as usize);
        }
        w
    }

    /// For random pairs of workers, select(A, B) and select(B, A) pick mirrored lanes.
    #[test]
    fn selection_is_symmetric() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut ok, mut multi) = (0, 0);
        for round in 0..3000 {
            let a = random_worker(&mut rng);
            let b = random_worker(&mut rng);
            let same_process = rng.chance(10);
            let seed = rng.next();
            // symmetric: same transport, then a coin per unordered pair of devices
            let reachable = |x: &TlInfo, y: &TlInfo| {
                let (d1, d2) = if x.dev_name <= y.dev_name {
                    (&x.dev_name, &y.dev_name)
                } else {
                    (&y.dev_name, &x.dev_name)
                };
                let h = d1
                    .bytes()
                    .chain([0])
                    .chain(d2.bytes())
                    .fold(seed, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3));
                x.tl_name == y.tl_name
                    && if x.tl_name == "self" {
                        same_process
                    } else {
                        d1 == d2 || h % 3 != 0
                    }
            };
            let (ua, ub) = (rng.below(4), rng.below(4) + 4);
            let (ua, ub) = if rng.chance(50) { (ua, ub) } else { (ub, ua) };
            let aux = |w: &[TlInfo], rng: &mut Rng| w.iter().map(|_| rng.chance(15)).collect::<Vec<_>>();
            let (aux_a, aux_b) = (aux(&a, &mut rng), aux(&b, &mut rng));
            let p = SelectParams {
                aux_only: aux_a,
                remote_aux_only: aux_b,
                rma: rng.chance(50),
                amo32: rng.chance(30),
                amo64: rng.chance(50),
                peer_failure: rng.chance(30),
                max_am_bw_lanes: 1 + rng.below(3) as usize,
                max_rma_bw_lanes: rng.below(4) as usize,
                est_num_eps: 1 + rng.below(100) as usize,
                ..params(ua, ub)
            };
            let sa = select(&a, &b, &|i, j| reachable(&a[i], &b[j]), &p);
            let sb = select(&b, &a, &|i, j| reachable(&b[i], &a[j]), &swapped(&p));
            if let Ok(s) = &sa {
                ok += 1;
                multi += (s.am_bw.len() > 1 || s.rma_bw.len() > 1) as u32;
                for lane in &s.lanes {
                    assert!(!lane.usage.is_empty());
                }
            }
            if std::panic::catch_unwind(|| assert_mirrored(&sa, &sb)).is_err() {
                panic!("round {round}: not mirrored\nA = {a:#?}\nB = {b:#?}\n{p:?}");
            }
        }
        // the rounds exercised both outcomes and multi-rail
        assert!(ok > 300 && ok < 2900 && multi > 50, "ok {ok} multi {multi}");
    }
}
