//! errno -> `ucs::Error` for verbs calls, with the one log line every device failure gets, and
//! the errors (with context) for arguments rejected before calling into libibverbs.
//!
//! libibverbs reports errors in two ways: object-creating calls return NULL and set `errno`,
//! the `ibv_post_*`/`ibv_modify_*` family returns the errno value itself. Both end up here.

use ucs::{Error, Status};

/// The errno values verbs calls report (Linux, all architectures we support).
pub(crate) mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const ENOSYS: i32 = 38;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EPROTONOSUPPORT: i32 = 93;
}

/// Which kind of call failed: a post of work requests maps "no memory" to "queue full".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// Creating/modifying/querying an object.
    Control,
    /// `ibv_post_send`/`ibv_post_recv`/`ibv_post_srq_recv`: ENOMEM means the queue is full.
    Post,
}

/// Maps a verbs errno to a status (pure; unit-tested).
pub(crate) fn status_from_errno(err: i32, kind: CallKind) -> Status {
    match err {
        errno::ENOMEM if kind == CallKind::Post => Status::NoResource,
        errno::ENOSYS | errno::EOPNOTSUPP | errno::EPROTONOSUPPORT => Status::Unsupported,
        errno::EPERM => Status::IoError,
        errno::ENOENT => Status::NoElem,
        0 => Status::IoError, // a failure without errno must not read as success
        e => Status::from_errno(e),
    }
}

/// The current thread's errno (after a verbs call returned NULL / -1).
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The errno of a call that returned `rc != 0`: most verbs return the errno value itself,
/// a few return -1 and set `errno`.
pub(crate) fn rc_errno(rc: i32) -> i32 {
    if rc < 0 {
        last_errno()
    } else {
        rc
    }
}

/// Logs one line naming the failing verbs call, what it was doing and errno (a device or
/// provider failure the operator should see), and returns the matching status as an error
/// without context: allocates nothing, so a full queue on a post (`NoResource`) stays cheap.
/// Not used on success paths, so formatting costs nothing there.
#[cold]
pub(crate) fn fail(call: &str, what: std::fmt::Arguments<'_>, err: i32, kind: CallKind) -> Error {
    let status = status_from_errno(err, kind);
    ucs::error!(
        "{call}({what}) failed: {} (errno {err}) -> {}",
        std::io::Error::from_raw_os_error(err),
        status.name()
    );
    Error::from(status)
}

/// A rejected argument (API misuse, caught before calling into libibverbs): `status` with
/// `{call}: {why}` as the context the caller gets (logged at debug level only).
#[cold]
pub(crate) fn invalid(call: &str, why: std::fmt::Arguments<'_>, status: Status) -> Error {
    ucs::debug!("{call}: {why} -> {}", status.name());
    Error::new(status, format!("{call}: {why}"))
}

/// A host setup the library cannot use (no such device, no usable GID): logged for the
/// operator, and `status` with `{call}: {why}` as the context the caller gets.
#[cold]
pub(crate) fn unusable(call: &str, why: std::fmt::Arguments<'_>, status: Status) -> Error {
    ucs::error!("{call}: {why} -> {}", status.name());
    Error::new(status, format!("{call}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_enomem_is_queue_full_but_create_enomem_is_no_memory() {
        assert_eq!(
            status_from_errno(errno::ENOMEM, CallKind::Post),
            Status::NoResource
        );
        assert_eq!(
            status_from_errno(errno::ENOMEM, CallKind::Control),
            Status::NoMemory
        );
    }

    #[test]
    fn unsupported_and_fallbacks() {
        assert_eq!(
            status_from_errno(errno::EOPNOTSUPP, CallKind::Control),
            Status::Unsupported
        );
        assert_eq!(
            status_from_errno(errno::ENOSYS, CallKind::Control),
            Status::Unsupported
        );
        assert_eq!(
            status_from_errno(22 /* EINVAL */, CallKind::Post),
            Status::InvalidParam
        );
        assert_eq!(
            status_from_errno(errno::EAGAIN, CallKind::Control),
            Status::NoResource
        );
        assert_eq!(status_from_errno(0, CallKind::Control), Status::IoError);
        assert_eq!(
            status_from_errno(errno::ENOENT, CallKind::Control),
            Status::NoElem
        );
    }
}
