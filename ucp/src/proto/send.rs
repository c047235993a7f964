//! The one send path: active messages, tag messages and stream bytes alike take the protocol
//! [`select`] gives them and are executed here — rendezvous, zero-copy, short, bcopy, or
//! queued (whole or in pieces) when the lane has no room or the message needs several.
//! What differs between operations is only their prefixes and uct AM ids ([`Head`]).

use std::rc::Rc;

use ucs::{Error, Result, Status};

use super::op::{copy, Done, SendOp};
use super::payload::{give_back, Held};
use super::select::{self, select, Force, Msg, Op};
use crate::ep::EpInner;
use crate::request::{request, Completer, Issued};
use crate::tag::wire::SyncFrom;
use crate::wire::{self, am_id, AmHeader, ReplyTo, FLAG_REPLY};
use crate::AmProto as Proto;
use uct::LentBytes;

/// The longest prefix a message starts with (a tag first fragment's).
const MAX_PREFIX: usize = crate::tag::wire::FIRST_LEN;

/// What identifies a message on the wire, per operation.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Head {
    Am { id: u16, reply: bool },
    Tag(u64),
    TagSync(u64, SyncFrom),
    Stream,
}

impl Head {
    pub(crate) fn op(self) -> Op {
        match self {
            Head::Am { reply, .. } => Op::Am { reply },
            Head::Tag(_) => Op::Tag,
            Head::TagSync(..) => Op::TagSync,
            Head::Stream => Op::Stream,
        }
    }

    /// The uct AM ids of a whole message, a first and a later fragment.
    fn ids(self) -> (u8, u8, u8) {
        match self {
            Head::Am { .. } => (am_id::SINGLE, am_id::FIRST, am_id::MIDDLE),
            Head::Tag(_) => (am_id::TAG_EAGER, am_id::TAG_FIRST, am_id::TAG_MIDDLE),
            Head::TagSync(..) => (am_id::TAG_SYNC, am_id::TAG_FIRST, am_id::TAG_MIDDLE),
            Head::Stream => (am_id::STREAM, am_id::STREAM, am_id::STREAM),
        }
    }

    fn am_header(id: u16, reply: bool, header: &[u8]) -> Result<AmHeader> {
        Ok(AmHeader {
            id,
            flags: if reply { FLAG_REPLY } else { 0 },
            user_hdr_len: u32::try_from(header.len())
                .map_err(|_| Error::new(Status::InvalidParam, "ucp: AM header longer than 4 GiB"))?,
        })
    }

    /// The prefix of a message sent whole when it is one 8-byte word and no user header
    /// follows (a tag message; an active message without reply fields): the word.
    #[inline(always)]
    fn short_word(self) -> Option<u64> {
        match self {
            Head::Tag(tag) => Some(tag),
            Head::Am { id, reply: false } => Some(
                AmHeader {
                    id,
                    flags: 0,
                    user_hdr_len: 0,
                }
                .word(),
            ),
            _ => None,
        }
    }

    /// The prefix of a message sent whole.
    fn single_prefix(self, ep: &EpInner, header: &[u8], out: &mut [u8; MAX_PREFIX]) -> Result<usize> {
        Ok(match self {
            Head::Am { id, reply } => {
                let hdr = Self::am_header(id, reply, header)?;
                let to = reply.then(|| ReplyTo {
                    worker: ep.remote_self_id(),
                    ep: ep.id.get(),
                });
                wire::put_single_prefix(out, hdr, to)
            }
            Head::Tag(tag) => {
                out[..8].copy_from_slice(&tag.to_le_bytes());
                8
            }
            Head::TagSync(tag, from) => {
                crate::tag::wire::put_sync_prefix(out, tag, from);
                crate::tag::wire::SYNC_LEN
            }
            Head::Stream => stream_prefix(ep, out),
        })
    }

    /// The prefix of the first of several messages of `total` payload bytes.
    fn first_prefix(
        self,
        ep: &EpInner,
        header: &[u8],
        worker: u64,
        msg_id: u64,
        total: usize,
    ) -> Result<Vec<u8>> {
        let mut p = [0u8; MAX_PREFIX];
        let n = match self {
            Head::Am { id, reply } => {
                let hdr = Self::am_header(id, reply, header)?;
                let reply_ep = reply.then(|| ep.id.get());
                wire::put_first_prefix(&mut p, hdr, worker, msg_id, total as u64, reply_ep)
            }
            Head::Tag(tag) => tag_first(&mut p, tag, None, worker, msg_id, total),
            Head::TagSync(tag, from) => tag_first(&mut p, tag, Some(from), worker, msg_id, total),
            Head::Stream => stream_prefix(ep, &mut p),
        };
        Ok(p[..n].to_vec())
    }

    /// The RTS's AM id and header word.
    fn rts(self, header: &[u8]) -> Result<(u8, u64)> {
        match self {
            Head::Am { id, reply } => Ok((am_id::RTS, Self::am_header(id, reply, header)?.word())),
            Head::Tag(tag) | Head::TagSync(tag, _) => Ok((am_id::TAG_RTS, tag)),
            Head::Stream => Err(Error::new(Status::Unsupported, "ucp: streams have no rendezvous")),
        }
    }
}

