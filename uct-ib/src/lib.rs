//! InfiniBand / RoCE transports over libibverbs: the `ib` component (one memory domain per
//! verbs device) and its transports (`rc_verbs`, `ud_verbs`). Loaded as the plugin `libuct_ib.so`
//! (`rucx_module_ib`); see docs/ib.md.
#![forbid(unsafe_code)]

pub mod config;
pub mod device;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
pub mod iface_common;
pub mod md;
pub mod rc;
pub mod rx_ring;
mod txq;
pub mod ud;

pub use config::{IbConfig, IB_CONFIG};

use uct_transport::abi::{RawComponent, RawIfaceOps, RawMdOps, RawTransport};
use uct_transport::export;

static MD_OPS: RawMdOps = export::md_ops::<md::IbMd>();
static RC_IFACE_OPS: RawIfaceOps = export::iface_ops::<rc::RcIface>();
static UD_IFACE_OPS: RawIfaceOps = export::iface_ops::<ud::UdIface>();
/// The transports of the `ib` component (one line each).
static TRANSPORTS: &[RawTransport] = &[
    export::transport::<rc::RcTransport>(&RC_IFACE_OPS),
    export::transport::<ud::UdTransport>(&UD_IFACE_OPS),
];
static COMPONENTS: [RawComponent; 1] = [export::component::<md::IbComponent>(&MD_OPS, TRANSPORTS)];

uct_transport::declare_module!(ib, COMPONENTS, [&IB_CONFIG, &ud::UD_CONFIG]);
