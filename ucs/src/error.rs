//! The error type of every rucx API, and the value of operations that may complete later.
//!
//! [`Error`] is a UCX [`Status`] that is always an error (never `Ok` or `InProgress`), plus,
//! where the library knows more, the context a caller needs: what was wrong and how to fix it.
//! The context reaches the caller whatever logging is set up. Creating an error from a bare
//! status (flow control's `NoResource`, a peer's failure code) allocates nothing.
//!
//! [`Outcome`] is what a non-blocking operation that was accepted says: done at once, or in
//! progress (its completion fires later).

use std::fmt;

use crate::Status;

/// `Result` with an [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// A rucx error: an error [`Status`] and an optional message for the caller.
///
/// Two errors compare equal when their statuses do (the message is explanation, not identity),
/// and an error compares equal to its status: `assert_eq!(r, Err(Status::NoResource.into()))`,
/// `if e == Status::NoResource`.
///
/// ```
/// use ucs::{Error, Result, Status};
///
/// fn open(dev: &str) -> Result<()> {
///     Err(Error::new(Status::NoDevice, format!("no device {dev}")))
/// }
///
/// let e = open("mlx5_9").map_err(|e| e.context_with("opening the interface")).unwrap_err();
/// assert_eq!(e, Status::NoDevice); // the status decides; the message explains
/// assert_eq!(e.context(), Some("opening the interface: no device mlx5_9"));
/// assert_eq!(e.to_string(), format!("opening the interface: no device mlx5_9 ({})", Status::NoDevice.name()));
/// assert_eq!(Status::from(&e) as i8, -14); // UCX's UCS_ERR_NO_DEVICE
/// ```
pub struct Error {
    status: Status,
    /// Boxed twice so an `Error` is two words and `Result<(), Error>` fits in registers.
    #[allow(clippy::box_collection)]
    context: Option<Box<String>>,
}

impl Error {
    /// An error with `status` and `context` (what went wrong, naming the cause and the fix).
    #[cold]
    pub fn new(status: Status, context: impl Into<String>) -> Error {
        Error {
            status: error_status(status),
            context: Some(Box::new(context.into())),
        }
    }

    /// The status: always an error code.
    #[inline]
    pub fn status(&self) -> Status {
        self.status
    }

    /// What went wrong, when the library said more than the status.
    pub fn context(&self) -> Option<&str> {
        self.context.as_deref().map(String::as_str)
    }

    /// Takes the context out (for carrying it across the plugin boundary).
    pub fn take_context(&mut self) -> Option<String> {
        self.context.take().map(|b| *b)
    }

    /// The same error with `context` put in front of the one it has (or as its context).
    #[cold]
    pub fn context_with(mut self, context: impl fmt::Display) -> Error {
        let s = match self.context.take() {
            Some(old) => format!("{context}: {old}"),
            None => context.to_string(),
        };
        self.context = Some(Box::new(s));
        self
    }
}

/// Statuses that are not errors have no business in an [`Error`]: a bug, reported as `IoError`.
#[inline]
fn error_status(status: Status) -> Status {
    if status.is_err() {
        status
    } else {
        not_an_error(status)
    }
}

#[cold]
#[inline(never)]
fn not_an_error(status: Status) -> Status {
    debug_assert!(false, "an Error made from the non-error status {status:?}");
    Status::IoError
}

impl From<Status> for Error {
    /// An error without context. A non-error status (`Ok`, `InProgress`) becomes `IoError` (and
    /// fails a debug build's assertion): callers convert only error codes.
    #[inline]
    fn from(status: Status) -> Error {
        Error {
            status: error_status(status),
            context: None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(Status::from(&e), e.to_string())
    }
}

impl From<nix::errno::Errno> for Error {
    fn from(e: nix::errno::Errno) -> Error {
        Error::from(Status::from(e))
    }
}

impl From<crate::config::ConfigError> for Error {
    fn from(e: crate::config::ConfigError) -> Error {
        Error::new(Status::InvalidParam, e.to_string())
    }
}

impl From<Error> for Status {
    /// The status alone (the context is dropped).
    #[inline]
    fn from(e: Error) -> Status {
        e.status
    }
}

impl From<&Error> for Status {
    #[inline]
    fn from(e: &Error) -> Status {
        e.status
    }
}

impl Clone for Error {
    fn clone(&self) -> Error {
        Error {
            status: self.status,
            context: self.context.clone(),
        }
    }
}

impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.status == other.status
    }
}

