//! `uct-transport` — what a transport author implements, and the plugin boundary.
//!
//! Applications use the `uct` crate; this crate is the other side. A transport implements the
//! safe traits in [`traits`] ([`TransportComponent`] → [`TransportMd`] → [`Transport`] →
//! [`TransportIface`] → [`TransportEp`]); [`export`] turns them into the `#[repr(C)]` tables of
//! [`abi`], and [`declare_module!`] publishes the module for linking in (`module()`) and for
//! loading as a plugin ([`export_plugin!`], from a thin `cdylib` crate). Built-in and plugin
//! transports run the same code.
//!
//! What a transport uses from the host: the worker's services ([`worker_ref`]), the AM handler
//! table ([`am`]), safe views of the host's callbacks ([`callbacks`]) and I/O vectors ([`iov`]),
//! and, for transports that execute RMA in software, the bounds-checked region table ([`rma`]).
//!
//! This is an ABI crate: the boundary modules (`abi`, `export`, `callbacks`, `iov`, `am`,
//! `worker_ref`, `rma`) hold unsafe code, each marked `#![allow(unsafe_code)]`; transport crates
//! built on it are `#![forbid(unsafe_code)]`.
#![deny(unsafe_code)]

pub mod abi;
pub mod am;
pub mod callbacks;
pub mod error_context;
pub mod export;
pub mod iov;
mod log_bridge;
pub mod rma;
#[cfg(feature = "fuzz")]
pub mod rng;
pub mod traits;
pub mod types;
pub mod worker_ref;

pub use traits::{
    AtomicSize, EpHandle, IfaceOpenParams, Transport, TransportComponent, TransportEp, TransportIface,
    TransportMd,
};
pub use ucs::{Error, Outcome, Result, Status};
