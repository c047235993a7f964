//! `uct` — the rucx transport API for applications, modelled on UCX's UCT.
//!
//! Object model (all single-threaded, `!Send`): [`Context`] (modules and their components) →
//! [`Component`] → [`Md`] (memory domain: registration, rkeys) → [`Worker`] (progress engine) →
//! [`Iface`] (one transport on one device) → [`Ep`] (endpoint: AM, RMA, atomics, pending, flush).
//!
//! Transports are written against the `uct-transport` crate (its traits and C-ABI tables); this
//! crate is the host side of that boundary: every type here calls through a transport's
//! tables, so built-in and plugin transports run the same code path.
//!
//! This is an ABI crate: the modules that call through the tables or hold raw memory say
//! `#![allow(unsafe_code)]` at their top.
#![deny(unsafe_code)]

mod completion;
mod component;
mod context;
mod ep;
mod host;
mod iface;
mod mem;
mod transport_progress;
mod worker;

pub use completion::{AtomicResult, Completion};
pub use component::{Component, Md, Rkey};
pub use context::{Context, ContextBuilder, ModuleConfigVar, ModuleInfo, ModuleStatus};
pub use ep::{AtomicWidth, Ep, PendingRequest};
pub use iface::{AmMessage, EpKey, Iface, IfaceParams, RxDesc};
pub use mem::{Mem, MemIov, MEM_ALIGN};
pub use ucs::async_ctx::AsyncMode;
pub use ucs::{Result, Status};
pub use uct_transport::abi::{RawModule as Module, ABI_VERSION as PLUGIN_ABI_VERSION};
pub use uct_transport::types::*;
pub use worker::{ThreadMode, Worker};
