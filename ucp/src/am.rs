//! Active messages: the application's handlers, the send calls (executed by
//! [`crate::proto::send`]) and the receive side (delivery, reassembly).
//!
//! A message is `(id, header, data)`. It goes as one transport message when it fits the AM
//! lane (short, then bcopy; zero-copy for an owned buffer from the zcopy threshold up), else
//! as fragments on the AM lane: a first fragment with the total length and the header, then
//! middles with their offsets, reassembled by the receiver in one buffer. All fragments take
//! the same lane, so they arrive in order; anything else is a protocol violation (the partial
//! message is dropped, with a log line).

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Error, Result, Status};
use uct::{AmMessage, RxDesc};

use crate::ep::Ep;
use crate::request::Issued;
use crate::wire::{self, ReplyTo};
use crate::worker::WorkerInner;

/// Largest message a receiver reassembles.
pub(crate) const MAX_MESSAGE: u64 = 1 << 36;

// ------------------------------------------------------------------------------ handlers

type HandlerFn = dyn FnMut(&mut AmMsg<'_>);

/// An application handler (shared, so one may be replaced while it runs) and how it takes
/// rendezvous messages.
pub(crate) struct AmHandler(Rc<RefCell<Box<HandlerFn>>>, AmHandlerFlags);

impl AmHandler {
    pub fn new(flags: AmHandlerFlags, f: impl FnMut(&mut AmMsg<'_>) + 'static) -> AmHandler {
        AmHandler(Rc::new(RefCell::new(Box::new(f))), flags)
    }
}

/// How a handler receives its messages ([`crate::Worker::set_am_handler_with`]).
///
/// The default (no flag, what [`crate::Worker::set_am_handler`] installs): every message
/// reaches the handler with all its data in [`AmMsg::data`], whatever its size and protocol.
/// The worker fetches a rendezvous message's data into a buffer it allocates and calls the
/// handler once the data is in (so such a message may reach the handler after smaller ones
/// its sender sent later).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmHandlerFlags(u8);

impl AmHandlerFlags {
    /// Rendezvous messages reach the handler when announced, in their sender's order, with
    /// the data still at the sender (UCX's `UCP_AM_RECV_ATTR_FLAG_RNDV`): [`AmMsg::is_rndv`]
    /// is true, [`AmMsg::data`] empty, and the handler takes [`AmMsg::take_data_desc`] to
    /// fetch the data into a buffer of its own ([`crate::Worker::am_recv_data`]), e.g. one it
    /// reuses, with no copy beyond the transfer itself.
    pub const RNDV_DESC: AmHandlerFlags = AmHandlerFlags(1);

    /// True when every flag of `o` is in `self`.
    pub fn contains(self, o: AmHandlerFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl std::ops::BitOr for AmHandlerFlags {
    type Output = AmHandlerFlags;
    fn bitor(self, o: AmHandlerFlags) -> AmHandlerFlags {
        AmHandlerFlags(self.0 | o.0)
    }
}

/// The handlers, indexed by id (ids are small in practice; the table grows to the largest).
#[derive(Default)]
pub(crate) struct AmHandlers {
    by_id: Vec<Option<AmHandler>>,
    warned: Vec<u16>,
}

impl AmHandlers {
    pub fn set(&mut self, id: u16, h: AmHandler) {
        let i = usize::from(id);
        if i >= self.by_id.len() {
            self.by_id.resize_with(i + 1, || None);
        }
        self.by_id[i] = Some(h);
    }

    pub fn clear(&mut self, id: u16) {
        if let Some(h) = self.by_id.get_mut(usize::from(id)) {
            *h = None;
        }
    }

    #[inline]
    fn get(&self, id: u16) -> Option<&AmHandler> {
        self.by_id.get(usize::from(id)).and_then(Option::as_ref)
    }
}

/// Send flags of [`Ep::am_send`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmFlags(u8);

impl AmFlags {
    /// The receiver's handler gets an endpoint back to the sender ([`AmMsg::reply_ep`]).
    pub const REPLY: AmFlags = AmFlags(1);
    /// Eager protocols only (never rendezvous).
    pub const EAGER: AmFlags = AmFlags(2);
    /// Rendezvous whatever the size: the receiver fetches the data into a buffer it gives
    /// ([`crate::Worker::am_recv_data`]). Not together with `EAGER`.
    pub const RNDV: AmFlags = AmFlags(4);

    /// True when every flag of `o` is set in `self`.
    pub fn contains(self, o: AmFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl std::ops::BitOr for AmFlags {
    type Output = AmFlags;
    fn bitor(self, o: AmFlags) -> AmFlags {
        AmFlags(self.0 | o.0)
    }
}

/// The protocol an active message goes with ([`Ep::am_protocol`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmProto {
    /// Inline in one `am_short` (header and data copied into the send itself).
    Short,
    /// Copied into one transport buffer (`am_bcopy`).
    Bcopy,
    /// Sent from the application's buffer, registered for the send (`am_zcopy`; owned sends).
    Zcopy,
    /// Split into this many segments, each copied (`am_bcopy`) and reassembled by the receiver.
    Fragments(usize),
    /// Announced (RTS); the receiver fetches the data with `get_zcopy` or asks for it in
    /// pieces on the AM lane.
    Rndv,
    /// Not chosen yet: the endpoint is still connecting
    /// ([`Worker::connect_sockaddr`](crate::Worker::connect_sockaddr)); the message waits and
    /// takes the protocol its lanes give it then.
    Queued,
}

impl std::fmt::Display for AmProto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AmProto::Short => f.write_str("eager short"),
            AmProto::Bcopy => f.write_str("eager bcopy"),
            AmProto::Zcopy => f.write_str("eager zcopy"),
            AmProto::Fragments(n) => write!(f, "eager bcopy, {n} fragments"),
            AmProto::Rndv => f.write_str("rendezvous"),
            AmProto::Queued => f.write_str("queued until connected"),
        }
    }
}

// ------------------------------------------------------------------------------ received messages

enum Body<'a> {
    /// In the transport's buffer, valid during the handler: `keep` takes its descriptor.
    Lent {
        bytes: &'a [u8],
        msg: &'a AmMessage<'a>,
        start: usize,
    },
    /// Reassembled into a buffer of our own (empty once kept).
    Owned(Vec<u8>),
    /// Rendezvous: the data is still at the sender (the descriptor, until taken; the length).
    Rndv(Option<crate::rndv::AmDataDesc>, usize),
}

/// An active message as its handler sees it.
pub struct AmMsg<'a> {
    id: u16,
    header: &'a [u8],
    body: Body<'a>,
    reply: Option<Ep>,
}

