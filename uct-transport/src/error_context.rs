//! Error messages across the plugin boundary.
//!
//! The tables return a bare status; when a transport's error carries context (what went wrong
//! and how to fix it), the glue leaves the message here just before it returns that status, and
//! the host picks it up while turning the status into its [`ucs::Error`]. Per thread, so it
//! pairs with the call that just returned on this thread; tagged with the status, so a message
//! is never attached to another error. A plugin has its own copy of this crate: its glue hands
//! the message to the host's copy through [`RawHostApi::set_error`](crate::abi::RawHostApi),
//! registered at init; a built-in transport shares the host's copy.
//!
//! `NoResource` never carries a message: it is flow control, on the fast path.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::sync::OnceLock;

use ucs::{Error, Status};

use crate::abi::{RawSetErrorFn, RawStatus};

thread_local! {
    static LAST: RefCell<Option<(RawStatus, String)>> = const { RefCell::new(None) };
}

/// The host's `set_error`, when this copy of the crate lives in a plugin.
static HOST: OnceLock<RawSetErrorFn> = OnceLock::new();

pub(crate) fn set_host(f: RawSetErrorFn) {
    let _ = HOST.set(f);
}

/// Leaves `message` for the host, as the context of the error `status` about to be returned.
pub fn leave(status: RawStatus, message: String) {
    if status == Status::NoResource.as_raw() {
        return;
    }
    match HOST.get() {
        // SAFETY: the host's function takes a byte range valid for the call.
        Some(f) => unsafe { f(status, message.as_ptr(), message.len()) },
        None => store(status, message),
    }
}

/// Keeps `message` in this thread's slot (the host's side of [`leave`]).
pub fn store(status: RawStatus, message: String) {
    LAST.with(|l| *l.borrow_mut() = Some((status, message)));
}

/// The error for a status a table returned: with the message left for it, if any.
#[cold]
pub fn take(status: RawStatus) -> Error {
    let s = Status::from_raw(status);
    if status == Status::NoResource.as_raw() {
        return Error::from(s);
    }
    match LAST.with(|l| l.borrow_mut().take()) {
        Some((st, msg)) if st == status => Error::new(s, msg),
        _ => Error::from(s),
    }
}

/// The glue's side: the raw status of `e`, its context left for the host.
#[inline]
pub(crate) fn to_raw(mut e: Error) -> RawStatus {
    let st = e.status().as_raw();
    if let Some(msg) = e.take_context() {
        leave(st, msg);
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_goes_with_its_status_only() {
        let st = to_raw(Error::new(Status::InvalidParam, "bad id 40"));
        assert_eq!(st, Status::InvalidParam.as_raw());
        let e = take(st);
        assert_eq!(e, Status::InvalidParam);
        assert_eq!(e.context(), Some("bad id 40"));
        // Taken once.
        assert_eq!(take(st).context(), None);
        // Another status does not pick it up.
        to_raw(Error::new(Status::Unsupported, "no put"));
        assert_eq!(take(Status::IoError.as_raw()).context(), None);
        assert_eq!(take(Status::Unsupported.as_raw()).context(), None);
        // NoResource never carries one.
        to_raw(Error::new(Status::NoResource, "full"));
        assert_eq!(take(Status::NoResource.as_raw()).context(), None);
    }
}
