//! The receiver's side of rendezvous: the handler's data descriptor, `am_recv_data` (fetch by
//! `get_zcopy`, or RTR and the sender's DATA messages), ATS when done.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};
use uct::{Completion, IfaceFlags, MemAccess};

use super::wire;
use crate::am;
use crate::ep::{Ep, EpInner};
use crate::proto::op::{self, SendOp};
use crate::proto::stall::StallTimer;
use crate::recv_buf::{RecvBuf, RecvDone, RegisteredBuf};
use crate::request::{request_from, Issued};
use crate::wire::{am_id, FLAG_REPLY};
use crate::worker::WorkerInner;

/// A rendezvous message's data, still at the sender: give it a buffer with
/// [`crate::Worker::am_recv_data`]. Dropped without that, the message is discarded and the
/// sender released (its request completes successfully, as UCX's does).
pub struct AmDataDesc(Option<Desc>);

struct Desc {
    ep: Rc<EpInner>,
    rndv_id: u64,
    total: usize,
    addr: u64,
    resource: u8,
    rkey: Vec<u8>,
}

impl AmDataDesc {
    /// Length of the message's data.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.total)
    }

    /// True for a message without data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sender worker.
    pub(crate) fn peer(&self) -> u64 {
        self.0.as_ref().map_or(0, |d| d.ep.remote.uuid)
    }

    /// Our endpoint toward the sender (its id).
    pub(crate) fn ep_id(&self) -> u64 {
        self.0.as_ref().map_or(0, |d| d.ep.id.get())
    }

    /// Bytes of the sender's key it holds.
    pub(crate) fn key_len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.rkey.len())
    }
}

impl std::fmt::Debug for AmDataDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AmDataDesc({} bytes)", self.len())
    }
}

impl Drop for AmDataDesc {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            send_ats(&d.ep, d.rndv_id, Status::Ok);
        }
    }
}

fn send_ats(ep: &Rc<EpInner>, rndv_id: u64, status: Status) {
    // Not from a worker being torn down (its unmatched descriptors drop then).
    if ep.check_usable().is_err() || ep.worker.strong_count() == 0 {
        return;
    }
    let ats = wire::Ats {
        rndv_id,
        worker: ep.remote_self_id(),
        status,
    };
    ep.queue
        .borrow_mut()
        .push_back(SendOp::control(am_id::ATS, ats.encode(), op::Done::Nothing));
    ep.dispatch();
}

use crate::wire::violation;

/// Our endpoint toward `(worker, ep)`: the one wireup paired with it, else (wireup not done on
/// our side yet) any endpoint to that worker — the ids in the messages are the sender's.
pub(crate) fn find_ep(w: &WorkerInner, worker: u64, ep: u64) -> Option<Rc<EpInner>> {
    let t = w.eps.borrow();
    if let Some(e) = t.by_remote.get(&(worker, ep)).and_then(|id| t.get(*id)) {
        return Some(e);
    }
    t.unmatched
        .iter()
        .chain(t.passive.iter())
        .find(|((uuid, _), _)| *uuid == worker)
        .map(|(_, e)| e.clone())
        .or_else(|| t.live().find(|e| e.remote.uuid == worker))
}

/// RTS: a rendezvous message for the application's handler.
pub(crate) fn on_rts(w: &Rc<WorkerInner>, _iface: usize, m: &uct::AmMessage<'_>) {
    let r = match wire::decode_rts(m.data()) {
        Ok(r) => r,
        Err(e) => return violation("rendezvous RTS", &e),
    };
    let Some(desc) = desc_for(w, &r) else { return };
    let hdr = crate::wire::AmHeader::from_word(r.word);
    let reply = desc
        .0
        .as_ref()
        .filter(|_| hdr.flags & FLAG_REPLY != 0)
        .map(|d| Ep::from_inner(d.ep.clone()));
    am::deliver_rndv(w, hdr.id, r.user_hdr, reply, desc);
}

/// The descriptor of an announced message, or `None` (dropped with a log line) when it is
/// too large or comes from a worker we have no endpoint to.
pub(crate) fn desc_for(w: &WorkerInner, r: &wire::Rts<'_>) -> Option<AmDataDesc> {
    if r.total > am::MAX_MESSAGE {
        let e = Error::new(
            Status::ExceedsLimit,
            format!("a {}-byte message exceeds {}", r.total, am::MAX_MESSAGE),
        );
        violation("rendezvous RTS", &e);
        return None;
    }
    let Some(ep) = find_ep(w, r.worker, r.ep) else {
        let e = Error::new(
            Status::InvalidParam,
            format!("no endpoint toward worker {:#x}", r.worker),
        );
        violation("rendezvous RTS", &e);
        return None;
    };
    Some(AmDataDesc(Some(Desc {
        ep,
        rndv_id: r.rndv_id,
        total: r.total as usize,
        addr: r.addr,
        resource: r.resource,
        rkey: r.rkey.to_vec(),
    })))
}

