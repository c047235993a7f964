//! Plain data describing transports: capability flags, attributes, resources.
//!
//! These structs are `#[repr(C)]` and contain only numbers and fixed-size byte arrays, so they cross
//! the plugin boundary by value without any allocator or Rust-layout dependency.

use std::fmt;

/// Defines a `u64` flag set with UCX's bit numbers (no external bitflags crate needed).
macro_rules! flag_set {
    ($(#[$m:meta])* $name:ident : $ty:ty { $($(#[$fm:meta])* $flag:ident = $bit:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(pub $ty);
        #[allow(missing_docs)]
        impl $name {
            $($(#[$fm])* pub const $flag: $name = $name(1 << $bit);)*
            pub const EMPTY: $name = $name(0);
            /// Every named flag with its name, in bit order.
            pub const NAMED: &'static [(&'static str, $name)] = &[$((stringify!($flag), $name(1 << $bit))),*];
            #[inline] pub const fn contains(self, other: $name) -> bool { self.0 & other.0 == other.0 }
            #[inline] pub const fn intersects(self, other: $name) -> bool { self.0 & other.0 != 0 }
            #[inline] pub const fn union(self, other: $name) -> $name { $name(self.0 | other.0) }
            #[inline] pub const fn bits(self) -> $ty { self.0 }
            #[inline] pub const fn is_empty(self) -> bool { self.0 == 0 }
        }
        impl std::ops::BitOr for $name { type Output = $name; fn bitor(self, o: $name) -> $name { $name(self.0 | o.0) } }
        impl std::ops::BitOrAssign for $name { fn bitor_assign(&mut self, o: $name) { self.0 |= o.0 } }
        impl std::ops::BitAnd for $name { type Output = $name; fn bitand(self, o: $name) -> $name { $name(self.0 & o.0) } }
        impl std::ops::Not for $name { type Output = $name; fn not(self) -> $name { $name(!self.0) } }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                for (n, v) in Self::NAMED {
                    if self.contains(*v) {
                        if !first { f.write_str("|")?; }
                        f.write_str(n)?;
                        first = false;
                    }
                }
                if first { f.write_str("(empty)")?; }
                Ok(())
            }
        }
    };
}

flag_set! {
    /// Interface capability flags (`UCT_IFACE_FLAG_*`, same bit numbers and meanings).
    IfaceFlags: u64 {
        AM_SHORT = 0, AM_BCOPY = 1, AM_ZCOPY = 2, PENDING = 3,
        PUT_SHORT = 4, PUT_BCOPY = 5, PUT_ZCOPY = 6,
        GET_SHORT = 8, GET_BCOPY = 9, GET_ZCOPY = 10,
        ATOMIC_CPU = 30, ATOMIC_DEVICE = 31,
        ERRHANDLE_SHORT_BUF = 32, ERRHANDLE_BCOPY_BUF = 33, ERRHANDLE_ZCOPY_BUF = 34,
        ERRHANDLE_AM_ID = 35, ERRHANDLE_REMOTE_MEM = 36, ERRHANDLE_BCOPY_LEN = 37,
        ERRHANDLE_PEER_FAILURE = 38, EP_CHECK = 39,
        CONNECT_TO_IFACE = 40, CONNECT_TO_EP = 41, CONNECT_TO_SOCKADDR = 42,
        AM_DUP = 43, CB_SYNC = 44, CB_ASYNC = 45, EP_KEEPALIVE = 46,
        INTER_NODE = 54,
    }
}

flag_set! {
    /// Event capabilities (`UCT_IFACE_FLAG_EVENT_*`).
    EventFlags: u64 { SEND_COMP = 0, RECV = 1, RECV_SIG = 2, FD = 3, ASYNC_CB = 4 }
}

flag_set! {
    /// Events an application arms with `event_arm` (`UCT_EVENT_*`).
    ArmEvents: u32 { SEND_COMP = 0, RECV = 1, RECV_SIG = 2 }
}

flag_set! {
    /// Memory-domain capability flags (`UCT_MD_FLAG_*`).
    MdFlags: u64 { ALLOC = 0, REG = 1, NEED_MEMH = 2, NEED_RKEY = 3, ADVISE = 4, FIXED = 5, RKEY_PTR = 6 }
}

