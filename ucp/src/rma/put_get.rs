//! Put and get: the protocol by size on the endpoint's RMA lane — short (inline), bcopy (one
//! copy into a transport buffer), zcopy (from or into the operation's buffer, registered on
//! the lane's memory domain) — in pieces of the lane's largest size where the data exceeds
//! it.
//!
//! A put completes locally (its buffer is free again) when the transport is done with it;
//! [`crate::Ep::flush`] completes when earlier puts are complete at the peer. A get
//! completes when its data is here.

use std::cell::RefCell;
use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct::{IfaceAttr, IfaceFlags, MemAccess};

use super::rkey::{no_lanes, RemoteKey, RkeyInner};
use super::{submit, worker_of, RmaOp, Track};
use crate::ep::{Ep, EpInner};
use crate::request::{request, Issued};

/// How a put or get of a given size goes ([`Ep::put_protocol`], [`Ep::get_protocol`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaProto {
    /// Inline in one call (`put_short`, `get_short`).
    Short,
    /// Copied through one transport buffer.
    Bcopy,
    /// From / into the operation's buffer, registered for it.
    Zcopy,
    /// In this many bcopy pieces (the lane has no zcopy).
    BcopyFragments(usize),
    /// In this many zcopy pieces of the lane's largest zcopy.
    ZcopyFragments(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Short,
    Bcopy,
    Zcopy,
}

/// The protocol for `len` bytes on an interface with `attr`, and its piece size.
fn plan(attr: &IfaceAttr, put: bool, len: usize) -> Result<(RmaProto, Mode, usize)> {
    let (caps, short, bcopy, zcopy) = if put {
        (
            &attr.put,
            IfaceFlags::PUT_SHORT,
            IfaceFlags::PUT_BCOPY,
            IfaceFlags::PUT_ZCOPY,
        )
    } else {
        (
            &attr.get,
            IfaceFlags::GET_SHORT,
            IfaceFlags::GET_BCOPY,
            IfaceFlags::GET_ZCOPY,
        )
    };
    let f = attr.flags;
    if f.contains(short) && len <= caps.max_short {
        return Ok((RmaProto::Short, Mode::Short, len.max(1)));
    }
    if f.contains(bcopy) && len <= caps.max_bcopy {
        return Ok((RmaProto::Bcopy, Mode::Bcopy, len.max(1)));
    }
    if f.contains(zcopy) && caps.max_zcopy > 0 && len >= caps.min_zcopy {
        let n = len.div_ceil(caps.max_zcopy);
        let p = if n == 1 {
            RmaProto::Zcopy
        } else {
            RmaProto::ZcopyFragments(n)
        };
        return Ok((p, Mode::Zcopy, caps.max_zcopy));
    }
    if f.contains(bcopy) && caps.max_bcopy > 0 {
        return Ok((
            RmaProto::BcopyFragments(len.div_ceil(caps.max_bcopy)),
            Mode::Bcopy,
            caps.max_bcopy,
        ));
    }
    Err(Error::new(
        Status::Unsupported,
        format!(
            "ucp: the RMA lane cannot {} {len} bytes (no bcopy or zcopy {0})",
            if put { "put" } else { "get" }
        ),
    ))
}

/// The lane for `len` bytes: the RMA lanes for small transfers, the bandwidth lanes for those
/// larger than a bcopy; the first one the key has an entry for.
fn pick_lane(ep: &EpInner, rk: Option<&RkeyInner>, put: bool, len: usize, what: &str) -> Result<usize> {
    let l = &ep.route.lanes;
    let w = worker_of(ep)?;
    super::require(&w, &[crate::Features::RMA], "Features::RMA", what)?;
    if l.rma.is_empty() && l.rma_bw.is_empty() {
        return Err(no_lanes(ep, what));
    }
    let attr = |i: usize| w.ifaces[l.lanes[i].local].iface.attr();
    let large = l.rma.first().is_none_or(|&i| {
        let a = attr(i);
        len > if put { a.put.max_bcopy } else { a.get.max_bcopy }
    });
    let (first, second) = if large {
        (&l.rma_bw, &l.rma)
    } else {
        (&l.rma, &l.rma_bw)
    };
    first
        .iter()
        .chain(second)
        .copied()
        .find(|&i| rk.is_none_or(|k| k.keys[i].is_some()))
        .ok_or_else(|| {
            Error::new(
                Status::InvalidParam,
                format!("ucp: {what}: the RemoteKey has no key for this endpoint's RMA lanes"),
            )
        })
}

enum Buf {
    Vec(Vec<u8>),
    Mem(uct::Mem),
    Gone,
}

impl Buf {
    fn take(&mut self) -> Vec<u8> {
        match std::mem::replace(self, Buf::Gone) {
            Buf::Vec(v) => v,
            Buf::Mem(m) => m.into_vec().unwrap_or_else(|m| m.to_vec()),
            Buf::Gone => Vec::new(),
        }
    }
}

