//! `ofi`: a transport over libfabric reliable-datagram (`FI_EP_RDM`) endpoints, so rucx runs on
//! every fabric libfabric has a provider for (`tcp;ofi_rxm`, `shm`, `verbs;ofi_rxm`, `efa`, …).
//! Loaded only as the plugin `libuct_ofi.so` (`rucx_module_ofi`); see docs/ofi.md.
//!
//! The FFI is in [`ffi`] (bindings, thin owning wrappers, the buffers libfabric writes behind the
//! compiler's back). Its data-path calls are `unsafe fn` (libfabric uses the buffers after the
//! call returns); `iface`, `ep` and `md` call them, each with a `SAFETY` comment on who keeps the
//! memory valid. The rest is safe code.
#![deny(unsafe_code)]

pub mod config;
pub mod device;
mod ep;
pub mod ffi;
#[cfg(feature = "fuzz")]
pub mod fuzz;
mod iface;
mod md;
mod msg;
mod wire;

pub use config::OFI_CONFIG;

use uct_transport::abi::{RawComponent, RawIfaceOps, RawMdOps, RawTransport};
use uct_transport::export;

static MD_OPS: RawMdOps = export::md_ops::<md::OfiMd>();
static IFACE_OPS: RawIfaceOps = export::iface_ops::<iface::OfiIface>();
static TRANSPORTS: [RawTransport; 1] = [export::transport::<iface::OfiTransport>(&IFACE_OPS)];
static COMPONENTS: [RawComponent; 1] = [export::component::<md::OfiComponent>(&MD_OPS, &TRANSPORTS)];

uct_transport::declare_module!(ofi, COMPONENTS, [&OFI_CONFIG]);