/// A tag first fragment's prefix (with the synchronous sender's request, `from`).
fn tag_first(
    out: &mut [u8; MAX_PREFIX],
    tag: u64,
    from: Option<SyncFrom>,
    worker: u64,
    msg_id: u64,
    total: usize,
) -> usize {
    let first = crate::tag::wire::First {
        tag,
        worker,
        msg_id,
        total: total as u64,
        req: from.map_or(0, |s| s.req),
        ep: from.map_or(0, |s| s.ep),
        data: &[],
    };
    *out = first.prefix();
    out.len()
}

/// A stream message's prefix: our worker, our endpoint.
fn stream_prefix(ep: &EpInner, out: &mut [u8]) -> usize {
    out[..8].copy_from_slice(&ep.remote_self_id().to_le_bytes());
    out[8..16].copy_from_slice(&ep.id.get().to_le_bytes());
    crate::stream::PREFIX_LEN
}

/// A message: what identifies it, the application's header (active messages), the choice
/// the caller forces.
pub(crate) struct Message<'a> {
    pub head: Head,
    pub header: &'a [u8],
    pub force: Force,
}

/// A payload the send path takes: borrowed (copied where it must outlive the call) or a
/// buffer handed over ([`Lend`]: read in place, zero-copy where the lane allows, given back
/// on completion).
pub(crate) trait Payload: Sized {
    /// What the completed send gives back.
    type Back: 'static;
    fn bytes(&self) -> &[u8];
    /// The caller lends the buffer until completion.
    fn lent(&self) -> bool;
    /// What a send that outlives the call holds.
    fn into_held(self) -> Held;
    /// What a send finished in the call gives back.
    fn back(self) -> Self::Back;
    /// The completion of a send that outlives the call.
    fn done(c: Completer<Self::Back>) -> Done;
}

impl Payload for &[u8] {
    type Back = ();
    fn bytes(&self) -> &[u8] {
        self
    }
    fn lent(&self) -> bool {
        false
    }
    fn into_held(self) -> Held {
        Held::Copy(self.to_vec())
    }
    fn back(self) {}
    fn done(c: Completer<()>) -> Done {
        Done::Unit(c)
    }
}

/// A buffer the caller lends for the send.
pub(crate) struct Lend<B>(pub B);

impl<B: LentBytes> Payload for Lend<B> {
    type Back = B;
    fn bytes(&self) -> &[u8] {
        self.0.lent_bytes()
    }
    fn lent(&self) -> bool {
        true
    }
    fn into_held(self) -> Held {
        Held::Lent(Box::new(self.0))
    }
    fn back(self) -> B {
        self.0
    }
    fn done(c: Completer<B>) -> Done {
        give_back(c)
    }
}

/// A buffer the send path made (an io-vector gathered, a generic datatype packed): owned by
/// the send, read in place as a lent buffer would be.
pub(crate) struct Staged(pub Vec<u8>);

impl Payload for Staged {
    type Back = ();
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn lent(&self) -> bool {
        true
    }
    fn into_held(self) -> Held {
        Held::Copy(self.0)
    }
    fn back(self) {}
    fn done(c: Completer<()>) -> Done {
        Done::Unit(c)
    }
}

/// The protocol `m` with `len` payload bytes takes on `ep` (`lent`: the buffer is handed
/// over).
pub(crate) fn protocol(ep: &EpInner, m: &Message<'_>, len: usize, lent: bool) -> Proto {
    select(
        &ep.route.limits,
        &Msg {
            op: m.head.op(),
            header_len: m.header.len(),
            len,
            lent,
            force: m.force,
        },
    )
}

/// [`send`]'s most common case, taken before the selection: a copied (not lent) message with
/// no header whose prefix is one 8-byte word ([`Head::short_word`]), which [`select`] would
/// send `Short`, on a lane that can send now: one `am_short`. `None`: not that case, or no
/// room (the general path then queues it).
#[inline(always)]
fn try_short<P: Payload>(ep: &EpInner, m: &Message<'_>, data: &P) -> Option<Result<()>> {
    if data.lent() || !m.header.is_empty() || m.force == Force::Rndv {
        return None;
    }
    let word = m.head.short_word()?;
    let (l, bytes) = (&ep.route.limits, data.bytes());
    if bytes.len() >= l.rndv_thresh || bytes.len() + 8 > l.max_short || !ep.can_send_now() {
        return None;
    }
    debug_assert_eq!(protocol(ep, m, bytes.len(), false), Proto::Short);
    match ep.am_ep().am_short(m.head.ids().0, word, bytes) {
        Err(e) if e == Status::NoResource => None,
        r => Some(r),
    }
}

/// Sends `m` with `data` by the protocol [`select`] gives it: `Done` when it went out in the
/// call, else the request completes when it is sent (for a rendezvous: fetched).
#[inline(always)]
pub(crate) fn send<P: Payload>(ep: &Rc<EpInner>, m: &Message<'_>, data: P) -> Result<Issued<P::Back>> {
    match try_short(ep, m, &data) {
        Some(r) => r.map(|()| Issued::Done(data.back())),
        None => send_selected(ep, m, data),
    }
}

