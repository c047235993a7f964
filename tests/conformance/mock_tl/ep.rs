//! `loopq` endpoints: credit-limited sends into the peer's inbox, completions, the pending queue,
//! peer failure.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::{Rc, Weak};

use uct::callbacks::{Comp, PackCb, PendingReq, PendingResult, PurgeCb, ResultPtr, UnpackCb};
use uct::iov::{total_len, Iov};
use uct::transport::{self, AtomicSize, EpHandle};
use uct::types::*;
use uct::{Result, Status};

use super::*;

pub(super) struct EpShared {
    pub(super) id: u64,
    /// The endpoint's own interface (peers connecting to this endpoint send there).
    pub(super) iface: Weak<IfShared>,
    pub(super) handle: Cell<EpHandle>,
    pub(super) connected: Cell<bool>,
    pub(super) target: RefCell<Option<Weak<IfShared>>>,
    pub(super) next_seq: Cell<u64>,
    /// Messages not yet consumed by the receiver (bounded by CREDITS).
    pub(super) in_flight: Cell<usize>,
    pub(super) outstanding: RefCell<BTreeMap<u64, Outstanding>>,
    pub(super) acks: RefCell<VecDeque<(u64, Reply)>>,
    pub(super) pending: RefCell<VecDeque<PendingReq>>,
    /// A pending request is running: its own sends must not be refused for the queue.
    pub(super) dispatching: Cell<bool>,
    pub(super) flushes: RefCell<Vec<Comp>>,
    pub(super) failed: Cell<Option<Status>>,
}

impl EpShared {
    pub(super) fn finish(o: Outstanding, reply: Reply) {
        let status = match &reply {
            Reply::Failed(s) => *s,
            _ => Status::Ok,
        };
        match (o.done, reply) {
            (Done::GetBcopy(u), Reply::Data(d)) => u.deliver(&d),
            (Done::GetBcopy(u), _) => u.cancel(),
            (Done::GetZcopy(iov), Reply::Data(d)) => {
                let mut at = 0;
                for e in &iov {
                    at += e.write_at(0, &d[at..]);
                }
            }
            (Done::Fetch(r), Reply::Value(v)) => r.set(v),
            _ => {}
        }
        if !o.comp.is_none() {
            o.comp.complete(status);
        }
    }

    /// Sender role: acknowledgements, flushes, pending dispatch, peer failure.
    pub(super) fn progress(self: &Rc<Self>, iface: &IfShared) -> u32 {
        let mut work = 0;
        loop {
            let a = self.acks.borrow_mut().pop_front();
            let Some((seq, reply)) = a else { break };
            work += 1;
            let o = self.outstanding.borrow_mut().remove(&seq);
            if let Some(o) = o {
                Self::finish(o, reply);
            }
        }
        if self.connected.get() && self.failed.get().is_none() && self.target().is_none() {
            work += 1;
            self.fail(Status::ConnectionReset);
            iface.err.report(self.handle.get(), Status::ConnectionReset);
        }
        if self.outstanding.borrow().is_empty() {
            let f = std::mem::take(&mut *self.flushes.borrow_mut());
            for c in f {
                c.complete(self.failed.get().unwrap_or(Status::Ok));
            }
        }
        while self.failed.get().is_none() {
            let r = self.pending.borrow_mut().pop_front();
            let Some(r) = r else { break };
            work += 1;
            self.dispatching.set(true);
            let res = r.dispatch();
            self.dispatching.set(false);
            if res != PendingResult::Done {
                self.pending.borrow_mut().push_front(r);
                break;
            }
        }
        work
    }

    /// Completes everything outstanding with `status`; later operations fail with it.
    pub(super) fn fail(&self, status: Status) {
        self.failed.set(Some(status));
        let all = std::mem::take(&mut *self.outstanding.borrow_mut());
        for (_, o) in all {
            Self::finish(o, Reply::Failed(status));
        }
        let f = std::mem::take(&mut *self.flushes.borrow_mut());
        for c in f {
            c.complete(status);
        }
    }

    fn target(&self) -> Option<Rc<IfShared>> {
        self.target.borrow().as_ref().and_then(Weak::upgrade)
    }

    /// The target if a send may go now.
    fn ready(&self) -> Result<Rc<IfShared>> {
        if let Some(s) = self.failed.get() {
            return Err(s);
        }
        if !self.connected.get() {
            return Err(Status::NoResource);
        }
        let t = self.target().ok_or(Status::ConnectionReset)?;
        let queued = !self.pending.borrow().is_empty() && !self.dispatching.get();
        if queued || self.in_flight.get() >= CREDITS {
            return Err(Status::NoResource);
        }
        Ok(t)
    }

    fn post(self: &Rc<Self>, t: &IfShared, op: Op, comp: Comp, done: Done) {
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        self.in_flight.set(self.in_flight.get() + 1);
        self.outstanding
            .borrow_mut()
            .insert(seq, Outstanding { comp, done });
        t.inbox.borrow_mut().push_back(Msg {
            seq,
            from: Rc::downgrade(self),
            op,
        });
    }
}

