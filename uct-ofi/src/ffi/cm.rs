//! Connection management of connected endpoints: the event queue and the passive endpoint.
#![allow(unsafe_code)]

use std::ptr;
use std::rc::Rc;

use super::*;

/// An event queue (`fi_eq_open`): connection events of connected endpoints.
pub struct Eq {
    pub(super) p: *mut fid_eq,
    pub(super) _fabric: Rc<Fabric>,
}

/// An event read from an [`Eq`].
pub enum EqEvent {
    /// A peer asks to connect; open an endpoint from `info` and accept.
    ConnReq { info: Info },
    /// The endpoint `fid` is connected.
    Connected { fid: usize },
    /// The endpoint `fid`'s connection is closed (by the peer, or it failed).
    Shutdown { fid: usize },
    /// An error for `fid` (a connection refused, or lost).
    Error { fid: usize, err: i32, message: String },
    /// An event the transport does not use.
    Other(u32),
}

impl Eq {
    /// Opens an EQ, with an fd wait object when `wait_fd` (falling back to none).
    pub fn open(fabric: &Rc<Fabric>, wait_fd: bool) -> Result<Rc<Eq>, i32> {
        let mut attr = fi_eq_attr {
            size: 64,
            wait_obj: wait_obj(wait_fd),
            ..Default::default()
        };
        let mut p = ptr::null_mut();
        // SAFETY: valid fabric and attributes; p receives the EQ.
        check(unsafe { rucx_fi_eq_open(fabric.p, &mut attr, &mut p, ptr::null_mut()) })?;
        Ok(Rc::new(Eq {
            p,
            _fabric: fabric.clone(),
        }))
    }

    pub(super) fn fid(&self) -> *mut fid {
        // SAFETY: fid_eq starts with its fid.
        unsafe { &mut (*self.p).fid }
    }

    /// The EQ's wait fd (`FI_GETWAIT`), when it has one.
    pub fn wait_fd(&self) -> Option<i32> {
        wait_fd_of(self.fid())
    }

    /// Reads one event (`None`: none waiting, or the read failed, which is logged).
    pub fn read(&self) -> Option<EqEvent> {
        // fi_eq_cm_entry and room for connection data we never send
        let mut buf = [0u64; 16];
        let mut event: u32 = 0;
        // SAFETY: buf has room for a CM entry (fid, info, data); the provider writes at most
        // its length.
        let r = unsafe {
            rucx_fi_eq_read(
                self.p,
                &mut event,
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(&buf),
                0,
            )
        };
        if r < 0 {
            if -r as i32 == errno::EAVAIL {
                return self.readerr();
            }
            if -r as i32 != errno::EAGAIN {
                ucs::warn!("ofi: fi_eq_read failed: {}", strerror(r as i64));
            }
            return None;
        }
        // SAFETY: a CM event wrote a fi_eq_cm_entry at the start of buf (u64-aligned).
        let e = unsafe { &*(buf.as_ptr() as *const fi_eq_cm_entry) };
        // an info the provider allocated is ours to free (fi_eq_cm_entry)
        let info = (!e.info.is_null()).then_some(Info { p: e.info });
        Some(match (event, info) {
            (FI_CONNREQ, Some(info)) => EqEvent::ConnReq { info },
            (FI_CONNECTED, _) => EqEvent::Connected { fid: e.fid as usize },
            (FI_SHUTDOWN, _) => EqEvent::Shutdown { fid: e.fid as usize },
            (other, _) => EqEvent::Other(other),
        })
    }

    fn readerr(&self) -> Option<EqEvent> {
        let mut e = fi_eq_err_entry::default();
        // SAFETY: e is a valid error entry (err_data null: the provider keeps its own).
        let r = unsafe { rucx_fi_eq_readerr(self.p, &mut e, 0) };
        if r < 1 {
            return None;
        }
        Some(EqEvent::Error {
            fid: e.fid as usize,
            err: e.err,
            message: strerror(e.err as i64),
        })
    }
}

impl Drop for Eq {
    fn drop(&mut self) {
        close(self.fid(), "event queue");
    }
}

/// A listening passive endpoint (`fi_passive_ep` + `fi_listen`), its connection requests
/// reported on an [`Eq`].
pub struct PassiveEp {
    pub(super) p: *mut fid_pep,
    pub(super) _eq: Rc<Eq>,
    pub(super) _fabric: Rc<Fabric>,
}

impl PassiveEp {
    pub fn listen(fabric: &Rc<Fabric>, info: &Info, eq: &Rc<Eq>) -> Result<PassiveEp, i32> {
        let mut p = ptr::null_mut();
        // SAFETY: valid fabric and info; p receives the passive endpoint.
        check(unsafe { rucx_fi_passive_ep(fabric.p, info.p, &mut p, ptr::null_mut()) })?;
        let pep = PassiveEp {
            p,
            _eq: eq.clone(),
            _fabric: fabric.clone(),
        };
        // SAFETY: binding an EQ of the same fabric, then listening.
        unsafe {
            check(rucx_fi_pep_bind(pep.p, eq.fid(), 0))?;
            check(rucx_fi_listen(pep.p))?;
        }
        Ok(pep)
    }

    /// The address it listens at (`fi_getname`): what peers connect to.
    pub fn name(&self) -> Result<Vec<u8>, i32> {
        // SAFETY: fid_pep starts with its fid.
        getname(unsafe { &mut (*self.p).fid })
    }
}

impl Drop for PassiveEp {
    fn drop(&mut self) {
        // SAFETY: fid_pep starts with its fid.
        close(unsafe { &mut (*self.p).fid }, "passive endpoint");
    }
}
