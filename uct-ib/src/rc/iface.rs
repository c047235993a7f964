//! The rc_verbs interface: one SRQ and a send/receive CQ pair per interface, one RC QP per
//! endpoint; attributes derived from the port; progress, flush, events.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;

use ucs::mpool::MemPool;
use ucs::{Outcome, Result, Status};
use uct_transport::am::AmTable;
use uct_transport::callbacks::{Comp, ErrHandler};
use uct_transport::traits::{IfaceOpenParams, Transport, TransportIface};
use uct_transport::types::*;

use super::doorbell::Doorbell;
use super::ep::{EpState, RcEp};
use super::fc::FcParams;
use super::qp_map::QpMap;
use super::wire::{AM_HDR_LEN, EP_ADDR_LEN};
use crate::config::IbConfig;
use crate::device::{DeviceAddr, IbDevice, PortInfo, DEV_ADDR_LEN};
use crate::iface_common::{
    array_pool, buffer_pool, open_port, EventCqs, RxRing, SendCqPacing, BUF_DATA_OFFSET,
};
use crate::md::IbMd;
use uct_ib_verbs::{
    AccessFlags, AtomicCap, Mtu, QpCaps, QpInitAttr, QpType, QueuePair, RxHeads, SharedReceiveQueue, RX_HEAD,
};

/// CPU cost of posting a send (UCX's rc_verbs figure).
const OVERHEAD: f64 = 75e-9;
/// Extra latency per endpoint (QP cache pressure), as UCX models rc.
const LATENCY_PER_EP: f64 = 1e-9;
/// Largest zcopy AM header (UCX: 127).
const MAX_AM_HDR: usize = 127;

pub struct RcTransport;

impl Transport for RcTransport {
    type Md = IbMd;
    type Iface = RcIface;
    const NAME: &'static CStr = c"rc_verbs";

    fn query_devices(md: &IbMd) -> Result<Vec<TlResource>> {
        Ok(md.device().tl_resources("rc_verbs"))
    }

    fn iface_open(md: &IbMd, params: IfaceOpenParams) -> Result<RcIface> {
        let cfg = IbConfig::read_with(&params.config)?;
        let port = open_port(md, &params.dev_name, &cfg)?;
        IfaceShared::open(md, port, cfg, params).map(|shared| RcIface { shared })
    }
}

/// Limits granted by the device, fixed at open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub max_inline: usize,
    pub max_send_sge: usize,
    pub max_get_sge: usize,
    pub max_msg: usize,
    pub atomics: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub path_mtu: Mtu,
    /// The path MTU toward a peer at this port's own address (see [`local_path_mtu`]).
    pub local_path_mtu: Mtu,
    pub tx_qlen: u32,
    pub moderation: u32,
    pub seg_size: usize,
    /// Transport retries of connected QPs (`RUCX_IB_RETRY_COUNT`, see [`retry_count`]).
    pub retry_count: u8,
}

/// Soft-RoCE's vendor id.
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// Soft-RoCE (rdma_rxe), by vendor id or, failing that, by its conventional name.
fn is_soft_roce(dev: &IbDevice) -> bool {
    dev.attr.vendor_id == RXE_VENDOR_ID || dev.name().starts_with("rxe")
}

/// The path MTU of a QP toward a peer at this port's own address. Soft-RoCE hands such packets
/// from QP to QP in software (its loopback path: same source and destination address), so no
/// wire limits their size, and its cost is per packet: with `RUCX_IB_PATH_MTU=auto` those QPs
/// use the port's largest MTU. Elsewhere (hardware, whose loopback may still obey the link's
/// MTU; or another setting) the same as toward any peer.
pub(crate) fn local_path_mtu(
    soft_roce: bool,
    local_max_mtu: bool,
    port_max: Option<Mtu>,
    path_mtu: Mtu,
) -> Mtu {
    match port_max {
        Some(max) if soft_roce && local_max_mtu => max.max(path_mtu),
        _ => path_mtu,
    }
}

/// The transport retry count for `dev`: Soft-RoCE (rxe) treats 7 as "retry forever" (like the
/// RNR retry count), so a dead peer would never be detected; there 7 becomes 6.
fn retry_count(dev: &IbDevice, configured: u8) -> u8 {
    let rxe = is_soft_roce(dev);
    if rxe && configured == 7 {
        ucs::debug!(
            "rc_verbs: {}: RUCX_IB_RETRY_COUNT 7 means infinite on Soft-RoCE; using 6",
            dev.name()
        );
        return 6;
    }
    configured
}

