//! The ud_verbs transport and interface: one UD QP, its CQs (on a completion channel: the
//! event fd), a ring of posted receive buffers and a pool of send buffers, shared by every
//! endpoint of the interface.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ucs::{Outcome, Result, Status};
use uct_transport::am::AmTable;
use uct_transport::callbacks::{Comp, ErrHandler};
use uct_transport::traits::{EpHandle, IfaceOpenParams, Transport, TransportIface};
use uct_transport::types::*;

use super::config::UdConfig;
use super::ep::{EpCell, PassiveKey, UdEp, QKEY};
use super::ep_table::{EpTable, MAX_EPS};
use super::recv::Faults;
use super::skb::{TxPool, MAX_ZCOPY_IOV};
use super::wire::{put_u24, EP_ADDR_LEN, HDR_LEN, IFACE_ADDR_LEN};
use crate::config::IbConfig;
use crate::device::{DeviceAddr, IbDevice, PortInfo, DEV_ADDR_LEN};
use crate::iface_common::{
    array_pool, buffer_pool, open_port, EventCqs, RxRing, SendCqPacing, BUF_DATA_OFFSET,
};
use crate::md::IbMd;
use uct_ib_verbs::{
    AccessFlags, AddressHandle, InitParams, QpCaps, QpInitAttr, QpType, QueuePair, RxHeads, WcBatch, GRH_LEN,
    RX_HEAD,
};

/// Transport name.
pub const TL_NAME: &str = "ud_verbs";
/// Largest number of completions polled at once (the configured poll counts are capped).
const MAX_POLL: usize = 32;

/// The `ud_verbs` transport of the `ib` component.
pub struct UdTransport;

impl Transport for UdTransport {
    type Md = IbMd;
    type Iface = UdIface;
    const NAME: &'static CStr = c"ud_verbs";

    fn query_devices(md: &IbMd) -> Result<Vec<TlResource>> {
        Ok(md.device().tl_resources(TL_NAME))
    }

    fn iface_open(md: &IbMd, params: IfaceOpenParams) -> Result<UdIface> {
        Ok(UdIface {
            sh: Rc::new(UdShared::open(md, params)?),
        })
    }
}

/// Everything the interface and its endpoints share. Field order is drop order: the QP goes
/// before the buffers it may still reference.
pub struct UdShared {
    pub(crate) qp: QueuePair,
    pub(crate) cqs: EventCqs,
    pub(crate) rx: RxRing,
    pub(crate) tx: RefCell<TxPool>,
    /// User iov entries an am_zcopy may have (send SGEs minus the header's; 0: no zcopy).
    pub(crate) max_zcopy_iov: usize,
    pub(crate) dev: Arc<IbDevice>,
    pub(crate) port: PortInfo,
    pub(crate) ibcfg: IbConfig,
    pub(crate) cfg: UdConfig,
    /// Largest packet: the path MTU.
    pub(crate) seg: usize,
    pub(crate) qpn: u32,
    pub(crate) dev_addr: [u8; DEV_ADDR_LEN],
    pub(crate) am: Rc<AmTable>,
    pub(crate) err: ErrHandler,
    pub(crate) eps: RefCell<EpTable<Rc<EpCell>>>,
    /// Endpoints created by connection requests, by requester.
    pub(crate) passive: RefCell<HashMap<PassiveKey, u32>>,
    pub(crate) ahs: RefCell<HashMap<[u8; DEV_ADDR_LEN], Arc<AddressHandle>>>,
    /// Endpoints with control packets to send.
    pub(crate) ctl_list: RefCell<Vec<Rc<EpCell>>>,
    /// Endpoints with a received ACK not yet applied (`EpState::ack_in`).
    pub(crate) ack_list: RefCell<Vec<Rc<EpCell>>>,
    /// Endpoints with pending requests.
    pub(crate) pending_list: RefCell<Vec<Rc<EpCell>>>,
    /// Reusable scratch list (timer ticks, dispatch), so steady state does not allocate.
    pub(crate) spare: RefCell<Vec<Rc<EpCell>>>,
    /// Completions to fire once no borrow is held.
    pub(crate) completions: RefCell<VecDeque<(Comp, Status)>>,
    /// Error reports to deliver once no borrow is held.
    pub(crate) reports: RefCell<VecDeque<(EpHandle, Status)>>,
    pub(crate) iface_flushes: RefCell<Vec<Comp>>,
    pub(crate) faults: Option<Faults>,
    pub(crate) epoch: Instant,
    pub(crate) next_tick: Cell<u64>,
    pub(crate) tick: u64,
    /// Progress calls since the clock was last read (see `maybe_tick`).
    pub(crate) clock_skipped: Cell<u8>,
    /// The last progress round returned after its receives (see `progress`): this one does
    /// the chores.
    pub(crate) chores_owed: Cell<bool>,
    /// When progress polls the send CQ.
    pub(crate) tx_pacing: SendCqPacing,
    pub(crate) rx_max_poll: usize,
    pub(crate) tx_max_poll: usize,
}

