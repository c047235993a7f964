//! Wireup: how two workers' endpoints find each other (UCX's REQUEST / REPLY / ACK).
//!
//! `connect` sends a REQUEST on the wireup lane (a lane that connects to the peer's interface):
//! the sender's worker address, its endpoint id, a connection number, and the addresses of its
//! endpoints on lanes that connect endpoint to endpoint (rc_verbs). The peer pairs it with its
//! own `connect` of the same number toward the sender (simultaneous connects end in one pair of
//! endpoints), or makes an endpoint for it, connects its endpoint-to-endpoint lanes, and
//! answers with a REPLY (its endpoint id and lane addresses). The initiator connects its lanes
//! and, when there were any endpoint-to-endpoint lanes, sends an ACK: both sides then use them.
//! Both sides select lanes from the same two addresses with a symmetric rule, so the lanes pair
//! up; a mismatch fails the endpoint with a log line.

use std::rc::Rc;

use ucs::{Error, Result, Status};
use uct::AmMessage;

use crate::address::WorkerAddress;
use crate::ep::{self, EpInner, ErrMode};
use crate::wire::{am_id, PROTOCOL_VERSION};
use crate::worker::WorkerInner;

const REQUEST: u8 = 1;
const REPLY: u8 = 2;
const ACK: u8 = 3;
/// The sender closed its endpoint (`Ep::close` with `CloseMode::Flush`).
const CLOSE: u8 = 4;
/// Keepalive: a probe (`FLAG_PROBE`, answered at once) or the answer to one.
const KEEPALIVE: u8 = 5;
const FIXED: usize = 40;
/// Flag: the initiator's endpoint uses `ErrMode::Peer` (both sides select lanes with it).
pub(crate) const FLAG_ERR_PEER: u8 = 1;
/// Flag of a KEEPALIVE: a probe, to be answered.
const FLAG_PROBE: u8 = 2;
const MAX_LANE_ADDRS: usize = 64;

/// The address of one endpoint-to-endpoint lane: the sender's resource, the receiver's, and
/// the sender's endpoint address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneAddr {
    pub sender_rsc: u8,
    pub receiver_rsc: u8,
    pub addr: Vec<u8>,
}

/// A wireup message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub kind: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    pub src_worker: u64,
    pub src_ep: u64,
    /// 0 when the sender does not know the receiver's endpoint yet (REQUEST).
    pub dst_ep: u64,
    pub conn_sn: u64,
    /// The sender's packed worker address (REQUEST only).
    pub address: Vec<u8>,
    pub lanes: Vec<LaneAddr>,
}

impl Msg {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + self.address.len() + 64);
        b.push(PROTOCOL_VERSION);
        b.push(self.kind);
        b.push(self.lanes.len() as u8);
        b.push(self.flags);
        b.extend_from_slice(&(self.address.len() as u32).to_le_bytes());
        for v in [self.src_worker, self.src_ep, self.dst_ep, self.conn_sn] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.address);
        for l in &self.lanes {
            b.push(l.sender_rsc);
            b.push(l.receiver_rsc);
            b.extend_from_slice(&(l.addr.len() as u16).to_le_bytes());
            b.extend_from_slice(&l.addr);
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Msg> {
        let bad = |why: String| Error::new(Status::InvalidParam, format!("ucp: wireup message: {why}"));
        if b.len() < FIXED {
            return Err(bad(format!("{} bytes, at least {FIXED} needed", b.len())));
        }
        if b[0] != PROTOCOL_VERSION {
            return Err(bad(format!(
                "version {}, this worker speaks {PROTOCOL_VERSION}",
                b[0]
            )));
        }
        let kind = b[1];
        if !(REQUEST..=KEEPALIVE).contains(&kind) {
            return Err(bad(format!("unknown type {kind}")));
        }
        let n_lanes = b[2] as usize;
        let flags = b[3];
        if flags & !(FLAG_ERR_PEER | FLAG_PROBE) != 0 {
            return Err(bad(format!("unknown flags {flags:#04x}")));
        }
        let addr_len = u32::from_le_bytes(b[4..8].try_into().expect("4")) as usize;
        let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        let (src_worker, src_ep, dst_ep, conn_sn) = (u(8), u(16), u(24), u(32));
        let mut at = FIXED;
        if b.len() - at < addr_len {
            return Err(bad(format!("address of {addr_len} bytes, {} left", b.len() - at)));
        }
        let address = b[at..at + addr_len].to_vec();
        at += addr_len;
        if n_lanes > MAX_LANE_ADDRS {
            return Err(bad(format!("{n_lanes} lane addresses")));
        }
        let mut lanes = Vec::with_capacity(n_lanes);
        for _ in 0..n_lanes {
            if b.len() - at < 4 {
                return Err(bad("truncated lane address".into()));
            }
            let len = u16::from_le_bytes([b[at + 2], b[at + 3]]) as usize;
            if b.len() - at - 4 < len {
                return Err(bad(format!(
                    "lane address of {len} bytes, {} left",
                    b.len() - at - 4
                )));
            }
            lanes.push(LaneAddr {
                sender_rsc: b[at],
                receiver_rsc: b[at + 1],
                addr: b[at + 4..at + 4 + len].to_vec(),
            });
            at += 4 + len;
        }
        if at != b.len() {
            return Err(bad(format!("{} bytes of trailing garbage", b.len() - at)));
        }
        Ok(Msg {
            kind,
            flags,
            src_worker,
            src_ep,
            dst_ep,
            conn_sn,
            address,
            lanes,
        })
    }
}

