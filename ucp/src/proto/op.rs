//! Sends that wait in an endpoint's queue, or go out in pieces: whole messages, fragments,
//! stream pieces, rendezvous steps, RMA and flushes; how each continues when the lane has
//! room, and what its completion tells. [`super::send`] makes them; `EpInner::dispatch`
//! runs them in order.

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Error, Result, Status};
use uct::{Completion, MemAccess};

use super::payload::Held;
use crate::ep::EpInner;
use crate::request::{Completer, Issued};
use crate::wire::{self, am_id};
use crate::worker::WorkerInner;

/// What to tell when a queued send finishes.
pub(crate) enum Done {
    /// The operation completes its request itself (a flush, from its lanes' completions).
    Nothing,
    Unit(Completer<()>),
    /// Gives the application's buffer back (as the type it lent, see [`super::payload`]).
    Back(Box<dyn FnOnce(Result<Held>)>),
    /// A rendezvous RTS: the transfer completes later (ATS, or the last DATA); a failed RTS
    /// fails it.
    Rndv(u64, std::rc::Weak<WorkerInner>),
    /// A synchronous tag send's data: it completes once sent and acknowledged.
    Sync(u64, std::rc::Weak<WorkerInner>),
}

/// A send that waits in an endpoint's queue (or is being sent in pieces).
pub(crate) struct SendOp {
    kind: OpKind,
    done: Done,
}

enum OpKind {
    /// One whole transport message (sent with bcopy): its prefix (and header), then the
    /// payload (an owned send's buffer, given back on completion).
    Whole { uct_id: u8, bytes: Vec<u8>, data: Held },
    /// Flushes the lanes once everything before it was handed to them.
    Flush(crate::ep::FlushOp),
    /// A rendezvous step (the sender's DATA, the receiver's fetch).
    Rndv(crate::rndv::RndvOp),
    /// Stream bytes.
    Stream(crate::stream::StreamOp),
    /// A put, get or atomic (it completes its request itself).
    Rma(crate::rma::RmaOp),
    /// A fragmented message: the first fragment (uct AM id `ids.0`) carries `prefix` and the
    /// header, the later ones (`ids.1`) offsets.
    Frags {
        ids: (u8, u8),
        prefix: Vec<u8>,
        header: Vec<u8>,
        data: Held,
        msg_id: u64,
        worker: u64,
        sent: usize,
        first_sent: bool,
    },
}

impl SendOp {
    pub(crate) fn flush(f: crate::ep::FlushOp) -> SendOp {
        SendOp {
            kind: OpKind::Flush(f),
            done: Done::Nothing,
        }
    }

    /// A wireup message that must follow the data queued before it (CLOSE).
    pub(crate) fn wireup(bytes: Vec<u8>) -> SendOp {
        SendOp::control(am_id::WIREUP, bytes, Done::Nothing)
    }

    /// A message sent whole, queued: `prefix` then `data` (given back by `Done::Back`).
    pub(crate) fn whole(uct_id: u8, prefix: Vec<u8>, data: Held, done: Done) -> SendOp {
        SendOp {
            kind: OpKind::Whole {
                uct_id,
                bytes: prefix,
                data,
            },
            done,
        }
    }

    /// One protocol message on the AM lane, in order with the data.
    pub(crate) fn control(uct_id: u8, bytes: Vec<u8>, done: Done) -> SendOp {
        SendOp::whole(uct_id, bytes, Held::Copy(Vec::new()), done)
    }

