//! The receiving side of tag matching: arriving messages (matched to a posted receive, or
//! filed as unexpected), and the application's receives and probes.

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Error, Result, Status};
use uct::AmMessage;

use super::wire::{self, SyncFrom};
use super::{receive_whole, truncated, Incoming, Posted, TagInfo, TagMsg, TagProbe, TagRecvd, Target, Unexp};
use crate::am::MAX_MESSAGE;
use crate::proto::op::{Done, SendOp};
use crate::recv_buf::{Received, RecvBuf, RecvDone};
use crate::request::FromRecv;
use crate::request::{request_from, Issued};
use crate::worker::{Worker, WorkerInner};

use crate::wire::violation;

/// Tells a synchronous sender its message matched.
fn ack(w: &WorkerInner, from: SyncFrom) {
    let Some(ep) = crate::rndv::find_ep(w, from.worker, from.ep) else {
        ucs::warn!(
            "ucp: synchronous tag message from worker {:#x}: no endpoint back to acknowledge it",
            from.worker
        );
        return;
    };
    if ep.check_usable().is_err() {
        return;
    }
    let bytes = wire::encode_ack(from.req, w.uuid);
    ep.queue.borrow_mut().push_back(SendOp::control(
        crate::wire::am_id::TAG_SYNC_ACK,
        bytes,
        Done::Nothing,
    ));
    ep.dispatch();
}

/// A whole eager message arrived (single, plain or synchronous): its data is `m` from `at`
/// on, copied once, into the posted buffer or the unexpected message (the message may still
/// lie in shared memory: these handlers take `AmCbFlags::SHARED_DATA`).
#[inline(always)]
fn on_whole(w: &Rc<WorkerInner>, tag: u64, m: &AmMessage<'_>, at: usize, sync: Option<SyncFrom>) {
    let posted = w.tag.borrow_mut().matcher.take_expected(tag);
    match posted {
        Some(mut p) => {
            if let Some(from) = sync {
                ack(w, from);
            }
            p.buf.put_msg(0, m, at);
            p.complete(tag, m.len() - at);
        }
        None => {
            let mut data = Vec::new();
            m.extend_vec(at, &mut data);
            let refused = w.tag.borrow_mut().push_unexp(tag, Unexp::Whole(data, sync));
            if let Err((e, _dropped)) = refused {
                violation("unexpected tag message (dropped)", &e);
            }
        }
    }
}

pub(crate) fn on_eager(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let mut h = [0u8; wire::EAGER_LEN];
    let n = m.copy_to(0, &mut h);
    match wire::decode_eager(&h[..n]) {
        Ok((tag, _)) => on_whole(w, tag, m, wire::EAGER_LEN, None),
        Err(e) => violation("tag message", &e),
    }
}

pub(crate) fn on_sync(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let mut h = [0u8; wire::SYNC_LEN];
    let n = m.copy_to(0, &mut h);
    match wire::decode_sync(&h[..n]) {
        Ok((tag, from, _)) => on_whole(w, tag, m, wire::SYNC_LEN, Some(from)),
        Err(e) => violation("synchronous tag message", &e),
    }
}