/// The addresses of `ep`'s endpoint-to-endpoint lanes.
fn lane_addrs(ep: &EpInner) -> Result<Vec<LaneAddr>> {
    let mut out = Vec::new();
    for (i, l) in ep.route.lanes.lanes.iter().enumerate() {
        if ep.route.is_p2p(i) {
            out.push(LaneAddr {
                sender_rsc: l.local as u8,
                receiver_rsc: l.remote as u8,
                addr: ep.uct[i].address()?,
            });
        }
    }
    Ok(out)
}

/// Connects `ep`'s endpoint-to-endpoint lanes to the peer's endpoints named in `lanes` (once).
fn connect_lanes(ep: &EpInner, lanes: &[LaneAddr]) -> Result<()> {
    if ep.p2p_connected.get() || ep.route.p2p == 0 {
        return Ok(());
    }
    for (i, l) in ep.route.lanes.lanes.iter().enumerate() {
        if !ep.route.is_p2p(i) {
            continue;
        }
        let Some(a) = lanes
            .iter()
            .find(|a| a.sender_rsc as usize == l.remote && a.receiver_rsc as usize == l.local)
        else {
            return Err(Error::new(
                Status::Unreachable,
                format!(
                    "ucp: the peer chose other lanes (no address for its resource {} to our {}): \
                     do both sides run with the same RUCX_TLS?",
                    l.remote, l.local
                ),
            ));
        };
        let dev = &ep.remote.entries[l.remote].dev_addr;
        ep.uct[i].connect_to_ep(dev, &a.addr)?;
    }
    ep.p2p_connected.set(true);
    Ok(())
}

/// Queues the REQUEST of a new endpoint.
pub(crate) fn send_request(ep: &Rc<EpInner>) -> Result<()> {
    let w = ep
        .worker
        .upgrade()
        .ok_or_else(|| Error::new(Status::NotConnected, "ucp: worker gone"))?;
    let m = Msg {
        kind: REQUEST,
        flags: if ep.err_mode == ErrMode::Peer {
            FLAG_ERR_PEER
        } else {
            0
        },
        src_worker: w.uuid,
        src_ep: ep.id.get(),
        dst_ep: 0,
        conn_sn: ep.conn_sn,
        address: w.address.clone(),
        lanes: lane_addrs(ep)?,
    };
    ep.send_wireup(m.encode());
    Ok(())
}

fn reply(ep: &Rc<EpInner>, kind: u8) -> Result<()> {
    let w = ep
        .worker
        .upgrade()
        .ok_or_else(|| Error::new(Status::NotConnected, "ucp: worker gone"))?;
    let m = Msg {
        kind,
        flags: 0,
        src_worker: w.uuid,
        src_ep: ep.id.get(),
        dst_ep: ep.remote_ep.get().unwrap_or(0),
        conn_sn: ep.conn_sn,
        address: Vec::new(),
        lanes: if kind == REPLY {
            lane_addrs(ep)?
        } else {
            Vec::new()
        },
    };
    ep.send_wireup(m.encode());
    Ok(())
}

