//! InfiniBand / RoCE transports over libibverbs: the `ib` component (one memory domain per
//! verbs device) and its transports (`rc_verbs`, `ud_verbs`). Loaded as the plugin `libuct_ib.so`
//! (`rucx_module_ib`); see docs/ib.md.
#![deny(unsafe_code)]

pub mod config;
pub mod device;
#[doc(hidden)]
pub mod fuzz;
pub mod iface_common;
pub mod md;
pub mod rc;
pub mod rx_ring;
mod txq;
pub mod ud;
pub mod verbs;

pub use config::{IbConfig, IB_CONFIG};

static MD_OPS: uct::abi::RawMdOps = uct::abi::export::md_ops::<md::IbMd>();
static RC_IFACE_OPS: uct::abi::RawIfaceOps = uct::abi::export::iface_ops::<rc::RcIface>();
static UD_IFACE_OPS: uct::abi::RawIfaceOps = uct::abi::export::iface_ops::<ud::UdIface>();
/// The transports of the `ib` component (one line each).
static TRANSPORTS: &[uct::abi::RawTransport] = &[
    uct::abi::export::transport::<rc::RcTransport>(&RC_IFACE_OPS),
    uct::abi::export::transport::<ud::UdTransport>(&UD_IFACE_OPS),
];
static COMPONENTS: [uct::abi::RawComponent; 1] = [uct::abi::export::component::<md::IbComponent>(
    &MD_OPS, TRANSPORTS,
)];

uct::declare_module!(ib, COMPONENTS, [&IB_CONFIG, &ud::UD_CONFIG]);
