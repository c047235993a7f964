//! A thin safe wrapper over libibverbs (through the `rdma-sys` bindings): devices, protection
//! domains, memory regions, completion queues and channels, SRQs, queue pairs (RC, UC, UD)
//! and address handles.
//!
//! Every object holds an `Arc` of its parent (QP -> PD, CQs, SRQ; CQ -> context, channel;
//! MR/AH/SRQ -> PD; PD -> context), so drop order is always right. Failed verbs calls return
//! a `ucs::Error` (the status, no context) and log one line naming the call, its arguments
//! and errno; arguments rejected before calling into libibverbs return the reason as the
//! error's context. The fast paths (`post_send`, `post_send_inline`, `post_recv`, `poll`) do
//! not allocate; work request chains are built on the stack.
//!
//! This is the only crate in the workspace that calls libibverbs: the transports in `uct-ib`
//! are safe code on top of it.
#![deny(unsafe_op_in_unsafe_fn)]

mod ah;
mod attr;
mod cq;
mod device;
mod error;
mod gid;
mod host_mem;
mod lend;
mod mr;
mod pd;
mod qp;
mod qp_params;
mod recv_chain;
mod rx_heads;
mod send_batch;
mod srq;
mod wc;
mod wr;

pub use ah::{AddressHandle, AhAttr, GlobalRoute};
pub use attr::{AtomicCap, DeviceAttr, LinkLayer, Mtu, PortAttr, PortState};
pub use cq::{CompletionChannel, CompletionQueue, CqId};
pub use device::{Context, Device, DeviceList};
pub use gid::{Gid, GidEntry, GidType};
pub use host_mem::{register_host_memory, MrChunkAllocator};
pub use lend::{touch_posted, RxLoan, RX_DESC_HDR};
pub use mr::{AccessFlags, MemoryRegion, RegisteredBuffer};
pub use pd::ProtectionDomain;
pub use qp::QueuePair;
pub use qp_params::{
    qp_timeout_from_secs, rnr_timer_from_secs, InitParams, QpCaps, QpInitAttr, QpState, QpType, RtrParams,
    RtsParams,
};
pub use recv_chain::RecvChain;
pub use rx_heads::{HeadCopy, RxHeads, RX_HEAD};
pub use send_batch::{ChainRefused, SendBatch, SEND_BATCH_MAX};
pub use srq::SharedReceiveQueue;
pub use wc::{WcBatch, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{
    RecvPostError, RecvRequest, SendFlags, SendOp, SendRequest, Sge, UdDest, UdInlineWr, MAX_INLINE_PIECES,
    MAX_RECV_BATCH,
};

/// Size of the Global Routing Header that precedes every UD receive payload.
pub const GRH_LEN: usize = 40;
