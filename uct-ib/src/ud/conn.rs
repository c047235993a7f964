//! Endpoint life cycle: creation, connecting to an interface (connection request/reply) or to
//! an endpoint (its address is the QP number and the endpoint id), address handles, and the
//! end of an endpoint (lingering until its packets are acknowledged).

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use ucs::{Error, Result, Status};

use super::ep::{ctl, EpCell, EpState, Peer};
use super::iface::UdShared;
use super::reliability::Reliability;
use super::wire::{get_u24, EP_ADDR_LEN, EP_ID_NONE};
use crate::device::{DeviceAddr, DEV_ADDR_LEN};
use uct_ib_verbs::AddressHandle;

impl UdShared {
    /// The address handle for a peer's device address (cached per interface).
    pub(crate) fn get_ah(&self, dev: &[u8]) -> Result<Arc<AddressHandle>> {
        let d = DeviceAddr::unpack(dev).map_err(|e| {
            e.context_with(format_args!(
                "ud_verbs: not an ib device address ({} bytes); pass the peer's iface device address",
                dev.len()
            ))
        })?;
        if !self.port.can_reach(&d) {
            ucs::error!(
                ?d,
                "ud_verbs: peer unreachable from this port (other link layer or address family)"
            );
            return Err(Status::Unreachable.into());
        }
        let mut key = [0u8; DEV_ADDR_LEN];
        key.copy_from_slice(&dev[..DEV_ADDR_LEN]);
        if let Some(ah) = self.ahs.borrow().get(&key) {
            return Ok(ah.clone());
        }
        let attr = self.port.ah_attr(&d, &self.ibcfg);
        let ah = Arc::new(AddressHandle::new(&self.dev.pd, &attr)?);
        self.ahs.borrow_mut().insert(key, ah.clone());
        Ok(ah)
    }

    /// A new endpoint in the table.
    pub(crate) fn new_ep(&self, peer: Option<Peer>, active: bool) -> Result<Rc<EpCell>> {
        let ep = EpCell::new(EpState {
            id: EP_ID_NONE,
            handle: None,
            peer,
            rel: Reliability::new(self.cfg.rel),
            failed: None,
            flushes: VecDeque::new(),
            dispatching: false,
            ctl: 0,
            in_ctl_list: false,
            in_pending_list: false,
            ack_in: None,
            flush_asked: None,
            passive: None,
            active,
            user_gone: false,
        });
        let Some(id) = self.eps.borrow_mut().insert(ep.clone()) else {
            let msg = format!(
                "ud_verbs: too many endpoints on this interface (max {})",
                super::ep_table::MAX_EPS
            );
            ucs::error!("{msg}");
            return Err(Error::new(Status::ExceedsLimit, msg));
        };
        ep.st.borrow_mut().id = id;
        Ok(ep)
    }

    /// `ep_create_connected`: an endpoint that asks the peer interface for a connection.
    /// Sends return `NoResource` until the reply arrives.
    pub(crate) fn connect_to_iface(&self, dev: &[u8], iface: &[u8]) -> Result<Rc<EpCell>> {
        let Some(qpn) = get_u24(iface) else {
            return Err(Error::new(
                Status::InvalidAddr,
                format!(
                    "ud_verbs: interface address of {} bytes too short (3 bytes: the QP number)",
                    iface.len()
                ),
            ));
        };
        let ah = self.get_ah(dev)?;
        let ep = self.new_ep(
            Some(Peer {
                ah,
                qpn,
                ep_id: EP_ID_NONE,
            }),
            true,
        )?;
        {
            let mut st = ep.st.borrow_mut();
            st.rel.set_connecting(true);
            st.ctl |= ctl::CREQ;
            self.schedule_ctl(&ep, &mut st);
        }
        self.send_ctl();
        Ok(ep)
    }

