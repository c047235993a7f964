//! `uct` — the rucx transport API, modelled on UCX's UCT.
//!
//! Object model (all single-threaded, `!Send`): [`Context`] (modules and their components) →
//! [`Component`] → [`Md`] (memory domain: registration, rkeys) → [`Worker`] (progress engine) →
//! [`Iface`] (one transport on one device) → [`Ep`] (endpoint: AM, RMA, atomics, pending, flush).
//!
//! Transports implement the safe traits in [`transport`]; [`abi::export`] turns them into the
//! C-ABI tables that cross the plugin boundary, and the types in [`api`] call through those tables.
//! Built-in and plugin transports therefore run exactly the same code path.
//!
//! Unsafe code lives only in the boundary modules (`abi`, `api`, `callbacks`, `iov`, `am`,
//! `worker_ref`, `rma`), each marked `#![allow(unsafe_code)]`.
#![deny(unsafe_code)]

pub mod abi;
pub mod am;
pub mod api;
pub mod callbacks;
pub mod iov;
mod log_bridge;
pub mod rma;
pub mod rng;
pub mod transport;
pub mod types;
pub mod worker_ref;

pub use api::completion::{AtomicResult, Completion};
pub use api::component::{Component, Md, Rkey};
pub use api::context::{Context, ContextBuilder, ModuleConfigVar, ModuleInfo, ModuleStatus};
pub use api::ep::{AtomicWidth, Ep, PendingRequest, MAX_IOV};
pub use api::iface::{AmMessage, EpKey, Iface, IfaceParams, RxDesc};
pub use api::mem::{Mem, MemIov, MEM_ALIGN};
pub use api::worker::{ThreadMode, Worker};
pub use types::*;
pub use ucs::async_ctx::AsyncMode;
pub use ucs::{Result, Status};