/// A first fragment: its fields from a copy of its head, its data copied once out of the
/// message (which may lie in shared memory), into the posted buffer or the unexpected one.
pub(crate) fn on_first(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let (h, n) = crate::wire::head::<{ wire::FIRST_LEN }>(m);
    let f = match wire::decode_first_head(&h[..n], m.len()) {
        Ok(f) => f,
        Err(e) => return violation("tag first fragment", &e),
    };
    let carried = m.len() - wire::FIRST_LEN;
    if f.total > MAX_MESSAGE {
        let e = Error::new(
            Status::ExceedsLimit,
            format!("a {}-byte message exceeds {MAX_MESSAGE}", f.total),
        );
        return violation("tag first fragment", &e);
    }
    if let Err(e) = w.known_peer(f.worker) {
        return violation("tag first fragment", &e);
    }
    let total = f.total as usize;
    let key = (f.worker, f.msg_id);
    let budget = &w.reasm.budget;
    // Grows with the fragments. Admitted (charged as if unexpected) before it takes a
    // posted receive or memory.
    let room = crate::proto::reasm::first_room(budget, total, carried);
    if carried < total {
        if let Err(e) = w.tag.borrow().incoming.admit(budget, key, room) {
            violation("tag first fragment", &e);
            return crate::worker::fail_peer(w, f.worker, e);
        }
    }
    let posted = w.tag.borrow_mut().matcher.take_expected(f.tag);
    let target = match posted {
        Some(mut p) => {
            if let Some(from) = f.sync_from() {
                ack(w, from);
            }
            p.buf.put_msg(0, m, wire::FIRST_LEN);
            Target::Posted(p)
        }
        None => {
            let mut v = Vec::new();
            if v.try_reserve_exact(room).is_err() {
                let e = Error::new(Status::NoMemory, format!("no memory for a {total}-byte message"));
                return violation("tag first fragment", &e);
            }
            m.extend_vec(wire::FIRST_LEN, &mut v);
            Target::Unexp(v)
        }
    };
    let matched = matches!(target, Target::Posted(_));
    let held = target.held();
    let inc = Rc::new(RefCell::new(Incoming {
        tag: f.tag,
        peer: f.worker,
        unexp_charged: 0,
        total,
        received: carried,
        target,
        sync: if matched { None } else { f.sync_from() },
    }));
    let mut t = w.tag.borrow_mut();
    if carried < total {
        t.incoming.insert(budget, key, total, carried, held, inc.clone());
    }
    if !matched {
        if let Err((e, _)) = t.push_unexp(f.tag, Unexp::Eager(inc)) {
            t.incoming.remove(budget, key);
            drop(t);
            violation("tag first fragment", &e);
            return crate::worker::fail_peer(w, f.worker, e);
        }
    } else if carried == total {
        drop(t);
        finish(inc);
        return;
    }
    drop(t);
    if carried < total {
        w.reasm.timer.arm(&w.uct);
    }
}

/// Completes a fully arrived message's posted receive, if it has one.
fn finish(inc: Rc<RefCell<Incoming>>) {
    let (tag, total, target) = {
        let mut i = inc.borrow_mut();
        if !matches!(i.target, Target::Posted(_)) {
            return;
        }
        (i.tag, i.total, std::mem::replace(&mut i.target, Target::Gone))
    };
    if let Target::Posted(p) = target {
        p.complete(tag, total);
    }
}

/// A later fragment: its data copied once, to where the message goes.
pub(crate) fn on_middle(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    use crate::wire::MIDDLE_PREFIX_LEN;
    let (h, n) = crate::wire::head::<MIDDLE_PREFIX_LEN>(m);
    let d = match crate::wire::decode_middle(&h[..n]) {
        Ok(d) => d,
        Err(e) => return violation("tag fragment", &e),
    };
    let carried = m.len() - MIDDLE_PREFIX_LEN;
    let key = (d.worker, d.msg_id);
    let budget = &w.reasm.budget;
    let fragment = w
        .tag
        .borrow_mut()
        .incoming
        .fragment(budget, key, d.offset, carried)
        .map(|inc| inc.clone());
    let inc = match fragment {
        Ok(inc) => inc,
        Err(r) => {
            violation("tag fragment", &r.error);
            if let Some(inc) = r.target {
                super::drop_incoming(w, &inc, r.error);
            }
            return;
        }
    };
    // Copied with no table borrowed: an unpacking receive runs the application's code.
    let held = {
        let mut i = inc.borrow_mut();
        let at = i.received;
        match &mut i.target {
            Target::Posted(p) => p.buf.put_msg(at, m, MIDDLE_PREFIX_LEN),
            Target::Unexp(v) => m.extend_vec(MIDDLE_PREFIX_LEN, v),
            Target::Gone => {}
        }
        i.received += carried;
        i.target.held()
    };
    let settled = w.tag.borrow_mut().incoming.settle(budget, key, held);
    match settled {
        Ok(Some(inc)) => {
            let charged = w.tag.borrow().charge_whole(&inc);
            if let Err(e) = charged {
                violation("tag fragment", &e);
                super::drop_incoming(w, &inc, e.clone());
                return crate::worker::fail_peer(w, d.worker, e);
            }
            finish(inc)
        }
        Ok(None) => {}
        Err(r) => {
            violation("tag fragment", &r.error);
            if let Some(inc) = r.target {
                super::drop_incoming(w, &inc, r.error.clone());
            }
            crate::worker::fail_peer(w, d.worker, r.error);
        }
    }
}