/// A put or get in pieces.
pub(crate) struct Xfer {
    pub lane: usize,
    rkey: Rc<RkeyInner>,
    raddr: u64,
    len: usize,
    at: usize,
    put: bool,
    mode: Mode,
    chunk: usize,
    buf: Rc<RefCell<Buf>>,
    track: Rc<Track>,
}

impl Xfer {
    /// `data`: the put's data, or the get's destination (its length is the get's).
    fn new(
        ep: &EpInner,
        rk: &RemoteKey,
        raddr: u64,
        data: Vec<u8>,
        put: bool,
        done: impl FnOnce(Result<Vec<u8>>) + 'static,
    ) -> Result<Xfer> {
        let what = if put { "put" } else { "get" };
        let len = data.len();
        let lane = pick_lane(ep, Some(&rk.inner), put, len, what)?;
        let w = worker_of(ep)?;
        let wi = &w.ifaces[ep.route.lanes.lanes[lane].local];
        let (_, mut mode, mut chunk) = plan(wi.iface.attr(), put, len)?;
        let buf = if mode == Mode::Zcopy {
            let access = if put {
                MemAccess::LOCAL_READ
            } else {
                MemAccess::LOCAL_WRITE
            };
            match uct::Mem::try_register(&wi.md, data, access) {
                Ok(m) => Buf::Mem(m),
                Err((e, data)) => {
                    let caps = if put {
                        &wi.iface.attr().put
                    } else {
                        &wi.iface.attr().get
                    };
                    let bcopy = if put {
                        IfaceFlags::PUT_BCOPY
                    } else {
                        IfaceFlags::GET_BCOPY
                    };
                    if !wi.iface.attr().flags.contains(bcopy) || caps.max_bcopy == 0 {
                        return Err(e.context_with(format_args!("ucp: {what}: registering the buffer")));
                    }
                    ucs::debug!("ucp: {what} by bcopy: registering the buffer failed: {e}");
                    (mode, chunk) = (Mode::Bcopy, caps.max_bcopy);
                    Buf::Vec(data)
                }
            }
        } else {
            Buf::Vec(data)
        };
        let buf = Rc::new(RefCell::new(buf));
        let b = buf.clone();
        let track = Track::new(move |r| {
            let v = b.borrow_mut().take();
            done(r.map(|_| v));
        });
        Ok(Xfer {
            lane,
            rkey: rk.inner.clone(),
            raddr,
            len,
            at: 0,
            put,
            mode,
            chunk,
            buf,
            track,
        })
    }

    pub fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        let u = &ep.uct[self.lane];
        let Some(key) = self.rkey.keys[self.lane].as_ref() else {
            return Err(Error::new(
                Status::InvalidParam,
                "ucp: the RemoteKey has no key for the lane",
            ));
        };
        while self.at < self.len {
            let (at, n) = (self.at, self.chunk.min(self.len - self.at));
            let raddr = self.raddr + at as u64;
            let r = match (self.put, self.mode) {
                (_, Mode::Zcopy) => {
                    let iov = match &*self.buf.borrow() {
                        Buf::Mem(m) => m.iov(at, n)?,
                        _ => return Err(Error::new(Status::InvalidParam, "ucp: zcopy without memory")),
                    };
                    let c = self.track.completion();
                    if self.put {
                        u.put_zcopy(&[iov], raddr, key, Some(&c))
                    } else {
                        u.get_zcopy(&[iov], raddr, key, Some(&c))
                    }
                }
                (true, mode) => {
                    let b = self.buf.borrow();
                    let Buf::Vec(v) = &*b else {
                        return Err(Error::new(Status::InvalidParam, "ucp: put without data"));
                    };
                    let src = &v[at..at + n];
                    if mode == Mode::Short {
                        u.put_short(src, raddr, key).map(|_| Outcome::Done)
                    } else {
                        u.put_bcopy(
                            |dst| {
                                dst[..n].copy_from_slice(src);
                                n
                            },
                            raddr,
                            key,
                        )
                        .map(|_| Outcome::Done)
                    }
                }
                (false, Mode::Short) => {
                    let mut b = self.buf.borrow_mut();
                    let Buf::Vec(v) = &mut *b else {
                        return Err(Error::new(Status::InvalidParam, "ucp: get without buffer"));
                    };
                    u.get_short(&mut v[at..at + n], raddr, key).map(|_| Outcome::Done)
                }
                (false, _) => {
                    let c = self.track.completion();
                    let buf = self.buf.clone();
                    let unpack = move |data: &[u8]| {
                        if let Buf::Vec(v) = &mut *buf.borrow_mut() {
                            let m = data.len().min(n);
                            v[at..at + m].copy_from_slice(&data[..m]);
                        }
                    };
                    u.get_bcopy(n, raddr, key, unpack, Some(&c))
                }
            };
            match r {
                Ok(Outcome::InProgress) => self.track.in_flight(),
                Ok(Outcome::Done) => {}
                Err(e) if e == Status::NoResource => return Ok(false),
                Err(e) => return Err(e),
            }
            self.at += n;
        }
        Ok(true)
    }

    pub fn finish(self, r: Result<()>) {
        self.track.issued(r);
    }
}

