//! One error type for the example: what failed, the uct error (if any) and a hint to fix it.

use std::fmt;

use ucs::{Error, Status};

pub struct Failure {
    pub what: String,
    /// The uct error: its status and, where the library said more, the cause.
    pub error: Option<Error>,
    pub hint: String,
    /// The transport lacks what was asked (exit status 77, "skipped").
    pub unsupported: bool,
}

pub type Res<T> = Result<T, Failure>;

impl Failure {
    pub fn new(what: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure {
            what: what.into(),
            error: None,
            hint: hint.into(),
            unsupported: false,
        }
    }

    /// A failure with a uct error, or a bare status (`Status::TimedOut.into()`).
    pub fn status(what: impl Into<String>, error: impl Into<Error>, hint: impl Into<String>) -> Failure {
        Failure {
            error: Some(error.into()),
            ..Failure::new(what, hint)
        }
    }

    pub fn unsupported(what: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure {
            unsupported: true,
            ..Failure::status(what, Status::Unsupported, hint)
        }
    }

    pub fn io(what: impl Into<String>, e: &std::io::Error, hint: impl Into<String>) -> Failure {
        Failure::new(format!("{}: {e}", what.into()), hint)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.what)?;
        if let Some(e) = &self.error {
            // The library's context (cause and fix) when it gave one, else the status's
            // message; both end with the status name, e.g. `(UCS_ERR_NO_DEVICE)`.
            write!(f, ": {e}")?;
        }
        if !self.hint.is_empty() {
            write!(f, "\n  hint: {}", self.hint)?;
        }
        Ok(())
    }
}

/// Attaches a description and a hint to a uct result.
pub trait Context<T> {
    fn or_fail(self, what: impl FnOnce() -> String, hint: &str) -> Res<T>;
}

impl<T> Context<T> for ucs::Result<T> {
    fn or_fail(self, what: impl FnOnce() -> String, hint: &str) -> Res<T> {
        self.map_err(|e| Failure::status(what(), e, hint))
    }
}