impl Eq for Error {}

impl PartialEq<Status> for Error {
    fn eq(&self, other: &Status) -> bool {
        self.status == *other
    }
}

impl PartialEq<Error> for Status {
    fn eq(&self, other: &Error) -> bool {
        *self == other.status
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.context {
            Some(c) => write!(f, "{c} ({})", self.status.name()),
            None => write!(f, "{} ({})", self.status.message(), self.status.name()),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.context {
            Some(c) => write!(f, "{:?}({c:?})", self.status),
            None => write!(f, "{:?}", self.status),
        }
    }
}

impl std::error::Error for Error {}

/// How an accepted non-blocking operation stands: finished, or finishing later (its
/// completion fires then). Errors are the `Err` of the `Result` around it.
#[must_use = "an operation in progress completes later, through its completion"]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Completed at once; the completion will not fire for it.
    Done,
    /// Accepted; the completion fires when it finishes (UCX's `UCS_INPROGRESS`).
    InProgress,
}

impl Outcome {
    /// True for [`Outcome::Done`].
    #[inline]
    pub fn is_done(self) -> bool {
        self == Outcome::Done
    }

    /// The UCX status of the outcome (`Ok` or `InProgress`).
    #[inline]
    pub fn status(self) -> Status {
        match self {
            Outcome::Done => Status::Ok,
            Outcome::InProgress => Status::InProgress,
        }
    }
}

impl Status {
    /// `Ok(Done)` for `Ok`, `Ok(InProgress)` for `InProgress`, `Err` for error codes.
    #[inline]
    pub fn into_outcome(self) -> Result<Outcome> {
        match self {
            Status::Ok => Ok(Outcome::Done),
            Status::InProgress => Ok(Outcome::InProgress),
            e => Err(Error::from(e)),
        }
    }

    /// `Ok(())` for `Ok` and `InProgress`, `Err` for error codes.
    #[inline]
    pub fn check(self) -> Result<()> {
        if self.is_err() {
            Err(Error::from(self))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_two_words_and_a_unit_result_as_small() {
        assert_eq!(std::mem::size_of::<Error>(), 16);
        assert_eq!(std::mem::size_of::<Result<()>>(), 16);
    }

    #[test]
    fn statuses_and_contexts() {
        let e = Error::from(Status::NoResource);
        assert_eq!(e, Status::NoResource);
        assert_eq!(e.context(), None);
        assert_eq!(
            e.to_string(),
            "No resources are available to initiate the operation (UCS_ERR_NO_RESOURCE)"
        );
        let e = Error::new(
            Status::NoDevice,
            "no transport tcp on device eth9: see rucx-info -d",
        );
        assert_eq!(e, Error::from(Status::NoDevice));
        assert_eq!(
            e.to_string(),
            "no transport tcp on device eth9: see rucx-info -d (UCS_ERR_NO_DEVICE)"
        );
        let e = e.context_with("opening the interface");
        assert_eq!(
            e.context(),
            Some("opening the interface: no transport tcp on device eth9: see rucx-info -d")
        );
        assert_eq!(format!("{:?}", Error::from(Status::Busy)), "Busy");
    }

    #[test]
    fn outcomes_from_statuses() {
        assert_eq!(Status::Ok.into_outcome(), Ok(Outcome::Done));
        assert_eq!(Status::InProgress.into_outcome(), Ok(Outcome::InProgress));
        assert_eq!(Status::Canceled.into_outcome(), Err(Status::Canceled.into()));
        assert_eq!(Outcome::InProgress.status(), Status::InProgress);
        assert!(Status::InProgress.check().is_ok());
        assert!(Status::IoError.check().is_err());
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn a_non_error_status_becomes_io_error() {
        assert_eq!(Error::from(Status::Ok), Status::IoError);
    }
}