    /// A message in fragments: `prefix` and `header` on the first, offsets on the later ones;
    /// `msg_id` and `worker` as the prefix names them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn frags(
        ids: (u8, u8),
        prefix: Vec<u8>,
        header: Vec<u8>,
        data: Held,
        msg_id: u64,
        worker: u64,
        done: Done,
    ) -> SendOp {
        SendOp {
            kind: OpKind::Frags {
                ids,
                prefix,
                header,
                data,
                msg_id,
                worker,
                sent: 0,
                first_sent: false,
            },
            done,
        }
    }

    pub(crate) fn stream(op: crate::stream::StreamOp, c: Completer<()>) -> SendOp {
        SendOp {
            kind: OpKind::Stream(op),
            done: Done::Unit(c),
        }
    }

    pub(crate) fn rndv(op: crate::rndv::RndvOp) -> SendOp {
        SendOp {
            kind: OpKind::Rndv(op),
            done: Done::Nothing,
        }
    }

    pub(crate) fn rma(op: crate::rma::RmaOp) -> SendOp {
        SendOp {
            kind: OpKind::Rma(op),
            done: Done::Nothing,
        }
    }

    /// Bytes of data it holds while queued (what `RUCX_EP_SEND_QUEUE_LIMIT` bounds).
    pub fn queued_len(&self) -> usize {
        match &self.kind {
            OpKind::Whole { bytes, data, .. } => bytes.len() + data.len(),
            OpKind::Frags {
                header, data, sent, ..
            } => header.len() + data.len().saturating_sub(*sent),
            OpKind::Stream(s) => s.remaining(),
            OpKind::Flush(_) | OpKind::Rndv(_) | OpKind::Rma(_) => 0,
        }
    }

    /// The lane whose resources it waits for.
    pub fn lane(&self, ep: &EpInner) -> usize {
        match &self.kind {
            OpKind::Rndv(r) => r.lane(ep),
            OpKind::Rma(r) => r.lane(),
            _ => ep.route.lanes.am,
        }
    }

    /// Sends what it can: `Ok(true)` when all of it went, `Ok(false)` when the lane is out of
    /// resources (call again later).
    pub fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        let lane = ep.am_ep();
        let max = ep.route.limits.max_bcopy;
        match &mut self.kind {
            OpKind::Whole { uct_id, bytes, data } => {
                match lane.am_bcopy(*uct_id, |b| copy(b, &[bytes, data.bytes()])) {
                    Ok(_) => Ok(true),
                    Err(e) if e == Status::NoResource => Ok(false),
                    Err(e) => Err(e),
                }
            }
            OpKind::Flush(f) => f.progress(ep),
            OpKind::Rndv(r) => r.progress(ep),
            OpKind::Stream(s) => s.progress(ep),
            OpKind::Rma(r) => r.progress(ep),
            OpKind::Frags {
                ids,
                prefix,
                header,
                data,
                msg_id,
                worker,
                sent,
                first_sent,
            } => {
                let data = data.bytes();
                while !*first_sent || *sent < data.len() {
                    let r = if !*first_sent {
                        let room = max.saturating_sub(prefix.len() + header.len());
                        let n = room.min(data.len());
                        lane.am_bcopy(ids.0, |b| copy(b, &[prefix, header, &data[..n]]))
                            .map(|_| n)
                    } else {
                        let n = (max - wire::MIDDLE_PREFIX_LEN).min(data.len() - *sent);
                        let mut mp = [0u8; wire::MIDDLE_PREFIX_LEN];
                        wire::put_middle_prefix(&mut mp, *worker, *msg_id, *sent as u64);
                        let chunk = &data[*sent..*sent + n];
                        lane.am_bcopy(ids.1, |b| copy(b, &[&mp, chunk])).map(|_| n)
                    };
                    match r {
                        Ok(n) => {
                            *first_sent = true;
                            *sent += n;
                        }
                        Err(e) if e == Status::NoResource => return Ok(false),
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            }
        }
    }

    /// Completes the send's request (with the buffer, for owned sends).
    pub fn finish(self, r: Result<()>) {
        match self.done {
            Done::Nothing => match (self.kind, r) {
                (OpKind::Flush(f), Err(e)) => f.fail(e),
                (OpKind::Rndv(op), r) => op.finish(r),
                (OpKind::Rma(op), r) => op.finish(r),
                _ => {}
            },
            Done::Sync(id, w) => {
                if let Some(w) = w.upgrade() {
                    crate::tag::sync_sent(&w, id, r);
                }
            }
            Done::Rndv(id, w) => {
                if let (Err(e), Some(w)) = (r, w.upgrade()) {
                    crate::rndv::finish_send(&w, id, Err(e));
                }
            }
            Done::Unit(c) => c.complete(r),
            Done::Back(back) => {
                let data = match self.kind {
                    OpKind::Frags { data, .. } | OpKind::Whole { data, .. } => data,
                    OpKind::Flush(_) | OpKind::Rndv(_) | OpKind::Stream(_) | OpKind::Rma(_) => {
                        Held::Copy(Vec::new())
                    }
                };
                back(r.map(|_| data));
            }
        }
    }
}

