//! What UCP knows about one transport resource: its name and device, and the attributes lane
//! selection and protocol thresholds use. The same record describes a local interface (from
//! `uct::Iface::attr`) and a peer's, unpacked from its worker address, so that both peers run
//! the same selection on the same numbers.

use uct::{AtomicOps, IfaceAttr, IfaceFlags};

/// Performance and capabilities of one interface, as carried in a worker address.
#[derive(Clone, Debug, PartialEq)]
pub struct TlAttr {
    /// Capability flags (`UCT_IFACE_FLAG_*` bits).
    pub flags: IfaceFlags,
    /// Seconds: `latency_c + latency_m * endpoints`.
    pub latency_c: f64,
    /// Seconds added per endpoint.
    pub latency_m: f64,
    /// Seconds of CPU per send.
    pub overhead: f64,
    /// Bytes per second: `bw_dedicated + bw_shared / processes per node`.
    pub bw_dedicated: f64,
    /// Bytes per second shared by the node's processes.
    pub bw_shared: f64,
    /// Higher wins ties.
    pub priority: u8,
    /// Largest AM the interface sends and receives in one bcopy (its segment size).
    pub am_max_bcopy: usize,
    /// Largest am_short, header included.
    pub am_max_short: usize,
    /// Largest am_zcopy payload and user header.
    pub am_max_zcopy: usize,
    /// Largest user header of an am_zcopy.
    pub am_max_hdr: usize,
    /// Most iov entries an am_zcopy takes.
    pub am_max_iov: usize,
    /// Largest put/get zcopy.
    pub put_max_zcopy: usize,
    /// Largest get zcopy.
    pub get_max_zcopy: usize,
    /// Atomic operations supported without and with a result, 32 and 64 bit.
    pub atomic32: (AtomicOps, AtomicOps),
    /// 64-bit atomic operations without and with a result.
    pub atomic64: (AtomicOps, AtomicOps),
}

impl TlAttr {
    /// The record of a local interface.
    pub fn from_iface(a: &IfaceAttr) -> TlAttr {
        TlAttr {
            flags: a.flags,
            latency_c: a.latency.c,
            latency_m: a.latency.m,
            overhead: a.overhead,
            bw_dedicated: a.bandwidth.dedicated,
            bw_shared: a.bandwidth.shared,
            priority: a.priority,
            am_max_bcopy: a.am.max_bcopy,
            am_max_short: a.am.max_short,
            am_max_zcopy: a.am.max_zcopy,
            am_max_hdr: a.am.max_hdr,
            am_max_iov: a.am.max_iov,
            put_max_zcopy: a.put.max_zcopy,
            get_max_zcopy: a.get.max_zcopy,
            atomic32: (a.atomic32.op_flags, a.atomic32.fop_flags),
            atomic64: (a.atomic64.op_flags, a.atomic64.fop_flags),
        }
    }

    /// Latency with `eps` endpoints, seconds.
    pub fn latency(&self, eps: f64) -> f64 {
        self.latency_c + self.latency_m * eps
    }

    /// Bandwidth one of `ppn` processes gets, bytes per second.
    pub fn bandwidth(&self, ppn: f64) -> f64 {
        self.bw_dedicated + self.bw_shared / ppn.max(1.0)
    }
}

/// One transport resource: transport, device, memory-domain component and attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct TlInfo {
    /// Transport name, e.g. `tcp`, `rc_verbs`.
    pub tl_name: String,
    /// Device name, e.g. `lo`, `rxe0:1`.
    pub dev_name: String,
    /// The memory-domain component, e.g. `tcp`, `ib`, `self` (rkeys are per component).
    pub component: String,
    /// `uct::DeviceType` as its raw value (network, intra-node, accelerator, loopback).
    pub dev_type: u8,
    /// Performance and capabilities (lane selection's inputs).
    pub attr: TlAttr,
}
