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
//!
//! # Example
//!
//! An active message over TCP on the loopback device, from one interface to another on the
//! same worker (the `rucx` crate's `context()` gives a context with every built-in transport):
//!
//! ```
//! use std::{cell::RefCell, rc::Rc};
//! use uct::{AmCbFlags, Context, Iface, IfaceParams, Worker};
//!
//! let ctx = Context::builder().builtin(uct_tcp::module()).plugins(false).build();
//! let (md, _) = ctx.find_resource("tcp", "lo")?;
//! let worker = Worker::new()?;
//! let server = Iface::open(&md, &worker, IfaceParams::new("tcp", "lo"))?;
//! let client = Iface::open(&md, &worker, IfaceParams::new("tcp", "lo"))?;
//!
//! let got = Rc::new(RefCell::new(Vec::new()));
//! let g = got.clone();
//! server.set_am_handler(1, AmCbFlags::SYNC, move |m| g.borrow_mut().push(m.data()[8..].to_vec()))?;
//!
//! let ep = client.ep_create_connected(&server.device_address()?, &server.address()?)?;
//! while ep.am_short(1, 0, b"hello").is_err() {
//!     worker.progress(); // connecting: NoResource until the connection is up
//! }
//! while got.borrow().is_empty() {
//!     worker.progress();
//! }
//! assert_eq!(got.borrow()[0], b"hello");
//! # Ok::<(), uct::Error>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod completion;
mod component;
mod context;
#[cfg(feature = "copy-stats")]
pub mod copy_stats;
mod ep;
mod host;
mod iface;
mod mem;
mod worker;

pub use completion::{AtomicResult, Completion};
pub use component::{Component, Md, Rkey};
pub use context::{Context, ContextBuilder, ModuleConfigVar, ModuleInfo, ModuleStatus};
pub use ep::{AtomicWidth, Ep, PendingRequest};
pub use iface::{AmMessage, EpKey, Iface, IfaceParams, RxDesc};
pub use mem::{LentBytes, LentBytesMut, Mem, MemIov, MEM_ALIGN};
pub use ucs::async_ctx::AsyncMode;
pub use ucs::{Error, Outcome, Result, Status};
pub use uct_transport::abi::{RawModule as Module, ABI_VERSION as PLUGIN_ABI_VERSION};
pub use uct_transport::callbacks::PendingResult;
pub use uct_transport::types::*;
pub use worker::Worker;
