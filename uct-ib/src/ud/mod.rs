//! `ud_verbs`: active messages over one unreliable-datagram QP per interface, made reliable
//! in software (UCX's `ud` transport). See `docs/ib.md` ("ud_verbs").
//!
//! - [`wire`]: the versioned little-endian packet header and control bodies.
//! - [`reliability`]: PSNs, cumulative ACKs, AIMD window, resend timer, peer timeout (pure);
//!   `window`: the ring of packets in flight it keeps.
//! - [`inject`]: the loss/duplication/reordering test hook (pure).
//! - `iface`, `ep`: the transport objects; `send` (fast path), `skb` (send buffers), `recv`
//!   (packet processing), `conn` (connection setup and teardown), `timer`, `pending`.

pub mod config;
mod conn;
mod ep;
pub mod ep_table;
mod iface;
pub mod inject;
mod pending;
mod recv;
pub mod reliability;
#[cfg(test)]
mod reliability_sim;
mod send;
mod skb;
mod timer;
mod window;
pub mod wire;

pub use config::{UdConfig, UD_CONFIG};
pub use ep::UdEp;
pub use iface::{UdIface, UdTransport, TL_NAME};
