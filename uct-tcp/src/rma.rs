//! Put, get and atomics: the initiator's requests and replies, and the target's execution.
//!
//! The target checks every request against the memory it registered (rkey, range, access,
//! alignment) through its memory domain's `RegionTable`; a refused request is logged naming the
//! peer and the range, nothing is written, and the initiator gets the error in the reply
//! (PUT_ACK / GET_REP / ATOMIC_REP), completing its operation with it. A posted put or atomic
//! has no completion, so its error fails the endpoint (error handler). Requests run in arrival
//! order in the target's progress, which makes atomics atomic with respect to all tcp peers and
//! a get see every earlier put of the same endpoint.

use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, ResultPtr, UnpackCb};
use uct_transport::iov::{total_len, Iov};
use uct_transport::traits::AtomicSize;
use uct_transport::types::AtomicOp;

use crate::conn::{Conn, Ctl, Sink, State};
use crate::ep::TcpEp;
use crate::iface::Shared;
use crate::ops::{Done, GetDst, Op, OpKind};
use crate::tx::{small_ctl, Lent, MAX_PARTS};
use crate::wire::{self, encode_frame, AtomicRep, AtomicReq, GetRep, GetReq, Msg, PutAck, PutReq, WireError};

#[cold]
fn too_many_iov(n: usize, max: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("tcp: {n} I/O-vector entries, more than RUCX_TCP_MAX_IOV={max}"),
    )
}

