//! The active-message handler table of an interface (32 ids), shared by the host (which sets
//! handlers) and the transport (which invokes them).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::c_void;

use ucs::{Error, Status};

use crate::abi::{RawAmCb, RawRxDesc};
use crate::types::{AmCbFlags, AM_ID_MAX};

#[derive(Clone, Copy)]
struct Entry {
    cb: Option<RawAmCb>,
    arg: *mut c_void,
    /// Installed with `AmCbFlags::SHARED_DATA`.
    shared: bool,
}

const EMPTY: Entry = Entry {
    cb: None,
    arg: std::ptr::null_mut(),
    shared: false,
};

/// Handlers by AM id. Interior-mutable so a handler may replace handlers while running.
pub struct AmTable {
    entries: [Cell<Entry>; AM_ID_MAX as usize],
    /// One warning per id without a handler, so a flood does not flood the log.
    warned: Cell<u32>,
    /// Whether handlers may be sync (the iface only calls them from progress: `CB_SYNC`).
    supports_sync: bool,
}

/// A receive descriptor a transport lends to an AM handler (see [`RawRxDesc`]).
#[derive(Debug)]
pub struct LentDesc(std::ptr::NonNull<RawRxDesc>);

impl LentDesc {
    /// Wraps a descriptor.
    ///
    /// # Safety
    /// `desc` must point to a `RawRxDesc` whose `release` stays callable, with the received data
    /// valid, until the host calls it (exactly once) — the host keeps it only if the handler
    /// asks to.
    pub unsafe fn new(desc: std::ptr::NonNull<RawRxDesc>) -> LentDesc {
        LentDesc(desc)
    }
}

/// What an AM handler did with the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmDisposition {
    /// Consumed (or copied); the transport may reuse the buffer.
    Done,
    /// The handler kept the descriptor; it will call its `release`.
    Kept,
}

impl AmTable {
    /// A table with no handlers. `supports_sync` is true when the iface has `CB_SYNC`.
    pub fn new(supports_sync: bool) -> AmTable {
        AmTable {
            entries: [const { Cell::new(EMPTY) }; AM_ID_MAX as usize],
            warned: Cell::new(0),
            supports_sync,
        }
    }

    /// Installs (`cb` some) or removes (`cb` none) the handler of `id` (`uct_iface_set_am_handler`).
    pub fn set(&self, id: u8, cb: Option<RawAmCb>, arg: *mut c_void, flags: AmCbFlags) -> ucs::Result<()> {
        let invalid = |msg: String| Err(Error::new(Status::InvalidParam, msg));
        if id >= AM_ID_MAX {
            return invalid(format!(
                "set_am_handler: AM id {id} out of range 0..{}",
                AM_ID_MAX - 1
            ));
        }
        if flags.contains(AmCbFlags::RESERVED) {
            return invalid(format!(
                "set_am_handler (id {id}): the RESERVED flag must not be used"
            ));
        }
        if cb.is_some() && !flags.contains(AmCbFlags::ASYNC) && !self.supports_sync {
            return invalid(format!(
                "set_am_handler (id {id}): this transport calls handlers asynchronously; pass AmCbFlags::ASYNC"
            ));
        }
        let shared = flags.contains(AmCbFlags::SHARED_DATA);
        self.entries[id as usize].set(Entry { cb, arg, shared });
        Ok(())
    }

    /// Removes every handler (when the interface closes: the host frees them afterwards).
    pub fn clear(&self) {
        for e in &self.entries {
            e.set(EMPTY);
        }
    }

    /// True when `id` has a handler.
    pub fn has_handler(&self, id: u8) -> bool {
        id < AM_ID_MAX && self.entries[id as usize].get().cb.is_some()
    }

    /// True when the handler of `id` takes messages in shared memory
    /// ([`AmCbFlags::SHARED_DATA`], see [`AmTable::invoke_shared`]).
    #[inline]
    pub fn takes_shared(&self, id: u8) -> bool {
        self.entries.get(id as usize).is_some_and(|e| e.get().shared)
    }

    /// Delivers a message that lies in memory a peer can write to the handler of `id`, which
    /// must take shared data ([`AmTable::takes_shared`]; otherwise the message is dropped with
    /// an error); nothing can keep it. Returns as [`AmTable::invoke`].
    ///
    /// # Safety
    /// `data` must be readable for `len` bytes until this returns (it may change meanwhile).
    #[inline]
    pub unsafe fn invoke_shared(&self, id: u8, data: *const u8, len: usize) -> ucs::Result<AmDisposition> {
        let Some((e, cb)) = self.handler(id, len)? else {
            return Ok(AmDisposition::Done);
        };
        if !e.shared {
            return Err(not_shared(id));
        }
        // SAFETY: the handler and its argument were installed by the host (kept alive while
        // installed); it was installed for shared data, and `data` is readable for `len`
        // bytes for the call (the caller's contract).
        let _ = unsafe {
            cb(
                e.arg,
                data,
                len,
                std::ptr::null_mut(),
                crate::abi::AM_PARAM_SHARED,
            )
        };
        Ok(AmDisposition::Done)
    }