/// What the interface and all its endpoints share.
pub(crate) struct IfaceShared {
    pub dev: Arc<IbDevice>,
    pub port: PortInfo,
    pub cfg: IbConfig,
    pub caps: Caps,
    pub fc: FcParams,
    pub cqs: EventCqs,
    pub srq: Arc<SharedReceiveQueue>,
    pub rx: RxRing,
    pub tx_pool: MemPool,
    pub am: Rc<AmTable>,
    pub err: ErrHandler,
    /// Send work requests the send CQ can still take (every posted WR counts until completed,
    /// so even a burst of flush errors cannot overflow the CQ).
    pub cq_available: Cell<u32>,
    /// A send was refused for want of send resources since the send CQ was last polled: the
    /// next progress polls it even when messages arrived.
    pub tx_wanted: Cell<bool>,
    /// When progress polls the send CQ.
    pub tx_pacing: SendCqPacing,
    /// bcopy sends of a burst waiting for one doorbell.
    pub db: Doorbell,
    /// Endpoints by local QP number (including destroyed ones still draining).
    pub eps: RefCell<QpMap<Rc<EpState>>>,
    /// Endpoints with pending requests or pure grants to send, in dispatch order.
    pub sched: RefCell<VecDeque<Rc<EpState>>>,
    next_serial: Cell<u64>,
}

impl IfaceShared {
    fn open(md: &IbMd, port: PortInfo, cfg: IbConfig, params: IfaceOpenParams) -> Result<Rc<IfaceShared>> {
        let dev = md.device().clone();
        let a = &dev.attr;
        let tx_qlen = cfg.tx_queue_len.min(a.max_qp_wr.max(1) as u32);
        let rx_len = cfg.rx_queue_len.min(a.max_srq_wr.max(1) as u32);
        if rx_len < cfg.rx_queue_len {
            ucs::debug!(
                rx_len,
                "rc_verbs: RUCX_IB_RX_QUEUE_LEN clamped to the device maximum"
            );
        }
        let cqs = EventCqs::new(md, cfg.tx_cq_len + tx_qlen, rx_len)?;
        // head slots need a second SGE per receive
        let heads = cfg.rx_heads && a.max_srq_sge >= 2;
        let srq = SharedReceiveQueue::new(&dev.pd, rx_len, if heads { 2 } else { 1 }, 0)?;
        // a probe QP tells what the device grants (inline size, SGEs), as UCX does
        let probe = QueuePair::new(
            &dev.pd,
            cqs.tx.raw(),
            cqs.rx.raw(),
            Some(&srq),
            &qp_attr(&cfg, tx_qlen),
        )?;
        let granted = probe.caps();
        drop(probe);
        let auto_rd = |dev_max: i32| -> u8 { dev_max.clamp(0, 16) as u8 };
        let max_rd_atomic = cfg.max_rd_atomic.map_or(auto_rd(a.max_qp_init_rd_atom), |v| {
            v.min(a.max_qp_init_rd_atom.clamp(0, 255) as u8)
        });
        let caps = Caps {
            max_inline: granted.max_inline_data as usize,
            max_send_sge: granted
                .max_send_sge
                .clamp(1, uct_ib_verbs::MAX_INLINE_PIECES as u32) as usize,
            max_get_sge: (granted.max_send_sge.min(a.max_sge_rd.max(1) as u32)).max(1) as usize,
            max_msg: port.attr.max_msg_sz as usize,
            atomics: a.atomic_cap != AtomicCap::None && max_rd_atomic > 0,
            max_rd_atomic,
            max_dest_rd_atomic: cfg.max_rd_atomic.map_or(auto_rd(a.max_qp_rd_atom), |v| {
                v.min(a.max_qp_rd_atom.clamp(0, 255) as u8)
            }),
            path_mtu: port.path_mtu(cfg.path_mtu),
            local_path_mtu: local_path_mtu(
                is_soft_roce(&dev),
                cfg.local_max_mtu,
                port.attr.max_mtu,
                port.path_mtu(cfg.path_mtu),
            ),
            tx_qlen: granted.max_send_wr.min(tx_qlen).max(1),
            moderation: cfg.tx_cq_moderation.min((tx_qlen / 4).max(1)),
            seg_size: cfg.seg_size,
            retry_count: retry_count(&dev, cfg.retry_count),
        };
        let rx_pool = buffer_pool(&dev.pd, "rc_verbs rx", cfg.seg_size, 256, usize::MAX, cfg.thp)?;
        let mut rx = RxRing::new(rx_pool, rx_len, cfg.rx_max_batch, BUF_DATA_OFFSET, cfg.seg_size)?;
        if heads {
            let n = rx_len as usize;
            let pool = array_pool(&dev.pd, "rc_verbs rx heads", n * RX_HEAD)?;
            rx = rx.with_heads(RxHeads::new(pool, n)?)?;
        }
        let tx_pool = buffer_pool(&dev.pd, "rc_verbs tx", cfg.seg_size, 128, usize::MAX, cfg.thp)?;
        let fc = FcParams::new(
            cfg.fc_enable,
            cfg.fc_wnd_size,
            cfg.fc_soft_thresh,
            cfg.fc_hard_thresh,
        );
        let shared = Rc::new(IfaceShared {
            dev,
            port,
            caps,
            fc,
            cq_available: Cell::new(cfg.tx_cq_len),
            tx_wanted: Cell::new(false),
            tx_pacing: SendCqPacing::default(),
            db: Doorbell::new(cfg.tx_db_batch),
            cfg,
            cqs,
            srq,
            rx,
            tx_pool,
            am: params.am,
            err: params.err_handler,
            eps: RefCell::new(QpMap::default()),
            sched: RefCell::new(VecDeque::new()),
            next_serial: Cell::new(1),
        });
        shared.refill_rx()?;
        ucs::debug!(
            dev = %params.dev_name,
            gid_index = shared.port.gid.index,
            ?caps,
            "rc_verbs interface open"
        );
        Ok(shared)
    }