fn check_id(id: u8) -> Result<()> {
    if id >= AM_ID_MAX {
        Err(Status::InvalidParam)
    } else {
        Ok(())
    }
}

fn check_len(len: usize, max: usize) -> Result<()> {
    if len > max {
        Err(Status::InvalidParam)
    } else {
        Ok(())
    }
}

fn check_target(key: u64, addr: u64, len: usize, get: bool) -> Result<()> {
    REGIONS.with(|r| {
        if get {
            r.with_source(key, addr, len, |_| ())
        } else {
            r.with_target(key, addr, len, |_| ())
        }
    })
}

fn detach(iov: &[Iov]) -> Vec<Iov<'static>> {
    iov.iter().map(Iov::detach).collect()
}

pub struct QEp {
    pub(super) sh: Rc<EpShared>,
}

impl Drop for QEp {
    fn drop(&mut self) {
        EPS.with(|m| m.borrow_mut().remove(&self.sh.id));
        // Outstanding operations complete (canceled) when their endpoint is destroyed.
        self.sh.fail(Status::Canceled);
    }
}

impl transport::Ep for QEp {
    fn on_created(&self, handle: EpHandle) {
        self.sh.handle.set(handle);
    }

    fn get_address(&self, buf: &mut [u8]) -> Result<()> {
        buf.get_mut(..8)
            .ok_or(Status::BufferTooSmall)?
            .copy_from_slice(&self.sh.id.to_le_bytes());
        Ok(())
    }