/// Message data kept beyond the handler ([`AmMsg::keep`]).
pub struct AmData(Kept);

enum Kept {
    Desc { desc: RxDesc, start: usize, len: usize },
    Vec(Vec<u8>),
}

impl std::ops::Deref for AmData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Kept::Desc { desc, start, len } => &desc[*start..*start + *len],
            Kept::Vec(v) => v,
        }
    }
}

impl std::fmt::Debug for AmData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AmData({} bytes)", self.len())
    }
}

impl<'a> AmMsg<'a> {
    /// The application's AM id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The sender's header (valid during the handler).
    pub fn header(&self) -> &[u8] {
        self.header
    }

    /// The data, all of it (valid during the handler; [`AmMsg::keep`] keeps it). Only for a
    /// handler installed with [`AmHandlerFlags::RNDV_DESC`] is it empty for a rendezvous
    /// message ([`AmMsg::is_rndv`]), whose data that handler fetches with
    /// [`AmMsg::take_data_desc`].
    pub fn data(&self) -> &[u8] {
        match &self.body {
            Body::Lent { bytes, .. } => bytes,
            Body::Owned(v) => v,
            Body::Rndv(..) => &[],
        }
    }

    /// Length of the data (a rendezvous message's too).
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Rndv(_, n) => *n,
            _ => self.data().len(),
        }
    }

    /// True for a message without data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the data is still at the sender (a rendezvous message, for a handler
    /// installed with [`AmHandlerFlags::RNDV_DESC`]; never for the others).
    pub fn is_rndv(&self) -> bool {
        matches!(self.body, Body::Rndv(..))
    }

    /// The descriptor of a rendezvous message's data, for [`crate::Worker::am_recv_data`]
    /// (in the handler or later), for a handler installed with [`AmHandlerFlags::RNDV_DESC`];
    /// `None` for other messages, other handlers (their data is in [`AmMsg::data`]) or once
    /// taken. Not taken, the message is discarded when the handler returns and the sender
    /// released.
    pub fn take_data_desc(&mut self) -> Option<crate::rndv::AmDataDesc> {
        match &mut self.body {
            Body::Rndv(d, _) => d.take(),
            _ => None,
        }
    }

    /// Keeps the data beyond the handler: the transport's buffer itself where it lends it, the
    /// reassembled or fetched buffer of a fragmented or rendezvous message (no copy), else a
    /// copy. Afterwards [`AmMsg::data`] is empty for a reassembled or fetched message. Empty
    /// for a message still at the sender ([`AmMsg::is_rndv`]: use [`AmMsg::take_data_desc`]).
    pub fn keep(&mut self) -> AmData {
        match &mut self.body {
            Body::Lent { bytes, msg, start } => {
                let desc = msg.keep();
                if desc.is_zero_copy() {
                    AmData(Kept::Desc {
                        desc,
                        start: *start,
                        len: bytes.len(),
                    })
                } else {
                    AmData(Kept::Vec(bytes.to_vec()))
                }
            }
            Body::Owned(v) => AmData(Kept::Vec(std::mem::take(v))),
            Body::Rndv(..) => AmData(Kept::Vec(Vec::new())),
        }
    }

    /// An endpoint back to the sender, when it sent with [`AmFlags::REPLY`].
    pub fn reply_ep(&self) -> Option<&Ep> {
        self.reply.as_ref()
    }
}

