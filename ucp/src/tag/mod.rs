//! Tag matching (UCX's `ucp_tag_*`): `Ep::tag_send` / `tag_send_sync` and
//! `Worker::tag_recv` / `tag_probe` / `tag_msg_recv`, with MPI's matching rules
//! ([`matcher`]). Messages go eager (short, bcopy, zcopy, fragments) or by rendezvous with the
//! active messages' thresholds; one endpoint's messages match in the order they were sent,
//! whatever protocol each took, because every first piece (eager message, first fragment or
//! RTS) travels in order on the endpoint's AM lane and is matched on arrival.
//!
//! Receive buffers: `tag_recv(tag, mask, buf)` accepts up to `buf.len()` bytes and hands the
//! buffer back holding the message (its length is the message's); `tag_recv_into` lands the
//! message in memory the application lends (any [`uct::LentBytesMut`]), not zeroed first, and
//! hands it back whole. A longer message completes the receive with `MessageTruncated` and
//! nothing is written past the buffer.

pub mod matcher;
pub(crate) mod recv;
mod send;
mod unexp;
pub(crate) mod wire;

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Error, Result};

use crate::recv_buf::{Received, RecvBuf};
use crate::request::{Completer, CompleterFrom};
use crate::rndv::AmDataDesc;
use crate::worker::WorkerInner;
use matcher::Matcher;
use wire::SyncFrom;

pub(crate) use recv::{on_eager, on_first, on_middle, on_rts, on_sync, on_sync_ack};

/// A completed tag receive: the sender's tag, the message's length and the receive buffer
/// holding the message. [`crate::Worker::tag_recv`]'s `Vec` is cut to the message;
/// [`crate::Worker::tag_recv_into`]'s lent buffer `B` comes back whole, only its first
/// `length` bytes written.
#[derive(Debug, PartialEq, Eq)]
pub struct TagRecvd<B = Vec<u8>> {
    /// The tag the sender gave.
    pub tag: u64,
    /// The message's length in bytes.
    pub length: usize,
    /// The receive buffer, holding the message in its first `length` bytes.
    pub data: B,
}

impl<B: 'static> crate::request::FromRecv<Received> for TagRecvd<B> {
    #[inline(always)]
    fn from_recv(r: Received) -> Result<Self> {
        Ok(TagRecvd {
            tag: r.tag,
            length: r.length,
            data: r.buf.into_lent()?,
        })
    }
}

/// What a probe saw: the sender's tag and the message's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagInfo {
    /// The tag the sender gave.
    pub tag: u64,
    /// The message's length in bytes (the whole message, even while fragments still arrive).
    pub length: usize,
}

/// A message taken off the unexpected queue by [`crate::Worker::tag_probe`] with `remove`:
/// receive it with [`crate::Worker::tag_msg_recv`]. Dropped, the message is discarded.
pub struct TagMsg {
    info: TagInfo,
    msg: Unexp,
    /// The id of the worker that received it (only its progress can finish the receive).
    worker: u64,
}

impl TagMsg {
    /// The message's tag and length (to size the buffer for [`crate::Worker::tag_msg_recv`]).
    pub fn info(&self) -> TagInfo {
        self.info
    }
}

impl std::fmt::Debug for TagMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TagMsg({:?})", self.info)
    }
}

/// [`crate::Worker::tag_probe`]'s answer.
#[derive(Debug)]
pub struct TagProbe {
    /// The matching message's tag and length.
    pub info: TagInfo,
    /// The message, when the probe removed it.
    pub msg: Option<TagMsg>,
}

/// A posted receive.
pub(crate) struct Posted {
    buf: RecvBuf,
    done: CompleterFrom<Received>,
}

impl Posted {
    /// Completes with a `total`-byte message (all of it arrived).
    #[inline(always)]
    fn complete(self, tag: u64, total: usize) {
        let Posted { mut buf, done } = self;
        let room = buf.room();
        if total > room {
            return done.complete(Err(truncated(total, room)));
        }
        done.complete(buf.holding(total).map(|buf| Received {
            tag,
            length: total,
            buf,
        }));
    }
}

/// A whole message received into `buf`: the buffer holding it, or `MessageTruncated`.
fn receive_whole(mut buf: RecvBuf, tag: u64, data: &[u8]) -> Result<Received> {
    let room = buf.room();
    if data.len() > room {
        return Err(truncated(data.len(), room));
    }
    buf.put(0, data);
    Ok(Received {
        tag,
        length: data.len(),
        buf: buf.holding(data.len())?,
    })
}

fn truncated(total: usize, room: usize) -> Error {
    crate::recv_buf::truncated("tag message", total, room)
}

/// Where an eager message's bytes go.
enum Target {
    /// Nobody asked yet: kept here.
    Unexp(Vec<u8>),
    /// Into a posted receive.
    Posted(Posted),
    /// Handed over (the message was matched and its receive completed, or it was discarded).
    Gone,
}

/// An eager message (possibly still arriving in fragments).
struct Incoming {
    tag: u64,
    /// The sender worker (as its fragments name it, checked to be a known peer).
    peer: u64,
    /// Charged to the unexpected budget while it is unexpected (see `unexp`).
    unexp_charged: usize,
    total: usize,
    received: usize,
    target: Target,
    /// The synchronous sender to acknowledge at match time.
    sync: Option<SyncFrom>,
}

