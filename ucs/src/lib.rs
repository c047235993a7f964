//! `ucs` — rucx services: status codes, async context, MPMC queue, memory pools, callback queue,
//! arbiter, configuration, logging, the module loader and CPU-specific bulk copies.
//!
//! Unsafe code is confined to the modules that need it (memory pool chunks, module loading,
//! fd/epoll FFI, the x86-64 string copy); each such module says so at its top with
//! `#![allow(unsafe_code)]`.
#![deny(unsafe_code)]

pub mod arbiter;
pub mod arch;
pub mod async_ctx;
pub mod callbackq;
pub mod config;
pub mod log;
pub mod module;
pub mod mpmc;
pub mod mpool;
pub mod status;

pub use status::{Result, Status};
