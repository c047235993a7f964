//! Event bits and handler ids of the async context.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

/// Readiness events of an fd handler (UCX `ucs_event_set_types_t`: EVREAD=1, EVWRITE=2, EVERR=4).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Events(u32);

impl Events {
    /// No events (an fd handler with no interest still gets [`Events::ERR`]).
    pub const NONE: Self = Self(0);
    /// The fd is readable (`EPOLLIN`).
    pub const READ: Self = Self(1);
    /// The fd is writable (`EPOLLOUT`).
    pub const WRITE: Self = Self(2);
    /// Error or hang-up (`EPOLLERR` / `EPOLLHUP`); always reported, no need to ask for it.
    pub const ERR: Self = Self(4);
    const ALL: u32 = 7;

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Events from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u32) -> Self {
        Self(bits & Self::ALL)
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any bit of `other` is set in `self`.
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Events {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for Events {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for Events {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [(Self::READ, "READ"), (Self::WRITE, "WRITE"), (Self::ERR, "ERR")];
        let mut first = true;
        for (bit, name) in names {
            if self.contains(bit) {
                f.write_str(if first { "" } else { "|" })?;
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("NONE")?;
        }
        Ok(())
    }
}

/// Identifies a handler (fd or timer) of an async context. Unique in the process, never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct HandlerId(pub(super) u64);

impl HandlerId {
    /// The raw id (for logs).
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_ops_and_debug() {
        let e = Events::READ | Events::ERR;
        assert!(e.contains(Events::READ));
        assert!(!e.contains(Events::WRITE));
        assert!(e.intersects(Events::ERR | Events::WRITE));
        assert_eq!(e & Events::READ, Events::READ);
        assert_eq!(format!("{e:?}"), "READ|ERR");
        assert_eq!(format!("{:?}", Events::NONE), "NONE");
        assert_eq!(
            Events::from_bits_truncate(0xff),
            Events::READ | Events::WRITE | Events::ERR
        );
    }
}