impl Target {
    /// Bytes of ours it holds (charged to the sender's reassembly budget).
    fn held(&self) -> usize {
        match self {
            Target::Unexp(v) => v.capacity(),
            Target::Posted(_) | Target::Gone => 0,
        }
    }
}

/// An unexpected message.
enum Unexp {
    /// A whole eager message (no fragments to follow): its data and synchronous sender.
    Whole(Vec<u8>, Option<SyncFrom>),
    Eager(Rc<RefCell<Incoming>>),
    Rndv(AmDataDesc),
}

impl Unexp {
    fn len(&self) -> usize {
        match self {
            Unexp::Whole(d, _) => d.len(),
            Unexp::Eager(i) => i.borrow().total,
            Unexp::Rndv(d) => d.len(),
        }
    }
}

/// A synchronous send waiting for its data to leave and for the receiver's match.
struct SyncWait {
    ep_id: u64,
    peer: u64,
    sent: bool,
    acked: bool,
    done: Completer<()>,
}

/// A worker's tag-matching state.
pub(crate) struct TagState {
    /// Unexpected messages go in and out through `unexp`'s methods, which charge them.
    matcher: Matcher<Posted, Unexp>,
    /// Eager messages still arriving, by (sender worker, message id).
    incoming: crate::proto::reasm::Reassembler<Rc<RefCell<Incoming>>>,
    sync: ucs::hash::FastMap<u64, SyncWait>,
    next_req: u64,
    unexp_budget: crate::proto::budget::Budget,
}

/// Ends whatever depended on endpoint `ep_id` to `peer`: its synchronous sends, its unexpected
/// rendezvous announcements, and messages from that worker still arriving (a posted receive
/// they fill completes with `e`).
pub(crate) fn fail_ep(w: &WorkerInner, ep_id: u64, peer: u64, e: &Error) {
    let (syncs, arriving) = {
        let mut t = w.tag.borrow_mut();
        let ids: Vec<u64> = t
            .sync
            .iter()
            .filter(|(_, s)| s.ep_id == ep_id)
            .map(|(k, _)| *k)
            .collect();
        let syncs: Vec<SyncWait> = ids.iter().filter_map(|id| t.sync.remove(id)).collect();
        let arriving = t.incoming.remove_peer(&w.reasm.budget, peer);
        // Announcements through it can no longer be fetched (their descriptors drop without
        // an ATS: the endpoint is not usable).
        t.retain_unexp(|u| !matches!(u, Unexp::Rndv(d) if d.ep_id() == ep_id));
        (syncs, arriving)
    };
    for s in syncs {
        s.done.complete(Err(e.clone()));
    }
    for inc in arriving {
        drop_incoming(w, &inc, e.clone());
    }
}

/// Ends a message that left reassembly unfinished (its peer failed, it stalled or broke the
/// rules): the posted receive it was filling completes with `e`; unexpected, it leaves the
/// unexpected queue (no receive may match a message that will never be whole).
fn drop_incoming(w: &WorkerInner, inc: &Rc<RefCell<Incoming>>, e: Error) {
    let target = std::mem::replace(&mut inc.borrow_mut().target, Target::Gone);
    match target {
        Target::Posted(p) => p.done.complete(Err(e)),
        Target::Unexp(_) => {
            w.tag
                .borrow_mut()
                .retain_unexp(|u| !matches!(u, Unexp::Eager(i) if Rc::ptr_eq(i, inc)));
        }
        Target::Gone => {}
    }
}

/// The reassembly stall timer ticked: messages that stopped arriving are dropped.
pub(crate) fn reasm_tick(w: &WorkerInner) {
    let gone = w.tag.borrow_mut().incoming.tick(&w.reasm.budget);
    for (key, inc) in gone {
        let e = crate::proto::reasm::Reassembler::<()>::stalled(&w.reasm.timer, key);
        crate::wire::violation("tag message", &e);
        drop_incoming(w, &inc, e);
    }
}

/// Messages under reassembly.
pub(crate) fn reasm_len(w: &WorkerInner) -> usize {
    w.tag.borrow().incoming.len()
}

/// Nothing under reassembly (the stall timer may stop).
pub(crate) fn reasm_idle(w: &WorkerInner) -> bool {
    w.tag.borrow().incoming.is_empty()
}

/// A synchronous send's data left (or failed to).
pub(crate) fn sync_sent(w: &WorkerInner, req: u64, r: Result<()>) {
    sync_progress(w, req, true, r);
}

/// Completes synchronous send `req`: its data left (`sent`) or the receiver matched it.
fn sync_progress(w: &WorkerInner, req: u64, sent: bool, r: Result<()>) {
    let done = {
        let mut t = w.tag.borrow_mut();
        let Some(s) = t.sync.get_mut(&req) else { return };
        if sent {
            s.sent = true;
        } else {
            s.acked = true;
        }
        if r.is_err() || (s.sent && s.acked) {
            t.sync.remove(&req)
        } else {
            None
        }
    };
    if let Some(s) = done {
        s.done.complete(r);
    }
}
