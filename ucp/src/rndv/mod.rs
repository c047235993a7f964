//! Rendezvous active messages: the sender announces a large message with RTS and keeps its
//! buffer; the receiver gives a buffer (the application's, [`crate::Worker::am_recv_data`], or
//! the worker's own for a plain handler, `am::fetch_then_deliver`) and the data moves either
//! by `get_zcopy` from the sender's registered memory (then ATS releases the sender) or, where
//! the lanes have no zero-copy get, by RTR and the sender's DATA messages on the AM lane (the
//! active-message pipeline).
//!
//! This module keeps the transfers in flight (by the sender's and the receiver's ids) and the
//! sender's side; `recv` is the receiver's side.

mod recv;
pub mod wire;

use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};
use uct::{IfaceFlags, MemAccess};

use crate::ep::EpInner;
use crate::proto::op::{Done, SendOp};
use crate::proto::payload::Held;
use crate::proto::stall::StallTimer;
use crate::wire::am_id;
use crate::worker::WorkerInner;

pub use recv::AmDataDesc;
pub(crate) use recv::{desc_for, find_ep, on_data, on_rts, tick, GetOp, RecvState};
pub(crate) use recv::{recv_data, recv_data_as, recv_data_lent, recv_data_vec};

/// The sender's buffer: registered for the peer's `get_zcopy`, or plain (pipeline).
pub(crate) enum SendBuf {
    Mem(uct::Mem),
    Held(Held),
}

impl SendBuf {
    fn len(&self) -> usize {
        match self {
            SendBuf::Mem(m) => m.len(),
            SendBuf::Held(v) => v.len(),
        }
    }

    fn read(&self, offset: usize, out: &mut [u8]) {
        match self {
            SendBuf::Mem(m) => {
                // In bounds: the pipeline only reads below `len`.
                let _ = m.read(offset, out);
            }
            SendBuf::Held(v) => out.copy_from_slice(&v.bytes()[offset..offset + out.len()]),
        }
    }

    fn into_held(self) -> Result<Held> {
        match self {
            SendBuf::Mem(m) => Held::from_mem(m),
            SendBuf::Held(v) => Ok(v),
        }
    }
}

/// A message announced with RTS, waiting for the receiver.
struct SendState {
    ep_id: u64,
    /// The peer worker (the only one whose ATS or RTR counts).
    peer: u64,
    ep: Weak<EpInner>,
    /// Taken while DATA messages are being sent from it.
    buf: Option<SendBuf>,
    done: Done,
    /// Flushes of the endpoint waiting for this message.
    waiters: Vec<Rc<dyn Fn()>>,
}

/// The worker's rendezvous transfers, and the stall timer of its receives waiting for data
/// (`RUCX_RNDV_TIMEOUT`), which runs while there are any.
pub(crate) struct Rndv {
    pub st: std::cell::RefCell<RndvState>,
    pub timer: StallTimer,
}

impl Rndv {
    pub fn new(timeout: Option<std::time::Duration>) -> Rndv {
        Rndv {
            st: Default::default(),
            timer: StallTimer::new(timeout, "rendezvous receive stall"),
        }
    }
}

/// The transfers in flight, by our id.
#[derive(Default)]
pub(crate) struct RndvState {
    next_id: u64,
    sends: ucs::hash::FastMap<u64, SendState>,
    recvs: ucs::hash::FastMap<u64, RecvState>,
}

