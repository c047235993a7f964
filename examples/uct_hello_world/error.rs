//! One error type for the example: what failed, the uct status (if any) and a hint to fix it.

use std::fmt;

use ucs::Status;

pub struct Failure {
    pub what: String,
    pub status: Option<Status>,
    pub hint: String,
    /// The transport lacks what was asked (exit status 77, "skipped").
    pub unsupported: bool,
}

pub type Res<T> = Result<T, Failure>;

impl Failure {
    pub fn new(what: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure {
            what: what.into(),
            status: None,
            hint: hint.into(),
            unsupported: false,
        }
    }

    pub fn status(what: impl Into<String>, status: Status, hint: impl Into<String>) -> Failure {
        Failure {
            status: Some(status),
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
        if let Some(s) = self.status {
            write!(f, ": {s} ({})", s.name())?;
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
        self.map_err(|s| Failure::status(what(), s, hint))
    }
}