/// A pipelined receive, waiting for DATA messages.
pub(crate) struct RecvState {
    pub ep_id: u64,
    sender: u64,
    /// The sender's id of the transfer (for the ATS of a timeout).
    rndv_id: u64,
    /// The stall timer's tick when DATA last arrived (or the RTR was sent).
    tick: u32,
    buf: RecvBuf,
    total: usize,
    received: usize,
    done: RecvDone,
}

/// [`crate::Worker::am_recv_data`] into an owned vector (grown or cut to the message).
pub(crate) fn recv_data_vec(w: &Rc<WorkerInner>, desc: AmDataDesc, buf: Vec<u8>) -> Result<Issued<Vec<u8>>> {
    recv_data_as(w, desc, RecvBuf::Owned(buf))
}

/// [`crate::Worker::am_recv_data_into`]: into lent memory of at least the message's length.
pub(crate) fn recv_data_lent<B: uct::LentBytesMut>(
    w: &Rc<WorkerInner>,
    desc: AmDataDesc,
    buf: B,
) -> Result<Issued<B>> {
    recv_data_as(w, desc, RecvBuf::lend(buf))
}

pub(crate) fn recv_data_as<B: 'static>(
    w: &Rc<WorkerInner>,
    desc: AmDataDesc,
    buf: RecvBuf,
) -> Result<Issued<B>> {
    let (mut req, c) = request_from::<RecvBuf, B>(w);
    recv_data(w, desc, buf, RecvDone::Data(c));
    Ok(match req.take() {
        Some(r) => Issued::Done(r?),
        None => Issued::Pending(req),
    })
}

/// Fetches `desc`'s data into `buf`, then completes `done` (perhaps before returning).
pub(crate) fn recv_data(w: &Rc<WorkerInner>, mut desc: AmDataDesc, mut buf: RecvBuf, done: RecvDone) {
    // The descriptor drops with the error: the message is discarded, the sender released.
    let foreign = desc
        .0
        .as_ref()
        .is_some_and(|d| !std::ptr::eq(d.ep.worker.as_ptr(), Rc::as_ptr(w)));
    if foreign {
        return done.fail(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: am_recv_data on worker {:#x} of a message another worker received \
                 (only its progress can fetch the data)",
                w.uuid
            ),
        ));
    }
    let Some(d) = desc.0.take() else {
        return done.fail(Error::new(
            Status::InvalidParam,
            "ucp: am_recv_data: the descriptor was already used",
        ));
    };
    let ep = d.ep.clone();
    if let Err(e) = ep.check_usable() {
        return done.fail(e);
    }
    let total = d.total;
    match &mut buf {
        // The fetch overwrites the buffer: what it already holds needs no zeroing, only the
        // bytes it must grow by.
        RecvBuf::Owned(v) => {
            v.truncate(total);
            if v.try_reserve_exact(total - v.len()).is_err() {
                send_ats(&ep, d.rndv_id, Status::NoMemory);
                return done.fail(Error::new(
                    Status::NoMemory,
                    format!("ucp: am_recv_data: no memory for {total} bytes"),
                ));
            }
            v.resize(total, 0);
        }
        lent => {
            let room = lent.room();
            if room < total {
                // Discarded, as a dropped descriptor is: the sender is released.
                send_ats(&ep, d.rndv_id, Status::Ok);
                return done.fail(crate::recv_buf::truncated("rendezvous message", total, room));
            }
        }
    }
    if total == 0 {
        send_ats(&ep, d.rndv_id, Status::Ok);
        return done.complete(Ok(buf), 0);
    }
    let buf = match get_plan(w, &d) {
        Some((lane, rkey)) => {
            let md = &w.ifaces[ep.route.lanes.lanes[lane].local].md;
            match buf.register(md, MemAccess::LOCAL_WRITE) {
                Ok(mem) => {
                    let op = GetOp::new(&ep, &d, lane, rkey, mem, done);
                    ep.queue
                        .borrow_mut()
                        .push_back(SendOp::rndv(super::RndvOp::Get(op)));
                    ep.dispatch();
                    return;
                }
                Err((e, buf)) => {
                    ucs::debug!("ucp: rendezvous receive without get_zcopy: {e}");
                    buf
                }
            }
        }
        None => buf,
    };
    let recv_id = {
        let mut st = w.rndv.st.borrow_mut();
        let id = st.next_id();
        st.recvs.insert(
            id,
            RecvState {
                ep_id: ep.id.get(),
                sender: ep.remote.uuid,
                rndv_id: d.rndv_id,
                tick: w.rndv.timer.now(),
                buf,
                total,
                received: 0,
                done,
            },
        );
        id
    };
    w.rndv.timer.arm(&w.uct);
    let rtr = wire::Rtr {
        rndv_id: d.rndv_id,
        recv_id,
        worker: w.uuid,
    };
    ep.queue
        .borrow_mut()
        .push_back(SendOp::control(am_id::RTR, rtr.encode(), op::Done::Nothing));
    ep.dispatch();
}