impl TcpEp {
    pub(crate) fn send_put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        if iov.len() > self.sh.cfg.max_iov {
            return Err(too_many_iov(iov.len(), self.sh.cfg.max_iov));
        }
        let total = total_len(iov) as u64;
        self.with_tx(0, |conn, tx| {
            let seq = conn.ops.borrow_mut().take_seq();
            let mut hdr = [0u8; 40];
            let put = PutReq {
                remote_addr: raddr,
                rkey,
                length: total,
                seq,
                ack_req: true,
            };
            let h = encode_frame(&Msg::PutReq(put), &mut hdr).map_err(Status::from)?;
            let mut parts: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
            parts[0] = &hdr[..h];
            for (p, e) in parts[1..].iter_mut().zip(iov) {
                *p = e.bytes();
            }
            self.sh
                .send_parts(conn, tx, &parts[..1 + iov.len()], 1, Lent::Iov(iov), Comp::NONE)?;
            // Completed by the target's PUT_ACK: an out-of-bounds put reports its error here.
            conn.ops.borrow_mut().q.push_back(Op {
                seq,
                kind: OpKind::PutAck,
                done: Done::Comp(comp),
            });
            Ok(Outcome::InProgress)
        })
    }

    /// Sends a GET_REQ and queues the operation that takes its reply.
    fn send_get(&self, len: u64, raddr: u64, rkey: u64, make: impl FnOnce(u32) -> Op) -> Result<Outcome> {
        self.with_tx(0, |conn, tx| {
            let seq = conn.ops.borrow_mut().take_seq();
            let mut hdr = [0u8; 40];
            let get = GetReq {
                remote_addr: raddr,
                rkey,
                length: len,
                seq,
            };
            let h = encode_frame(&Msg::GetReq(get), &mut hdr).map_err(Status::from)?;
            self.sh
                .send_parts(conn, tx, &[&hdr[..h]], 1, Lent::None, Comp::NONE)?;
            conn.ops.borrow_mut().q.push_back(make(seq));
            Ok(Outcome::InProgress)
        })
    }

    pub(crate) fn send_get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        if iov.len() > self.sh.cfg.max_iov {
            return Err(too_many_iov(iov.len(), self.sh.cfg.max_iov));
        }
        let len = total_len(iov) as u64;
        let dst: Box<[Iov<'static>]> = iov.iter().map(|e| e.detach()).collect();
        self.send_get(len, raddr, rkey, |seq| Op {
            seq,
            kind: OpKind::Get {
                len,
                dst: GetDst::Zcopy { iov: dst },
            },
            done: Done::Comp(comp),
        })
    }

    pub(crate) fn send_get_bcopy(
        &self,
        unpack: UnpackCb,
        len: usize,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        if len > self.sh.cfg.rx_seg {
            unpack.cancel();
            ucs::error!(
                "tcp: get_bcopy of {len} bytes exceeds get.max_bcopy ({})",
                self.sh.cfg.rx_seg
            );
            return Err(Status::InvalidParam.into());
        }
        let mut unpack = Some(unpack);
        let r = self.send_get(len as u64, raddr, rkey, |seq| Op {
            seq,
            kind: OpKind::Get {
                len: len as u64,
                dst: GetDst::Bcopy {
                    buf: Vec::with_capacity(len),
                    unpack: unpack.take(),
                },
            },
            done: Done::Comp(comp),
        });
        if let Some(u) = unpack.take() {
            u.cancel();
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_atomic(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        compare: u64,
        result: Option<ResultPtr>,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<Outcome> {
        let post = result.is_none();
        if post && matches!(op, AtomicOp::Swap | AtomicOp::Cswap) {
            ucs::error!(
                "tcp: atomic_post supports add/and/or/xor; use atomic_fetch or atomic_cswap for {op:?}"
            );
            return Err(Status::InvalidParam.into());
        }
        let (wsize, mask) = match size {
            AtomicSize::U32 => (wire::AtomicSize::Bits32, u64::from(u32::MAX)),
            AtomicSize::U64 => (wire::AtomicSize::Bits64, u64::MAX),
        };
        if !raddr.is_multiple_of(u64::from(wsize.bytes())) {
            ucs::error!(
                "tcp: atomic at unaligned address {raddr:#x} (needs {}-byte alignment)",
                wsize.bytes()
            );
            return Err(Status::InvalidParam.into());
        }
        self.with_tx(0, |conn, tx| {
            let seq = conn.ops.borrow_mut().take_seq();
            let req = AtomicReq {
                remote_addr: raddr,
                rkey,
                operand: value & mask,
                compare: if op == AtomicOp::Cswap { compare & mask } else { 0 },
                seq,
                op,
                size: wsize,
                fetch: !post,
                ack_req: false,
            };
            let mut hdr = [0u8; 48];
            let h = encode_frame(&Msg::AtomicReq(req), &mut hdr).map_err(Status::from)?;
            self.sh
                .send_parts(conn, tx, &[&hdr[..h]], 1, Lent::None, Comp::NONE)?;
            let mut ops = conn.ops.borrow_mut();
            if post {
                ops.need_barrier = true;
                Ok(Outcome::Done)
            } else {
                ops.q.push_back(Op {
                    seq,
                    kind: OpKind::Atomic { result },
                    done: Done::Comp(comp),
                });
                Ok(Outcome::InProgress)
            }
        })
    }
}

impl Shared {
    /// Sends a target-side reply now, or queues it behind the message being sent.
    pub fn reply(&self, conn: &Conn, ctl: Ctl) {
        if conn.state.get() != State::Connected {
            return;
        }
        let queued = conn.in_pack.get() || !conn.ctl.borrow().is_empty() || conn.tx.borrow().busy();
        if queued {
            conn.ctl.borrow_mut().push_back(ctl);
            self.update_interest(conn, true);
            return;
        }
        let r = {
            let mut tx = conn.tx.borrow_mut();
            self.send_ctl(conn, &mut tx, &ctl)
        };
        if let Err(st) = r {
            self.conn_failed(conn, st);
        }
    }

    #[cold]
    fn refused(&self, conn: &Conn, what: &str, addr: u64, len: u64, key: u64, st: Status) {
        ucs::warn!(
            "tcp: refused {what} of [{addr:#x}, +{len}) with rkey {key:#x} from {}: {st} (outside the memory \
             this process registered for remote access)",
            conn.peer.get()
        );
    }

    pub fn on_put_req(&self, conn: &Rc<Conn>, sink: &mut Sink, r: PutReq) {
        // An empty put writes nothing (it is the flush barrier): nothing to check.
        let status = if r.length == 0 {
            Status::Ok
        } else {
            match usize::try_from(r.length)
                .map_err(|_| Error::from(Status::InvalidParam))
                .and_then(|n| self.regions.with_target(r.rkey, r.remote_addr, n, |_| ()))
            {
                Ok(()) => Status::Ok,
                Err(e) => {
                    let st = e.status();
                    self.refused(conn, "put", r.remote_addr, r.length, r.rkey, st);
                    st
                }
            }
        };
        if r.length == 0 {
            self.put_done(conn, r.seq, r.ack_req, status);
        } else {
            *sink = Sink::Put {
                key: r.rkey,
                addr: r.remote_addr,
                len: r.length,
                seq: r.seq,
                ack_req: r.ack_req,
                status,
            };
        }
    }

    /// A peer's put is complete (written, or refused and its data dropped).
    pub fn put_done(&self, conn: &Conn, seq: u32, ack_req: bool, status: Status) {
        if status != Status::Ok || ack_req {
            self.reply(conn, small_ctl(&Msg::PutAck(PutAck { seq, status })));
        }
    }

    pub fn on_get_req(&self, conn: &Rc<Conn>, r: GetReq) {
        let check = if r.length == 0 {
            Ok(())
        } else {
            usize::try_from(r.length)
                .map_err(|_| Error::from(Status::InvalidParam))
                .and_then(|n| self.regions.with_source(r.rkey, r.remote_addr, n, |_| ()))
        };
        match check {
            Ok(()) if r.length > 0 => self.reply(
                conn,
                Ctl::GetRep {
                    seq: r.seq,
                    key: r.rkey,
                    addr: r.remote_addr,
                    len: r.length,
                },
            ),
            Ok(()) => self.reply(
                conn,
                small_ctl(&Msg::GetRep(GetRep {
                    length: 0,
                    seq: r.seq,
                    status: Status::Ok,
                })),
            ),
            Err(e) => {
                let st = e.status();
                self.refused(conn, "get", r.remote_addr, r.length, r.rkey, st);
                self.reply(
                    conn,
                    small_ctl(&Msg::GetRep(GetRep {
                        length: 0,
                        seq: r.seq,
                        status: st,
                    })),
                );
            }
        }
    }

    pub fn on_atomic_req(&self, conn: &Rc<Conn>, r: AtomicReq) {
        let size = match r.size {
            wire::AtomicSize::Bits32 => AtomicSize::U32,
            wire::AtomicSize::Bits64 => AtomicSize::U64,
        };
        match self
            .regions
            .atomic(r.rkey, r.remote_addr, size, r.op, r.operand, r.compare)
        {
            Ok(old) => {
                if r.fetch || r.ack_req {
                    self.reply(
                        conn,
                        small_ctl(&Msg::AtomicRep(AtomicRep {
                            value: old,
                            seq: r.seq,
                            status: Status::Ok,
                        })),
                    );
                }
            }
            Err(st) => {
                self.refused(
                    conn,
                    "atomic",
                    r.remote_addr,
                    u64::from(r.size.bytes()),
                    r.rkey,
                    (&st).into(),
                );
                self.reply(
                    conn,
                    small_ctl(&Msg::AtomicRep(AtomicRep {
                        value: 0,
                        seq: r.seq,
                        status: st.into(),
                    })),
                );
            }
        }
    }

    /// Completes `op` and the flush markers it was holding back.
    fn finish_op(&self, conn: &Conn, op: Op, st: Status) {
        op.finish(st);
        self.release_markers(conn);
    }

    fn release_markers(&self, conn: &Conn) {
        let markers = conn.ops.borrow_mut().pop_markers();
        for m in markers {
            m.finish(Status::Ok);
        }
    }

    /// A posted (unacknowledged) put or atomic was refused by the target: that operation
    /// failed, not the endpoint. It has no completion of its own, so the next flush that
    /// reports (its completion, or the flush call once nothing is outstanding) fails with it.
    fn posted_failed(&self, conn: &Conn, what: &str, st: Status) {
        ucs::warn!(
            "tcp: a {what} posted to {} was refused by the target: {st}; the next flush reports it",
            conn.peer.get()
        );
        let mut ops = conn.ops.borrow_mut();
        if ops.posted_error.is_none() {
            ops.posted_error = Some(st);
        }
    }

    fn unexpected_reply(&self, conn: &Conn, what: &'static str, seq: u32) {
        self.violation(
            conn,
            &WireError::BadField {
                what,
                value: seq.into(),
            },
        );
    }

    pub fn on_put_ack(&self, conn: &Rc<Conn>, a: PutAck) {
        let op = conn.ops.borrow_mut().pop_reply(a.seq);
        match op {
            Some(op) if matches!(op.kind, OpKind::Barrier) => {
                // The barrier covers the posted operations before it: a refusal among them
                // fails the flush that reports.
                let st = match a.status {
                    Status::Ok if op.done.reports() => conn.ops.borrow_mut().posted_error.take(),
                    _ => None,
                };
                self.finish_op(conn, op, st.unwrap_or(a.status))
            }
            Some(op) if matches!(op.kind, OpKind::PutAck) => self.finish_op(conn, op, a.status),
            Some(op) => {
                conn.ops.borrow_mut().q.push_front(op);
                self.unexpected_reply(conn, "PUT_ACK sequence number (answers a get or atomic)", a.seq);
            }
            None if a.status.is_err() => self.posted_failed(conn, "put", a.status),
            None => self.unexpected_reply(conn, "PUT_ACK sequence number (no such put waiting)", a.seq),
        }
    }

    pub fn on_get_rep(&self, conn: &Rc<Conn>, sink: &mut Sink, r: GetRep) {
        let Some(op) = conn.ops.borrow_mut().pop_reply(r.seq) else {
            return self.unexpected_reply(conn, "GET_REP sequence number (no such get waiting)", r.seq);
        };
        let OpKind::Get { len, .. } = op.kind else {
            conn.ops.borrow_mut().q.push_front(op);
            return self.unexpected_reply(conn, "GET_REP sequence number (answers a put or atomic)", r.seq);
        };
        if r.status != Status::Ok {
            self.finish_op(conn, op, r.status);
        } else if r.length != len {
            conn.ops.borrow_mut().q.push_front(op);
            self.violation(
                conn,
                &WireError::BadLength {
                    what: "GET_REP data",
                    len: r.length,
                    expected: len,
                },
            );
        } else if len == 0 {
            self.get_done(conn, op);
        } else {
            *sink = Sink::Get(op);
        }
    }

    /// All data of a get arrived.
    pub fn get_done(&self, conn: &Conn, op: Op) {
        let Op { kind, done, .. } = op;
        if let OpKind::Get {
            dst: GetDst::Bcopy { buf, unpack: Some(u) },
            ..
        } = kind
        {
            u.deliver(&buf);
        }
        done.complete(Status::Ok);
        self.release_markers(conn);
    }

    pub fn on_atomic_rep(&self, conn: &Rc<Conn>, r: AtomicRep) {
        let op = conn.ops.borrow_mut().pop_reply(r.seq);
        match op {
            Some(op) if matches!(op.kind, OpKind::Atomic { .. }) => {
                if let OpKind::Atomic { result: Some(p) } = &op.kind {
                    if r.status == Status::Ok {
                        p.set(r.value);
                    }
                }
                self.finish_op(conn, op, r.status);
            }
            Some(op) => {
                conn.ops.borrow_mut().q.push_front(op);
                self.unexpected_reply(conn, "ATOMIC_REP sequence number (answers a put or get)", r.seq);
            }
            None if r.status.is_err() => self.posted_failed(conn, "atomic", r.status),
            None => self.unexpected_reply(conn, "ATOMIC_REP sequence number (no such atomic waiting)", r.seq),
        }
    }
}
