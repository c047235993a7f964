//! The ofi endpoint: the libfabric endpoint and address its operations go to (the interface's
//! RDM endpoint and the peer's address in its AV; or its own connected endpoint and
//! `FI_ADDR_UNSPEC`), its pending queue and flush waiters. A connected one refuses operations
//! with `NoResource` until the connection is up.
//!
//! Data paths: am_short is one `fi_inject` (no completion; the provider copies the data);
//! am_bcopy packs into the slot's send buffer and `fi_send`s it; am_zcopy sends the header from
//! the slot's buffer and the user's registered I/O vector with one `fi_sendmsg`; put/get zcopy
//! are `fi_writemsg` (delivery-complete, so a flush means the data is at the target) and
//! `fi_readmsg`; atomics are `fi_fetch_atomic`/`fi_compare_atomic` through the slot's buffer
//! (`[operand][compare][result]`), posts included, so flush waits for them too.
#![allow(unsafe_code)]

use std::rc::Rc;

use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, PackCb, PendingReq, PurgeCb, ResultPtr};
use uct_transport::iov::{gather, total_len, Iov};
use uct_transport::traits::{AtomicSize, EpHandle, TransportEp};
use uct_transport::types::{AtomicOp, EpAttr, FlushFlags, AM_ID_MAX};

use crate::ffi::{self, atomic, iovec_of};
use crate::iface::{fi_op, Op, Shared};
use crate::md::remote_key;
use crate::wire;

mod rma;
mod state;

pub(crate) use state::EpState;

pub struct OfiEp {
    s: Rc<Shared>,
    st: Rc<EpState>,
}

impl OfiEp {
    pub(crate) fn connect(s: &Rc<Shared>, dev: &[u8], iface: &[u8]) -> Result<OfiEp> {
        if !s.reachable(dev, iface) {
            return Err(Error::new(
                Status::Unreachable,
                format!(
                    "ofi {}: the peer's address is not of this provider and fabric (or host, for shm)",
                    s.md.name
                ),
            ));
        }
        if s.msg.is_some() {
            return crate::msg::connect(s, iface).map(|st| OfiEp { s: s.clone(), st });
        }
        let dest = s.peer_addr(iface).map_err(|e| {
            Error::new(
                Status::Unreachable,
                format!(
                    "ofi {}: fi_av_insert of the peer failed: {}",
                    s.md.name,
                    ffi::strerror(e as i64)
                ),
            )
        })?;
        Ok(OfiEp {
            s: s.clone(),
            st: Rc::new(EpState::new(s.rx.clone(), dest, false)),
        })
    }

    /// Refuses a send while the endpoint failed, or while others wait in its pending queue
    /// (unless this is the pending request being dispatched).
    #[inline]
    fn ready(&self) -> Result<()> {
        if let Some(st) = self.st.failed.get() {
            return Err(failed(st));
        }
        if self.st.connecting.get()
            || (self.st.has_pending() && self.s.dispatching.get() != Rc::as_ptr(&self.st) as usize)
        {
            return Err(Status::NoResource.into());
        }
        Ok(())
    }

    /// A libfabric return value: 0 is success, `-FI_EAGAIN` is `NoResource`.
    #[inline]
    fn posted(&self, r: isize, what: &str) -> Result<()> {
        if r == 0 {
            self.st.blocked.set(false);
            self.st.stalled_since.set(None);
            return Ok(());
        }
        if -r as i32 == ffi::errno::EAGAIN {
            self.st.blocked.set(true);
            if self.st.stalled_since.get().is_none() {
                // RxM says -FI_EAGAIN while it (re)connects, for ever if the peer is gone:
                // progress fails the endpoint after RUCX_OFI_PEER_TIMEOUT
                self.st.stalled_since.set(Some(std::time::Instant::now()));
                if !self.st.watched.replace(true) {
                    self.s.stalled.borrow_mut().push(self.st.clone());
                }
            }
            return Err(Status::NoResource.into());
        }
        Err(post_failed(&self.s.md.name, what, r))
    }

    /// Posts an operation in a fresh slot: `post(slot)` returns libfabric's value.
    #[inline]
    fn with_slot(
        &self,
        what: &str,
        op: impl FnOnce(usize) -> Op,
        post: impl FnOnce(usize) -> isize,
    ) -> Result<()> {
        self.ready()?;
        let i = self.s.alloc()?;
        match self.posted(post(i), what) {
            Ok(()) => {
                self.s.posted(i, op(i), &self.st);
                Ok(())
            }
            Err(e) => {
                self.s.unalloc(i);
                Err(e)
            }
        }
    }