pub(crate) fn on_rts(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let r = match crate::rndv::wire::decode_tag_rts(m.data()) {
        Ok(r) => r,
        Err(e) => return violation("tag rendezvous RTS", &e),
    };
    let Some(desc) = crate::rndv::desc_for(w, &r) else {
        return;
    };
    let tag = r.word;
    let posted = w.tag.borrow_mut().matcher.take_expected(tag);
    let Some(p) = posted else {
        let refused = w.tag.borrow_mut().push_unexp(tag, Unexp::Rndv(desc));
        if let Err((e, desc)) = refused {
            violation("tag rendezvous RTS", &e);
            // Failed first: the dropped descriptor then tells the sender nothing.
            crate::worker::fail_peer(w, r.worker, e);
            drop(desc);
        }
        return;
    };
    bind(w, tag, Unexp::Rndv(desc), p)
}

pub(crate) fn on_sync_ack(w: &Rc<WorkerInner>, _iface: usize, m: &AmMessage<'_>) {
    let (req, worker) = match wire::decode_ack(m.data()) {
        Ok(a) => a,
        Err(e) => return violation("tag sync acknowledgement", &e),
    };
    let known = w.tag.borrow().sync.get(&req).map(|s| s.peer == worker);
    if known != Some(true) {
        let e = Error::new(
            Status::InvalidParam,
            format!("no synchronous send {req} toward worker {worker:#x}"),
        );
        return violation("tag sync acknowledgement", &e);
    }
    super::sync_progress(w, req, false, Ok(()));
}

/// Gives matched message `msg` its receive `p`.
fn bind(w: &Rc<WorkerInner>, tag: u64, msg: Unexp, mut p: Posted) {
    match msg {
        Unexp::Whole(data, sync) => {
            if let Some(from) = sync {
                ack(w, from);
            }
            p.done.complete(receive_whole(p.buf, tag, &data));
        }
        Unexp::Eager(inc) => {
            let complete = {
                let mut i = inc.borrow_mut();
                if let Some(from) = i.sync.take() {
                    ack(w, from);
                }
                if let Target::Unexp(v) = std::mem::replace(&mut i.target, Target::Gone) {
                    p.buf.put(0, &v);
                }
                i.target = Target::Posted(p);
                i.received == i.total
            };
            if complete {
                finish(inc);
            }
        }
        Unexp::Rndv(desc) => {
            let total = desc.len();
            let room = p.buf.room();
            if total > room {
                // The sender is released (its data is not wanted whole).
                drop(desc);
                return p.done.complete(Err(truncated(total, room)));
            }
            let Posted { buf, done } = p;
            crate::rndv::recv_data(w, desc, buf, RecvDone::Tag(tag, done));
        }
    }
}

/// Posts a receive into `buf` for `(tag, mask)`: its request, cancellable until matched.
#[inline(always)]
fn post<B: 'static>(w: &Rc<WorkerInner>, tag: u64, mask: u64, buf: RecvBuf) -> crate::Request<TagRecvd<B>> {
    let (req, done) = request_from::<Received, TagRecvd<B>>(w);
    let id = w.tag.borrow_mut().matcher.post(tag, mask, Posted { buf, done });
    req.set_cancel(crate::request::Cancel { id });
    req
}

