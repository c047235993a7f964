//! Endpoints (RDM, connected, shared receive contexts) and their data-path calls.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;
use std::rc::Rc;

use super::*;

/// Operation codes and datatypes for atomics.
pub mod atomic {
    use super::sys::*;
    pub const U32: u32 = fi_datatype_FI_UINT32;
    pub const U64: u32 = fi_datatype_FI_UINT64;
    pub const SUM: u32 = fi_op_FI_SUM;
    pub const BAND: u32 = fi_op_FI_BAND;
    pub const BOR: u32 = fi_op_FI_BOR;
    pub const BXOR: u32 = fi_op_FI_BXOR;
    pub const WRITE: u32 = fi_op_FI_ATOMIC_WRITE;
    pub const CSWAP: u32 = fi_op_FI_CSWAP;
}

/// Which flavour of atomic is asked about in [`Endpoint::atomic_valid`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicKind {
    Post,
    Fetch,
    Compare,
}

/// What an endpoint was opened on and bound to, kept open while it is.
#[derive(Default)]
struct Keep {
    _domain: Option<Rc<Domain>>,
    _cq: Option<Rc<Cq>>,
    _av: Option<Rc<Av>>,
    _srx: Option<Rc<Endpoint>>,
    _eq: Option<Rc<Eq>>,
}

/// An endpoint: a reliable-datagram one bound to a CQ (send and receive) and an AV; a
/// connected one bound to a CQ, a shared receive context and an EQ; or a shared receive
/// context (`fi_srx_context`, receives only). Enabled when opened.
pub struct Endpoint {
    pub(super) p: *mut fid_ep,
    /// Connected: shut down before it is closed, so the peer hears of it.
    pub(super) msg: bool,
    keep: Keep,
}