impl UdShared {
    fn open(md: &IbMd, params: IfaceOpenParams) -> Result<UdShared> {
        let ibcfg = IbConfig::read_with(&params.config)?;
        let cfg = UdConfig::read_with(&params.config)?;
        let port = open_port(md, &params.dev_name, &ibcfg)?;
        let dev = md.device().clone();
        let seg = (port.path_mtu(ibcfg.path_mtu).bytes() as usize).min(ibcfg.seg_size);
        let max_wr = dev.attr.max_qp_wr.max(16) as u32;
        let rx_len = ibcfg.rx_queue_len.min(max_wr);
        let tx_len = ibcfg.tx_queue_len.min(max_wr);
        let cqs = EventCqs::new(md, tx_len, rx_len)?;
        // Receive heads (docs/ib.md): an am_short of up to 12 bytes lands with its GRH in a
        // 64-byte slot of one dense array.
        let heads = ibcfg.rx_heads && dev.attr.max_sge >= 2;
        let qp = QueuePair::new(
            &dev.pd,
            cqs.tx.raw(),
            cqs.rx.raw(),
            None,
            &QpInitAttr {
                qp_type: QpType::Ud,
                caps: QpCaps {
                    max_send_wr: tx_len,
                    max_recv_wr: rx_len,
                    max_send_sge: ibcfg.tx_min_sge.clamp(1, dev.attr.max_sge.max(1) as u32),
                    max_recv_sge: if heads { 2 } else { 1 },
                    max_inline_data: ibcfg.tx_min_inline,
                },
                sq_sig_all: false,
            },
        )?;
        qp.modify_to_init(&InitParams {
            port_num: port.num,
            pkey_index: 0,
            access: AccessFlags::NONE,
            qkey: QKEY,
        })?;
        qp.modify_ud_to_rts(0)?;
        let granted = qp.caps();
        let rx_pool = buffer_pool(&dev.pd, "ud_verbs rx", GRH_LEN + seg, 256, usize::MAX, ibcfg.thp)?;
        let rx_cap = granted.max_recv_wr.min(rx_len);
        let mut rx = RxRing::new(
            rx_pool,
            rx_cap,
            ibcfg.rx_max_batch,
            BUF_DATA_OFFSET,
            GRH_LEN + seg,
        )?;
        if heads {
            let n = rx_cap as usize;
            let pool = array_pool(&dev.pd, "ud_verbs rx heads", n * RX_HEAD)?;
            rx = rx.with_heads(RxHeads::new(pool, n)?)?;
        }
        rx.refill(|chain| qp.post_recv_chain(chain))?;
        let tx_pool = buffer_pool(&dev.pd, "ud_verbs tx", seg, 128, cfg.tx_bufs, ibcfg.thp)?;
        let tx = TxPool::new(
            tx_pool,
            cfg.tx_bufs,
            granted.max_send_wr.min(tx_len),
            granted.max_inline_data as usize,
            ibcfg.tx_cq_moderation,
        )
        .with_doorbell_batch(ibcfg.tx_db_batch);
        let max_zcopy_iov = (granted.max_send_sge as usize)
            .saturating_sub(1)
            .min(MAX_ZCOPY_IOV);
        let mut dev_addr = [0u8; DEV_ADDR_LEN];
        port.device_address().pack(&mut dev_addr)?;
        let faults = if cfg.faults.is_active() {
            let f = cfg.faults;
            ucs::warn!(
                "ud_verbs test hook active on {}: dropping {:.1}%, duplicating {:.1}%, reordering {:.1}% of \
                 received packets (RUCX_UD_TEST_*)",
                params.dev_name,
                f.loss * 100.0,
                f.dup * 100.0,
                f.reorder * 100.0
            );
            Some(Faults::new(&cfg, GRH_LEN + seg)?)
        } else {
            None
        };
        let tick = u64::try_from(cfg.timer_tick.as_nanos()).unwrap_or(u64::MAX);
        ucs::debug!(
            dev = %params.dev_name, qpn = qp.qp_num(), seg, rx = rx.posted(), tx_len,
            inline = granted.max_inline_data, heads = rx.head_size(), "ud_verbs: interface open"
        );
        Ok(UdShared {
            qpn: qp.qp_num(),
            qp,
            cqs,
            rx,
            tx: RefCell::new(tx),
            max_zcopy_iov,
            dev,
            port,
            rx_max_poll: ibcfg.rx_max_poll.min(MAX_POLL),
            tx_max_poll: ibcfg.tx_max_poll.min(MAX_POLL),
            ibcfg,
            cfg,
            seg,
            dev_addr,
            am: params.am,
            err: params.err_handler,
            eps: RefCell::new(EpTable::default()),
            passive: RefCell::new(HashMap::new()),
            ahs: RefCell::new(HashMap::new()),
            ctl_list: RefCell::new(Vec::new()),
            ack_list: RefCell::new(Vec::new()),
            pending_list: RefCell::new(Vec::new()),
            spare: RefCell::new(Vec::new()),
            completions: RefCell::new(VecDeque::new()),
            reports: RefCell::new(VecDeque::new()),
            iface_flushes: RefCell::new(Vec::new()),
            faults,
            epoch: Instant::now(),
            next_tick: Cell::new(0),
            clock_skipped: Cell::new(0),
            chores_owed: Cell::new(false),
            tx_pacing: SendCqPacing::default(),
            tick,
        })
    }