#[inline(always)]
fn deliver(w: &Rc<WorkerInner>, msg: &mut AmMsg<'_>) {
    let h = w.am.borrow().get(msg.id).map(|h| h.0.clone());
    let Some(h) = h else {
        let mut am = w.am.borrow_mut();
        if !am.warned.contains(&msg.id) {
            am.warned.push(msg.id);
            ucs::warn!(
                "ucp: active message id {} has no handler (Worker::set_am_handler): dropped",
                msg.id
            );
        }
        return;
    };
    let Ok(mut f) = h.try_borrow_mut() else {
        ucs::error!(
            "ucp: active message id {} arrived while its handler runs (progress called from inside \
             the handler?): dropped",
            msg.id
        );
        return;
    };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(msg))).is_err() {
        ucs::error!(
            "ucp: panic in the handler of active message id {} (caught)",
            msg.id
        );
    }
}

/// Delivers a rendezvous message (RTS) to its handler: at once, with its descriptor, to a
/// handler that takes descriptors (or to none: the descriptor's drop releases the sender);
/// to the others once the worker fetched the data.
pub(crate) fn deliver_rndv(
    w: &Rc<WorkerInner>,
    id: u16,
    header: &[u8],
    reply: Option<Ep>,
    desc: crate::rndv::AmDataDesc,
) {
    let takes_desc =
        w.am.borrow()
            .get(id)
            .map(|h| h.1.contains(AmHandlerFlags::RNDV_DESC));
    if takes_desc == Some(false) {
        return fetch_then_deliver(w, id, header, reply, desc);
    }
    let n = desc.len();
    let mut msg = AmMsg {
        id,
        header,
        body: Body::Rndv(Some(desc), n),
        reply,
    };
    deliver(w, &mut msg);
}

/// Fetches a rendezvous message's data into a buffer of the worker's, then delivers it whole.
/// A fetch that fails drops the message with a log line (the sender's request fails too, by
/// the ATS); one canceled by the endpoint's or the worker's end drops it quietly.
fn fetch_then_deliver(
    w: &Rc<WorkerInner>,
    id: u16,
    header: &[u8],
    reply: Option<Ep>,
    desc: crate::rndv::AmDataDesc,
) {
    let n = desc.len();
    let worker = Rc::downgrade(w);
    let header = header.to_vec();
    // Weak: the fetch's completion lives in the endpoint's queue, which must not keep it.
    let reply = reply.and_then(|e| e.ready().map(Rc::downgrade));
    let done = move |r: Result<Vec<u8>>| {
        let Some(w) = worker.upgrade() else { return };
        match r {
            Ok(data) => {
                let mut msg = AmMsg {
                    id,
                    header: &header,
                    body: Body::Owned(data),
                    reply: reply.and_then(|e| e.upgrade()).map(Ep::from_inner),
                };
                deliver(&w, &mut msg);
            }
            Err(e) if e == Status::Canceled => {
                ucs::debug!("ucp: active message id {id} ({n} bytes, rendezvous) dropped: {e}");
            }
            Err(e) => ucs::warn!(
                "ucp: active message id {id} ({n} bytes, rendezvous) dropped: fetching its data: {e}"
            ),
        }
    };
    match crate::rndv::recv_data_vec(w, desc, Vec::new()) {
        Ok(fetch) => fetch.on_complete(done),
        Err(e) => done(Err(e)),
    }
}

