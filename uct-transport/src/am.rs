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
}

const EMPTY: Entry = Entry {
    cb: None,
    arg: std::ptr::null_mut(),
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
        self.entries[id as usize].set(Entry { cb, arg });
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

    /// Delivers a message to the handler of `id`. `desc` is the descriptor the handler may keep
    /// (`None` when the data lives in a buffer the transport reuses at once).
    ///
    /// Returns `Err(InvalidParam)` for an id out of range (a malformed message: the caller
    /// should drop the connection). A message for an id without handler is logged once per id
    /// and dropped, as UCX does.
    #[inline]
    pub fn invoke(&self, id: u8, data: &[u8], desc: Option<LentDesc>) -> ucs::Result<AmDisposition> {
        let desc = desc.map_or(std::ptr::null_mut(), |d| d.0.as_ptr());
        let Some(cell) = self.entries.get(id as usize) else {
            return Err(id_out_of_range(id));
        };
        let e = cell.get();
        let Some(cb) = e.cb else {
            self.warn_unhandled(id, data.len());
            return Ok(AmDisposition::Done);
        };
        // SAFETY: the handler and its argument were installed by the host, which keeps them
        // alive while installed; `data` is valid for the call.
        let st = unsafe { cb(e.arg, data.as_ptr(), data.len(), desc) };
        if st == Status::InProgress.as_raw() {
            if desc.is_null() {
                kept_without_desc(id);
                return Ok(AmDisposition::Done);
            }
            return Ok(AmDisposition::Kept);
        }
        Ok(AmDisposition::Done)
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
