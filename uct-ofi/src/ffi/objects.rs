//! Fabric, domain, memory regions, completion queue and address vector.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ptr;
use std::rc::Rc;

use super::*;

/// A fabric (`fi_fabric`).
pub struct Fabric {
    pub(super) p: *mut fid_fabric,
}

impl Fabric {
    pub fn open(info: &Info) -> Result<Rc<Fabric>, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: the info's fabric_attr is valid; p receives the fabric.
        check(unsafe { fi_fabric((*info.p).fabric_attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Fabric { p }))
    }

    /// `fi_trywait` on `cq`: `Ok` when it is safe to sleep on the CQ's fd, `Err(-FI_EAGAIN)`
    /// when completions are pending or progress is needed.
    pub fn trywait(&self, cq: &Cq) -> Result<(), i32> {
        let mut f = cq.fid();
        // SAFETY: one valid fid of an object opened on this fabric.
        check(unsafe { rucx_fi_trywait(self.p, &mut f, 1) })
    }

    /// `fi_trywait` on `eq`: `Ok` when its fd is armed again (some providers' fds stay
    /// signalled until this is called), `Err(-FI_EAGAIN)` when events wait.
    pub fn trywait_eq(&self, eq: &Eq) -> Result<(), i32> {
        let mut f = eq.fid();
        // SAFETY: one valid fid of an object opened on this fabric.
        check(unsafe { rucx_fi_trywait(self.p, &mut f, 1) })
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: fid_fabric starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "fabric");
    }
}

/// A domain (`fi_domain`).
pub struct Domain {
    pub(super) p: *mut fid_domain,
    pub fabric: Rc<Fabric>,
}

impl Domain {
    pub fn open(fabric: &Rc<Fabric>, info: &Info) -> Result<Rc<Domain>, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid fabric and info; p receives the domain.
        check(unsafe { rucx_fi_domain(fabric.p, info.p, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Domain {
            p,
            fabric: fabric.clone(),
        }))
    }

    /// Registers `[addr, addr + len)` with `FI_*` access bits and (unless the provider picks keys)
    /// `key`.
    ///
    /// # Safety
    /// The memory must stay mapped until the returned region is dropped: peers (and the provider)
    /// read and write it through the region without further checks.
    pub unsafe fn mr_reg(
        self: &Rc<Self>,
        addr: *const u8,
        len: usize,
        access: u64,
        key: u64,
    ) -> Result<Mr, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: forwarded to the caller (the range stays valid); p receives the region.
        check(unsafe {
            rucx_fi_mr_reg(
                self.p,
                addr.cast(),
                len,
                access,
                0,
                key,
                0,
                &mut p,
                ptr::null_mut(),
            )
        })?;
        Ok(Mr {
            p,
            _domain: self.clone(),
        })
    }
}

impl Domain {
    /// Whether the domain's endpoints support `op` on `datatype` (`fi_query_atomic`).
    pub fn atomic_valid(&self, kind: AtomicKind, datatype: u32, op: u32) -> bool {
        let flags = match kind {
            AtomicKind::Post => 0,
            AtomicKind::Fetch => FI_FETCH_ATOMIC,
            AtomicKind::Compare => FI_COMPARE_ATOMIC,
        };
        let mut attr = fi_atomic_attr::default();
        // SAFETY: a query into our attr struct.
        let r = unsafe { rucx_fi_query_atomic(self.p, datatype, op, &mut attr, flags) };
        r == 0 && attr.count >= 1
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: fid_domain starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "domain");
    }
}

/// A registered memory region.
pub struct Mr {
    pub(super) p: *mut fid_mr,
    pub(super) _domain: Rc<Domain>,
}

impl Mr {
    /// The local descriptor data calls take (`fi_mr_desc`).
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: valid region.
        unsafe { rucx_fi_mr_desc(self.p) }
    }
    /// The key peers use (`fi_mr_key`).
    pub fn key(&self) -> u64 {
        // SAFETY: valid region.
        unsafe { rucx_fi_mr_key(self.p) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: fid_mr starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "memory region");
    }
}

/// One completion (`struct fi_cq_msg_entry`).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct CqEntry(pub(super) fi_cq_msg_entry);

impl CqEntry {
    pub fn context(&self) -> usize {
        self.0.op_context as usize
    }
    pub fn flags(&self) -> u64 {
        self.0.flags
    }
    pub fn len(&self) -> usize {
        self.0.len
    }
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
}

/// An error completion, decoded.
#[derive(Debug)]
pub struct CqError {
    pub context: usize,
    pub flags: u64,
    pub err: i32,
    pub message: String,
}