    /// Largest AM (header and payload of `am_short`, or a bcopy message).
    #[inline]
    pub fn max_am(&self) -> usize {
        self.seg - HDR_LEN
    }

    /// Nanoseconds since the interface opened.
    #[inline]
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// One round of progress: receives, send completions (see [`SendCqPacing`]), control
    /// packets, timers, pending requests, completions. Inlined into the worker's progress
    /// callback.
    ///
    /// A round that received packets returns right after them when the round before did the
    /// rest (the chores) and nothing waits to be sent or fired: the caller may be waiting to
    /// answer what it just received, and the chores (which then include the ACKs taken from
    /// those packets, see [`UdShared::take_ack`]) run in the next round, while it waits for
    /// the reply. Chores therefore run at least every other round, also while packets stream
    /// in. Control packets (an ACK a peer asked for goes out in the round that received its
    /// packet, as in UCX: the caller may stop progressing after what it received) and
    /// completions or error reports (a flush must not return `Ok` before the operations it
    /// covers have completed) keep the round going.
    #[inline]
    fn progress(&self) -> u32 {
        // the ACKs of the last round first: their window release and completions were kept
        // off the path from a received packet to the caller
        self.apply_acks();
        let mut work = self.poll_rx();
        if work > 0 && !self.chores_owed.replace(true) && self.nothing_queued() {
            // packets the AM handlers sent go out now, as at the end of every round
            self.tx.borrow_mut().end_burst(&self.qp);
            return work;
        }
        self.chores_owed.set(false);
        if self.tx_pacing.poll_now(work, self.tx_wanted()) {
            self.poll_tx();
        }
        work += self.send_ctl();
        work += self.maybe_tick();
        work += self.dispatch_pending();
        self.fire();
        // after the user callbacks of `fire`, which may send
        self.tx.borrow_mut().end_burst(&self.qp);
        work
    }