/// A receive into `buf` ([`Worker::tag_recv`], [`Worker::tag_recv_into`]).
#[inline(always)]
fn recv<B: 'static>(w: &Rc<WorkerInner>, tag: u64, mask: u64, buf: RecvBuf) -> Result<Issued<TagRecvd<B>>> {
    if w.tag.borrow().matcher.unexpected_len() == 0 {
        // Nothing arrived unasked (the usual case): post at once.
        return Ok(Issued::Pending(post(w, tag, mask, buf)));
    }
    let found = w.tag.borrow_mut().take_unexp(tag, mask);
    // A whole message already here: copied out, no request needed.
    let found = match found {
        Some((t, Unexp::Whole(data, sync))) => {
            if let Some(from) = sync {
                ack(w, from);
            }
            return receive_whole(buf, t, &data)
                .and_then(TagRecvd::from_recv)
                .map(Issued::Done);
        }
        other => other,
    };
    let Some((t, msg)) = found else {
        return Ok(Issued::Pending(post(w, tag, mask, buf)));
    };
    bound(w, t, msg, buf)
}

/// Message `msg` received into `buf`: done at once, or its request.
fn bound<B: 'static>(w: &Rc<WorkerInner>, tag: u64, msg: Unexp, buf: RecvBuf) -> Result<Issued<TagRecvd<B>>> {
    let (mut req, c) = request_from::<Received, TagRecvd<B>>(w);
    bind(w, tag, msg, Posted { buf, done: c });
    Ok(match req.take() {
        Some(r) => Issued::Done(r?),
        None => Issued::Pending(req),
    })
}

/// Withdraws posted receive `c.id` if no message matched it yet ([`Request::cancel`]).
pub(crate) fn cancel(worker: &std::rc::Weak<WorkerInner>, c: crate::request::Cancel) {
    let Some(w) = worker.upgrade() else { return };
    let p = w.tag.borrow_mut().matcher.cancel(c.id);
    if let Some(p) = p {
        p.done.complete(Err(Error::new(
            Status::Canceled,
            "ucp: the tag receive was canceled",
        )));
    }
}

impl Worker {
    /// Receives a message whose tag matches `tag` under `mask` (`(msg_tag ^ tag) & mask == 0`;
    /// `u64::MAX` compares every bit) into `buf`, which takes up to `buf.len()` bytes and comes
    /// back holding the message. The oldest matching message that already arrived is taken;
    /// else the receive waits for one (`Request::cancel` withdraws it until then).
    #[inline]
    pub fn tag_recv(&self, tag: u64, mask: u64, buf: Vec<u8>) -> Result<Issued<TagRecvd>> {
        self.inner
            .ctx
            .features()
            .require(crate::Features::TAG, "Worker::tag_recv")?;
        recv(&self.inner, tag, mask, RecvBuf::Owned(buf))
    }