/// A wireup message arrived on interface `_iface`.
pub(crate) fn on_message(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let msg = match Msg::decode(m.data()) {
        Ok(msg) => msg,
        Err(e) => return crate::wire::violation("wireup message", &e),
    };
    let r = match msg.kind {
        REQUEST => on_request(w, &msg),
        REPLY => on_reply(w, &msg),
        ACK => on_ack(w, &msg),
        CLOSE => on_close(w, &msg),
        _ => on_keepalive(w, &msg),
    };
    if let Err(e) = r {
        ucs::warn_limited!("ucp: wireup from worker {:#x}: {e}", msg.src_worker);
    }
}

/// `Ok` when a request from worker `peer` may make one more passive endpoint (checked
/// before its address is even unpacked: a refused request costs nothing).
fn passive_room(w: &WorkerInner, peer: u64) -> Result<()> {
    let lim = w.ctx.inner.cfg.passive;
    let t = w.eps.borrow();
    let (var, limit) = if t.passive.len() >= lim.per_worker {
        ("RUCX_PASSIVE_WORKER_LIMIT", lim.per_worker)
    } else if t.passive.keys().filter(|k| k.0 == peer).count() >= lim.per_peer {
        ("RUCX_PASSIVE_PEER_LIMIT", lim.per_peer)
    } else {
        return Ok(());
    };
    Err(Error::new(
        Status::ExceedsLimit,
        format!(
            "request refused: {limit} endpoints made by requests and not adopted already \
             ({var}={limit}; raise it for more clients, or adopt them with Worker::connect)"
        ),
    ))
}

fn on_request(w: &Rc<WorkerInner>, msg: &Msg) -> Result<()> {
    let key = (msg.src_worker, msg.conn_sn);
    let known = w.eps.borrow_mut().take_unmatched(&key);
    let ep = match known {
        Some(ep) => ep,
        None => {
            let existing = w.eps.borrow().passive.get(&key).cloned();
            match existing {
                // A repeated request (replayed or resent): answer again, change nothing.
                Some(ep) => ep,
                None => {
                    passive_room(w, msg.src_worker)?;
                    let remote = WorkerAddress::unpack(&msg.address)?;
                    if remote.uuid != msg.src_worker {
                        return Err(Error::new(
                            Status::InvalidParam,
                            "request's address names another worker than its sender",
                        ));
                    }
                    let mode = if msg.flags & FLAG_ERR_PEER != 0 {
                        ErrMode::Peer
                    } else {
                        ErrMode::None
                    };
                    let ep = ep::create(w, remote, msg.conn_sn, Some(msg.src_ep), mode)?;
                    w.eps.borrow_mut().passive.insert(key, ep.clone());
                    ep
                }
            }
        }
    };
    let old = ep.remote_ep.replace(Some(msg.src_ep));
    w.eps
        .borrow_mut()
        .link_remote(ep.id.get(), msg.src_worker, old, msg.src_ep);
    crate::stream::on_wired(w, &ep);
    if let Err(e) = connect_lanes(&ep, &msg.lanes) {
        ep.fail(e.clone());
        return Err(e);
    }
    reply(&ep, REPLY)?;
    // Without endpoint-to-endpoint lanes nothing waits for an ACK.
    if ep.route.p2p == 0 {
        ep.set_ready();
    }
    Ok(())
}

fn on_reply(w: &Rc<WorkerInner>, msg: &Msg) -> Result<()> {
    let ep = w.eps.borrow().get(msg.dst_ep);
    let Some(ep) = ep else {
        return Err(Error::new(
            Status::NoElem,
            format!("reply for unknown endpoint {:#x}", msg.dst_ep),
        ));
    };
    if ep.remote.uuid != msg.src_worker {
        return Err(Error::new(
            Status::InvalidParam,
            "reply from another worker than the endpoint's peer",
        ));
    }
    w.eps.borrow_mut().take_unmatched(&(msg.src_worker, ep.conn_sn));
    let old = ep.remote_ep.replace(Some(msg.src_ep));
    w.eps
        .borrow_mut()
        .link_remote(ep.id.get(), msg.src_worker, old, msg.src_ep);
    crate::stream::on_wired(w, &ep);
    if let Err(e) = connect_lanes(&ep, &msg.lanes) {
        ep.fail(e.clone());
        return Err(e);
    }
    if ep.route.p2p != 0 {
        reply(&ep, ACK)?;
    }
    ep.set_ready();
    Ok(())
}

