//! ud_verbs endpoints: software objects on the interface's one UD QP. An endpoint knows its
//! peer (address handle, QP number, the peer endpoint's id) and carries the reliability state
//! of its connection, its pending queue and its flushes.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb, PendingReq, PurgeCb};
use uct_transport::iov::{gather, total_len, Iov};
use uct_transport::traits::{EpHandle, TransportEp};
use uct_transport::types::{FlushFlags, AM_ID_MAX};

use super::iface::UdShared;
use super::reliability::{Psn, Reliability};
use super::skb::MAX_ZCOPY_IOV;
use super::wire::{put_u24, EP_ADDR_LEN, EP_ID_NONE};
use crate::device::DEV_ADDR_LEN;
use crate::md::lkey_of_memh;
use uct_ib_verbs::{AddressHandle, Sge, UdDest};

/// Q_Key of every ud_verbs QP (UCX's `UCT_IB_KEY`).
pub const QKEY: u32 = 0x1EE7_A330;

/// Control packets an endpoint still has to send.
pub mod ctl {
    pub const CREQ: u8 = 1;
    pub const CREP: u8 = 2;
    /// An ACK that asks for an ACK back (flush).
    pub const ACK_REQ: u8 = 4;
}

/// Identifies the requester of a connection: its device address, QP number and endpoint.
pub type PassiveKey = ([u8; DEV_ADDR_LEN], u32, u32);

/// The remote end of an endpoint.
pub struct Peer {
    pub ah: Arc<AddressHandle>,
    pub qpn: u32,
    /// The peer endpoint, or [`EP_ID_NONE`] while a connection request waits for its reply.
    pub ep_id: u32,
}

impl Peer {
    #[inline]
    pub fn dest(&self) -> UdDest<'_> {
        UdDest {
            ah: &self.ah,
            remote_qpn: self.qpn,
            remote_qkey: QKEY,
        }
    }
}

/// The state of one endpoint.
pub struct EpState {
    pub id: u32,
    /// The host's handle; `None` for endpoints created by a peer's connection request, and
    /// after the user destroyed the endpoint (it may linger until its packets are acknowledged).
    pub handle: Option<EpHandle>,
    pub peer: Option<Peer>,
    pub rel: Reliability<u32>,
    pub failed: Option<Status>,
    /// Flushes waiting for the acknowledgement of a PSN.
    pub flushes: VecDeque<(Psn, Comp)>,
    /// A pending request of this endpoint is running (its sends may go ahead of the queue).
    pub dispatching: bool,
    /// Bits of [`ctl`].
    pub ctl: u8,
    pub in_ctl_list: bool,
    pub in_pending_list: bool,
    /// The newest cumulative ACK received and not yet applied to the window (see
    /// `UdShared::apply_acks`); the endpoint is in the interface's ACK list while set.
    pub ack_in: Option<Psn>,
    /// The last sent PSN a flush has asked the peer to acknowledge. A flush asks once per
    /// PSN, as UCX marks the window's last packet: a caller spinning on `flush` would
    /// otherwise send an ACK request per call. A lost request or answer is the resend
    /// timer's (its last resend asks for an ACK). Cleared once that PSN is acknowledged.
    pub flush_asked: Option<Psn>,
    /// Created by a connection request from this key.
    pub passive: Option<PassiveKey>,
    /// Created by `ep_create_connected`: the peer made an endpoint for it, tell it when done.
    pub active: bool,
    pub user_gone: bool,
}

impl EpState {
    /// Connected: the peer endpoint is known.
    #[inline]
    pub fn connected(&self) -> bool {
        self.peer.as_ref().is_some_and(|p| p.ep_id != EP_ID_NONE)
    }

    /// Whether a new AM may be sent (apart from send buffers): `Err(NoResource)` when not
    /// connected yet, the window is full, or requests are queued (nothing overtakes them).
    #[inline]
    pub fn check_send(&self, queued: bool) -> Result<()> {
        if let Some(s) = self.failed {
            return Err(s.into());
        }
        if !self.connected() || (queued && !self.dispatching) || !self.rel.can_send() {
            return Err(Status::NoResource.into());
        }
        Ok(())
    }
}

/// An endpoint as the interface holds it.
pub struct EpCell {
    pub st: RefCell<EpState>,
    /// Kept apart from `st`: dispatching a request runs user code that sends on the endpoint.
    pub pending: RefCell<VecDeque<PendingReq>>,
}

impl EpCell {
    pub fn new(st: EpState) -> Rc<EpCell> {
        Rc::new(EpCell {
            st: RefCell::new(st),
            pending: RefCell::new(VecDeque::new()),
        })
    }

    #[inline]
    pub fn has_pending(&self) -> bool {
        !self.pending.borrow().is_empty()
    }
}

/// The endpoint handed to the host.
pub struct UdEp {
    pub(crate) sh: Rc<UdShared>,
    pub(crate) ep: Rc<EpCell>,
}