flag_set! {
    /// Memory access flags for registration (`UCT_MD_MEM_ACCESS_*`).
    MemAccess: u32 {
        REMOTE_PUT = 5, REMOTE_GET = 6, REMOTE_ATOMIC = 7, LOCAL_READ = 8, LOCAL_WRITE = 9,
    }
}

impl MemAccess {
    /// Everything: local and remote read/write/atomic.
    pub const ALL: MemAccess = MemAccess(0b11111 << 5);
    /// Remote put and get.
    pub const RMA: MemAccess = MemAccess((1 << 5) | (1 << 6));
}

flag_set! {
    /// Atomic operation bitmap (`UCS_BIT(uct_atomic_op_t)`).
    AtomicOps: u64 { ADD = 0, AND = 1, OR = 2, XOR = 3, SWAP = 4, CSWAP = 5 }
}

flag_set! {
    /// AM handler registration flags (`UCT_CB_FLAG_*`).
    AmCbFlags: u32 {
        RESERVED = 0,
        ASYNC = 1,
        /// The handler takes messages in memory a peer can write (a shared-memory FIFO
        /// element) without the transport copying them out first: it reads them only through
        /// copies (`AmMessage::copy_to`, `data`), and keeping one copies it. A rucx extension
        /// (bit 16, beside UCX's bits); transports without shared receive buffers ignore it.
        SHARED_DATA = 16
    }
}

impl AmCbFlags {
    /// A handler that runs only from `Worker::progress` (UCX's default, no flag).
    pub const SYNC: AmCbFlags = AmCbFlags(0);
}

flag_set! {
    /// Flush flags (`UCT_FLUSH_FLAG_*`). `LOCAL` is the empty set.
    FlushFlags: u32 { CANCEL = 0, REMOTE = 1 }
}

impl FlushFlags {
    /// Completed at the origin.
    pub const LOCAL: FlushFlags = FlushFlags(0);
}

flag_set! {
    /// Progress directions (`UCT_PROGRESS_*`).
    ProgressFlags: u32 { SEND = 0, RECV = 1, THREAD_SAFE = 7 }
}

/// Atomic operation codes (`uct_atomic_op_t`; also the tcp wire codes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum AtomicOp {
    Add = 0,
    And = 1,
    Or = 2,
    Xor = 3,
    Swap = 4,
    Cswap = 5,
}

impl AtomicOp {
    /// Decodes a raw value; `None` for anything unknown (it may come from the network).
    pub fn from_raw(v: u8) -> Option<AtomicOp> {
        Some(match v {
            0 => AtomicOp::Add,
            1 => AtomicOp::And,
            2 => AtomicOp::Or,
            3 => AtomicOp::Xor,
            4 => AtomicOp::Swap,
            5 => AtomicOp::Cswap,
            _ => return None,
        })
    }

    /// The bit of this op in an [`AtomicOps`] set.
    pub const fn flag(self) -> AtomicOps {
        AtomicOps(1 << self as u8)
    }

    /// Applies the op to `old` and returns the new value (64-bit; callers truncate for 32-bit).
    /// `Cswap` is not a binary op; it returns `old` (use `apply_cswap`).
    pub fn apply(self, old: u64, operand: u64) -> u64 {
        match self {
            AtomicOp::Add => old.wrapping_add(operand),
            AtomicOp::And => old & operand,
            AtomicOp::Or => old | operand,
            AtomicOp::Xor => old ^ operand,
            AtomicOp::Swap => operand,
            AtomicOp::Cswap => old,
        }
    }
}

/// Device types (`uct_device_type_t`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum DeviceType {
    Net = 0,
    Shm = 1,
    Acc = 2,
    SelfDev = 3,
}

impl DeviceType {
    /// Decodes a raw value; unknown values read as `Net`.
    pub fn from_raw(v: u8) -> DeviceType {
        match v {
            1 => DeviceType::Shm,
            2 => DeviceType::Acc,
            3 => DeviceType::SelfDev,
            _ => DeviceType::Net,
        }
    }

    /// UCX's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Net => "network",
            DeviceType::Shm => "intra-node",
            DeviceType::Acc => "accelerator",
            DeviceType::SelfDev => "loopback",
        }
    }
}