fn reply_ep(w: &WorkerInner, worker: u64, ep: u64) -> Option<Ep> {
    let t = w.eps.borrow();
    let id = t.by_remote.get(&(worker, ep))?;
    t.get(*id).map(Ep::from_inner)
}

use crate::proto::reasm::Reassembler;
use crate::wire::violation;

pub(crate) fn on_single(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let bytes = m.data();
    let s = match wire::decode_single(bytes) {
        Ok(s) => s,
        Err(e) => return violation("active message", &e),
    };
    let reply = s.reply.and_then(|r| reply_ep(w, r.worker, r.ep));
    let start = bytes.len() - s.data.len();
    let mut msg = AmMsg {
        id: s.hdr.id,
        header: s.user_hdr,
        body: Body::Lent {
            bytes: s.data,
            msg: m,
            start,
        },
        reply,
    };
    deliver(w, &mut msg);
}

/// A message being reassembled: its buffer is ours (the reassembler's target).
pub(crate) struct Partial {
    id: u16,
    header: Vec<u8>,
    reply: Option<ReplyTo>,
    data: Vec<u8>,
}

/// Bytes a partial message holds (charged to its peer's reassembly budget).
fn held(p: &Partial) -> usize {
    p.data.capacity() + p.header.capacity()
}

/// A first fragment: its fields from a copy of its head, its user header and data copied
/// once out of the message (which may lie in shared memory) into the reassembly buffer. Only
/// a worker we have an endpoint to starts one, within its reassembly budget.
pub(crate) fn on_first(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let (h, n) = crate::wire::head::<{ wire::FIRST_HEAD_LEN }>(m);
    let f = match wire::decode_first_head(&h[..n], m.len()) {
        Ok(f) => f,
        Err(e) => return violation("first fragment", &e),
    };
    if f.total > MAX_MESSAGE {
        let e = Error::new(
            Status::ExceedsLimit,
            format!("a {}-byte message exceeds {MAX_MESSAGE}", f.total),
        );
        return violation("first fragment", &e);
    }
    if let Err(e) = w.known_peer(f.worker) {
        return violation("first fragment", &e);
    }
    let total = f.total as usize;
    let carried = m.len() - f.data_at;
    let key = (f.worker, f.msg_id);
    // Room for what has arrived, growing with the fragments, charged to the peer's budget.
    let room = crate::proto::reasm::first_room(&w.reasm.budget, total, carried);
    let header_len = f.data_at - f.user_hdr_at;
    if carried < total {
        if let Err(e) = w.am_reasm.borrow().admit(&w.reasm.budget, key, room + header_len) {
            violation("first fragment", &e);
            return crate::worker::fail_peer(w, f.worker, e);
        }
    }
    let mut data = Vec::new();
    if data.try_reserve_exact(room).is_err() {
        let e = Error::new(Status::NoMemory, format!("no memory for a {total}-byte message"));
        return violation("first fragment", &e);
    }
    m.extend_vec(f.data_at, &mut data);
    let mut header = vec![0u8; header_len];
    m.copy_to(f.user_hdr_at, &mut header);
    let p = Partial {
        id: f.hdr.id,
        header,
        reply: f.reply_ep.map(|ep| ReplyTo { worker: f.worker, ep }),
        data,
    };
    if carried == total {
        return deliver_whole(w, p);
    }
    let h = held(&p);
    w.am_reasm
        .borrow_mut()
        .insert(&w.reasm.budget, key, total, carried, h, p);
    w.reasm.timer.arm(&w.uct);
}