fn on_ack(w: &Rc<WorkerInner>, msg: &Msg) -> Result<()> {
    let ep = w.eps.borrow().get(msg.dst_ep);
    match ep {
        Some(ep) if ep.remote.uuid == msg.src_worker => {
            ep.set_ready();
            Ok(())
        }
        _ => Err(Error::new(
            Status::NoElem,
            format!("ACK for unknown endpoint {:#x}", msg.dst_ep),
        )),
    }
}

/// The CLOSE notice of `ep` (the peer finds its endpoint by our worker and endpoint ids).
pub(crate) fn close_message(ep: &EpInner) -> Option<Vec<u8>> {
    let w = ep.worker.upgrade()?;
    let m = Msg {
        kind: CLOSE,
        flags: 0,
        src_worker: w.uuid,
        src_ep: ep.id.get(),
        dst_ep: ep.remote_ep.get().unwrap_or(0),
        conn_sn: ep.conn_sn,
        address: Vec::new(),
        lanes: Vec::new(),
    };
    Some(m.encode())
}

/// A KEEPALIVE from `ep` (a `probe`, or the answer to ours).
pub(crate) fn keepalive_message(ep: &EpInner, probe: bool) -> Option<Vec<u8>> {
    let w = ep.worker.upgrade()?;
    let m = Msg {
        kind: KEEPALIVE,
        flags: if probe { FLAG_PROBE } else { 0 },
        src_worker: w.uuid,
        src_ep: ep.id.get(),
        dst_ep: ep.remote_ep.get()?,
        conn_sn: ep.conn_sn,
        address: Vec::new(),
        lanes: Vec::new(),
    };
    Some(m.encode())
}

/// The peer is alive: note it, and answer a probe.
fn on_keepalive(w: &Rc<WorkerInner>, msg: &Msg) -> Result<()> {
    let ep = {
        let t = w.eps.borrow();
        t.by_remote
            .get(&(msg.src_worker, msg.src_ep))
            .and_then(|&id| t.get(id))
    };
    let Some(ep) = ep.filter(|e| e.id.get() == msg.dst_ep) else {
        // Closed here meanwhile, or not wired on our side yet: the prober's timeout decides.
        ucs::debug!("ucp: keepalive from worker {:#x} for no endpoint", msg.src_worker);
        return Ok(());
    };
    ep.last_rx.set(std::time::Instant::now());
    if msg.flags & FLAG_PROBE != 0 {
        if let Some(bytes) = keepalive_message(&ep, false) {
            ep.send_wireup(bytes);
        }
    }
    Ok(())
}

fn on_close(w: &Rc<WorkerInner>, msg: &Msg) -> Result<()> {
    let ep = {
        let t = w.eps.borrow();
        t.by_remote
            .get(&(msg.src_worker, msg.src_ep))
            .and_then(|&id| t.get(id))
    };
    let Some(ep) = ep else {
        // Never wired on our side, or closed here too: nothing to tell.
        return Ok(());
    };
    ep.fail(Error::new(
        Status::ConnectionReset,
        format!(
            "ucp: worker {:#x} closed its endpoint to this one",
            msg.src_worker
        ),
    ));
    Ok(())
}

/// The uct AM id wireup messages use.
pub(crate) const AM_ID: u8 = am_id::WIREUP;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let m = Msg {
            flags: 0,
            kind: REQUEST,
            src_worker: 1,
            src_ep: 2,
            dst_ep: 0,
            conn_sn: 3,
            address: vec![9; 17],
            lanes: vec![LaneAddr {
                sender_rsc: 1,
                receiver_rsc: 2,
                addr: vec![7; 10],
            }],
        };
        let b = m.encode();
        assert_eq!(Msg::decode(&b).unwrap(), m);
        for cut in 0..b.len() {
            assert!(Msg::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(Msg::decode(&extra).is_err());
        let mut v = b.clone();
        v[0] = 99;
        assert!(Msg::decode(&v).is_err());
        let mut t = b;
        t[1] = 9;
        assert!(Msg::decode(&t).is_err());
    }
}
