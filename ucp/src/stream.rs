//! Streams (UCX's `ucp_stream_*`): an ordered byte stream per endpoint pair, without message
//! boundaries. `Ep::stream_send` cuts the bytes into AM-lane messages (uct AM id 15: the
//! sender's worker and endpoint ids, then bytes); the receiver queues them per sender
//! endpoint and `Ep::stream_recv` takes any amount of them, in order.
//!
//! Bytes that arrived and were not read are charged to their sender worker and to the worker
//! (each queued message's buffer plus 256; `RUCX_STREAM_PEER_LIMIT`, `RUCX_STREAM_WORKER_LIMIT`):
//! a message past either fails the sender's endpoints with `ExceedsLimit`, as a peer that
//! sends faster than the application reads must not exhaust memory.

use std::collections::VecDeque;
use std::rc::Rc;

use ucs::{Error, Result, Status};
use uct::AmMessage;

use crate::ep::{Ep, EpInner};
use crate::proto::budget::{Budget, BudgetSpec, ENTRY_COST};
use crate::request::{request, Completer, Issued};
use crate::wire::am_id;
use crate::worker::WorkerInner;

/// Before the bytes of a stream message: sender worker, sender endpoint.
pub const PREFIX_LEN: usize = 16;

/// A posted stream receive.
pub(crate) struct StreamRecv {
    buf: Vec<u8>,
    filled: usize,
    wait_all: bool,
    done: Completer<Vec<u8>>,
}

impl StreamRecv {
    fn can_complete(&self) -> bool {
        self.filled == self.buf.len() || (!self.wait_all && self.filled > 0)
    }

    fn complete(mut self) {
        self.buf.truncate(self.filled);
        self.done.complete(Ok(self.buf));
    }
}

/// Bytes from one sender endpoint not yet received, and receives waiting for bytes (never
/// both at once).
#[derive(Default)]
struct StreamQ {
    data: VecDeque<Vec<u8>>,
    /// Bytes of `data[0]` already taken.
    head: usize,
    recvs: VecDeque<StreamRecv>,
}

impl StreamQ {
    /// Moves queued bytes into `r`; returns the charge of the messages it used up.
    fn fill(&mut self, r: &mut StreamRecv) -> usize {
        self.fill_into(&mut r.buf, &mut r.filled)
    }

    /// Moves queued bytes into `buf` from `filled` on, advancing it; returns the charge of
    /// the messages it used up.
    fn fill_into(&mut self, buf: &mut [u8], filled: &mut usize) -> usize {
        let mut freed = 0;
        while *filled < buf.len() {
            let Some(d) = self.data.front() else { break };
            let n = (d.len() - self.head).min(buf.len() - *filled);
            buf[*filled..*filled + n].copy_from_slice(&d[self.head..self.head + n]);
            *filled += n;
            self.head += n;
            if self.head == d.len() {
                freed += cost(d);
                self.data.pop_front();
                self.head = 0;
            }
        }
        freed
    }

    /// The charge of everything queued.
    fn charged(&self) -> usize {
        self.data.iter().map(cost).sum()
    }
}

/// Uncharges `freed` bytes of `peer`'s.
fn release(budget: &Budget, peer: u64, freed: usize) {
    if freed != 0 {
        let _ = budget.recharge(peer, freed, 0);
    }
}

/// What a queued message is charged.
fn cost(d: &Vec<u8>) -> usize {
    d.capacity() + ENTRY_COST
}

/// A worker's streams, by (sender worker, sender endpoint).
pub(crate) struct StreamState {
    queues: ucs::hash::FastMap<(u64, u64), StreamQ>,
    /// Receives of endpoints that do not know their peer's endpoint id yet.
    early: ucs::hash::FastMap<u64, Vec<StreamRecv>>,
    /// Unread bytes, by sender worker.
    budget: Budget,
}

