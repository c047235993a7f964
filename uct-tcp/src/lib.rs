//! `uct-tcp` — the rucx TCP transport (component, memory domain and transport `tcp`).
//!
//! One resource per network device that is up and has an IPv4/IPv6 address (`lo`, `eth0`...),
//! selected by `RUCX_NET_DEVICES` (`ucs::config::NET_TABLE`, shared with UCP and the other
//! network transports); tuning through `RUCX_TCP_*` ([`TCP_CONFIG`]). An interface
//! listens on its device's address; endpoints connect to an interface or to a peer endpoint,
//! and each pair of endpoints shares one non-blocking socket, driven by the interface's
//! progress (`epoll`). See docs/wire-tcp.md for the protocol and `connect.rs` for how sockets
//! are matched to endpoints (including simultaneous connects).
//!
//! Beyond UCX's tcp: a versioned little-endian wire format with a handshake ([`wire`]), put,
//! get and atomics executed by the target's progress against the memory it registered (bounds-
//! and key-checked, refusals reported to the initiator), peer failures reported once per
//! endpoint through the interface's error handler, and bounded handshakes against floods.
//!
//! Modules: [`config`]; `md` (component, registrations, rkeys); `iface` (open, attributes,
//! registries); `progress` (the epoll loop, accept, deadlines, event arming); `read_tuner`
//! (whether progress reads a lone connection directly, measured at run time); `connect`
//! (handshake, endpoint matching); `conn` / `tx` / `rx` (a socket's state, send and receive
//! sides); `ep` (pending queue, flush, destroy); `send` (the AM fast path); `rma`; `ops`
//! (operations awaiting replies); `errors` (failure handling); `timers`; `addr` (address
//! formats); `bufs` (send/receive buffers lent to busy connections); `coalesce` (copied
//! sends sharing one `send()`: bursts, full sockets); `sock` (socket calls); `sys` (the data
//! path's system calls) and `direct` (receiving a get's reply into user memory). Building
//! blocks: [`wire`], [`rx_parser`], [`netif`].
#![forbid(unsafe_code)]

mod addr;
mod bufs;
mod coalesce;
pub mod config;
mod conn;
mod connect;
mod direct;
mod ep;
mod errors;
mod iface;
mod md;
pub mod netif;
mod ops;
mod progress;
mod read_tuner;
mod rma;
mod rx;
pub mod rx_parser;
mod send;
mod sock;
mod sys;
mod timers;
mod tx;
pub mod wire;

pub use config::{NET_CONFIG, TCP_CONFIG};

use uct_transport::abi::{RawComponent, RawIfaceOps, RawMdOps, RawTransport};
use uct_transport::export;

static MD_OPS: RawMdOps = export::md_ops::<md::TcpMd>();
static IFACE_OPS: RawIfaceOps = export::iface_ops::<iface::TcpIface>();
static TRANSPORTS: [RawTransport; 1] = [export::transport::<iface::TcpTransport>(&IFACE_OPS)];
static COMPONENTS: [RawComponent; 1] = [export::component::<md::TcpComponent>(&MD_OPS, &TRANSPORTS)];

// RUCX_NET_DEVICES (ucs::config::NET_TABLE) is registered by ucs, not listed here, so that
// `rucx-info -c` shows it once whichever network modules are loaded.
uct_transport::declare_module!(tcp, COMPONENTS, [&TCP_CONFIG]);
