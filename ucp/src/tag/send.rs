//! The sending side of tag matching: plain and owned sends take the one send path
//! ([`crate::proto::send`]); synchronous sends register for the receiver's acknowledgement
//! first.

use std::rc::Rc;

use ucs::{Error, Result, Status};

use super::wire::SyncFrom;
use super::SyncWait;
use crate::ep::Ep;
use crate::proto::op::Done;
use crate::proto::select::Force;
use crate::proto::send::{protocol, queued, send, Head, Lend, Message, Staged};
use crate::request::{request, Issued};
use crate::AmProto;

fn message(head: Head) -> Message<'static> {
    Message {
        head,
        header: &[],
        force: Force::Auto,
    }
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
        send(ep, &message(Head::Tag(tag)), data)
    }

    /// Sends `data` with `tag` from a buffer the caller lends until the send finished: read
    /// in place (zero-copy where the lane allows, from the zcopy threshold up; a rendezvous
    /// registers it for the peer), and given back, as the same value, with the completion
    /// (as [`Ep::am_send_owned`]: a `Vec<u8>`, or an `Arc<[u8]>` lent to many sends at once).
    pub fn tag_send_owned<B: uct::LentBytes>(&self, tag: u64, data: B) -> Result<Issued<B>> {
        let Some(ep) = self.live(crate::Features::TAG, "Ep::tag_send_owned")? else {
            return self.defer(move |e| e.tag_send_owned(tag, data));
        };
        send(ep, &message(Head::Tag(tag)), Lend(data))
    }

    /// Sends the io-vector `segments` with `tag` as one message (UCX's iov datatype): they
    /// are gathered at the call into one buffer the send owns (so they are free when it
    /// returns), which then goes as [`Ep::tag_send_owned`]'s would. The receiver sees one
    /// message of their total length, received into any destination.
    pub fn tag_send_iov(&self, tag: u64, segments: &[&[u8]]) -> Result<Issued<()>> {
        let data = crate::datatype::gather(segments)?;
        self.tag_send_staged(tag, data, "Ep::tag_send_iov")
    }

    /// Sends what `pack` packs with `tag` (UCX's generic datatype, as MPI's derived datatypes
    /// need): [`crate::Pack::pack`] is called at the call, filling one buffer the send owns
    /// with [`crate::Pack::packed_size`] bytes; `InvalidParam` when it gives fewer.
    ///
    /// ```
    /// use ucp::{Context, Features, Pack, Worker};
    ///
    /// /// The first byte of each 4-byte record.
    /// struct Firsts(Vec<u8>);
    /// impl Pack for Firsts {
    ///     fn packed_size(&self) -> usize {
    ///         self.0.len() / 4
    ///     }
    ///     fn pack(&mut self, offset: usize, dst: &mut [u8]) -> usize {
    ///         let src = self.0.chunks(4).skip(offset).map(|c| c[0]);
    ///         dst.iter_mut().zip(src).map(|(d, s)| *d = s).count()
    ///     }
    /// }
    ///
    /// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
    /// let ctx = Context::builder(uct).features(Features::TAG).build()?;
    /// let worker = Worker::new(&ctx)?;
    /// let ep = worker.connect(worker.address())?;
    /// let r = worker.tag_recv(2, u64::MAX, vec![0; 16])?;
    /// ep.tag_send_packed(2, &mut Firsts(b"a...b...c...".to_vec()))?.wait(&worker)?;
    /// assert_eq!(r.wait(&worker)?.data, b"abc");
    /// # Ok::<(), ucp::Error>(())
    /// ```
    pub fn tag_send_packed(&self, tag: u64, pack: &mut dyn crate::Pack) -> Result<Issued<()>> {
        let data = crate::datatype::pack_all(pack)?;
        self.tag_send_staged(tag, data, "Ep::tag_send_packed")
    }

    /// [`Ep::tag_send_sync`] of the io-vector `segments` (gathered at the call).
    pub fn tag_send_sync_iov(&self, tag: u64, segments: &[&[u8]]) -> Result<Issued<()>> {
        self.tag_send_sync(tag, &crate::datatype::gather(segments)?)
    }

    fn tag_send_staged(&self, tag: u64, data: Vec<u8>, what: &'static str) -> Result<Issued<()>> {
        let Some(ep) = self.live(crate::Features::TAG, what)? else {
            return self.defer(move |e| e.tag_send_staged(tag, data, what));
        };
        send(ep, &message(Head::Tag(tag)), Staged(data))
    }

    /// Sends `data` with `tag` and completes only once the receiver matched it (MPI's
    /// synchronous send): an acknowledgement for eager messages, the receiver's fetch for
    /// rendezvous.
    pub fn tag_send_sync(&self, tag: u64, data: &[u8]) -> Result<Issued<()>> {
        let Some(ep) = self.live(crate::Features::TAG, "Ep::tag_send_sync")? else {
            let data = data.to_vec();
            return self.defer(move |e| e.tag_send_sync(tag, &data));
        };
        let w = ep
            .worker
            .upgrade()
            .ok_or_else(|| Error::new(Status::NotConnected, "ucp: the worker is gone"))?;
        let placeholder = SyncFrom {
            worker: w.uuid,
            ep: ep.id.get(),
            req: 0,
        };
        if protocol(ep, &message(Head::TagSync(tag, placeholder)), data.len(), false) == AmProto::Rndv {
            // A rendezvous completes once the receiver fetched the data: matched.
            return send(ep, &message(Head::Tag(tag)), data);
        }
        let (req, c) = request(&ep.worker);
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
            req: id,
            ..placeholder
        };
        let op = queued(
            ep,
            &message(Head::TagSync(tag, from)),
            crate::proto::payload::Held::Copy(data.to_vec()),
            Done::Sync(id, Rc::downgrade(&w)),
        )?;
        ep.send_op(op, req)
    }
}