    /// Delivers a message to the handler of `id`. `desc` is the descriptor the handler may keep
    /// (`None` when the data lives in a buffer the transport reuses at once).
    ///
    /// Returns `Err(InvalidParam)` for an id out of range (a malformed message: the caller
    /// should drop the connection). A message for an id without handler is logged once per id
    /// and dropped, as UCX does.
    #[inline]
    pub fn invoke(&self, id: u8, data: &[u8], desc: Option<LentDesc>) -> ucs::Result<AmDisposition> {
        let desc = desc.map_or(std::ptr::null_mut(), |d| d.0.as_ptr());
        let Some((e, cb)) = self.handler(id, data.len())? else {
            return Ok(AmDisposition::Done);
        };
        // SAFETY: the handler and its argument were installed by the host, which keeps them
        // alive while installed; `data` is valid for the call.
        let st = unsafe { cb(e.arg, data.as_ptr(), data.len(), desc, 0) };
        if st == Status::InProgress.as_raw() {
            if desc.is_null() {
                kept_without_desc(id);
                return Ok(AmDisposition::Done);
            }
            return Ok(AmDisposition::Kept);
        }
        Ok(AmDisposition::Done)
    }

    /// The entry of `id` and its handler; `None` (logged once per id) without one, an error
    /// for an id out of range.
    #[inline]
    fn handler(&self, id: u8, len: usize) -> ucs::Result<Option<(Entry, RawAmCb)>> {
        let Some(cell) = self.entries.get(id as usize) else {
            return Err(id_out_of_range(id));
        };
        let e = cell.get();
        match e.cb {
            Some(cb) => Ok(Some((e, cb))),
            None => {
                self.warn_unhandled(id, len);
                Ok(None)
            }
        }
    }

    #[cold]
    fn warn_unhandled(&self, id: u8, len: usize) {
        let bit = 1u32 << id;
        if self.warned.get() & bit == 0 {
            self.warned.set(self.warned.get() | bit);
            ucs::warn!(
                id,
                len,
                "got active message id {id}, but no handler installed: dropped (set one with set_am_handler)"
            );
        }
    }
}

#[cold]
#[inline(never)]
fn not_shared(id: u8) -> Error {
    let msg =
        format!("active message id {id}: its handler does not take shared data (a transport bug): dropped");
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

/// Logging kept out of line: the send path that inlines `invoke` stays small.
#[cold]
#[inline(never)]
fn id_out_of_range(id: u8) -> Error {
    let msg = format!(
        "active message id {id} out of range 0..{}: dropped",
        AM_ID_MAX - 1
    );
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

#[cold]
#[inline(never)]
fn kept_without_desc(id: u8) {
    ucs::error!(
        id,
        "AM handler returned InProgress for data it cannot keep; treated as consumed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the test handler saw: (len, desc non-null, flags, first byte).
    type Seen = Vec<(usize, bool, u32, Option<u8>)>;

    unsafe extern "C" fn record(
        arg: *mut c_void,
        data: *const u8,
        len: usize,
        desc: *mut RawRxDesc,
        flags: u32,
    ) -> i8 {
        // SAFETY: `arg` is the test's `Seen`, alive for the table's use; `data` has `len` bytes.
        let seen = unsafe { &mut *(arg as *mut Seen) };
        // SAFETY: `len` bytes at `data` (one when non-empty).
        let first = (len > 0).then(|| unsafe { data.read() });
        seen.push((len, !desc.is_null(), flags, first));
        0
    }

    #[test]
    fn shared_data_reaches_only_handlers_that_take_it() {
        let mut seen: Seen = Vec::new();
        let arg = &mut seen as *mut Seen as *mut c_void;
        let t = AmTable::new(true);
        t.set(1, Some(record), arg, AmCbFlags::SYNC).unwrap();
        t.set(2, Some(record), arg, AmCbFlags::SHARED_DATA).unwrap();
        assert!(!t.takes_shared(1) && t.takes_shared(2) && !t.takes_shared(3) && !t.takes_shared(200));
        let bytes = [7u8, 8, 9];
        // SAFETY: `bytes` is readable for its length during the calls.
        unsafe {
            assert_eq!(t.invoke_shared(2, bytes.as_ptr(), 3), Ok(AmDisposition::Done));
            // A handler without the flag never gets shared data: refused, not called.
            assert_eq!(
                t.invoke_shared(1, bytes.as_ptr(), 3).unwrap_err(),
                Status::InvalidParam
            );
            assert_eq!(
                t.invoke_shared(40, bytes.as_ptr(), 3).unwrap_err(),
                Status::InvalidParam
            );
            // No handler: dropped (logged once), as `invoke`.
            assert_eq!(t.invoke_shared(5, bytes.as_ptr(), 3), Ok(AmDisposition::Done));
        }
        t.invoke(1, &bytes[..2], None).unwrap();
        assert_eq!(
            seen,
            vec![
                (3, false, crate::abi::AM_PARAM_SHARED, Some(7)),
                (2, false, 0, Some(7))
            ]
        );
        // Replaced without the flag: no longer takes it.
        t.set(2, Some(record), arg, AmCbFlags::SYNC).unwrap();
        assert!(!t.takes_shared(2));
    }
}