    /// A QP for a new endpoint, in INIT state.
    pub fn create_qp(&self) -> Result<QueuePair> {
        let qp = QueuePair::new(
            &self.dev.pd,
            self.cqs.tx.raw(),
            self.cqs.rx.raw(),
            Some(&self.srq),
            &qp_attr(&self.cfg, self.caps.tx_qlen),
        )?;
        qp.modify_to_init(&uct_ib_verbs::InitParams {
            port_num: self.port.num,
            pkey_index: 0,
            access: AccessFlags::ALL_REMOTE,
            qkey: 0,
        })?;
        Ok(qp)
    }

    /// A fresh base for an endpoint's sequence numbers (stale completions never match).
    pub fn next_sn_base(&self) -> u64 {
        let s = self.next_serial.get();
        self.next_serial.set(s + 1);
        s << 40
    }

    /// Posts receive buffers until the SRQ is full.
    pub fn refill_rx(&self) -> Result<u32> {
        self.rx.refill(|chain| self.srq.post_chain(chain))
    }

    /// Adds `ep` to the dispatch schedule (once).
    pub fn schedule(&self, ep: &Rc<EpState>) {
        if !ep.scheduled.replace(true) {
            self.sched.borrow_mut().push_back(ep.clone());
        }
    }

    /// Removes `ep` from the dispatch schedule.
    pub fn deschedule(&self, ep: &Rc<EpState>) {
        if ep.scheduled.replace(false) {
            self.sched.borrow_mut().retain(|e| !Rc::ptr_eq(e, ep));
        }
    }
}

fn qp_attr(cfg: &IbConfig, tx_qlen: u32) -> QpInitAttr {
    QpInitAttr {
        qp_type: QpType::Rc,
        caps: QpCaps {
            max_send_wr: tx_qlen,
            max_recv_wr: 0,
            max_send_sge: cfg.tx_min_sge,
            max_recv_sge: 1,
            max_inline_data: cfg.tx_min_inline,
        },
        sq_sig_all: false,
    }
}

/// The interface as the host holds it.
pub struct RcIface {
    pub(crate) shared: Rc<IfaceShared>,
}

impl Drop for RcIface {
    fn drop(&mut self) {
        // break the iface <-> endpoint cycles (endpoints still draining, schedule)
        let eps: Vec<_> = self.shared.eps.borrow_mut().drain().map(|(_, e)| e).collect();
        self.shared.sched.borrow_mut().clear();
        for e in &eps {
            // stop the HCA before the buffers of outstanding requests go back to the pools
            let _ = e.qp.modify_to_error();
            e.cancel_all(Status::Canceled);
        }
        drop(eps);
    }
}

impl TransportIface for RcIface {
    type Ep = RcEp;

