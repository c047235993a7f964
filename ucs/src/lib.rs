//! `ucs` — rucx services: status codes, async context, MPMC queue, memory pools, callback queue,
//! configuration, logging, the module loader, CPU-specific code (bulk copies, the tick counter) and
//! C-library process facts (`sys`).
//!
//! Unsafe code is confined to the modules that need it (memory pool chunks, module loading,
//! fd/epoll FFI, the x86-64 string copy and tick counter, `mallinfo2`); each such module says so
//! at its top with `#![allow(unsafe_code)]`.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod arch;
pub mod async_ctx;
pub mod callbackq;
pub mod config;
mod error;
pub mod hash;
pub mod log;
pub mod module;
pub mod mpmc;
pub mod mpool;
pub mod status;
pub mod sys;

pub use error::{Error, Outcome, Result};
pub use status::Status;