/// [`send`] past its short case.
fn send_selected<P: Payload>(ep: &Rc<EpInner>, m: &Message<'_>, data: P) -> Result<Issued<P::Back>> {
    let proto = protocol(ep, m, data.bytes().len(), data.lent());
    if m.force == Force::Rndv && proto != Proto::Rndv {
        return Err(rts_too_big(ep, m.header));
    }
    let (single, _, _) = m.head.ids();
    let mut p = [0u8; MAX_PREFIX];
    let data = match proto {
        Proto::Rndv => {
            let (rts_id, word) = m.head.rts(m.header)?;
            let (req, c) = request(&ep.worker);
            return match crate::rndv::start(ep, rts_id, word, m.header, data.into_held(), P::done(c))? {
                Ok(op) => ep.send_op(op, req),
                // The announcement did not fit after all (a larger rkey than the lane's
                // maximum): eagerly, completing the same request.
                Err((data, done)) => {
                    let op = queued(ep, m, data, done)?;
                    ep.send_op(op, req)
                }
            };
        }
        Proto::Zcopy if ep.can_send_now() => {
            let n = m.head.single_prefix(ep, m.header, &mut p)?;
            let prefix = [&p[..n], m.header].concat();
            let (mut req, c) = request(&ep.worker);
            return match ep.zcopy(single, &prefix, data.into_held(), P::done(c))? {
                Ok(true) => match req.take() {
                    Some(r) => r.map(Issued::Done),
                    None => Ok(Issued::Pending(req)),
                },
                Ok(false) => Ok(Issued::Pending(req)),
                // No room, or no registration: queued, sent by copy.
                Err((data, done)) => {
                    let op = queued(ep, m, data, done)?;
                    ep.send_op(op, req)
                }
            };
        }
        Proto::Short | Proto::Bcopy if ep.can_send_now() => {
            let n = m.head.single_prefix(ep, m.header, &mut p)?;
            let (prefix, bytes) = (&p[..n], data.bytes());
            let lane = ep.am_ep();
            let r = if proto == Proto::Bcopy {
                lane.am_bcopy(single, |b| copy(b, &[prefix, m.header, bytes]))
                    .map(|_| ())
            } else if n == 8 && m.header.is_empty() {
                let word = u64::from_le_bytes(p[..8].try_into().expect("8 bytes"));
                lane.am_short(single, word, bytes)
            } else {
                lane.am_short_iov(single, &[prefix, m.header, bytes])
            };
            match r {
                Ok(()) => return Ok(Issued::Done(data.back())),
                Err(e) if e == Status::NoResource => data,
                Err(e) => return Err(e),
            }
        }
        _ => data,
    };
    let (req, c) = request(&ep.worker);
    let op = queued(ep, m, data.into_held(), P::done(c))?;
    ep.send_op(op, req)
}

/// The queued form of an eager message: one transport message when it fits, else pieces
/// (fragments; a stream's independent messages).
pub(crate) fn queued(ep: &EpInner, m: &Message<'_>, data: Held, done: Done) -> Result<SendOp> {
    let (single, first, middle) = m.head.ids();
    let op = m.head.op();
    let l = &ep.route.limits;
    let mut p = [0u8; MAX_PREFIX];
    let n = m.head.single_prefix(ep, m.header, &mut p)?;
    if n + m.header.len() + data.len() <= l.max_bcopy {
        return Ok(SendOp::whole(single, [&p[..n], m.header].concat(), data, done));
    }
    if op == Op::Stream {
        let mut prefix = [0u8; crate::stream::PREFIX_LEN];
        prefix.copy_from_slice(&p[..crate::stream::PREFIX_LEN]);
        let (Done::Unit(c), Held::Copy(data)) = (done, data) else {
            unreachable!("stream sends copy their bytes and complete a request")
        };
        return Ok(SendOp::stream(crate::stream::StreamOp::new(prefix, data), c));
    }
    if !select::header_fits(l, op, m.header.len()) {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: AM header of {} bytes does not fit the {}-byte segment of the AM lane",
                m.header.len(),
                l.max_bcopy
            ),
        ));
    }
    let w = ep
        .worker
        .upgrade()
        .ok_or_else(|| Error::new(Status::NotConnected, "ucp: the worker is gone"))?;
    let msg_id = w.next_msg_id.get();
    w.next_msg_id.set(msg_id + 1);
    let prefix = m.head.first_prefix(ep, m.header, w.uuid, msg_id, data.len())?;
    Ok(SendOp::frags(
        (first, middle),
        prefix,
        m.header.to_vec(),
        data,
        msg_id,
        w.uuid,
        done,
    ))
}

fn rts_too_big(ep: &EpInner, header: &[u8]) -> Error {
    Error::new(
        Status::InvalidParam,
        format!(
            "ucp: AmFlags::RNDV with a {}-byte header: the announcement does not fit the {}-byte \
             segment of the AM lane (shorten the header or send eagerly)",
            header.len(),
            ep.route.limits.max_bcopy
        ),
    )
}