    fn plain(&self, comp: Comp) -> Op {
        Op::Plain {
            ep: self.st.clone(),
            comp,
        }
    }

    /// Local descriptors of an I/O vector (all null without `FI_MR_LOCAL`).
    fn descs(&self, iov: &[Iov], out: &mut Vec<*mut std::ffi::c_void>) -> Result<()> {
        for v in iov.iter().filter(|v| !v.is_empty()) {
            let d = self.s.md.desc(v.memh() as usize);
            if d.is_null() && self.s.md.mr_local() && !v.is_empty() {
                return Err(Error::new(
                    Status::InvalidParam,
                    format!(
                        "ofi {}: the provider needs registered memory (FI_MR_LOCAL): pass the memory handle of each zcopy buffer",
                        self.s.md.name
                    ),
                ));
            }
            out.push(d);
        }
        Ok(())
    }
}

/// Refuses an AM id out of range (misuse, never sent).
#[inline]
fn check_id(id: u8) -> Result<()> {
    if id < AM_ID_MAX {
        return Ok(());
    }
    Err(bad_id(id))
}

#[cold]
#[inline(never)]
fn bad_id(id: u8) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ofi: AM id {id} out of range 0..{}", AM_ID_MAX - 1),
    )
}

#[cold]
#[inline(never)]
fn failed(st: Status) -> Error {
    Error::new(
        st,
        "ofi: the endpoint's peer failed; destroy the endpoint".to_string(),
    )
}

#[cold]
#[inline(never)]
fn post_failed(dev: &str, what: &str, r: isize) -> Error {
    let msg = format!("ofi {dev}: {what} failed: {}", ffi::strerror(r as i64));
    ucs::error!("{msg}");
    Error::new(Status::IoError, msg)
}

#[cold]
#[inline(never)]
fn too_big(what: &str, len: usize, max: usize) -> Error {
    Error::new(
        Status::InvalidParam,
        format!("ofi: {what} of {len} bytes (or too many iov entries) exceeds the limit {max} (see the iface attributes)"),
    )
}

impl Drop for OfiEp {
    fn drop(&mut self) {
        self.st.destroyed.set(true);
        self.st.pending.borrow_mut().clear();
        self.s.arbiter.borrow_mut().retain(|e| !Rc::ptr_eq(e, &self.st));
        if let Some(m) = &self.s.msg {
            m.forget(&self.st);
        }
    }
}

impl TransportEp for OfiEp {
    fn on_created(&self, handle: EpHandle) {
        self.st.handle.set(handle);
    }

    fn query(&self) -> EpAttr {
        EpAttr {
            peer_am_max: 0,
            connected: !self.st.connecting.get(),
        }
    }

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> Result<()> {
        check_id(id)?;
        self.ready()?;
        let len = wire::HDR_LEN + 8 + payload.len();
        let mut buf = self.s.short_buf.borrow_mut();
        let Some(b) = buf.get_mut(..len) else {
            return Err(too_big("am_short", len - wire::HDR_LEN, self.s.max_short));
        };
        b[..wire::HDR_LEN].copy_from_slice(&wire::header(id));
        b[wire::HDR_LEN..wire::HDR_LEN + 8].copy_from_slice(&header.to_le_bytes());
        b[wire::HDR_LEN + 8..].copy_from_slice(payload);
        let r = self.st.tx.inject(b, self.st.dest);
        drop(buf);
        self.posted(r, "fi_inject")
    }

    fn am_short_iov(&self, id: u8, iov: &[Iov]) -> Result<()> {
        check_id(id)?;
        self.ready()?;
        let len = wire::HDR_LEN + total_len(iov);
        let mut buf = self.s.short_buf.borrow_mut();
        let Some(b) = buf.get_mut(..len) else {
            return Err(too_big("am_short_iov", len - wire::HDR_LEN, self.s.max_short));
        };
        b[..wire::HDR_LEN].copy_from_slice(&wire::header(id));
        gather(&mut b[wire::HDR_LEN..], iov);
        let r = self.st.tx.inject(b, self.st.dest);
        drop(buf);
        self.posted(r, "fi_inject")
    }