/// `c + m * x` (seconds, or seconds per byte).
#[derive(Clone, Copy, PartialEq, Debug, Default)]
#[repr(C)]
pub struct LinearFunc {
    pub c: f64,
    pub m: f64,
}

impl LinearFunc {
    /// Evaluates the function at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.c + self.m * x
    }
}

/// Bandwidth in bytes/s: `dedicated + shared / processes_per_node`.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
#[repr(C)]
pub struct Bandwidth {
    pub dedicated: f64,
    pub shared: f64,
}

impl Bandwidth {
    /// The bandwidth one of `ppn` processes gets.
    pub fn effective(&self, ppn: f64) -> f64 {
        self.dedicated + self.shared / ppn.max(1.0)
    }
}

/// Size limits of one operation family. For AM, `max_short`, `max_bcopy` and `max_zcopy` count
/// everything the receiver gets (header included), as in UCX; `max_hdr` bounds the zcopy header.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct OpCaps {
    /// For AM: includes the 8-byte header, as in UCX.
    pub max_short: usize,
    pub max_bcopy: usize,
    pub min_zcopy: usize,
    pub max_zcopy: usize,
    pub opt_zcopy_align: usize,
    pub align_mtu: usize,
    /// AM zcopy only: the largest user header.
    pub max_hdr: usize,
    pub max_iov: usize,
}

/// Atomic capabilities of one width.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct AtomicCaps {
    /// Ops supported without a result (`post`).
    pub op_flags: AtomicOps,
    /// Ops supported with a result (`fetch`, `cswap`).
    pub fop_flags: AtomicOps,
}

/// Interface attributes (`uct_iface_attr_t`).
#[derive(Clone, Copy, PartialEq, Debug, Default)]
#[repr(C)]
pub struct IfaceAttr {
    pub flags: IfaceFlags,
    pub event_flags: EventFlags,
    pub am: OpCaps,
    pub put: OpCaps,
    pub get: OpCaps,
    pub atomic32: AtomicCaps,
    pub atomic64: AtomicCaps,
    pub device_addr_len: usize,
    pub iface_addr_len: usize,
    pub ep_addr_len: usize,
    pub max_num_eps: usize,
    /// CPU overhead of a send, seconds.
    pub overhead: f64,
    pub bandwidth: Bandwidth,
    /// Seconds; `c + m * num_eps`.
    pub latency: LinearFunc,
    /// Tie-breaker in lane selection: higher wins.
    pub priority: u8,
}

/// What an endpoint knows about its peer (`uct_ep_attr_t`, plus the peer's limits).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct EpAttr {
    /// The largest active message (everything the receiver gets, header included) the peer
    /// accepts; 0 while unknown (not connected yet, or a transport whose addresses do not
    /// carry it: then both sides are expected to run with the same configuration).
    pub peer_am_max: usize,
    /// Whether the endpoint is connected to its peer (wireup done).
    pub connected: bool,
}

/// Memory-domain attributes.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
#[repr(C)]
pub struct MdAttr {
    pub flags: MdFlags,
    /// Largest registration (bytes).
    pub max_reg: usize,
    /// Packed rkey size in bytes.
    pub rkey_packed_size: usize,
    /// Registration cost: seconds, `c + m * bytes`.
    pub reg_cost: LinearFunc,
}

/// Fixed-size NUL-padded name used for resources at the plugin boundary.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Name<const N: usize>(pub [u8; N]);

impl<const N: usize> Name<N> {
    /// Builds a name, truncating to `N - 1` bytes so one NUL always remains.
    pub fn new(s: &str) -> Self {
        let mut a = [0u8; N];
        let mut n = s.len().min(N - 1);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        a[..n].copy_from_slice(&s.as_bytes()[..n]);
        Name(a)
    }

    /// The name as text (up to the first NUL; invalid UTF-8 reads as empty).
    pub fn as_str(&self) -> &str {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(N);
        std::str::from_utf8(&self.0[..end]).unwrap_or("")
    }
}

impl<const N: usize> Default for Name<N> {
    fn default() -> Self {
        Name([0; N])
    }
}

impl<const N: usize> fmt::Debug for Name<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> fmt::Display for Name<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// UCX limits: `UCT_TL_NAME_MAX` is 10 and `UCT_MD_NAME_MAX` 16; we allow a bit more room.
pub type TlName = Name<16>;
/// Memory-domain / component name.
pub type MdName = Name<32>;
/// Device name, e.g. `lo`, `rxe0:1`.
pub type DevName = Name<32>;