    /// [`Worker::tag_recv`] into memory the application lends (a `Vec`, a boxed slice, or
    /// its own [`uct::LentBytesMut`] type): the message lands in its first bytes, in place,
    /// with no zeroing and no reallocation, and the buffer comes back whole with the
    /// message's length ([`TagRecvd::length`]); the bytes after it keep what they held. One
    /// buffer can so serve receive after receive. A message longer than the buffer fails the
    /// receive with `MessageTruncated` (the buffer is dropped with the error).
    ///
    /// ```
    /// use ucp::{Context, Features, Worker};
    ///
    /// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let ctx = Context::builder(uct).features(Features::TAG).build()?;
    /// let worker = Worker::new(&ctx)?;
    /// let ep = worker.connect(worker.address())?;
    ///
    /// let mut buf = vec![b'.'; 8];
    /// for msg in [&b"hello"[..], b"hi"] {
    ///     ep.tag_send(7, msg)?.wait(&worker)?;
    ///     let got = worker.tag_recv_into(7, u64::MAX, buf)?.wait(&worker)?;
    ///     assert_eq!(&got.data[..got.length], msg);
    ///     buf = got.data; // the same 8 bytes, reused
    /// }
    /// assert_eq!(buf, b"hillo...");
    /// # Ok::<(), ucp::Error>(())
    /// ```
    pub fn tag_recv_into<B: uct::LentBytesMut>(
        &self,
        tag: u64,
        mask: u64,
        buf: B,
    ) -> Result<Issued<TagRecvd<B>>> {
        self.inner
            .ctx
            .features()
            .require(crate::Features::TAG, "Worker::tag_recv_into")?;
        recv(&self.inner, tag, mask, RecvBuf::lend(buf))
    }

    /// [`Worker::tag_recv`] into a scatter-gather list the application lends (UCX's iov
    /// datatype): the message fills the segments in order, in place, and the list comes back
    /// whole with the message's length; bytes past it keep their contents. A rendezvous
    /// message arrives through the sender's DATA messages (not fetched in place).
    ///
    /// ```
    /// use ucp::{Context, Features, Worker};
    ///
    /// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let ctx = Context::builder(uct).features(Features::TAG).build()?;
    /// let worker = Worker::new(&ctx)?;
    /// let ep = worker.connect(worker.address())?;
    ///
    /// let r = worker.tag_recv_iov(1, u64::MAX, vec![vec![0u8; 2], vec![0u8; 8]])?;
    /// ep.tag_send_iov(1, &[b"he", b"llo"])?.wait(&worker)?;
    /// let got = r.wait(&worker)?;
    /// assert_eq!(got.length, 5);
    /// assert_eq!(got.data, [b"he".to_vec(), b"llo\0\0\0\0\0".to_vec()]);
    /// # Ok::<(), ucp::Error>(())
    /// ```
    pub fn tag_recv_iov<B: uct::LentBytesMut>(
        &self,
        tag: u64,
        mask: u64,
        segments: Vec<B>,
    ) -> Result<Issued<TagRecvd<Vec<B>>>> {
        self.inner
            .ctx
            .features()
            .require(crate::Features::TAG, "Worker::tag_recv_iov")?;
        recv(&self.inner, tag, mask, RecvBuf::iov(segments))
    }

    /// [`Worker::tag_recv`] through the application's [`crate::Unpack`] (UCX's generic
    /// datatype, as MPI's derived datatypes need): each piece of the message is handed to
    /// `unpack` at its offset as it arrives, and the unpacker comes back with the message's
    /// length. An error from `unpack` fails the receive with it.
    pub fn tag_recv_unpack<U: crate::Unpack>(
        &self,
        tag: u64,
        mask: u64,
        unpack: U,
    ) -> Result<Issued<TagRecvd<U>>> {
        self.inner
            .ctx
            .features()
            .require(crate::Features::TAG, "Worker::tag_recv_unpack")?;
        recv(&self.inner, tag, mask, RecvBuf::unpack(unpack))
    }

