//! Protocols: how a message of a given size goes over an endpoint's lanes — the choice as
//! data (`select`), the one send path that executes it (`send`), the queued forms
//! (`op`), and the thresholds behind the choice ([`thresholds`]).

pub(crate) mod budget;
pub(crate) mod op;
pub(crate) mod payload;
pub(crate) mod reasm;
pub(crate) mod select;
pub(crate) mod send;
pub(crate) mod stall;
pub mod thresholds;