impl RndvState {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// The lane the sender registers its buffer for: a lane whose both sides do `get_zcopy`,
/// preferring the RMA bandwidth lanes; none with `RUCX_RNDV_SCHEME=am`.
pub(crate) fn get_lane(
    w: &WorkerInner,
    lanes: &crate::lanes::LaneSet,
    remote: &crate::WorkerAddress,
) -> Option<usize> {
    if w.ctx.inner.cfg.rndv_scheme == crate::config::RndvScheme::Am {
        return None;
    }
    let ok = |&i: &usize| {
        let l = &lanes.lanes[i];
        let lf = w.ifaces[l.local].info.attr.flags;
        let rf = remote.entries[l.remote].tl.attr.flags;
        lf.contains(IfaceFlags::GET_ZCOPY)
            && rf.contains(IfaceFlags::GET_ZCOPY)
            && !w.ifaces[l.local].aux_only
    };
    lanes
        .rma_bw
        .iter()
        .chain(lanes.rma.iter())
        .copied()
        .find(ok)
        .or_else(|| (0..lanes.lanes.len()).find(ok))
}

/// Starts a rendezvous send of `data`: the RTS (uct AM id `rts_id`, header word `word`, the
/// application's `header`) to queue, or the data back when the RTS would not fit one transport
/// message (the caller sends eagerly then).
pub(crate) fn start(
    ep: &Rc<EpInner>,
    rts_id: u8,
    word: u64,
    header: &[u8],
    data: Held,
    done: Done,
) -> Result<std::result::Result<SendOp, (Held, Done)>> {
    let w = ep
        .worker
        .upgrade()
        .ok_or_else(|| Error::new(Status::NotConnected, "ucp: the worker is gone"))?;
    let mut resource = wire::NO_RESOURCE;
    let mut rkey = Vec::new();
    let buf = match ep.route.rndv_lane.filter(|_| data.len() > 0) {
        Some(lane) => {
            let local = ep.route.lanes.lanes[lane].local;
            let access = MemAccess::LOCAL_READ | MemAccess::REMOTE_GET;
            match data.register(&w.ifaces[local].md, access) {
                Ok(m) => match m.pack_rkey() {
                    Ok(k) => {
                        resource = local as u8;
                        rkey = k;
                        SendBuf::Mem(m)
                    }
                    Err(_) => SendBuf::Held(Held::from_mem(m)?),
                },
                // Registration failed: the pipeline needs none.
                Err((e, data)) => {
                    ucs::debug!("ucp: rendezvous without get_zcopy: {e}");
                    SendBuf::Held(data)
                }
            }
        }
        None => SendBuf::Held(data),
    };
    if wire::RTS_LEN + rkey.len() + header.len() > ep.route.limits.max_bcopy
        || rkey.len() > usize::from(u16::MAX)
    {
        return Ok(Err((buf.into_held()?, done)));
    }
    let rndv_id = w.rndv.st.borrow_mut().next_id();
    let addr = match &buf {
        SendBuf::Mem(m) => m.addr(),
        SendBuf::Held(_) => 0,
    };
    let rts = wire::Rts {
        word,
        worker: w.uuid,
        ep: ep.id.get(),
        rndv_id,
        total: buf.len() as u64,
        addr,
        resource,
        rkey: &rkey,
        user_hdr: header,
    }
    .encode();
    w.rndv.st.borrow_mut().sends.insert(
        rndv_id,
        SendState {
            ep_id: ep.id.get(),
            peer: ep.remote.uuid,
            ep: Rc::downgrade(ep),
            buf: Some(buf),
            done,
            waiters: Vec::new(),
        },
    );
    Ok(Ok(SendOp::control(
        rts_id,
        rts,
        Done::Rndv(rndv_id, Rc::downgrade(&w)),
    )))
}

/// Completes send `rndv_id` with `r` (its buffer back for owned sends).
pub(crate) fn finish_send(w: &WorkerInner, rndv_id: u64, r: Result<()>) {
    let s = w.rndv.st.borrow_mut().sends.remove(&rndv_id);
    let Some(mut s) = s else { return };
    let buf = s.buf.take();
    for f in &s.waiters {
        f();
    }
    match s.done {
        Done::Unit(c) => c.complete(r),
        Done::Back(back) => back(r.and_then(|_| match buf {
            Some(b) => b.into_held(),
            None => Ok(Held::Copy(Vec::new())),
        })),
        Done::Nothing | Done::Rndv(..) | Done::Sync(..) => {}
    }
}

use crate::wire::violation;

/// ATS: the receiver is done with our buffer.
pub(crate) fn on_ats(w: &Rc<WorkerInner>, _iface: usize, m: &uct::AmMessage<'_>) {
    let a = match wire::decode_ats(m.data()) {
        Ok(a) => a,
        Err(e) => return violation("rendezvous ATS", &e),
    };
    let known = w
        .rndv
        .st
        .borrow()
        .sends
        .get(&a.rndv_id)
        .map(|s| (s.peer, s.buf.is_some()));
    match known {
        // A failure (the receiver timed out) may come while DATA messages are being sent.
        Some((peer, idle)) if peer == a.worker && (idle || a.status != Status::Ok) => {}
        _ => {
            let e = Error::new(
                Status::InvalidParam,
                format!(
                    "no rendezvous {} toward worker {:#x} waits for it",
                    a.rndv_id, a.worker
                ),
            );
            return violation("rendezvous ATS", &e);
        }
    }
    let r = if a.status == Status::Ok {
        Ok(())
    } else {
        Err(Error::new(
            a.status,
            "ucp: the receiver of a rendezvous active message could not fetch it",
        ))
    };
    finish_send(w, a.rndv_id, r);
}

/// RTR: the receiver asks for the data in DATA messages.
pub(crate) fn on_rtr(w: &Rc<WorkerInner>, _iface: usize, m: &uct::AmMessage<'_>) {
    let r = match wire::decode_rtr(m.data()) {
        Ok(r) => r,
        Err(e) => return violation("rendezvous RTR", &e),
    };
    let taken = {
        let mut st = w.rndv.st.borrow_mut();
        match st.sends.get_mut(&r.rndv_id) {
            Some(s) if s.peer == r.worker => s.buf.take().map(|b| (b, s.ep.clone())),
            _ => None,
        }
    };
    let Some((buf, ep)) = taken else {
        let e = Error::new(
            Status::InvalidParam,
            format!(
                "no rendezvous {} toward worker {:#x} waits for it",
                r.rndv_id, r.worker
            ),
        );
        return violation("rendezvous RTR", &e);
    };
    let Some(ep) = ep.upgrade() else {
        return finish_send(
            w,
            r.rndv_id,
            Err(Error::new(Status::Canceled, "ucp: the endpoint was destroyed")),
        );
    };
    let op = PipeOp {
        rndv_id: r.rndv_id,
        recv_id: r.recv_id,
        worker: Rc::downgrade(w),
        uuid: w.uuid,
        buf: Some(buf),
        sent: 0,
    };
    ep.queue.borrow_mut().push_back(SendOp::rndv(RndvOp::Pipe(op)));
    ep.dispatch();
}

/// Fails every transfer of endpoint `ep_id` (it failed or was closed).
pub(crate) fn fail_ep(w: &WorkerInner, ep_id: u64, e: &Error) {
    let (sends, recvs): (Vec<u64>, Vec<u64>) = {
        let st = w.rndv.st.borrow();
        (
            st.sends
                .iter()
                .filter(|(_, s)| s.ep_id == ep_id)
                .map(|(k, _)| *k)
                .collect(),
            st.recvs
                .iter()
                .filter(|(_, r)| r.ep_id == ep_id)
                .map(|(k, _)| *k)
                .collect(),
        )
    };
    for id in sends {
        finish_send(w, id, Err(e.clone()));
    }
    for id in recvs {
        recv::finish_recv(w, id, Err(e.clone()));
    }
}

/// Makes `f` run when each rendezvous send of `ep_id` now outstanding completes; returns how
/// many there are.
pub(crate) fn watch_sends(w: &WorkerInner, ep_id: u64, f: Rc<dyn Fn()>) -> usize {
    let mut st = w.rndv.st.borrow_mut();
    let mut n = 0;
    for s in st.sends.values_mut().filter(|s| s.ep_id == ep_id) {
        s.waiters.push(f.clone());
        n += 1;
    }
    n
}

/// The rendezvous steps that go through an endpoint's queue.
pub(crate) enum RndvOp {
    /// The sender's DATA messages (pipeline).
    Pipe(PipeOp),
    /// The receiver's `get_zcopy`s.
    Get(GetOp),
}

impl RndvOp {
    pub fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        match self {
            RndvOp::Pipe(p) => p.progress(ep),
            RndvOp::Get(g) => g.progress(ep),
        }
    }

