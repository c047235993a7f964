//! `uct-sm` — shared-memory transports between processes of one host (UCX's `posix`, `sysv`
//! and `cma`; see docs/sm.md).
//!
//! - **posix** and **sysv**: every interface owns a receive FIFO in a shared segment (`fifo`);
//!   endpoints connect to an interface, map its segment and write active messages into FIFO
//!   elements (am_short, am_bcopy, payload inline). The receiver copies each message into a
//!   private descriptor before its handler runs (`rxbuf`; `keep()` lends that descriptor).
//!   A full FIFO answers `NoResource`; pending requests are dispatched from progress. A sleeping
//!   receiver is woken through an abstract unix datagram socket, signalled only when it armed.
//!   Segments leave nothing behind: posix unlinks the name at creation (peers map it through
//!   `/proc/<pid>/fd`), sysv marks it removed at once (it goes with the last detach).
//! - **cma**: put/get zcopy with `process_vm_writev`/`process_vm_readv`, checked against the
//!   rkey's registered range (`cma`).
//!
//! Everything read from shared memory is read once into locals and checked before use. Unsafe
//! code lives in `sys` (system calls), `fifo` (the shared layout) and `rxbuf` (descriptors lent
//! across the host boundary), each block with its justification.
#![deny(unsafe_code)]

mod addr;
mod cma;
mod cma_table;
pub mod config;
mod ep;
mod fifo;
#[cfg(feature = "fuzz")]
pub mod fuzz;
mod iface;
mod mm;
mod rxbuf;
mod sys;

pub use config::{CMA_CONFIG, MM_CONFIG, POSIX_CONFIG, SYSV_CONFIG};

use uct_transport::abi::{RawComponent, RawIfaceOps, RawMdOps, RawTransport};
use uct_transport::export;

use mm::{MmComponent, MmMd, MmTransport, Posix, Sysv};

static POSIX_MD_OPS: RawMdOps = export::md_ops::<MmMd<Posix>>();
static SYSV_MD_OPS: RawMdOps = export::md_ops::<MmMd<Sysv>>();
static CMA_MD_OPS: RawMdOps = export::md_ops::<cma::CmaMd>();
static MM_IFACE_OPS: RawIfaceOps = export::iface_ops::<iface::MmIface>();
static CMA_IFACE_OPS: RawIfaceOps = export::iface_ops::<cma::CmaIface>();
static POSIX_TLS: [RawTransport; 1] = [export::transport::<MmTransport<Posix>>(&MM_IFACE_OPS)];
static SYSV_TLS: [RawTransport; 1] = [export::transport::<MmTransport<Sysv>>(&MM_IFACE_OPS)];
static CMA_TLS: [RawTransport; 1] = [export::transport::<cma::CmaTransport>(&CMA_IFACE_OPS)];
static COMPONENTS: [RawComponent; 3] = [
    export::component::<MmComponent<Posix>>(&POSIX_MD_OPS, &POSIX_TLS),
    export::component::<MmComponent<Sysv>>(&SYSV_MD_OPS, &SYSV_TLS),
    export::component::<cma::CmaComponent>(&CMA_MD_OPS, &CMA_TLS),
];

uct_transport::declare_module!(
    sm,
    COMPONENTS,
    [&MM_CONFIG, &POSIX_CONFIG, &SYSV_CONFIG, &CMA_CONFIG]
);