    fn query(&self) -> IfaceAttr {
        let s = &self.shared;
        let c = &s.caps;
        let mut flags = IfaceFlags::AM_BCOPY
            | IfaceFlags::AM_ZCOPY
            | IfaceFlags::PENDING
            | IfaceFlags::PUT_BCOPY
            | IfaceFlags::PUT_ZCOPY
            | IfaceFlags::GET_BCOPY
            | IfaceFlags::GET_ZCOPY
            | IfaceFlags::CONNECT_TO_EP
            | IfaceFlags::CB_SYNC
            | IfaceFlags::ERRHANDLE_PEER_FAILURE
            | IfaceFlags::INTER_NODE;
        if c.max_inline > AM_HDR_LEN + 8 {
            flags |= IfaceFlags::AM_SHORT;
        }
        if c.max_inline > 0 {
            flags |= IfaceFlags::PUT_SHORT;
        }
        let (mut a64, a32) = (AtomicCaps::default(), AtomicCaps::default());
        if c.atomics {
            flags |= IfaceFlags::ATOMIC_DEVICE;
            a64 = AtomicCaps {
                op_flags: AtomicOps::ADD,
                fop_flags: AtomicOps::ADD | AtomicOps::CSWAP,
            };
        }
        let (latency, bandwidth) = s.port.perf(LATENCY_PER_EP);
        let am_max = c.seg_size - AM_HDR_LEN;
        IfaceAttr {
            flags,
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::RECV_SIG | EventFlags::FD,
            am: OpCaps {
                max_short: c.max_inline.saturating_sub(AM_HDR_LEN),
                max_bcopy: am_max,
                min_zcopy: 0,
                max_zcopy: am_max,
                opt_zcopy_align: 512,
                align_mtu: c.path_mtu.bytes() as usize,
                max_hdr: MAX_AM_HDR.min(am_max),
                max_iov: c.max_send_sge - 1,
            },
            put: OpCaps {
                max_short: c.max_inline,
                max_bcopy: c.seg_size,
                min_zcopy: 0,
                max_zcopy: c.max_msg,
                opt_zcopy_align: 512,
                align_mtu: c.path_mtu.bytes() as usize,
                max_hdr: 0,
                max_iov: c.max_send_sge,
            },
            get: OpCaps {
                max_short: 0,
                max_bcopy: c.seg_size,
                min_zcopy: 1,
                max_zcopy: c.max_msg,
                opt_zcopy_align: 512,
                align_mtu: c.path_mtu.bytes() as usize,
                max_hdr: 0,
                max_iov: c.max_get_sge,
            },
            atomic32: a32,
            atomic64: a64,
            device_addr_len: DEV_ADDR_LEN,
            iface_addr_len: 0,
            ep_addr_len: EP_ADDR_LEN,
            max_num_eps: s.dev.attr.max_qp.max(0) as usize,
            overhead: OVERHEAD,
            bandwidth,
            latency,
            priority: 0,
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        self.shared.port.device_address().pack(buf)
    }

    fn is_reachable(&self, dev: &[u8], _iface: &[u8]) -> bool {
        DeviceAddr::unpack(dev).is_ok_and(|d| self.shared.port.can_reach(&d))
    }

    // inlined into the worker's progress callback (one call, not two, per progress)
    #[inline]
    fn progress(&self) -> u32 {
        self.shared.progress()
    }

    fn flush(&self, flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        self.shared.flush_all(flags, comp)
    }

    fn event_fd(&self) -> Result<RawFd> {
        Ok(self.shared.cqs.event_fd())
    }

    fn event_arm(&self, events: ArmEvents) -> Result<()> {
        // a waiting send must be on the wire before the caller sleeps on its answer
        self.shared.ring();
        self.shared.cqs.arm(events)
    }

    fn ep_create(&self) -> Result<RcEp> {
        RcEp::create(&self.shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_mtu_only_toward_ourselves_on_soft_roce_with_auto() {
        let (max, active) = (Some(Mtu::Mtu4096), Mtu::Mtu1024);
        assert_eq!(local_path_mtu(true, true, max, active), Mtu::Mtu4096);
        // Hardware, PATH_MTU=default or a number, or a port without a max: unchanged.
        assert_eq!(local_path_mtu(false, true, max, active), active);
        assert_eq!(local_path_mtu(true, false, max, active), active);
        assert_eq!(local_path_mtu(true, true, None, active), active);
        // Never below what any other peer gets.
        assert_eq!(local_path_mtu(true, true, Some(Mtu::Mtu512), active), active);
    }
}