/// A later fragment: its data copied once, straight into the reassembly buffer.
pub(crate) fn on_middle(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let (h, n) = crate::wire::head::<{ wire::MIDDLE_PREFIX_LEN }>(m);
    let d = match wire::decode_middle(&h[..n]) {
        Ok(d) => d,
        Err(e) => return violation("fragment", &e),
    };
    let carried = m.len() - wire::MIDDLE_PREFIX_LEN;
    let key = (d.worker, d.msg_id);
    let budget = &w.reasm.budget;
    let settled = {
        let mut r = w.am_reasm.borrow_mut();
        match r.fragment(budget, key, d.offset, carried) {
            Ok(p) => {
                m.extend_vec(wire::MIDDLE_PREFIX_LEN, &mut p.data);
                let h = held(p);
                r.settle(budget, key, h)
            }
            Err(refused) => Err(refused),
        }
    };
    match settled {
        Ok(Some(p)) => deliver_whole(w, p),
        Ok(None) => {}
        Err(refused) => {
            violation("fragment", &refused.error);
            if refused.error.status() == Status::ExceedsLimit {
                crate::worker::fail_peer(w, d.worker, refused.error);
            }
        }
    }
}

/// Drops the messages `peer` was sending (its endpoint failed or closed).
pub(crate) fn fail_peer(w: &WorkerInner, peer: u64) {
    let gone = w.am_reasm.borrow_mut().remove_peer(&w.reasm.budget, peer);
    if !gone.is_empty() {
        ucs::debug!(
            "ucp: {} active messages from worker {peer:#x} dropped unfinished",
            gone.len()
        );
    }
}

/// The stall timer ticked: drops messages that stopped arriving.
pub(crate) fn reasm_tick(w: &WorkerInner) {
    let gone = w.am_reasm.borrow_mut().tick(&w.reasm.budget);
    for (key, _) in gone {
        violation(
            "active message",
            &Reassembler::<Partial>::stalled(&w.reasm.timer, key),
        );
    }
}

fn deliver_whole(w: &Rc<WorkerInner>, p: Partial) {
    let reply = p.reply.and_then(|r| reply_ep(w, r.worker, r.ep));
    let mut msg = AmMsg {
        id: p.id,
        header: &p.header,
        body: Body::Owned(p.data),
        reply,
    };
    deliver(w, &mut msg);
}

// ------------------------------------------------------------------------------ sending

use crate::proto::select::{select, Force, Msg, Op};
use crate::proto::send::{send, Head, Lend, Message};

fn force(flags: AmFlags) -> Force {
    if flags.contains(AmFlags::RNDV) {
        Force::Rndv
    } else if flags.contains(AmFlags::EAGER) {
        Force::Eager
    } else {
        Force::Auto
    }
}

fn message<'a>(id: u16, header: &'a [u8], flags: AmFlags) -> Message<'a> {
    Message {
        head: Head::Am {
            id,
            reply: flags.contains(AmFlags::REPLY),
        },
        header,
        force: force(flags),
    }
}

impl Ep {
    /// The protocol a message with a `header_len`-byte header and `len` bytes of data takes on
    /// this endpoint with `flags` ([`Ep::am_send`]; `owned`: [`Ep::am_send_owned`]), when the
    /// lane has room for it at once: the choice the send itself makes.
    pub fn am_protocol(&self, header_len: usize, len: usize, flags: AmFlags, owned: bool) -> AmProto {
        let Some(ep) = self.ready() else {
            return AmProto::Queued;
        };
        let m = Msg {
            op: Op::Am {
                reply: flags.contains(AmFlags::REPLY),
            },
            header_len,
            len,
            lent: owned,
            force: force(flags),
        };
        select(&ep.route.limits, &m)
    }

    /// Sends active message `id` with `header` and `data` (copied: the buffers are free again
    /// when the call returns). `Done` when it went out in the call; `Pending` when it waits for
    /// the lanes (queued in order; the request completes when it is sent). Any size works:
    /// messages larger than the lane's segment go in fragments.
    pub fn am_send(&self, id: u16, header: &[u8], data: &[u8], flags: AmFlags) -> Result<Issued<()>> {
        check_flags(flags)?;
        let Some(ep) = self.live(crate::Features::AM, "Ep::am_send")? else {
            let (header, data) = (header.to_vec(), data.to_vec());
            return self.defer(move |e| e.am_send(id, &header, &data, flags));
        };
        send(ep, &message(id, header, flags), data)
    }

