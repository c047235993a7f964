//! The application-facing API: safe wrappers calling through the transports' C-ABI tables.

pub mod completion;
pub mod component;
pub mod context;
pub mod ep;
pub mod iface;
pub mod mem;
mod transport_progress;
pub mod worker;
