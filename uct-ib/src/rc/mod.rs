//! `rc_verbs`: reliable connected QPs, one per endpoint (UCX `rc_verbs`, see docs/ib.md).
//!
//! - `iface`: interface, attributes, SRQ + CQs, transport entry points
//! - `ep`: endpoint state, connection (INIT -> RTR -> RTS), pending queue
//! - `send`: the send fast path and every operation
//! - `doorbell`: bcopy bursts posted as chains (one doorbell per chain)
//! - `tx`: send completions, failures, pending dispatch, flush
//! - `rx`: receive completions and AM delivery
//! - `qp_map`: endpoints by local QP number
//! - `txq`: send-queue accounting with completion moderation
//! - `fc`: AM flow-control credits
//! - `wire`: header byte and endpoint address

mod doorbell;
mod ep;
mod fc;
mod iface;
mod qp_map;
mod rx;
mod send;
mod tx;
pub mod wire;

pub use ep::RcEp;
pub use iface::{RcIface, RcTransport};