    /// Sends active message `id` with the io-vector `segments` as its data (gathered at the
    /// call, as [`Ep::tag_send_iov`]).
    pub fn am_send_iov(
        &self,
        id: u16,
        header: &[u8],
        segments: &[&[u8]],
        flags: AmFlags,
    ) -> Result<Issued<()>> {
        let data = crate::datatype::gather(segments)?;
        self.am_send_staged(id, header, data, flags, "Ep::am_send_iov")
    }

    /// Sends active message `id` with what `pack` packs as its data (packed at the call, as
    /// [`Ep::tag_send_packed`]).
    pub fn am_send_packed(
        &self,
        id: u16,
        header: &[u8],
        pack: &mut dyn crate::Pack,
        flags: AmFlags,
    ) -> Result<Issued<()>> {
        let data = crate::datatype::pack_all(pack)?;
        self.am_send_staged(id, header, data, flags, "Ep::am_send_packed")
    }

    fn am_send_staged(
        &self,
        id: u16,
        header: &[u8],
        data: Vec<u8>,
        flags: AmFlags,
        what: &'static str,
    ) -> Result<Issued<()>> {
        check_flags(flags)?;
        let Some(ep) = self.live(crate::Features::AM, what)? else {
            let header = header.to_vec();
            return self.defer(move |e| e.am_send_staged(id, &header, data, flags, what));
        };
        send(ep, &message(id, header, flags), crate::proto::send::Staged(data))
    }

    /// Sends active message `id` from a buffer the caller lends until the send finished:
    /// read in place (zero-copy where the lane allows, from the zcopy threshold up; a
    /// rendezvous registers it for the peer), and given back, as the same value, with the
    /// completion. Any [`uct::LentBytes`] works: a `Vec<u8>`, a `Box<[u8]>`, or an
    /// `Arc<[u8]>` lent to many sends at once (clone it for each).
    ///
    /// ```
    /// # fn main() -> ucs::Result<()> {
    /// use std::sync::Arc;
    /// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let ctx = ucp::Context::builder(uct).build()?;
    /// let w = ucp::Worker::new(&ctx)?;
    /// let got = std::rc::Rc::new(std::cell::Cell::new(0));
    /// let g = got.clone();
    /// w.set_am_handler(1, move |m| g.set(g.get() + m.data().len()))?;
    /// let ep = w.connect(w.address())?;
    /// let buf: Arc<[u8]> = Arc::from(vec![7u8; 100_000]);
    /// let sends: Vec<_> = (0..4)
    ///     .map(|_| ep.am_send_owned(1, &[], buf.clone(), ucp::AmFlags::default()))
    ///     .collect::<ucs::Result<_>>()?;
    /// for s in sends {
    ///     let back = match s {
    ///         ucp::Issued::Done(b) => b,
    ///         ucp::Issued::Pending(r) => r.wait(&w)?,
    ///     };
    ///     assert!(Arc::ptr_eq(&back, &buf));
    /// }
    /// while got.get() < 400_000 {
    ///     w.progress();
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn am_send_owned<B: uct::LentBytes>(
        &self,
        id: u16,
        header: &[u8],
        data: B,
        flags: AmFlags,
    ) -> Result<Issued<B>> {
        check_flags(flags)?;
        let Some(ep) = self.live(crate::Features::AM, "Ep::am_send_owned")? else {
            let header = header.to_vec();
            return self.defer(move |e| e.am_send_owned(id, &header, data, flags));
        };
        send(ep, &message(id, header, flags), Lend(data))
    }
}

pub(crate) fn check_flags(flags: AmFlags) -> Result<()> {
    if flags.contains(AmFlags::RNDV) && flags.contains(AmFlags::EAGER) {
        return Err(Error::new(
            Status::InvalidParam,
            "ucp: AmFlags::RNDV and AmFlags::EAGER together: pick one",
        ));
    }
    Ok(())
}