    /// [`Worker::tag_recv`] into `len` bytes at `offset` of memory this worker mapped
    /// ([`Worker::mem_map`], [`Worker::mem_alloc`]): eager data is copied in, a rendezvous
    /// message is fetched straight into it through the registrations it already has (no
    /// registration per receive). Nothing is lent as a reference, so several receives may
    /// target the same bytes at once (as `ucx_perftest` posts a window of receives into one
    /// buffer); the bytes then hold whichever message wrote last. The request's
    /// [`TagRecvd::data`] is a clone of the handle. `OutOfRange` outside the region,
    /// `InvalidParam` for memory another worker mapped.
    ///
    /// ```
    /// use ucp::{Context, Features, Worker};
    ///
    /// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let ctx = Context::builder(uct).features(Features::TAG).build()?;
    /// let worker = Worker::new(&ctx)?;
    /// let ep = worker.connect(worker.address())?;
    ///
    /// let mem = worker.mem_alloc(64)?;
    /// let r = worker.tag_recv_mapped(3, u64::MAX, &mem, 8, 16)?;
    /// ep.tag_send(3, b"mapped")?.wait(&worker)?;
    /// let got = r.wait(&worker)?;
    /// assert_eq!(got.length, 6);
    /// let mut out = [0u8; 6];
    /// mem.read(8, &mut out)?;
    /// assert_eq!(&out, b"mapped");
    /// # Ok::<(), ucp::Error>(())
    /// ```
    pub fn tag_recv_mapped(
        &self,
        tag: u64,
        mask: u64,
        mem: &crate::MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Issued<TagRecvd<crate::MemHandle>>> {
        self.inner
            .ctx
            .features()
            .require(crate::Features::TAG, "Worker::tag_recv_mapped")?;
        mem.check_recv(&self.inner, offset, len)?;
        let buf = RecvBuf::Mapped {
            mem: mem.clone(),
            offset,
            len,
        };
        recv(&self.inner, tag, mask, buf)
    }

    /// Looks for an arrived message matching `(tag, mask)` without receiving it (progress is
    /// not called). With `remove`, the message leaves the queue and comes in
    /// [`TagProbe::msg`] for [`Worker::tag_msg_recv`]. A message still arriving in fragments
    /// is reported with its full length. `Unsupported` without [`crate::Features::TAG`].
    pub fn tag_probe(&self, tag: u64, mask: u64, remove: bool) -> Result<Option<TagProbe>> {
        self.inner
            .ctx
            .features()
            .require(crate::Features::TAG, "Worker::tag_probe")?;
        let mut t = self.inner.tag.borrow_mut();
        if !remove {
            let Some((t, m)) = t.matcher.peek_unexpected(tag, mask) else {
                return Ok(None);
            };
            let info = TagInfo {
                tag: t,
                length: m.len(),
            };
            return Ok(Some(TagProbe { info, msg: None }));
        }
        let Some((t, m)) = t.take_unexp(tag, mask) else {
            return Ok(None);
        };
        let info = TagInfo {
            tag: t,
            length: m.len(),
        };
        Ok(Some(TagProbe {
            info,
            msg: Some(TagMsg {
                info,
                msg: m,
                worker: self.inner.uuid,
            }),
        }))
    }

    /// Receives a message a probe removed into `buf` (as [`Worker::tag_recv`]).
    /// `InvalidParam` (the message discarded) when another worker's probe removed it.
    pub fn tag_msg_recv(&self, msg: TagMsg, buf: Vec<u8>) -> Result<Issued<TagRecvd>> {
        self.msg_recv(msg, RecvBuf::Owned(buf), "Worker::tag_msg_recv")
    }

    /// [`Worker::tag_msg_recv`] into lent memory (as [`Worker::tag_recv_into`]).
    pub fn tag_msg_recv_into<B: uct::LentBytesMut>(
        &self,
        msg: TagMsg,
        buf: B,
    ) -> Result<Issued<TagRecvd<B>>> {
        self.msg_recv(msg, RecvBuf::lend(buf), "Worker::tag_msg_recv_into")
    }

    fn msg_recv<B: 'static>(&self, msg: TagMsg, buf: RecvBuf, what: &str) -> Result<Issued<TagRecvd<B>>> {
        self.inner.ctx.features().require(crate::Features::TAG, what)?;
        if msg.worker != self.inner.uuid {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: {what} on worker {:#x} of a message worker {:#x} received",
                    self.inner.uuid, msg.worker
                ),
            ));
        }
        bound(&self.inner, msg.info.tag, msg.msg, buf)
    }
}
