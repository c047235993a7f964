//! The sending side of tag matching: the protocol by size, as for active messages (short,
//! bcopy, zero-copy for owned buffers, fragments, rendezvous), and synchronous sends.

use std::rc::Rc;

use ucs::{Error, Result, Status};

use super::wire::{self, SyncFrom};
use super::SyncWait;
use crate::am::{Done, SendOp};
use crate::ep::{Ep, EpInner};
use crate::request::{request, Issued};
use crate::wire::am_id;
use crate::worker::WorkerInner;

fn worker(ep: &EpInner) -> Result<Rc<WorkerInner>> {
    ep.worker
        .upgrade()
        .ok_or_else(|| Error::new(Status::NotConnected, "ucp: the worker is gone"))
}

/// Whether `len` bytes go by rendezvous on `ep`.
fn rndv(ep: &EpInner, len: usize) -> bool {
    len >= ep.limits.rndv_thresh
}

impl Ep {
    /// Sends `data` with `tag` (copied: the buffer is free when the call returns). `Done` when
    /// it went out in the call; else the request completes when it is sent (for a rendezvous:
    /// when the receiver has fetched it). Any size works.
    pub fn tag_send(&self, tag: u64, data: &[u8]) -> Result<Issued<()>> {
        let Some(ep) = self.live(crate::Features::TAG, "Ep::tag_send")? else {
            let data = data.to_vec();
            return self.defer(move |e| e.tag_send(tag, &data));
        };
        if rndv(ep, data.len()) {
            let (req, c) = request(ep.worker.clone());
            if let Ok(op) = crate::rndv::start(ep, am_id::TAG_RTS, tag, &[], data.to_vec(), Done::Unit(c))? {
                return ep.send_op(op, req);
            }
        }
        let total = wire::EAGER_LEN + data.len();
        if total <= ep.limits.max_bcopy && ep.can_send_now() {
            let lane = ep.am_ep();
            let r = if total <= ep.limits.max_short {
                lane.am_short(am_id::TAG_EAGER, tag, data)
            } else {
                lane.am_bcopy(am_id::TAG_EAGER, |b| {
                    b[..8].copy_from_slice(&tag.to_le_bytes());
                    b[8..total].copy_from_slice(data);
                    total
                })
                .map(|_| ())
            };
            match r {
                Ok(()) => return Ok(Issued::Done(())),
                Err(e) if e == Status::NoResource => {}
                Err(e) => return Err(e),
            }
        }
        let (req, c) = request(ep.worker.clone());
        let op = eager_op(ep, tag, data.to_vec(), None, Done::Unit(c))?;
        ep.send_op(op, req)
    }

    /// Sends `data` with `tag` from a buffer the caller hands over: zero-copy where the lane
    /// allows (from the zcopy threshold up); the buffer comes back when the send finished.
    pub fn tag_send_owned(&self, tag: u64, data: Vec<u8>) -> Result<Issued<Vec<u8>>> {
        let Some(ep) = self.live(crate::Features::TAG, "Ep::tag_send_owned")? else {
            return self.defer(move |e| e.tag_send_owned(tag, data));
        };
        let data = if rndv(ep, data.len()) {
            let (req, c) = request(ep.worker.clone());
            match crate::rndv::start(ep, am_id::TAG_RTS, tag, &[], data, Done::Buf(c))? {
                Ok(op) => return ep.send_op(op, req),
                Err((data, _)) => data,
            }
        } else {
            data
        };
        let l = ep.limits;
        let total = wire::EAGER_LEN + data.len();
        let data = if !data.is_empty()
            && data.len() >= l.zcopy_thresh
            && total <= l.max_zcopy
            && wire::EAGER_LEN <= l.max_zcopy_hdr
            && ep.can_send_now()
        {
            match ep.zcopy(am_id::TAG_EAGER, &tag.to_le_bytes(), data)? {
                Ok(issued) => return Ok(issued),
                Err(data) => data,
            }
        } else {
            data
        };
        if total <= l.max_bcopy {
            return Ok(match self.tag_send(tag, &data)? {
                Issued::Done(()) => Issued::Done(data),
                Issued::Pending(r) => {
                    let (req, c) = request(ep.worker.clone());
                    r.on_complete(move |res| c.complete(res.map(|_| data)));
                    Issued::Pending(req)
                }
            });
        }
        let (req, c) = request(ep.worker.clone());
        let op = eager_op(ep, tag, data, None, Done::Buf(c))?;
        ep.send_op(op, req)
    }

    /// Sends `data` with `tag` and completes only once the receiver matched it (MPI's
    /// synchronous send): an acknowledgement for eager messages, the receiver's fetch for
    /// rendezvous.
    pub fn tag_send_sync(&self, tag: u64, data: &[u8]) -> Result<Issued<()>> {
        let Some(ep) = self.live(crate::Features::TAG, "Ep::tag_send_sync")? else {
            let data = data.to_vec();
            return self.defer(move |e| e.tag_send_sync(tag, &data));
        };
        if rndv(ep, data.len()) {
            let (req, c) = request(ep.worker.clone());
            if let Ok(op) = crate::rndv::start(ep, am_id::TAG_RTS, tag, &[], data.to_vec(), Done::Unit(c))? {
                return ep.send_op(op, req);
            }
        }
        let w = worker(ep)?;
        let (req, c) = request(ep.worker.clone());
        let id = {
            let mut t = w.tag.borrow_mut();
            t.next_req += 1;
            let id = t.next_req;
            t.sync.insert(
                id,
                SyncWait {
                    ep_id: ep.id.get(),
                    peer: ep.remote.uuid,
                    sent: false,
                    acked: false,
                    done: c,
                },
            );
            id
        };
        let from = SyncFrom {
            worker: w.uuid,
            ep: ep.id.get(),
            req: id,
        };
        let op = eager_op(
            ep,
            tag,
            data.to_vec(),
            Some(from),
            Done::Sync(id, Rc::downgrade(&w)),
        )?;
        ep.send_op(op, req)
    }
}

/// A queued eager message: one transport message when it fits, else fragments.
fn eager_op(ep: &EpInner, tag: u64, data: Vec<u8>, sync: Option<SyncFrom>, done: Done) -> Result<SendOp> {
    let w = worker(ep)?;
    let prefix_len = if sync.is_some() {
        wire::SYNC_LEN
    } else {
        wire::EAGER_LEN
    };
    if prefix_len + data.len() <= ep.limits.max_bcopy {
        let mut bytes = vec![0u8; prefix_len];
        let id = match sync {
            Some(from) => {
                wire::put_sync_prefix(&mut bytes, tag, from);
                am_id::TAG_SYNC
            }
            None => {
                bytes.copy_from_slice(&tag.to_le_bytes());
                am_id::TAG_EAGER
            }
        };
        bytes.extend_from_slice(&data);
        return Ok(SendOp::control(id, bytes, done));
    }
    let msg_id = w.next_msg_id.get();
    w.next_msg_id.set(msg_id + 1);
    let first = wire::First {
        tag,
        worker: w.uuid,
        msg_id,
        total: data.len() as u64,
        req: sync.map_or(0, |s| s.req),
        ep: sync.map_or(0, |s| s.ep),
        data: &[],
    };
    Ok(SendOp::frags(
        (am_id::TAG_FIRST, am_id::TAG_MIDDLE),
        first.prefix().to_vec(),
        data,
        msg_id,
        w.uuid,
        done,
    ))
}