impl StreamState {
    pub fn new(limits: crate::config::ByteLimits) -> StreamState {
        StreamState {
            queues: Default::default(),
            early: Default::default(),
            budget: Budget::new(BudgetSpec {
                what: "unread stream bytes",
                peer: ("RUCX_STREAM_PEER_LIMIT", limits.peer_bytes),
                worker: ("RUCX_STREAM_WORKER_LIMIT", limits.worker_bytes),
            }),
        }
    }

    /// Unread messages and their charge ([`crate::Worker::stream_unread`]).
    pub fn unread(&self) -> crate::HeldUse {
        crate::HeldUse {
            messages: self.queues.values().map(|q| q.data.len()).sum(),
            bytes: self.budget.held(),
        }
    }

    /// Drops queue `key` and its charge.
    fn remove_queue(&mut self, key: (u64, u64)) {
        if let Some(q) = self.queues.remove(&key) {
            release(&self.budget, key.0, q.charged());
        }
    }
}

/// A stream message: the sender's worker and endpoint, the bytes.
pub fn decode(b: &[u8]) -> Result<(u64, u64, &[u8])> {
    if b.len() < PREFIX_LEN {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: stream message of {} bytes, at least {PREFIX_LEN} needed",
                b.len()
            ),
        ));
    }
    let worker = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let src_ep = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    Ok((worker, src_ep, &b[PREFIX_LEN..]))
}

/// A stream message arrived: its bytes go straight into the receives waiting for them and
/// the rest into the queue, copied once out of the message (which may lie in shared memory).
pub(crate) fn on_stream(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let (h, n) = crate::wire::head::<PREFIX_LEN>(m);
    let (worker, src_ep, _) = match decode(&h[..n]) {
        Ok(d) => d,
        Err(e) => return crate::wire::violation("stream message", &e),
    };
    if crate::rndv::find_ep(w, worker, src_ep).is_none() {
        ucs::warn_limited!(
            "ucp: stream message from worker {worker:#x}, which has no endpoint here: dropped"
        );
        return;
    }
    if m.len() == PREFIX_LEN {
        return;
    }
    let mut done = Vec::new();
    let mut over = None;
    {
        let mut st = w.stream.borrow_mut();
        let st = &mut *st;
        let q = st.queues.entry((worker, src_ep)).or_default();
        let mut at = PREFIX_LEN;
        // Queued bytes come first; receives wait only while nothing is queued.
        while q.data.is_empty() && at < m.len() {
            let Some(mut r) = q.recvs.pop_front() else { break };
            let filled = r.filled;
            let n = m.copy_to(at, &mut r.buf[filled..]);
            r.filled += n;
            at += n;
            if r.can_complete() {
                done.push(r);
            } else {
                q.recvs.push_front(r);
            }
        }
        if at < m.len() {
            // Checked before the copy: a refused message allocates nothing.
            match st.budget.allows(worker, m.len() - at + ENTRY_COST) {
                Ok(()) => {
                    let mut v = Vec::new();
                    m.extend_vec(at, &mut v);
                    let _ = st.budget.recharge(worker, 0, cost(&v));
                    q.data.push_back(v);
                }
                Err(e) => over = Some(e),
            }
        }
    }
    for r in done {
        r.complete();
    }
    if let Some(e) = over {
        crate::wire::violation("stream message", &e);
        crate::worker::fail_peer(w, worker, e);
    }
}

/// Endpoint `ep` learnt its peer's endpoint id: its early receives join that stream.
pub(crate) fn on_wired(w: &WorkerInner, ep: &EpInner) {
    let Some(remote) = ep.remote_ep.get() else { return };
    let mut done = Vec::new();
    {
        let mut st = w.stream.borrow_mut();
        let st = &mut *st;
        let Some(early) = st.early.remove(&ep.id.get()) else {
            return;
        };
        let q = st.queues.entry((ep.remote.uuid, remote)).or_default();
        for mut r in early {
            if q.recvs.is_empty() {
                let freed = q.fill(&mut r);
                release(&st.budget, ep.remote.uuid, freed);
                if r.can_complete() {
                    done.push(r);
                    continue;
                }
            }
            q.recvs.push_back(r);
        }
    }
    for r in done {
        r.complete();
    }
}