impl Endpoint {
    /// `fi_endpoint` from `info`, keeping `keep` open while it lives (not bound yet).
    fn create(domain: &Rc<Domain>, info: &Info, keep: Keep) -> Result<Endpoint, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and info; p receives the endpoint.
        check(unsafe { rucx_fi_endpoint(domain.p, info.p, &mut p, ptr::null_mut()) })?;
        Ok(Endpoint { p, msg: false, keep })
    }

    pub fn open(domain: &Rc<Domain>, info: &Info, cq: &Rc<Cq>, av: &Rc<Av>) -> Result<Endpoint, i32> {
        let keep = Keep {
            _cq: Some(cq.clone()),
            _av: Some(av.clone()),
            ..Keep::default()
        };
        let ep = Endpoint::create(domain, info, keep)?;
        let flags = (FI_TRANSMIT | FI_RECV) as u64;
        // SAFETY: binding a valid CQ and AV of the same domain to the endpoint, then enabling it.
        unsafe {
            check(rucx_fi_ep_bind(ep.p, cq.fid(), flags))?;
            check(rucx_fi_ep_bind(ep.p, &mut (*av.p).fid, 0))?;
            check(rucx_fi_enable(ep.p))?;
        }
        Ok(ep)
    }

    /// A shared receive context on `domain` (`fi_srx_context` with the info's receive
    /// attributes), its receive completions going to `cq`.
    pub fn srx(domain: &Rc<Domain>, info: &Info, cq: &Rc<Cq>) -> Result<Rc<Endpoint>, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid domain; the info's rx_attr is valid or null; p receives the context.
        check(unsafe { rucx_fi_srx_context(domain.p, (*info.p).rx_attr, &mut p, ptr::null_mut()) })?;
        let srx = Endpoint {
            p,
            msg: false,
            keep: Keep {
                _domain: Some(domain.clone()),
                _cq: Some(cq.clone()),
                ..Keep::default()
            },
        };
        // Some providers complete shared receives on the CQ bound to the context (tcp), others
        // on the CQ of the endpoint that received (verbs, which refuses this bind).
        // SAFETY: binding a valid CQ of the same domain.
        let r = unsafe { rucx_fi_ep_bind(srx.p, cq.fid(), FI_RECV as u64) };
        if r != 0 && -r != errno::ENOSYS {
            return Err(r);
        }
        Ok(Rc::new(srx))
    }

    /// A connected endpoint (not yet connected: see [`Endpoint::connect`], [`Endpoint::accept`])
    /// from `info` (the device's, with the peer's address; or a connection request's), bound to
    /// `cq`, the shared receive context `srx` and `eq`, enabled.
    pub fn open_msg(
        domain: &Rc<Domain>,
        info: &Info,
        cq: &Rc<Cq>,
        srx: &Rc<Endpoint>,
        eq: &Rc<Eq>,
    ) -> Result<Endpoint, i32> {
        let keep = Keep {
            _cq: Some(cq.clone()),
            _srx: Some(srx.clone()),
            _eq: Some(eq.clone()),
            ..Keep::default()
        };
        let ep = Endpoint::create(domain, info, keep)?;
        // SAFETY: binding a valid CQ, shared receive context and EQ of the same domain and
        // fabric, then enabling.
        unsafe {
            check(rucx_fi_ep_bind(ep.p, cq.fid(), (FI_TRANSMIT | FI_RECV) as u64))?;
            check(rucx_fi_ep_bind(ep.p, &mut (*srx.p).fid, 0))?;
            check(rucx_fi_ep_bind(ep.p, &mut (*eq.p).fid, 0))?;
            check(rucx_fi_enable(ep.p))?;
        }
        Ok(ep)
    }

    /// Starts connecting to the address its info names (`fi_connect`); the EQ reports
    /// `FI_CONNECTED` or an error.
    pub fn connect(&mut self, dest: &[u8]) -> Result<(), i32> {
        self.msg = true;
        // SAFETY: dest is an address of the provider's format (dest.len() bytes read); no
        // connection data.
        check(unsafe { rucx_fi_connect(self.p, dest.as_ptr().cast(), ptr::null(), 0) })
    }

    /// Accepts the connection request it was opened for (`fi_accept`).
    pub fn accept(&mut self) -> Result<(), i32> {
        self.msg = true;
        // SAFETY: valid endpoint opened from a connection request's info; no data.
        check(unsafe { rucx_fi_accept(self.p, ptr::null(), 0) })
    }

    /// The endpoint's fid, as EQ events name it.
    pub fn fid(&self) -> usize {
        self.p as usize
    }

    /// The endpoint's address (`fi_getname`), what peers insert into their AV.
    pub fn name(&self) -> Result<Vec<u8>, i32> {
        // SAFETY: the endpoint's fid starts its struct.
        getname(unsafe { &mut (*self.p).fid })
    }

    /// Whether `op` on `datatype` is supported (`fi_*atomicvalid`).
    pub fn atomic_valid(&self, kind: AtomicKind, datatype: u32, op: u32) -> bool {
        let mut count = 0usize;
        // SAFETY: queries only.
        let r = unsafe {
            match kind {
                AtomicKind::Post => rucx_fi_atomicvalid(self.p, datatype, op, &mut count),
                AtomicKind::Fetch => rucx_fi_fetch_atomicvalid(self.p, datatype, op, &mut count),
                AtomicKind::Compare => rucx_fi_compare_atomicvalid(self.p, datatype, op, &mut count),
            }
        };
        r == 0 && count >= 1
    }

    /// `fi_inject`: `buf` is copied before the call returns; no completion.
    #[inline]
    pub fn inject(&self, buf: &[u8], dest: u64) -> isize {
        // SAFETY: inject copies buf out before returning.
        unsafe { rucx_fi_inject(self.p, buf.as_ptr().cast(), buf.len(), dest) }
    }

    /// `fi_send` of `[buf, buf + len)`, completing with context `ctx`.
    ///
    /// # Safety
    /// The buffer stays valid and unmodified until the completion for `ctx` is read; `desc` is
    /// its region's descriptor (or null where the provider does not need one); `ctx` points to
    /// 64 writable bytes reserved for the operation until then (`FI_CONTEXT2`).
    #[inline]
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: u64,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: forwarded to the caller.
        unsafe { rucx_fi_send(self.p, buf.cast(), len, desc, dest, ctx) }
    }

    /// `fi_sendmsg` of an I/O vector.
    ///
    /// # Safety
    /// As [`Endpoint::send`], for every entry of `iov` (with `descs` in step).
    pub unsafe fn sendmsg(
        &self,
        iov: &[iovec],
        descs: &mut [*mut c_void],
        dest: u64,
        ctx: *mut c_void,
    ) -> isize {
        let msg = fi_msg {
            msg_iov: iov.as_ptr(),
            desc: descs.as_mut_ptr(),
            iov_count: iov.len(),
            addr: dest,
            context: ctx,
            data: 0,
        };
        // SAFETY: forwarded to the caller; msg lives for the call.
        unsafe { rucx_fi_sendmsg(self.p, &msg, FI_COMPLETION as u64) }
    }

    /// `fi_recv` into `[buf, buf + len)` from any peer.
    ///
    /// # Safety
    /// The buffer stays valid (and is not read) until the completion for `ctx` is read; `ctx`
    /// as in [`Endpoint::send`].
    pub unsafe fn recv(&self, buf: *mut u8, len: usize, desc: *mut c_void, ctx: *mut c_void) -> isize {
        // SAFETY: forwarded to the caller.
        unsafe { rucx_fi_recv(self.p, buf.cast(), len, desc, ADDR_UNSPEC, ctx) }
    }

    /// `fi_writemsg` (`write`) or `fi_readmsg` of a local I/O vector to/from remote
    /// `[addr, addr + total)` under `key`, delivery-complete for writes.
    ///
    /// # Safety
    /// As [`Endpoint::send`], for every entry of `iov` (written to, for reads).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rma(
        &self,
        write: bool,
        iov: &[iovec],
        descs: &mut [*mut c_void],
        dest: u64,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> isize {
        let total = iov.iter().map(|v| v.iov_len).sum();
        let rma = fi_rma_iov {
            addr,
            len: total,
            key,
        };
        let msg = fi_msg_rma {
            msg_iov: iov.as_ptr(),
            desc: descs.as_mut_ptr(),
            iov_count: iov.len(),
            addr: dest,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: ctx,
            data: 0,
        };
        // SAFETY: forwarded to the caller; msg and rma live for the call.
        unsafe {
            if write {
                rucx_fi_writemsg(self.p, &msg, (FI_COMPLETION | FI_DELIVERY_COMPLETE) as u64)
            } else {
                rucx_fi_readmsg(self.p, &msg, FI_COMPLETION as u64)
            }
        }
    }

    /// `fi_inject_atomic` of one element: `operand` is copied before the call returns.
    pub fn inject_atomic(
        &self,
        operand: &[u8],
        dest: u64,
        addr: u64,
        key: u64,
        datatype: u32,
        op: u32,
    ) -> isize {
        // SAFETY: the operand is copied out before returning.
        unsafe { rucx_fi_inject_atomic(self.p, operand.as_ptr().cast(), 1, dest, addr, key, datatype, op) }
    }

    /// `fi_fetch_atomic` (`compare` none) or `fi_compare_atomic` of one element.
    ///
    /// # Safety
    /// `operand`, `compare` and `result` (8 bytes each, described by `desc`) stay valid until
    /// the completion for `ctx` is read; `ctx` as in [`Endpoint::send`]. (On a provider that
    /// takes the operand and compare pointers' values as the operands, see
    /// `Shared::atomic_by_value`, those two are values and never dereferenced.)
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn fetch_atomic(
        &self,
        operand: *const u8,
        compare: Option<*const u8>,
        result: *mut u8,
        desc: *mut c_void,
        dest: u64,
        addr: u64,
        key: u64,
        datatype: u32,
        op: u32,
        ctx: *mut c_void,
    ) -> isize {
        // SAFETY: forwarded to the caller.
        unsafe {
            match compare {
                None => rucx_fi_fetch_atomic(
                    self.p,
                    operand.cast(),
                    1,
                    desc,
                    result.cast(),
                    desc,
                    dest,
                    addr,
                    key,
                    datatype,
                    op,
                    ctx,
                ),
                Some(c) => rucx_fi_compare_atomic(
                    self.p,
                    operand.cast(),
                    1,
                    desc,
                    c.cast(),
                    desc,
                    result.cast(),
                    desc,
                    dest,
                    addr,
                    key,
                    datatype,
                    op,
                    ctx,
                ),
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.msg {
            // SAFETY: a valid connected (or connecting) endpoint; failing is harmless here.
            unsafe { rucx_fi_shutdown(self.p, 0) };
        }
        // SAFETY: fid_ep starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "endpoint");
        let _ = &self.keep;
    }
}

/// `fi_getname` of `fid`.
pub(super) fn getname(fid: *mut fid) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; 256];
    let mut len = buf.len();
    // SAFETY: buf has len bytes; fid is a valid endpoint's.
    let mut r = unsafe { rucx_fi_getname(fid, buf.as_mut_ptr().cast(), &mut len) };
    if -r == 257 && len > buf.len() {
        buf.resize(len, 0);
        // SAFETY: as above, with the size the provider asked for.
        r = unsafe { rucx_fi_getname(fid, buf.as_mut_ptr().cast(), &mut len) };
    }
    check(r)?;
    buf.truncate(len);
    Ok(buf)
}