    /// No control packet to send, no completion or error report to fire.
    #[inline]
    fn nothing_queued(&self) -> bool {
        self.ctl_list.borrow().is_empty()
            && self.completions.borrow().is_empty()
            && self.reports.borrow().is_empty()
    }

    /// Sends wait for send completions (queue half used, no buffer, requests pending).
    #[inline]
    fn tx_wanted(&self) -> bool {
        !self.pending_list.borrow().is_empty() || self.tx.borrow().wants_completions()
    }

    /// Acknowledged (or dropped) am_zcopys complete with their send completions: polls the
    /// send CQ when any still waits, so that their completions are queued before a flush's.
    /// True when none waits any more.
    pub(crate) fn poll_awaited_sends(&self) -> bool {
        if self.tx.borrow().awaiting_send() == 0 {
            return true;
        }
        self.poll_tx();
        self.tx.borrow().awaiting_send() == 0
    }

    pub(crate) fn poll_tx(&self) {
        let mut batch = WcBatch::<MAX_POLL>::new();
        if let Ok(wcs) = self.cqs.tx.poll_into(self.tx_max_poll, &mut batch) {
            if !wcs.is_empty() {
                let mut tx = self.tx.borrow_mut();
                let mut done = self.completions.borrow_mut();
                for wc in wcs {
                    if !wc.is_success() {
                        ucs::debug!("ud_verbs: send completion with error: {}", wc.status_str());
                    }
                    tx.completed(wc.wr_id(), &mut done);
                }
            }
        }
    }

    fn poll_rx(&self) -> u32 {
        let held = self.faults.as_ref().map_or(0, |f| f.take_held());
        let mut batch = WcBatch::<MAX_POLL>::new();
        let wcs = self
            .cqs
            .rx
            .poll_into(self.rx_max_poll, &mut batch)
            .unwrap_or_default();
        let n = wcs.len();
        for wc in wcs {
            let ok = wc.is_success();
            if ok && self.faults.is_none() {
                // a packet that fits its head slot is handled where it landed
                let in_head = self.rx.with_head(wc.wr_id(), wc.byte_len() as usize, |b| {
                    self.handle_head(b, wc.src_qp())
                });
                if in_head.is_some() {
                    continue;
                }
            }
            let Some(msg) = self.rx.take(wc.wr_id(), ok.then_some(wc.byte_len() as usize)) else {
                continue;
            };
            if !ok {
                ucs::debug!("ud_verbs: receive completion with error: {}", wc.status_str());
                continue;
            }
            let len = (wc.byte_len() as usize).saturating_sub(GRH_LEN);
            self.receive(msg, len, wc.src_qp());
        }
        if n == 0 {
            // waiting: warm the buffer the next packet lands in
            self.rx.touch_next();
        }
        if self.rx.needs_refill(n > 0) {
            if let Err(e) = self.rx.refill(|chain| self.qp.post_recv_chain(chain)) {
                ucs::warn!("ud_verbs: cannot repost receive buffers: {e}");
            }
        }
        if held > 0 {
            self.release_held();
        }
        (n + held) as u32
    }
}

/// The interface handed to the host.
pub struct UdIface {
    sh: Rc<UdShared>,
}

impl TransportIface for UdIface {
    type Ep = UdEp;

