//! `self`: loopback within one thread, like UCX's `self` transport.
//!
//! Delivery is synchronous: a send runs the receiving handler before it returns, so every
//! operation completes at once and `flush` has nothing to wait for. Endpoints connect to an
//! interface on the same thread (their own or another one, e.g. a server and a client worker
//! in one process). RMA and atomics go through a bounds-checked region table: a put outside
//! registered memory is refused. The fast path (`am_short`) copies into a reusable buffer and
//! calls the handler: no allocation, no lock, no syscall.
#![forbid(unsafe_code)]

mod config;
mod ep;
mod iface;
mod md;

pub use config::SELF_CONFIG;

use uct_transport::abi::{RawComponent, RawIfaceOps, RawMdOps, RawTransport};
use uct_transport::export;

static MD_OPS: RawMdOps = export::md_ops::<md::SelfMd>();
static IFACE_OPS: RawIfaceOps = export::iface_ops::<iface::SelfIface>();
static TRANSPORTS: [RawTransport; 1] = [export::transport::<iface::SelfTransport>(&IFACE_OPS)];
static COMPONENTS: [RawComponent; 1] = [export::component::<md::SelfComponent>(&MD_OPS, &TRANSPORTS)];

uct_transport::declare_module!(self, COMPONENTS, [&SELF_CONFIG]);