    fn am_bcopy(&self, id: u8, pack: PackCb, _flags: u32) -> Result<usize> {
        check_id(id)?;
        self.ready()?;
        let s = &self.s;
        let i = s.alloc()?;
        let off = i * s.seg;
        // SAFETY: slot i's buffer is ours: no operation uses it until posted below.
        let b = unsafe { s.tx_bufs.bytes_mut(off, s.seg) };
        b[..wire::HDR_LEN].copy_from_slice(&wire::header(id));
        let n = match pack.pack(&mut b[wire::HDR_LEN..]) {
            Ok(n) => n,
            Err(e) => {
                s.unalloc(i);
                return Err(e);
            }
        };
        // SAFETY: the slot's buffer and context stay reserved until the send completes.
        let r = unsafe {
            self.st.tx.send(
                s.tx_bufs.addr(off),
                wire::HDR_LEN + n,
                s.tx_desc(),
                self.st.dest,
                s.ctx(i),
            )
        };
        match self.posted(r, "fi_send") {
            Ok(()) => {
                s.posted(i, self.plain(Comp::NONE), &self.st);
                Ok(n)
            }
            Err(e) => {
                s.unalloc(i);
                Err(e)
            }
        }
    }

    fn am_zcopy(&self, id: u8, header: &[u8], iov: &[Iov], _flags: u32, comp: Comp) -> Result<Outcome> {
        check_id(id)?;
        let s = &self.s;
        let total = wire::HDR_LEN + header.len() + total_len(iov);
        if total > s.seg || iov.len() > s.am_iov || header.len() > 128 {
            return Err(too_big("am_zcopy", total - wire::HDR_LEN, s.seg - wire::HDR_LEN));
        }
        let mut descs = Vec::with_capacity(iov.len() + 1);
        descs.push(s.tx_desc());
        self.descs(iov, &mut descs)?;
        let mut vecs = Vec::with_capacity(iov.len() + 1);
        self.with_slot(
            "fi_sendmsg",
            |_| self.plain(comp),
            |i| {
                let off = i * s.seg;
                // SAFETY: slot i's buffer is ours until posted.
                let b = unsafe { s.tx_bufs.bytes_mut(off, wire::HDR_LEN + header.len()) };
                b[..wire::HDR_LEN].copy_from_slice(&wire::header(id));
                b[wire::HDR_LEN..].copy_from_slice(header);
                vecs.push(iovec_of(s.tx_bufs.addr(off), wire::HDR_LEN + header.len()));
                vecs.extend(
                    iov.iter()
                        .filter(|v| !v.is_empty())
                        .map(|v| iovec_of(v.addr(), v.len())),
                );
                // SAFETY: the header is in the slot's buffer and the payload in host memory
                // kept valid until `comp` completes (uct zcopy contract).
                unsafe { self.st.tx.sendmsg(&vecs, &mut descs, self.st.dest, s.ctx(i)) }
            },
        )?;
        Ok(Outcome::InProgress)
    }

    fn put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        if !self.s.rma {
            return Err(Status::Unsupported.into());
        }
        self.rma(true, iov, raddr, rkey, comp)
    }

    fn get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        if !self.s.rma {
            return Err(Status::Unsupported.into());
        }
        self.rma(false, iov, raddr, rkey, comp)
    }

    fn atomic_post(&self, size: AtomicSize, op: AtomicOp, value: u64, raddr: u64, rkey: u64) -> Result<()> {
        self.fetch(size, op, value, None, None, raddr, rkey, Comp::NONE)
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
    ) -> Result<Outcome> {
        if op == AtomicOp::Cswap {
            return Err(Status::InvalidParam.into());
        }
        self.fetch(size, op, value, None, Some(result), raddr, rkey, comp)?;
        Ok(Outcome::InProgress)
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
    ) -> Result<Outcome> {
        self.fetch(
            size,
            AtomicOp::Cswap,
            swap,
            Some(compare),
            Some(result),
            raddr,
            rkey,
            comp,
        )?;
        Ok(Outcome::InProgress)
    }

    fn pending_add(&self, req: PendingReq, _flags: u32) -> Result<()> {
        if !self.st.has_pending()
            && !self.st.blocked.get()
            && !self.st.connecting.get()
            && self.s.has_free()
            && self.st.failed.get().is_none()
        {
            return Err(Status::Busy.into());
        }
        self.st.pending.borrow_mut().push_back(req);
        if !self.st.queued.replace(true) {
            self.s.arbiter.borrow_mut().push_back(self.st.clone());
        }
        Ok(())
    }

    fn pending_purge(&self, purge: PurgeCb) {
        let reqs = std::mem::take(&mut *self.st.pending.borrow_mut());
        for r in reqs {
            purge.purge(r);
        }
    }

    fn flush(&self, _flags: FlushFlags, comp: Comp) -> Result<Outcome> {
        if let Some(st) = self.st.failed.get() {
            return Err(failed(st));
        }
        if self.st.has_pending() {
            return Err(Status::NoResource.into());
        }
        if self.st.outstanding.get() == 0 {
            return Ok(Outcome::Done);
        }
        if !comp.is_none() {
            self.st.flush_waiters.borrow_mut().push(comp);
        }
        Ok(Outcome::InProgress)
    }
}
