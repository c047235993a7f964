//! Plugin side of the boundary: builds the C tables ([`crate::abi`]) from the safe traits of
//! [`crate::traits`], so a transport crate contains no `extern "C"` code of its own.
//!
//! Sections: [`md`] (component and memory domain), [`iface`] (transport, interface, endpoint
//! lifecycle, and the operation table), [`ep`] (the data path), [`module`] (the module
//! descriptor and the plugin entry point).
//!
//! # The boundary contract
//!
//! Every `unsafe extern "C" fn` in these modules is called only by a host through the tables
//! built here, and relies on the host keeping the rules of [`crate::abi`]:
//!
//! 1. **Handles**: an `md`, `iface` or `ep` argument is a handle this table's own `md_open`,
//!    `iface_open` or `ep_create*` returned, of the same concrete type, not yet closed or
//!    destroyed, used on the worker's thread; each is closed or destroyed once, after
//!    everything opened on it.
//! 2. **Buffers**: a pointer with a length is valid for that many bytes (reading, or writing
//!    for output buffers) for the duration of the call; a zero length may come with any pointer.
//! 3. **Out-pointers** (`*mut` results) are valid for one write.
//! 4. **Callbacks and their arguments** (pack/unpack, completions, pending requests, AM and
//!    error handlers) stay valid as [`crate::abi`] describes for each.
//!
//! Every entry point catches panics and turns them into `UCS_ERR_IO_ERROR` (or a harmless
//! default for functions without a status), so no unwinding crosses `extern "C"`.
#![allow(unsafe_code)]

mod ep;
mod iface;
mod md;
mod module;

pub use iface::{iface_ops, transport};
pub use md::{component, md_ops};
pub use module::{build_module, plugin_init};

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use ucs::{Error, Outcome, Status};

use crate::abi::*;
use crate::am::AmTable;
use crate::callbacks::{Comp, ErrHandler, PackCb, PendingReq, PurgeCb, ResultPtr, UnpackCb};
use crate::iov::Iov;
use crate::traits::{
    AtomicSize, EpHandle, IfaceOpenParams, Transport, TransportComponent, TransportEp, TransportIface,
    TransportMd,
};
use crate::types::{
    AmCbFlags, ArmEvents, AtomicOp, FlushFlags, MdAttr, MemAccess, ProgressFlags, TlResource,
};
use crate::worker_ref::{ProgressId, WorkerRef};

const PANIC: RawStatus = Status::IoError.as_raw();

#[inline(always)]
fn guard(f: impl FnOnce() -> RawStatus) -> RawStatus {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        ucs::error!("panic inside a transport (caught at the plugin boundary)");
        PANIC
    })
}

/// An error's raw status, its context left for the host.
#[inline(always)]
fn err(e: Error) -> RawStatus {
    crate::error_context::to_raw(e)
}

#[inline(always)]
fn st(r: ucs::Result<()>) -> RawStatus {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

#[inline(always)]
fn st2(r: ucs::Result<Outcome>) -> RawStatus {
    match r {
        Ok(Outcome::Done) => 0,
        Ok(Outcome::InProgress) => Status::InProgress.as_raw(),
        Err(e) => err(e),
    }
}

/// # Safety
/// `p` must be valid for `n` bytes when `n > 0` (any value, null too, when `n == 0`).
#[inline(always)]
unsafe fn bytes<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// # Safety
/// `p` must be valid for writing `n` bytes when `n > 0` (any value when `n == 0`).
#[inline(always)]
unsafe fn bytes_mut<'a>(p: *mut u8, n: usize) -> &'a mut [u8] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

#[inline(always)]
fn atomic_size(size: u8) -> ucs::Result<AtomicSize> {
    match size {
        4 => Ok(AtomicSize::U32),
        8 => Ok(AtomicSize::U64),
        _ => Err(bad_atomic("operand size", size)),
    }
}

#[inline(always)]
fn atomic_op(op: u8) -> ucs::Result<AtomicOp> {
    match AtomicOp::from_raw(op) {
        Some(op) => Ok(op),
        None => Err(bad_atomic("operation", op)),
    }
}

#[cold]
#[inline(never)]
fn bad_atomic(what: &str, v: u8) -> Error {
    Error::new(Status::InvalidParam, format!("unknown atomic {what} {v}"))
}

/// # Safety
/// `md` must be a handle returned by `md_open` of a component whose `Md` is `M`.
#[inline(always)]
pub(super) unsafe fn md_ref<'a, M>(md: *mut c_void) -> &'a M {
    // SAFETY: forwarded to the caller.
    unsafe { &*(md as *const M) }
}

/// # Safety
/// `ep` must be a handle returned by `ep_create*` of an iface whose ep type is `E`.
#[inline(always)]
pub(super) unsafe fn ep_ref<'a, E: TransportEp>(ep: *mut c_void) -> &'a E {
    // SAFETY: forwarded to the caller.
    unsafe { &*(ep as *const E) }
}