/// Inline: a call of its own goes through the GOT (an indirect call on every AM send).
#[inline(always)]
fn check_id(id: u8) -> Result<()> {
    if id >= AM_ID_MAX {
        return Err(bad_id(id));
    }
    Ok(())
}

#[cold]
fn bad_id(id: u8) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ud_verbs: AM id {id} out of range 0..{}", AM_ID_MAX - 1),
    )
}

impl UdEp {
    #[cold]
    fn too_long(&self, len: usize) -> Error {
        Error::new(
            Status::InvalidParam,
            format!(
                "ud_verbs: AM of {len} bytes longer than one packet ({} bytes: the path MTU minus the \
                 12-byte header); use a shorter message",
                self.sh.max_am()
            ),
        )
    }
}

impl TransportEp for UdEp {
    fn on_created(&self, handle: EpHandle) {
        self.ep.st.borrow_mut().handle = Some(handle);
    }

    /// Connected once the peer's endpoint is known. The peer's limits are not in its address:
    /// both sides are expected to run with the same configuration (as in UCX).
    fn query(&self) -> uct_transport::types::EpAttr {
        uct_transport::types::EpAttr {
            peer_am_max: 0,
            connected: self.ep.st.borrow().connected(),
        }
    }

    fn get_address(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..EP_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
        put_u24(out, self.sh.qpn);
        put_u24(&mut out[3..], self.ep.st.borrow().id);
        Ok(())
    }

    fn connect_to_ep(&self, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        self.sh.connect_to_ep(&self.ep, dev, ep_addr)
    }

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        check_id(id)?;
        let len = 8 + payload.len();
        if len > self.sh.max_am() {
            return Err(self.too_long(len));
        }
        self.sh.send_am_copy(&self.ep, id, |b| {
            b[..8].copy_from_slice(&header.to_le_bytes());
            if !payload.is_empty() {
                // (a call into libc's memcpy otherwise, even for nothing)
                b[8..len].copy_from_slice(payload);
            }
            len
        })
    }

    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        check_id(id)?;
        let len = total_len(iov);
        if len > self.sh.max_am() {
            return Err(self.too_long(len));
        }
        self.sh.send_am_copy(&self.ep, id, |b| gather(b, iov))
    }

    fn am_bcopy(&self, id: u8, pack: PackCb, _flags: u32) -> Result<usize> {
        check_id(id)?;
        self.sh.send_am(&self.ep, id, |b| pack.pack(b))
    }

    fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], _flags: u32, comp: Comp) -> Result<Outcome> {
        check_id(id)?;
        if self.sh.max_zcopy_iov == 0 {
            return Err(Status::Unsupported.into());
        }
        if iov.len() > self.sh.max_zcopy_iov {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ud_verbs: am_zcopy with {} iov entries; at most {}",
                    iov.len(),
                    self.sh.max_zcopy_iov
                ),
            ));
        }
        let len = header.len() + total_len(iov);
        if len > self.sh.max_am() {
            return Err(self.too_long(len));
        }
        let mut sges = [Sge::new(0, 0, 0); MAX_ZCOPY_IOV];
        let mut n = 0;
        for e in iov.iter().filter(|e| !e.is_empty()) {
            let Some(lkey) = lkey_of_memh(e.memh() as usize) else {
                return Err(Error::new(
                    Status::InvalidParam,
                    "ud_verbs: am_zcopy of memory not registered with this memory domain (use Mem::alloc or \
                     mem_reg)",
                ));
            };
            sges[n] = Sge::new(e.addr() as u64, e.len() as u32, lkey);
            n += 1;
        }
        if n == 0 {
            // only a header: an ordinary copied packet, complete at once
            self.sh.send_am_copy(&self.ep, id, |b| {
                b[..header.len()].copy_from_slice(header);
                header.len()
            })?;
            return Ok(Outcome::Done);
        }
        self.sh.send_zcopy(&self.ep, id, header, &sges[..n], comp)?;
        Ok(Outcome::InProgress)
    }

    fn pending_add(&self, req: PendingReq, _flags: u32) -> Result<()> {
        {
            let st = self.ep.st.borrow();
            if let Some(s) = st.failed {
                return Err(s.into());
            }
            if !self.ep.has_pending() && st.check_send(false).is_ok() && self.sh.tx.borrow().has_room() {
                return Err(Status::Busy.into());
            }
        }
        self.ep.pending.borrow_mut().push_back(req);
        self.sh.schedule_pending(&self.ep);
        Ok(())
    }

    fn pending_purge(&self, purge: PurgeCb) {
        loop {
            let r = self.ep.pending.borrow_mut().pop_front();
            let Some(r) = r else { break };
            purge.purge(r);
        }
    }

    fn flush(&self, _flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        self.sh.flush_ep(&self.ep, comp)
    }
}

impl Drop for UdEp {
    fn drop(&mut self) {
        self.sh.ep_destroyed(&self.ep);
    }
}