/// A completion queue (`fi_cq_open`, `FI_CQ_FORMAT_MSG`).
pub struct Cq {
    pub(super) p: *mut fid_cq,
    pub(super) _domain: Rc<Domain>,
}

impl Cq {
    /// Opens a CQ of `size` entries, with an fd wait object when `wait_fd`.
    pub fn open(domain: &Rc<Domain>, size: usize, wait_fd: bool) -> Result<Rc<Cq>, i32> {
        let mut attr = fi_cq_attr {
            size,
            format: fi_cq_format_FI_CQ_FORMAT_MSG,
            wait_obj: wait_obj(wait_fd),
            ..Default::default()
        };
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and attributes; p receives the CQ.
        check(unsafe { rucx_fi_cq_open(domain.p, &mut attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Cq {
            p,
            _domain: domain.clone(),
        }))
    }

    pub(super) fn fid(&self) -> *mut fid {
        // SAFETY: fid_cq starts with its fid.
        unsafe { &mut (*self.p).fid }
    }

    /// The CQ's wait fd (`FI_GETWAIT`), when it has one.
    pub fn wait_fd(&self) -> Option<i32> {
        wait_fd_of(self.fid())
    }

    /// Reads up to `out.len()` completions into storage left uninitialized (progress reads the
    /// CQ on every call; nothing is zeroed): the entries read (at least one), or libfabric's
    /// value (`-FI_EAGAIN`: none; `-FI_EAVAIL`: an error entry waits for [`Cq::readerr`]).
    #[inline]
    pub fn read<'a>(&self, out: &'a mut [MaybeUninit<CqEntry>]) -> Result<&'a [CqEntry], isize> {
        // SAFETY: out has room for out.len() entries of the CQ's format; the provider only
        // writes them.
        let n = unsafe { rucx_fi_cq_read(self.p, out.as_mut_ptr().cast(), out.len()) };
        if n <= 0 {
            return Err(n);
        }
        let n = (n as usize).min(out.len());
        // SAFETY: the provider wrote the first n entries; CqEntry is plain data, transparent
        // over fi_cq_msg_entry.
        Ok(unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<CqEntry>(), n) })
    }

    /// Reads one error entry.
    pub fn readerr(&self) -> Option<CqError> {
        let mut e = fi_cq_err_entry::default();
        // SAFETY: e is a valid error entry (err_data null: the provider keeps its own).
        let r = unsafe { rucx_fi_cq_readerr(self.p, &mut e, 0) };
        if r < 1 {
            return None;
        }
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: the provider's message for its own error, into our buffer.
        let s = unsafe { rucx_fi_cq_strerror(self.p, e.prov_errno, e.err_data, buf.as_mut_ptr(), buf.len()) };
        let prov = if s.is_null() { String::new() } else { cstr(s) };
        Some(CqError {
            context: e.op_context as usize,
            flags: e.flags,
            err: e.err,
            message: format!("{} ({prov})", strerror(e.err as i64)),
        })
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        close(self.fid(), "completion queue");
    }
}

/// An address vector (`fi_av_open`, `FI_AV_TABLE`).
pub struct Av {
    pub(super) p: *mut fid_av,
    pub(super) _domain: Rc<Domain>,
}

impl Av {
    pub fn open(domain: &Rc<Domain>, count: usize) -> Result<Rc<Av>, i32> {
        let mut attr = fi_av_attr {
            type_: fi_av_type_FI_AV_TABLE,
            count,
            ..Default::default()
        };
        let mut p = ptr::null_mut();
        // SAFETY: valid domain and attributes; p receives the AV.
        check(unsafe { rucx_fi_av_open(domain.p, &mut attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Av {
            p,
            _domain: domain.clone(),
        }))
    }

    /// Inserts one peer address (as its `fi_getname` gave it); returns its `fi_addr_t`.
    pub fn insert(&self, addr: &[u8]) -> Result<u64, i32> {
        let mut out: fi_addr_t = ADDR_UNSPEC;
        // SAFETY: one address of the provider's format (the length was checked by the caller
        // against the iface address length; libfabric reads addrlen bytes).
        let r = unsafe { rucx_fi_av_insert(self.p, addr.as_ptr().cast(), 1, &mut out, 0, ptr::null_mut()) };
        if r == 1 && out != ADDR_UNSPEC {
            Ok(out)
        } else if r < 0 {
            Err(r)
        } else {
            Err(-22)
        }
    }
}

impl Drop for Av {
    fn drop(&mut self) {
        // SAFETY: fid_av starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "address vector");
    }
}