/// Queues a transfer and returns its result when it finished in the call.
fn issue<T: 'static>(
    ep: &Rc<EpInner>,
    rk: &RemoteKey,
    raddr: u64,
    data: Vec<u8>,
    put: bool,
    map: impl FnOnce(Vec<u8>) -> T + 'static,
) -> Result<Issued<T>> {
    let what = if put { "put" } else { "get" };
    ep.check_usable()?;
    rk.inner.check(ep, raddr, data.len() as u64, what)?;
    if data.is_empty() {
        return Ok(Issued::Done(map(data)));
    }
    let (mut req, c) = request(&ep.worker);
    let x = Xfer::new(ep, rk, raddr, data, put, move |r| c.complete(r.map(map)))?;
    submit(ep, RmaOp::Xfer(x));
    match req.take() {
        Some(r) => r.map(Issued::Done),
        None => Ok(Issued::Pending(req)),
    }
}

impl Ep {
    /// Writes `data` (copied: free again when the call returns) to the peer's memory at
    /// `remote_addr`, inside the region of `rkey`. Completes when the data left; a later
    /// [`Ep::flush`] completes when it is in the peer's memory. `OutOfRange` for an access
    /// outside the region (nothing is sent); `Unsupported` without an RMA lane.
    pub fn put(&self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Issued<()>> {
        issue(
            self.connected_ep("Ep::put")?,
            rkey,
            remote_addr,
            data.to_vec(),
            true,
            |_| (),
        )
    }

    /// [`Ep::put`] from an owned buffer (sent from it by zcopy, no copy), which comes back
    /// when the put completes.
    pub fn put_owned(&self, data: Vec<u8>, remote_addr: u64, rkey: &RemoteKey) -> Result<Issued<Vec<u8>>> {
        issue(
            self.connected_ep("Ep::put_owned")?,
            rkey,
            remote_addr,
            data,
            true,
            |v| v,
        )
    }

    /// Reads `len` bytes of the peer's memory at `remote_addr` into a new buffer.
    pub fn get(&self, len: usize, remote_addr: u64, rkey: &RemoteKey) -> Result<Issued<Vec<u8>>> {
        self.get_into(vec![0; len], remote_addr, rkey)
    }

    /// Reads `buf.len()` bytes of the peer's memory into `buf`, which comes back filled.
    pub fn get_into(&self, buf: Vec<u8>, remote_addr: u64, rkey: &RemoteKey) -> Result<Issued<Vec<u8>>> {
        issue(
            self.connected_ep("Ep::get")?,
            rkey,
            remote_addr,
            buf,
            false,
            |v| v,
        )
    }

    /// The protocol a put of `len` bytes takes on this endpoint.
    pub fn put_protocol(&self, len: usize) -> Result<RmaProto> {
        self.rma_protocol(true, len)
    }

    /// The protocol a get of `len` bytes takes on this endpoint.
    pub fn get_protocol(&self, len: usize) -> Result<RmaProto> {
        self.rma_protocol(false, len)
    }

    fn rma_protocol(&self, put: bool, len: usize) -> Result<RmaProto> {
        let ep = self.connected_ep("Ep::put_protocol/get_protocol")?;
        let lane = pick_lane(ep, None, put, len, if put { "put" } else { "get" })?;
        let w = worker_of(ep)?;
        let attr = w.ifaces[ep.route.lanes.lanes[lane].local].iface.attr();
        Ok(plan(attr, put, len)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_by_size() {
        let mut a = IfaceAttr {
            flags: IfaceFlags::PUT_SHORT | IfaceFlags::PUT_BCOPY | IfaceFlags::PUT_ZCOPY,
            ..Default::default()
        };
        a.put.max_short = 64;
        a.put.max_bcopy = 8192;
        a.put.max_zcopy = 1 << 20;
        assert_eq!(plan(&a, true, 64).unwrap().0, RmaProto::Short);
        assert_eq!(plan(&a, true, 65).unwrap().0, RmaProto::Bcopy);
        assert_eq!(plan(&a, true, 8193).unwrap().0, RmaProto::Zcopy);
        assert_eq!(
            plan(&a, true, (3 << 20) + 1).unwrap().0,
            RmaProto::ZcopyFragments(4)
        );
        a.flags = IfaceFlags::PUT_BCOPY;
        assert_eq!(
            plan(&a, true, 8193).unwrap(),
            (RmaProto::BcopyFragments(2), Mode::Bcopy, 8192)
        );
        assert_eq!(plan(&a, false, 1).unwrap_err(), Status::Unsupported);
    }
}