/// The lane and unpacked rkey for fetching `d` with `get_zcopy`: a lane of ours to the
/// sender's resource that the rkey belongs to.
fn get_plan(w: &WorkerInner, d: &Desc) -> Option<(usize, uct::Rkey)> {
    if d.resource == wire::NO_RESOURCE {
        return None;
    }
    let ep = &d.ep;
    let lane = (0..ep.route.lanes.lanes.len()).find(|&i| {
        let l = &ep.route.lanes.lanes[i];
        l.remote == usize::from(d.resource)
            && w.ifaces[l.local].info.attr.flags.contains(IfaceFlags::GET_ZCOPY)
            && w.ifaces[l.local].info.attr.get_max_zcopy > 0
    })?;
    let md = &w.ifaces[ep.route.lanes.lanes[lane].local].md;
    match md.component().rkey_unpack(&d.rkey) {
        Ok(k) => Some((lane, k)),
        Err(e) => {
            ucs::warn!("ucp: rendezvous: the sender's rkey is unusable ({e}): fetching by RTR instead");
            None
        }
    }
}

/// DATA: a piece of a pipelined receive.
pub(crate) fn on_data(w: &Rc<WorkerInner>, _iface: usize, m: &uct::AmMessage<'_>) {
    let d = match wire::decode_data(m.data()) {
        Ok(d) => d,
        Err(e) => return violation("rendezvous DATA", &e),
    };
    let outcome = {
        let mut st = w.rndv.st.borrow_mut();
        match st.recvs.get_mut(&d.recv_id) {
            Some(r) if r.sender == d.worker => {
                if d.offset != r.received as u64 || r.received + d.data.len() > r.total {
                    Some(Err(Error::new(
                        Status::InvalidParam,
                        format!(
                            "ucp: rendezvous DATA at {} with {} bytes, expected offset {} of {}",
                            d.offset,
                            d.data.len(),
                            r.received,
                            r.total
                        ),
                    )))
                } else {
                    r.buf.put(r.received, d.data);
                    r.received += d.data.len();
                    r.tick = w.rndv.timer.now();
                    (r.received == r.total).then_some(Ok(()))
                }
            }
            _ => {
                drop(st);
                let e = Error::new(
                    Status::InvalidParam,
                    format!("no rendezvous receive {} from worker {:#x}", d.recv_id, d.worker),
                );
                return violation("rendezvous DATA", &e);
            }
        }
    };
    match outcome {
        Some(Err(e)) => {
            ucs::warn!("ucp: {e}: the receive fails");
            finish_recv(w, d.recv_id, Err(e));
        }
        Some(Ok(())) => finish_recv(w, d.recv_id, Ok(())),
        None => {}
    }
}

/// The stall timer ticked: receives that got no DATA for `RUCX_RNDV_TIMEOUT` complete with
/// `TimedOut` and their senders get an ATS saying so; the timer stops when none is left.
pub(crate) fn tick(w: &WorkerInner) {
    let now = w.rndv.timer.take_due();
    let stalled: Vec<(u64, u64, u64, usize, usize)> = w
        .rndv
        .st
        .borrow()
        .recvs
        .iter()
        .filter(|(_, r)| StallTimer::stalled(r.tick, now))
        .map(|(id, r)| (*id, r.ep_id, r.rndv_id, r.received, r.total))
        .collect();
    for (id, ep_id, rndv_id, received, total) in stalled {
        let ep = w.eps.borrow().get(ep_id);
        let peer = ep.as_ref().map_or(0, |e| e.remote.uuid);
        let e = Error::new(
            Status::TimedOut,
            format!(
                "rendezvous receive from worker {peer:#x} got no data for {} ms with {received} \
                 of {total} bytes in (RUCX_RNDV_TIMEOUT)",
                w.rndv.timer.millis()
            ),
        );
        violation("rendezvous receive", &e);
        if let Some(ep) = ep {
            send_ats(&ep, rndv_id, Status::TimedOut);
        }
        finish_recv(w, id, Err(e));
    }
    if w.rndv.st.borrow().recvs.is_empty() {
        w.rndv.timer.disarm(&w.uct);
    }
}

