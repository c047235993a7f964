//! The RMA and atomic UCP tests (`ucp_put_lat`, `ucp_put_bw`, `ucp_get`, `ucp_add`,
//! `ucp_fadd`, `ucp_swap`, `ucp_cswap`): each side maps a buffer and sends its key; the
//! initiator works on the peer's buffer, the responder only progresses until the initiator's
//! sentinel (a put of the run's number past the data) says the run is over.

use ucp::{AtomicOp, AtomicWidth, Ep, Issued, MemHandle, RemoteKey, Request, Worker};
use ucs::{Error, Result, Status};

use super::rte::Rte;

/// One-sided operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaOp {
    Put,
    Get,
    Add,
    Fadd,
    Swap,
    Cswap,
}

impl RmaOp {
    pub fn of(name: &str) -> Option<RmaOp> {
        Some(match name {
            "ucp_put_lat" | "ucp_put_bw" => RmaOp::Put,
            "ucp_get" => RmaOp::Get,
            "ucp_add" => RmaOp::Add,
            "ucp_fadd" => RmaOp::Fadd,
            "ucp_swap" => RmaOp::Swap,
            "ucp_cswap" => RmaOp::Cswap,
            _ => return None,
        })
    }

    pub fn is_atomic(self) -> bool {
        !matches!(self, RmaOp::Put | RmaOp::Get)
    }
}

/// A request of any of the operations' result types.
pub enum Pending {
    Unit(Request<()>),
    Bytes(Request<Vec<u8>>),
    Word(Request<u64>),
    /// A send from the one lent buffer every message is sent from.
    Lent(Request<std::sync::Arc<[u8]>>),
}

impl Pending {
    /// `Some` once finished.
    pub fn take(&mut self) -> Option<Result<()>> {
        match self {
            Pending::Unit(r) => r.take(),
            Pending::Bytes(r) => r.take().map(|v| v.map(drop)),
            Pending::Word(r) => r.take().map(|v| v.map(drop)),
            Pending::Lent(r) => r.take().map(|v| v.map(drop)),
        }
    }
}

fn pending<T>(i: Issued<T>, f: impl FnOnce(Request<T>) -> Pending) -> Option<Pending> {
    match i {
        Issued::Done(_) => None,
        Issued::Pending(r) => Some(f(r)),
    }
}

/// The mapped buffers and the peer's key.
pub struct Rma {
    pub op: RmaOp,
    len: usize,
    width: AtomicWidth,
    mem: MemHandle,
    key: RemoteKey,
    /// The run being measured (both sides count runs alike): the sentinel's value.
    run: u64,
}

/// Bytes mapped per side: the data, then the 8-byte sentinel.
fn mapped_len(len: usize) -> usize {
    len.max(8).next_multiple_of(8) + 8
}

impl Rma {
    /// Maps the buffer and trades keys with the peer over `rte`.
    pub fn new(op: RmaOp, len: usize, worker: &Worker, ep: &Ep, rte: &mut Rte) -> Result<Rma> {
        let width = match (op.is_atomic(), len) {
            (false, _) => AtomicWidth::U64,
            (true, 4) => AtomicWidth::U32,
            (true, 8) => AtomicWidth::U64,
            (true, n) => {
                return Err(Error::new(
                    Status::InvalidParam,
                    format!("rucx-perftest: atomic tests take -s 4 or -s 8, not {n}"),
                ))
            }
        };
        let mem = worker.mem_alloc(mapped_len(len))?;
        rte.post(&mem.rkey_pack()?)?;
        let packed = rte.recv(1 << 20, &mut || {
            worker.progress();
        })?;
        let key = ep.rkey_unpack(&packed)?;
        Ok(Rma {
            op,
            len,
            width,
            mem,
            key,
            run: 0,
        })
    }

    fn sentinel_at(&self) -> usize {
        mapped_len(self.len) - 8
    }

    /// A new run starts.
    pub fn next_run(&mut self) {
        self.run += 1;
    }

    /// Issues one operation on the peer's buffer; `Some` while in flight. `sn` goes in the
    /// last byte of a put (what `ucp_put_lat`'s peer waits for).
    pub fn issue(&self, ep: &Ep, sbuf: &mut [u8], sn: u8) -> Result<Option<Pending>> {
        let addr = self.key.addr();
        let k = &self.key;
        let w = self.width;
        Ok(match self.op {
            RmaOp::Put => {
                if let Some(last) = sbuf.last_mut() {
                    *last = sn;
                }
                pending(ep.put(sbuf, addr, k)?, Pending::Unit)
            }
            RmaOp::Get => pending(ep.get(self.len, addr, k)?, Pending::Bytes),
            RmaOp::Add => pending(ep.atomic_post(AtomicOp::Add, w, 1, addr, k)?, Pending::Unit),
            RmaOp::Fadd => pending(ep.atomic_fetch(AtomicOp::Add, w, 1, addr, k)?, Pending::Word),
            RmaOp::Swap => pending(ep.atomic_fetch(AtomicOp::Swap, w, 1, addr, k)?, Pending::Word),
            RmaOp::Cswap => pending(ep.atomic_cswap(w, 0, 0, addr, k)?, Pending::Word),
        })
    }

    /// The last byte of our own buffer (where the peer's put puts its `sn`).
    pub fn last_byte(&self) -> u8 {
        let mut b = [0u8];
        let _ = self.mem.read(self.len.saturating_sub(1), &mut b);
        b[0]
    }

    /// Sets the last byte of our buffer (before a ping-pong run).
    pub fn set_last_byte(&self, v: u8) {
        let _ = self.mem.write(self.len.saturating_sub(1), &[v]);
    }

    /// The initiator: tells the responder this run is over (a put of the run's number).
    pub fn send_sentinel(&self, ep: &Ep) -> Result<Option<Pending>> {
        let at = self.key.addr() + self.sentinel_at() as u64;
        Ok(pending(
            ep.put(&self.run.to_le_bytes(), at, &self.key)?,
            Pending::Unit,
        ))
    }

    /// The responder: whether the initiator's sentinel for this run arrived.
    pub fn sentinel_seen(&self) -> bool {
        self.mem.read_u64(self.sentinel_at()).is_ok_and(|v| v == self.run)
    }
}