    /// `connect_to_ep`: the peer endpoint's address is its QP number and endpoint id.
    pub(crate) fn connect_to_ep(&self, ep: &Rc<EpCell>, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        let (Some(qpn), Some(peer_ep)) = (get_u24(ep_addr), ep_addr.get(3..EP_ADDR_LEN).and_then(get_u24))
        else {
            return Err(Error::new(
                Status::InvalidAddr,
                format!(
                    "ud_verbs: endpoint address of {} bytes too short ({EP_ADDR_LEN} bytes)",
                    ep_addr.len()
                ),
            ));
        };
        let ah = self.get_ah(dev)?;
        let mut g = ep.st.borrow_mut();
        let st = &mut *g;
        if let Some(s) = st.failed {
            return Err(s.into());
        }
        if let Some(p) = &st.peer {
            if p.qpn == qpn && p.ep_id == peer_ep {
                return Ok(());
            }
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ud_verbs: endpoint {} already connected to another peer; create a new one",
                    st.id
                ),
            ));
        }
        st.peer = Some(Peer {
            ah,
            qpn,
            ep_id: peer_ep,
        });
        if st.rel.rx_unacked() {
            // data arrived before we knew where to acknowledge it
            st.rel.request_ack();
            self.schedule_ctl(ep, st);
        }
        if ep.has_pending() {
            self.schedule_pending_locked(ep, st);
        }
        Ok(())
    }

    /// The host destroyed the endpoint: it lingers until its packets are acknowledged (or
    /// the peer times out), so that what was sent still arrives.
    pub(crate) fn ep_destroyed(&self, ep: &Rc<EpCell>) {
        let dropped = std::mem::take(&mut *ep.pending.borrow_mut());
        if !dropped.is_empty() {
            ucs::warn!(
                n = dropped.len(),
                "ud_verbs: endpoint destroyed with pending requests (purge them first)"
            );
        }
        {
            let mut g = ep.st.borrow_mut();
            let st = &mut *g;
            st.handle = None;
            st.user_gone = true;
            self.apply_ack_in(ep, st);
            for (_, c) in st.flushes.drain(..) {
                self.completions.borrow_mut().push_back((c, Status::Canceled));
            }
            if st.failed.is_some() || st.rel.outstanding() == 0 {
                self.retire(st);
            }
        }
        self.fire();
    }

    /// Removes an endpoint from the interface for good (tells an accepting peer, if any).
    pub(crate) fn retire(&self, st: &mut EpState) {
        if self.eps.borrow_mut().remove(st.id).is_none() {
            return;
        }
        if let Some(key) = st.passive.take() {
            self.passive.borrow_mut().remove(&key);
        }
        if st.active && st.failed.is_none() {
            self.send_disc(st);
        }
        if st.failed.is_none() {
            st.failed = Some(Status::Canceled);
        }
        self.drain_window(st, Status::Canceled);
        st.ctl = 0;
    }

    /// Drops every unacknowledged packet of `st`; their zcopy operations complete with `status`.
    pub(crate) fn drain_window(&self, st: &mut EpState, status: Status) {
        let mut tx = self.tx.borrow_mut();
        let mut done = self.completions.borrow_mut();
        st.rel.drain(|_, slot| {
            if let Some(c) = tx.release(slot, status) {
                done.push_back(c);
            }
        });
    }

    /// The interface closes: forget every endpoint.
    pub(crate) fn close(&self) {
        let eps: Vec<Rc<EpCell>> = self.eps.borrow().values().cloned().collect();
        for ep in eps {
            if let Ok(mut st) = ep.st.try_borrow_mut() {
                // lingering endpoints still say goodbye (best effort, before the QP goes)
                self.retire(&mut st);
            }
        }
        self.ctl_list.borrow_mut().clear();
        self.ack_list.borrow_mut().clear();
        self.pending_list.borrow_mut().clear();
        self.passive.borrow_mut().clear();
        if let Some(f) = &self.faults {
            ucs::info!(stats = ?f.stats(), "ud_verbs: test hook (RUCX_UD_TEST_*) totals");
        }
    }
}