    fn connect_to_ep(&self, dev: &[u8], ep_addr: &[u8]) -> Result<()> {
        if le(dev) != Some(token()) {
            return Err(Status::Unreachable);
        }
        let peer = le(ep_addr).and_then(|id| EPS.with(|m| m.borrow().get(&id).and_then(Weak::upgrade)));
        let peer = peer.ok_or(Status::Unreachable)?;
        *self.sh.target.borrow_mut() = Some(peer.iface.clone());
        self.sh.connected.set(true);
        Ok(())
    }

    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        check_id(id)?;
        check_len(8 + payload.len(), AM_SHORT)?;
        let t = self.sh.ready()?;
        let mut data = header.to_le_bytes().to_vec();
        data.extend_from_slice(payload);
        self.sh.post(&t, Op::Am { id, data }, Comp::NONE, Done::Plain);
        Ok(())
    }

    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        check_id(id)?;
        check_len(iov.len(), MAX_IOV)?;
        check_len(total_len(iov), AM_SHORT)?;
        let t = self.sh.ready()?;
        let mut data = Vec::new();
        for e in iov {
            data.extend_from_slice(e.bytes());
        }
        self.sh.post(&t, Op::Am { id, data }, Comp::NONE, Done::Plain);
        Ok(())
    }

    fn am_bcopy(&self, id: u8, pack: PackCb, _flags: u32) -> Result<usize> {
        check_id(id)?;
        let t = self.sh.ready()?;
        let mut data = vec![0; AM_BCOPY];
        let n = pack.pack(&mut data)?;
        data.truncate(n);
        self.sh.post(&t, Op::Am { id, data }, Comp::NONE, Done::Plain);
        Ok(n)
    }

    fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], _flags: u32, comp: Comp) -> Result<Status> {
        check_id(id)?;
        check_len(header.len(), AM_HDR)?;
        check_len(iov.len(), MAX_IOV)?;
        check_len(header.len() + total_len(iov), AM_ZCOPY)?;
        let t = self.sh.ready()?;
        let op = Op::AmZcopy {
            id,
            hdr: header.to_vec(),
            iov: detach(iov),
        };
        self.sh.post(&t, op, comp, Done::Plain);
        Ok(Status::InProgress)
    }

    fn put_short(&self, data: &[u8], raddr: u64, rkey: u64) -> Result<()> {
        check_len(data.len(), RMA_SHORT)?;
        check_target(rkey, raddr, data.len(), false)?;
        let t = self.sh.ready()?;
        self.sh.post(
            &t,
            Op::Put {
                key: rkey,
                addr: raddr,
                data: data.to_vec(),
            },
            Comp::NONE,
            Done::Plain,
        );
        Ok(())
    }

    fn put_bcopy(&self, pack: PackCb, raddr: u64, rkey: u64) -> Result<usize> {
        let t = self.sh.ready()?;
        let mut data = vec![0; RMA_BCOPY];
        let n = pack.pack(&mut data)?;
        data.truncate(n);
        check_target(rkey, raddr, n, false)?;
        self.sh.post(
            &t,
            Op::Put {
                key: rkey,
                addr: raddr,
                data,
            },
            Comp::NONE,
            Done::Plain,
        );
        Ok(n)
    }

    fn put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Status> {
        check_len(iov.len(), MAX_IOV)?;
        check_len(total_len(iov), RMA_ZCOPY)?;
        check_target(rkey, raddr, total_len(iov), false)?;
        let t = self.sh.ready()?;
        self.sh.post(
            &t,
            Op::PutZcopy {
                key: rkey,
                addr: raddr,
                iov: detach(iov),
            },
            comp,
            Done::Plain,
        );
        Ok(Status::InProgress)
    }

    fn get_bcopy(&self, unpack: UnpackCb, len: usize, raddr: u64, rkey: u64, comp: Comp) -> Result<Status> {
        let checked = check_len(len, RMA_BCOPY).and_then(|_| check_target(rkey, raddr, len, true));
        let t = match checked.and_then(|_| self.sh.ready()) {
            Ok(t) => t,
            Err(e) => {
                unpack.cancel();
                return Err(e);
            }
        };
        self.sh.post(
            &t,
            Op::Get {
                key: rkey,
                addr: raddr,
                len,
            },
            comp,
            Done::GetBcopy(unpack),
        );
        Ok(Status::InProgress)
    }

    fn get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Status> {
        let len = total_len(iov);
        check_len(iov.len(), MAX_IOV)?;
        check_len(len, RMA_ZCOPY)?;
        check_target(rkey, raddr, len, true)?;
        let t = self.sh.ready()?;
        self.sh.post(
            &t,
            Op::Get {
                key: rkey,
                addr: raddr,
                len,
            },
            comp,
            Done::GetZcopy(detach(iov)),
        );
        Ok(Status::InProgress)
    }

    fn atomic_post(&self, size: AtomicSize, op: AtomicOp, value: u64, raddr: u64, rkey: u64) -> Result<()> {
        if matches!(op, AtomicOp::Swap | AtomicOp::Cswap) {
            return Err(Status::InvalidParam);
        }
        if size == AtomicSize::U32 && op != AtomicOp::Add {
            return Err(Status::Unsupported);
        }
        let t = self.atomic_target(size, raddr, rkey)?;
        let a = Op::Atomic {
            size,
            op,
            value,
            compare: 0,
            key: rkey,
            addr: raddr,
        };
        self.sh.post(&t, a, Comp::NONE, Done::Plain);
        Ok(())
    }

    fn atomic_fetch(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Status> {
        if op == AtomicOp::Cswap {
            return Err(Status::InvalidParam);
        }
        if size == AtomicSize::U32 && !matches!(op, AtomicOp::Add | AtomicOp::Swap) {
            return Err(Status::Unsupported);
        }
        let t = self.atomic_target(size, raddr, rkey)?;
        let a = Op::Atomic {
            size,
            op,
            value,
            compare: 0,
            key: rkey,
            addr: raddr,
        };
        self.sh.post(&t, a, comp, Done::Fetch(result));
        Ok(Status::InProgress)
    }

    fn atomic_cswap(
        &self,
        size: AtomicSize,
        compare: u64,
        swap: u64,
        result: ResultPtr,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Status> {
        let t = self.atomic_target(size, raddr, rkey)?;
        let a = Op::Atomic {
            size,
            op: AtomicOp::Cswap,
            value: swap,
            compare,
            key: rkey,
            addr: raddr,
        };
        self.sh.post(&t, a, comp, Done::Fetch(result));
        Ok(Status::InProgress)
    }

    fn pending_add(&self, req: PendingReq, _flags: u32) -> Result<()> {
        if let Some(s) = self.sh.failed.get() {
            return Err(s);
        }
        match self.sh.ready() {
            Ok(_) => Err(Status::Busy),
            Err(_) => {
                self.sh.pending.borrow_mut().push_back(req);
                Ok(())
            }
        }
    }

    fn pending_purge(&self, purge: PurgeCb) {
        let all = std::mem::take(&mut *self.sh.pending.borrow_mut());
        for r in all {
            purge.purge(r);
        }
    }

    fn flush(&self, _flags: FlushFlags, comp: Comp) -> Result<Status> {
        if let Some(s) = self.sh.failed.get() {
            return Err(s);
        }
        if !self.sh.pending.borrow().is_empty() {
            return Err(Status::NoResource);
        }
        if self.sh.outstanding.borrow().is_empty() {
            return Ok(Status::Ok);
        }
        if !comp.is_none() {
            self.sh.flushes.borrow_mut().push(comp);
        }
        Ok(Status::InProgress)
    }
}

impl QEp {
    fn atomic_target(&self, size: AtomicSize, raddr: u64, rkey: u64) -> Result<Rc<IfShared>> {
        let w = if size == AtomicSize::U32 { 4 } else { 8 };
        if !raddr.is_multiple_of(w as u64) {
            return Err(Status::InvalidAddr);
        }
        check_target(rkey, raddr, w, false)?;
        self.sh.ready()
    }
}