/// One transport resource: a transport on a device (`uct_tl_resource_desc_t`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct TlResource {
    pub tl_name: TlName,
    pub dev_name: DevName,
    pub dev_type: u8,
    /// The transport this resource duplicates on the same device (empty: none), with
    /// [`TlResource::dup_dev`]: see [`TlResource::duplicating`].
    pub dup_tl: TlName,
    /// The device of the resource it duplicates.
    pub dup_dev: DevName,
}

impl TlResource {
    /// Builds a resource record.
    pub fn new(tl: &str, dev: &str, ty: DeviceType) -> Self {
        TlResource {
            tl_name: Name::new(tl),
            dev_name: Name::new(dev),
            dev_type: ty as u8,
            dup_tl: Name::default(),
            dup_dev: Name::default(),
        }
    }

    /// Marks this resource as serving the same hardware as resource `tl`/`dev` of another
    /// transport that does it better (libfabric's `tcp;ofi_rxm/lo` next to rucx's `tcp/lo`). A
    /// UCP context leaves it out when that resource is usable and `RUCX_TLS` does not name
    /// this one's transport (docs/ucp.md, "Transport selection").
    pub fn duplicating(mut self, tl: &str, dev: &str) -> Self {
        self.dup_tl = Name::new(tl);
        self.dup_dev = Name::new(dev);
        self
    }

    /// The resource (`(transport, device)`) this one duplicates, if it said so.
    pub fn duplicate_of(&self) -> Option<(&str, &str)> {
        let tl = self.dup_tl.as_str();
        (!tl.is_empty()).then(|| (tl, self.dup_dev.as_str()))
    }

    /// The device type.
    pub fn device_type(&self) -> DeviceType {
        DeviceType::from_raw(self.dev_type)
    }
}

/// Number of active-message ids (`UCT_AM_ID_MAX`).
pub const AM_ID_MAX: u8 = 32;

/// Most I/O-vector entries one call passes (transports advertise their own `max_iov`).
pub const MAX_IOV: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_says_what_it_duplicates() {
        let r = TlResource::new("ofi", "shm", DeviceType::Shm);
        assert_eq!(r.duplicate_of(), None);
        let r = r.duplicating("posix", "memory");
        assert_eq!(r.duplicate_of(), Some(("posix", "memory")));
        assert_eq!((r.tl_name.as_str(), r.dev_name.as_str()), ("ofi", "shm"));
    }

    #[test]
    fn flag_bits_match_ucx() {
        assert_eq!(IfaceFlags::AM_SHORT.bits(), 1);
        assert_eq!(IfaceFlags::PUT_ZCOPY.bits(), 1 << 6);
        assert_eq!(IfaceFlags::ERRHANDLE_PEER_FAILURE.bits(), 1 << 38);
        assert_eq!(IfaceFlags::CONNECT_TO_EP.bits(), 1 << 41);
        let f = IfaceFlags::AM_SHORT | IfaceFlags::PENDING;
        assert!(f.contains(IfaceFlags::PENDING));
        assert!(!f.contains(IfaceFlags::AM_ZCOPY));
        assert_eq!(format!("{f:?}"), "AM_SHORT|PENDING");
    }

    #[test]
    fn names_truncate_and_read_back() {
        let n = TlName::new("a_very_long_transport_name");
        assert_eq!(n.as_str().len(), 15);
        assert_eq!(DevName::new("rxe0:1").as_str(), "rxe0:1");
        // Truncation never splits a UTF-8 character.
        let u = Name::<4>::new("aé€");
        assert_eq!(u.as_str(), "aé");
    }

    #[test]
    fn atomic_ops_apply() {
        assert_eq!(AtomicOp::Add.apply(u64::MAX, 2), 1);
        assert_eq!(AtomicOp::Xor.apply(0b1100, 0b1010), 0b0110);
        assert_eq!(AtomicOp::Swap.apply(5, 9), 9);
        assert_eq!(AtomicOp::from_raw(9), None);
        assert!(AtomicOps(0b111111).contains(AtomicOp::Cswap.flag()));
    }
}