    fn query(&self) -> IfaceAttr {
        let sh = &self.sh;
        let (latency, bandwidth) = sh.port.perf(0.0);
        let max = sh.max_am();
        let zcopy = if sh.max_zcopy_iov > 0 {
            IfaceFlags::AM_ZCOPY | IfaceFlags::ERRHANDLE_ZCOPY_BUF
        } else {
            IfaceFlags::EMPTY
        };
        IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | zcopy
                | IfaceFlags::PENDING
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::CONNECT_TO_EP
                | IfaceFlags::CB_SYNC
                | IfaceFlags::ERRHANDLE_PEER_FAILURE
                | IfaceFlags::ERRHANDLE_AM_ID
                | IfaceFlags::ERRHANDLE_BCOPY_LEN
                | IfaceFlags::ERRHANDLE_SHORT_BUF
                | IfaceFlags::ERRHANDLE_BCOPY_BUF,
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::FD,
            am: OpCaps {
                max_short: max,
                max_bcopy: max,
                // the header counts towards max_zcopy (it shares the packet), as in UCX
                max_zcopy: if sh.max_zcopy_iov > 0 { max } else { 0 },
                max_hdr: if sh.max_zcopy_iov > 0 { max } else { 0 },
                max_iov: sh.max_zcopy_iov.clamp(1, uct_transport::types::MAX_IOV),
                ..Default::default()
            },
            device_addr_len: DEV_ADDR_LEN,
            iface_addr_len: IFACE_ADDR_LEN,
            ep_addr_len: EP_ADDR_LEN,
            max_num_eps: MAX_EPS,
            // UCX's ud_verbs software overhead per send
            overhead: 105e-9,
            bandwidth,
            latency,
            priority: 0,
            ..Default::default()
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..DEV_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
        out.copy_from_slice(&self.sh.dev_addr);
        Ok(())
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..IFACE_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
        put_u24(out, self.sh.qpn);
        Ok(())
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        iface.len() >= IFACE_ADDR_LEN && DeviceAddr::unpack(dev).is_ok_and(|d| self.sh.port.can_reach(&d))
    }

    // inlined into the worker's progress callback (one call, not two, per progress)
    #[inline]
    fn progress(&self) -> u32 {
        self.sh.progress()
    }

    fn flush(&self, _flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        self.sh.flush_iface(comp)
    }

    fn event_fd(&self) -> Result<RawFd> {
        Ok(self.sh.cqs.event_fd())
    }

    /// `Err(Busy)` also while packets are unacknowledged: resends and peer timeouts run in
    /// progress, so the caller must not sleep until the peer has acknowledged (usually one
    /// round trip). ACKs owed to peers are sent before arming.
    fn event_arm(&self, events: ArmEvents) -> Result<()> {
        let sh = &self.sh;
        // collected packets go out before the caller sleeps on their answers
        sh.tx.borrow_mut().ring(&sh.qp);
        sh.apply_acks();
        if sh.has_work() || !sh.settle_for_sleep() {
            return Err(Status::Busy.into());
        }
        // acknowledgements (which complete sends and flushes) arrive as receives
        let mut ev = events;
        if ev.contains(ArmEvents::SEND_COMP) {
            ev |= ArmEvents::RECV;
        }
        sh.cqs.arm(ev)
    }

    fn ep_create(&self) -> Result<UdEp> {
        let ep = self.sh.new_ep(None, false)?;
        Ok(UdEp {
            sh: self.sh.clone(),
            ep,
        })
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<UdEp> {
        let ep = self.sh.connect_to_iface(dev, iface)?;
        Ok(UdEp {
            sh: self.sh.clone(),
            ep,
        })
    }
}

impl Drop for UdIface {
    fn drop(&mut self) {
        // Endpoints the host no longer owns (created by peers, or lingering) end with the
        // interface; break their cycles through the lists.
        self.sh.close();
    }
}