/// The endpoint failed or closed: its waiting receives complete with `e`; bytes that arrived
/// and were not read yet stay readable ([`Ep::stream_recv`] returns them, then the error).
pub(crate) fn fail_ep(w: &WorkerInner, ep: &EpInner, e: &Error) {
    let recvs: Vec<StreamRecv> = {
        let mut st = w.stream.borrow_mut();
        let mut v = st.early.remove(&ep.id.get()).unwrap_or_default();
        if let Some(key) = ep.remote_ep.get().map(|r| (ep.remote.uuid, r)) {
            if let Some(q) = st.queues.get_mut(&key) {
                v.extend(q.recvs.drain(..));
                if q.data.is_empty() {
                    st.queues.remove(&key);
                }
            }
        }
        v
    };
    for r in recvs {
        r.done.complete(Err(e.clone()));
    }
}

/// What an ended endpoint still holds for `buf`: `Some` with at least one byte, or `None`
/// (nothing left: the queue is gone).
fn drain_after_end(ep: &EpInner, mut buf: Vec<u8>) -> Option<Vec<u8>> {
    let w = ep.worker.upgrade()?;
    let key = (ep.remote.uuid, ep.remote_ep.get()?);
    let mut st = w.stream.borrow_mut();
    let q = st.queues.get_mut(&key)?;
    if buf.is_empty() || q.data.is_empty() {
        return None;
    }
    let mut filled = 0;
    let freed = q.fill_into(&mut buf, &mut filled);
    let empty = q.data.is_empty();
    release(&st.budget, key.0, freed);
    if empty {
        st.queues.remove(&key);
    }
    buf.truncate(filled);
    Some(buf)
}

/// The endpoint is gone: what it had not read goes.
pub(crate) fn forget(w: &WorkerInner, ep: &EpInner) {
    let Ok(mut st) = w.stream.try_borrow_mut() else {
        return;
    };
    st.early.remove(&ep.id.get());
    if let Some(r) = ep.remote_ep.get() {
        st.remove_queue((ep.remote.uuid, r));
    }
}

/// The sender's side of a stream send that did not go at once: messages of the lane's size.
pub(crate) struct StreamOp {
    prefix: [u8; PREFIX_LEN],
    data: Vec<u8>,
    sent: usize,
}