/// Concatenates `parts` into `b` (a bcopy pack); returns the length.
pub(crate) fn copy(b: &mut [u8], parts: &[&[u8]]) -> usize {
    let mut at = 0;
    for p in parts {
        b[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    at
}

impl EpInner {
    /// Our worker's id (the sender's, in reply fields).
    pub(crate) fn remote_self_id(&self) -> u64 {
        self.worker.upgrade().map_or(0, |w| w.uuid)
    }

    #[inline(always)]
    pub(crate) fn check_usable(&self) -> Result<()> {
        match self.wired.get() {
            crate::ep::Wired::Ready | crate::ep::Wired::WaitingForPeer => Ok(()),
            _ => Err(self.error()),
        }
    }
}

impl EpInner {
    /// One zero-copy send of `data` (registered for it, deregistered after), completing
    /// `done`. `Ok(true)`: it finished in the call; `Err` inside: the lane had no resources
    /// or the buffer could not be registered, nothing was sent, the payload and the
    /// completion come back (to be sent by copy).
    pub(crate) fn zcopy(
        self: &Rc<Self>,
        uct_id: u8,
        hdr: &[u8],
        data: Held,
        done: Done,
    ) -> Result<std::result::Result<bool, (Held, Done)>> {
        let ep = self;
        let w = ep
            .worker
            .upgrade()
            .ok_or_else(|| Error::new(Status::NotConnected, "ucp: the worker is gone"))?;
        let md = &w.ifaces[ep.route.lanes.lanes[ep.route.lanes.am].local].md;
        let mem = match data.register(md, MemAccess::LOCAL_READ) {
            Ok(m) => m,
            // Sent by copy instead: the caller keeps its buffer either way.
            Err((e, data)) => {
                ucs::debug!("ucp: zero-copy send without a registration ({e}): copied");
                return Ok(Err((data, done)));
            }
        };
        // The registration and the completion, for whoever finishes first: the transport's
        // callback, or this call when the send finished or did not start.
        let slot = Rc::new(RefCell::new(Some((mem.clone(), done))));
        let s2 = slot.clone();
        let comp = Completion::new(move |st| {
            if let Some((m, done)) = s2.borrow_mut().take() {
                finish_zcopy(m, done, if st.is_err() { Err(st.into()) } else { Ok(()) });
            }
        });
        // Bound first: the iov's hold on `mem` must end before the buffer is given back.
        let sent = ep.am_ep().am_zcopy(uct_id, hdr, &[mem.whole()], Some(&comp));
        drop(mem);
        if matches!(sent, Ok(ucs::Outcome::InProgress)) {
            return Ok(Ok(false));
        }
        drop(comp);
        let taken = slot.borrow_mut().take();
        let Some((m, done)) = taken else {
            return sent.map(|_| Ok(true));
        };
        match sent {
            Ok(_) => {
                finish_zcopy(m, done, Ok(()));
                Ok(Ok(true))
            }
            Err(e) if e == Status::NoResource => Ok(Err((Held::from_mem(m)?, done))),
            Err(e) => Err(e),
        }
    }

    /// Sends `op` now as far as it goes, queueing the rest; `Done` when all of it went.
    pub(crate) fn send_op<T>(
        self: &Rc<Self>,
        mut op: SendOp,
        mut req: crate::Request<T>,
    ) -> Result<Issued<T>> {
        let ep = self;
        if !ep.can_send_now() {
            self.enqueue(op);
            return Ok(Issued::Pending(req));
        }
        // Sends a handler makes meanwhile (self delivers inside the call) queue behind this.
        ep.dispatching.set(true);
        let r = op.progress(ep);
        ep.dispatching.set(false);
        match r {
            Ok(true) => {
                op.finish(Ok(()));
                ep.dispatch();
                match req.take() {
                    Some(r) => r.map(Issued::Done),
                    None => Ok(Issued::Pending(req)),
                }
            }
            Ok(false) => {
                ep.queue.borrow_mut().push_front(op);
                ep.dispatch();
                ep.check_queue();
                Ok(Issued::Pending(req))
            }
            Err(e) => {
                ep.dispatch();
                Err(e)
            }
        }
    }

    pub(crate) fn enqueue(self: &Rc<Self>, op: SendOp) {
        self.queue.borrow_mut().push_back(op);
        self.dispatch();
        self.check_queue();
    }

    /// Fails the endpoint when what waits in its queue passed `RUCX_EP_SEND_QUEUE_LIMIT`
    /// (the peer does not read, or reads far slower than the application sends).
    fn check_queue(&self) {
        let held = self.queue.borrow().bytes();
        let Some(w) = self.worker.upgrade() else { return };
        let limit = w.ctx.inner.cfg.send_queue_limit;
        if held <= limit || self.check_usable().is_err() {
            return;
        }
        self.fail(Error::new(
            Status::ExceedsLimit,
            format!(
                "ucp: {held} bytes of sends wait toward worker {:#x}, over \
                 RUCX_EP_SEND_QUEUE_LIMIT={limit}: the peer does not read (raise the limit if \
                 it is only slow)",
                self.remote.uuid
            ),
        ));
    }
}

/// Completes a zero-copy send: the payload back out of its registration.
fn finish_zcopy(mem: uct::Mem, done: Done, r: Result<()>) {
    match done {
        Done::Back(back) => back(r.and_then(|_| Held::from_mem(mem))),
        Done::Unit(c) => c.complete(r),
        Done::Nothing | Done::Rndv(..) | Done::Sync(..) => {}
    }
}