pub(crate) fn finish_recv(w: &WorkerInner, recv_id: u64, r: Result<()>) {
    let s = w.rndv.st.borrow_mut().recvs.remove(&recv_id);
    if let Some(s) = s {
        s.done.complete(r.map(|_| s.buf), s.total);
    }
}

/// Shared by a fetch's `get_zcopy` completions.
struct GetState {
    /// Bytes not fetched yet (issued or not).
    remaining: Cell<usize>,
    error: RefCell<Option<Error>>,
    mem: RefCell<Option<RegisteredBuf>>,
    total: usize,
    done: RefCell<Option<RecvDone>>,
    ep: Weak<EpInner>,
    rndv_id: u64,
}

impl GetState {
    fn chunk_done(&self, n: usize, r: Result<()>) {
        if let Err(e) = r {
            self.error.borrow_mut().get_or_insert(e);
        }
        self.remaining.set(self.remaining.get() - n);
        if self.remaining.get() != 0 {
            return;
        }
        let Some(c) = self.done.borrow_mut().take() else {
            return;
        };
        let buf = self.mem.borrow_mut().take().map(RegisteredBuf::unregister);
        let err = self.error.borrow_mut().take();
        if let Some(ep) = self.ep.upgrade() {
            send_ats(&ep, self.rndv_id, err.as_ref().map_or(Status::Ok, |e| e.status()));
        }
        let r = match (err, buf) {
            (None, Some(buf)) => buf,
            (Some(e), _) => Err(e.context_with("ucp: fetching a rendezvous message")),
            (None, None) => Err(Error::new(Status::IoError, "ucp: a fetch lost its buffer")),
        };
        c.complete(r, self.total);
    }
}

/// The receiver's fetch: `get_zcopy`s of the lane's largest size into the registered buffer.
pub(crate) struct GetOp {
    lane: usize,
    rkey: uct::Rkey,
    addr: u64,
    total: usize,
    issued: usize,
    state: Rc<GetState>,
}

impl GetOp {
    fn new(
        ep: &Rc<EpInner>,
        d: &Desc,
        lane: usize,
        rkey: uct::Rkey,
        mem: RegisteredBuf,
        c: RecvDone,
    ) -> GetOp {
        GetOp {
            lane,
            rkey,
            addr: d.addr,
            total: d.total,
            issued: 0,
            state: Rc::new(GetState {
                remaining: Cell::new(d.total),
                error: RefCell::new(None),
                mem: RefCell::new(Some(mem)),
                total: d.total,
                done: RefCell::new(Some(c)),
                ep: Rc::downgrade(ep),
                rndv_id: d.rndv_id,
            }),
        }
    }

    pub(super) fn lane(&self) -> usize {
        self.lane
    }

    pub(super) fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        let Some(w) = ep.worker.upgrade() else {
            return Err(Error::new(Status::NotConnected, "ucp: the worker is gone"));
        };
        let l = &ep.route.lanes.lanes[self.lane];
        let max = w.ifaces[l.local]
            .info
            .attr
            .get_max_zcopy
            .min(ep.remote.entries[l.remote].tl.attr.get_max_zcopy)
            .max(1);
        while self.issued < self.total {
            let n = max.min(self.total - self.issued);
            let iov = match self.state.mem.borrow().as_ref() {
                Some(m) => m.iov(self.issued, n)?,
                None => return Ok(true),
            };
            let s = self.state.clone();
            let comp = Completion::new(move |st| {
                s.chunk_done(n, if st.is_err() { Err(st.into()) } else { Ok(()) });
            });
            let iov = [iov];
            let r =
                ep.uct[self.lane].get_zcopy(&iov, self.addr + self.issued as u64, &self.rkey, Some(&comp));
            // The buffer's last clone goes before the fetch may finish: the receive then gets
            // the buffer back itself, not a copy.
            drop(iov);
            match r {
                Ok(ucs::Outcome::InProgress) => self.issued += n,
                Ok(ucs::Outcome::Done) => {
                    drop(comp);
                    self.issued += n;
                    self.state.chunk_done(n, Ok(()));
                }
                Err(e) if e == Status::NoResource => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Ends the fetch: on error, what was never issued counts as failed.
    pub(super) fn finish(self, r: Result<()>) {
        if let Err(e) = r {
            let left = self.total - self.issued;
            self.state.chunk_done(left, Err(e));
        }
    }
}