impl StreamOp {
    /// Bytes not sent yet.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.sent
    }

    /// `data` to send in messages that each start with `prefix`.
    pub fn new(prefix: [u8; PREFIX_LEN], data: Vec<u8>) -> StreamOp {
        StreamOp {
            prefix,
            data,
            sent: 0,
        }
    }

    pub fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        let per = ep.route.limits.max_bcopy - PREFIX_LEN;
        while self.sent < self.data.len() {
            let n = per.min(self.data.len() - self.sent);
            let chunk = &self.data[self.sent..self.sent + n];
            let r = ep.am_ep().am_bcopy(am_id::STREAM, |b| {
                b[..PREFIX_LEN].copy_from_slice(&self.prefix);
                b[PREFIX_LEN..PREFIX_LEN + n].copy_from_slice(chunk);
                PREFIX_LEN + n
            });
            match r {
                Ok(_) => self.sent += n,
                Err(e) if e == Status::NoResource => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl Ep {
    /// Appends `data` to this endpoint's byte stream (copied: the buffer is free when the call
    /// returns). `Done` when all of it went in the call; else the request completes when it
    /// has. The peer reads the bytes with [`Ep::stream_recv`], in any pieces.
    pub fn stream_send(&self, data: &[u8]) -> Result<Issued<()>> {
        let Some(ep) = self.live(crate::Features::STREAM, "Ep::stream_send")? else {
            let data = data.to_vec();
            return self.defer(move |e| e.stream_send(&data));
        };
        if data.is_empty() {
            return Ok(Issued::Done(()));
        }
        let m = crate::proto::send::Message {
            head: crate::proto::send::Head::Stream,
            header: &[],
            force: crate::proto::select::Force::Auto,
        };
        crate::proto::send::send(ep, &m, data)
    }

    /// Appends the io-vector `segments` to the stream, in order ([`Ep::stream_send`] of their
    /// concatenation, gathered at the call).
    pub fn stream_send_iov(&self, segments: &[&[u8]]) -> Result<Issued<()>> {
        self.stream_send(&crate::datatype::gather(segments)?)
    }

    /// Receives bytes of the peer's stream into `buf` (at most `buf.len()`), handing it back
    /// holding what arrived: at least one byte, or with `wait_all` exactly `buf.len()`.
    pub fn stream_recv(&self, buf: Vec<u8>, wait_all: bool) -> Result<Issued<Vec<u8>>> {
        let Some(ep) = self.ready() else {
            // Still connecting (`live` only reports a failed or closed connect then).
            self.live(crate::Features::STREAM, "Ep::stream_recv")?;
            return self.defer(move |e| e.stream_recv(buf, wait_all));
        };
        ep.features.require(crate::Features::STREAM, "Ep::stream_recv")?;
        if let Err(e) = ep.check_usable() {
            // Bytes that arrived before the endpoint ended (the peer closed it, or failed)
            // are still read, as from a socket before its end; then the error.
            return match drain_after_end(ep, buf) {
                Some(v) => Ok(Issued::Done(v)),
                None => Err(e),
            };
        }
        if buf.is_empty() {
            return Err(Error::new(
                Status::InvalidParam,
                "ucp: stream_recv into an empty buffer would never complete",
            ));
        }
        let w = ep
            .worker
            .upgrade()
            .ok_or_else(|| Error::new(Status::NotConnected, "ucp: the worker is gone"))?;
        let (mut req, c) = request(&ep.worker);
        let mut r = StreamRecv {
            buf,
            filled: 0,
            wait_all,
            done: c,
        };
        let mut guard = w.stream.borrow_mut();
        let st = &mut *guard;
        match ep.remote_ep.get() {
            None => st.early.entry(ep.id.get()).or_default().push(r),
            Some(remote) => {
                let q = st.queues.entry((ep.remote.uuid, remote)).or_default();
                if q.recvs.is_empty() {
                    let freed = q.fill(&mut r);
                    release(&st.budget, ep.remote.uuid, freed);
                }
                if q.recvs.is_empty() && r.can_complete() {
                    drop(guard);
                    r.complete();
                    return Ok(match req.take() {
                        Some(v) => Issued::Done(v?),
                        None => Issued::Pending(req),
                    });
                }
                q.recvs.push_back(r);
            }
        }
        Ok(Issued::Pending(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_releases_what_each_used_up_message_was_charged() {
        let mut q = StreamQ::default();
        for chunk in [&b"abc"[..], b"defg", b"h"] {
            q.data.push_back(chunk.to_vec());
        }
        let all = q.charged();
        assert_eq!(
            all,
            q.data.iter().map(|d| d.capacity()).sum::<usize>() + 3 * ENTRY_COST
        );
        let mut buf = [0u8; 5];
        let mut filled = 0;
        // "abc" used up, "defg" half read: only the first is released
        let freed = q.fill_into(&mut buf, &mut filled);
        assert_eq!((filled, &buf[..]), (5, &b"abcde"[..]));
        assert_eq!(freed, 3 + ENTRY_COST);
        assert_eq!(q.charged(), all - freed);
        let mut rest = [0u8; 8];
        let mut filled = 0;
        let freed2 = q.fill_into(&mut rest, &mut filled);
        assert_eq!(&rest[..filled], b"fgh");
        assert_eq!(freed + freed2, all);
        assert_eq!(q.charged(), 0);
    }
}
