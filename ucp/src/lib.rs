//! `ucp` — the protocol layer: what applications use to move data without picking transports,
//! devices or protocols by hand (UCX's UCP).
//!
//! Objects: [`Context`] (the usable transport resources, filtered by `RUCX_TLS` and
//! `RUCX_NET_DEVICES`) → [`Worker`] (one thread's progress engine: an interface per resource,
//! a packed [`WorkerAddress`]) → [`Ep`] (an endpoint to a peer worker, on the lanes chosen from
//! both workers' addresses). Active messages: [`Worker::set_am_handler`], [`Ep::am_send`];
//! the protocol (short, bcopy, zcopy, fragmented) is picked by size and lane. Without a side
//! channel for the addresses: [`Worker::listen`] and [`Worker::connect_sockaddr`]. Memory
//! access: [`Worker::mem_map`], [`Ep::rkey_unpack`], [`Ep::put`], [`Ep::get`], atomics ([`rma`]).
#![deny(missing_docs)]
#![forbid(unsafe_code)]
// docs.rs (and `RUSTDOCFLAGS=--cfg docsrs` on nightly) marks feature-gated items.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod activation;
pub mod address;
mod am;
mod am_stream;
mod cm;
pub mod config;
mod context;
mod ep;
// Fuzz bodies for the cargo-fuzz crate (`fuzz/`), not API: hidden from the docs.
mod datatype;
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz;
mod keepalive;
pub mod lanes;
pub mod proto;
mod recv_buf;
mod request;
pub mod rma;
mod rndv;
pub mod stream;
pub mod tag;
pub mod tl;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod tokio;
mod wakeup;
pub(crate) mod wire;
mod wireup;
mod worker;

pub use address::{AddressEntry, WorkerAddress};
pub use am::{AmData, AmFlags, AmHandlerFlags, AmMsg, AmProto};
pub use am_stream::{AmMessage, AmStream};
pub use cm::{ConnRequest, Listener, ListenerParams};
pub use context::{Context, ContextBuilder, Features};
pub use datatype::{Pack, Unpack};
pub use ep::{CloseMode, Ep, EpParams, ErrMode};
pub use request::{Issued, Request};
pub use rma::{AtomicOp, AtomicWidth, MemHandle, RemoteKey, RmaProto};
pub use rndv::AmDataDesc;
pub use tag::{TagInfo, TagMsg, TagProbe, TagRecvd};
pub use ucs::{Error, Outcome, Result, Status};
/// How a worker's async events are handled (see [`Worker::with_async_mode`]).
pub use uct::AsyncMode;
pub use wakeup::WorkerWaker;
pub use worker::{HeldUse, WeakWorker, Worker};