    pub fn finish(self, r: Result<()>) {
        match self {
            RndvOp::Pipe(p) => p.finish(r),
            RndvOp::Get(g) => g.finish(r),
        }
    }

    /// The lane it waits on for resources.
    pub fn lane(&self, ep: &EpInner) -> usize {
        match self {
            RndvOp::Pipe(_) => ep.route.lanes.am,
            RndvOp::Get(g) => g.lane(),
        }
    }
}

/// The sender's side of the pipeline: the data in DATA messages on the AM lane.
pub(crate) struct PipeOp {
    rndv_id: u64,
    recv_id: u64,
    worker: Weak<WorkerInner>,
    uuid: u64,
    buf: Option<SendBuf>,
    sent: usize,
}

impl PipeOp {
    fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        let Some(buf) = &self.buf else { return Ok(true) };
        // The receiver gave up (its ATS failed the transfer): nothing more to send.
        let gone = self
            .worker
            .upgrade()
            .is_none_or(|w| !w.rndv.st.borrow().sends.contains_key(&self.rndv_id));
        if gone {
            return Ok(true);
        }
        let per = ep.route.limits.max_bcopy - wire::DATA_PREFIX_LEN;
        while self.sent < buf.len() {
            let n = per.min(buf.len() - self.sent);
            let at = self.sent;
            let r = ep.am_ep().am_bcopy(am_id::DATA, |b| {
                wire::put_data_prefix(b, self.recv_id, self.uuid, at as u64);
                buf.read(at, &mut b[wire::DATA_PREFIX_LEN..wire::DATA_PREFIX_LEN + n]);
                wire::DATA_PREFIX_LEN + n
            });
            match r {
                Ok(_) => self.sent += n,
                Err(e) if e == Status::NoResource => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn finish(mut self, r: Result<()>) {
        let Some(w) = self.worker.upgrade() else { return };
        // The buffer goes back into the transfer, which completes with it.
        if let Some(s) = w.rndv.st.borrow_mut().sends.get_mut(&self.rndv_id) {
            s.buf = self.buf.take();
        }
        finish_send(&w, self.rndv_id, r);
    }
}
