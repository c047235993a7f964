//! The packed worker address: what a worker hands to its peers out of band so they can create
//! endpoints to it. It names the worker (uuid, name) and lists each transport resource with its
//! device and interface addresses and the attributes lane selection scores, so both peers run
//! the same selection on the same numbers.
//!
//! The format (docs/wire-ucp.md, "Worker address") is little-endian and fixed-width except for
//! length-prefixed names and addresses, with a magic and a version byte the reader checks. Every
//! field is bounded and checked, and every accepted encoding is canonical: re-packing an unpacked
//! address gives the same bytes (the fuzz body checks it).

use std::fmt;

use ucs::{Error, Result, Status};
use uct::{AtomicOps, IfaceFlags};

use crate::tl::{TlAttr, TlInfo};

/// The first four bytes of every packed worker address: `RXWA` ("rucx worker address").
pub const MAGIC: [u8; 4] = *b"RXWA";
/// The format version this release writes and the only one it reads.
pub const VERSION: u8 = 1;
/// Most entries (transport resources) in one address.
pub const MAX_ENTRIES: usize = 64;
/// Longest worker name, bytes of UTF-8 (`hostname:pid` fits: Linux host names are at most 64).
pub const MAX_WORKER_NAME_LEN: usize = 128;
/// Longest transport, device or component name, bytes of UTF-8 (uct's are at most 31).
pub const MAX_TL_NAME_LEN: usize = 32;
/// Longest device or interface address, bytes.
pub const MAX_ADDR_LEN: usize = 1024;
/// Bits of the atomic operation sets on the wire (`ADD`..=`CSWAP`); `pack` drops the others.
const ATOMIC_KNOWN: u64 = 0x3f;
/// magic, version, uuid, worker name length.
const HEADER_LEN: usize = 4 + 1 + 8 + 1;
/// The entry's fields between its names and its addresses: device type, five attributes,
/// priority, flags, seven limits, four atomic sets.
const ENTRY_FIXED_LEN: usize = 1 + 5 * 8 + 1 + 8 + 7 * 8 + 4;

/// One transport resource of a worker: its names and attributes, and the device and interface
/// addresses a peer connects to.
#[derive(Clone, Debug, PartialEq)]
pub struct AddressEntry {
    /// The transport's names, device type and performance attributes.
    pub tl: TlInfo,
    /// `uct::Iface::device_address`.
    pub dev_addr: Vec<u8>,
    /// `uct::Iface::iface_address` (empty for transports that connect to endpoints only).
    pub iface_addr: Vec<u8>,
}

/// A worker's address, as packed by [`WorkerAddress::pack`] and read by
/// [`WorkerAddress::unpack`].
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerAddress {
    /// Identifies the worker (random, per worker).
    pub uuid: u64,
    /// For messages and logs; at most [`MAX_WORKER_NAME_LEN`] bytes, no control characters
    /// ([`bounded_name`] makes one).
    pub name: String,
    /// At most [`MAX_ENTRIES`].
    pub entries: Vec<AddressEntry>,
}

/// `name` cut to [`MAX_WORKER_NAME_LEN`] bytes (at a character boundary), control characters
/// replaced by `?`: a worker name [`WorkerAddress::pack`] accepts.
pub fn bounded_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(MAX_WORKER_NAME_LEN));
    for c in name.chars() {
        let c = if c.is_control() { '?' } else { c };
        if out.len() + c.len_utf8() > MAX_WORKER_NAME_LEN {
            break;
        }
        out.push(c);
    }
    out
}

impl WorkerAddress {
    /// Checks that the address fits the format's bounds: what [`WorkerAddress::pack`] requires
    /// and [`WorkerAddress::unpack`] accepts. A worker checks its own address with this before
    /// handing it out.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Error::new(Status::InvalidParam, format!("bad worker address: {msg}"));
        check_name("worker name", &self.name, MAX_WORKER_NAME_LEN, true).map_err(bad)?;
        check_count(self.entries.len()).map_err(bad)?;
        for (i, e) in self.entries.iter().enumerate() {
            let in_entry = |msg: String| bad(format!("entry {i}: {msg}"));
            check_name("transport name", &e.tl.tl_name, MAX_TL_NAME_LEN, false).map_err(in_entry)?;
            check_name("device name", &e.tl.dev_name, MAX_TL_NAME_LEN, false).map_err(in_entry)?;
            check_name("component name", &e.tl.component, MAX_TL_NAME_LEN, false).map_err(in_entry)?;
            for (what, v) in attrs(&e.tl.attr) {
                check_attr(what, v).map_err(in_entry)?;
            }
            check_addr_len("device address", e.dev_addr.len()).map_err(in_entry)?;
            check_addr_len("interface address", e.iface_addr.len()).map_err(in_entry)?;
        }
        Ok(())
    }

    /// Bytes [`WorkerAddress::pack`] writes.
    pub fn packed_len(&self) -> usize {
        let entries: usize = self
            .entries
            .iter()
            .map(|e| {
                3 + e.tl.tl_name.len()
                    + e.tl.dev_name.len()
                    + e.tl.component.len()
                    + ENTRY_FIXED_LEN
                    + 2
                    + e.dev_addr.len()
                    + 2
                    + e.iface_addr.len()
            })
            .sum();
        HEADER_LEN + self.name.len() + 1 + entries
    }

    /// The address in the wire format. Atomic operation bits outside `ADD..=CSWAP` are dropped.
    ///
    /// # Panics
    /// If the address is out of the format's bounds ([`WorkerAddress::validate`] says which):
    /// the caller built it wrongly. A worker validates its address when it creates it.
    pub fn pack(&self) -> Vec<u8> {
        if let Err(e) = self.validate() {
            panic!("WorkerAddress::pack: {e}");
        }
        let mut out = Vec::with_capacity(self.packed_len());
        self.write(&mut out);
        debug_assert_eq!(out.len(), self.packed_len());
        out
    }

    /// The writer behind `pack`, without the bounds check (tests use it to build bad input).
    /// Lengths are written truncated to their field's width.
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.uuid.to_le_bytes());
        put_str8(out, &self.name);
        out.push(self.entries.len() as u8);
        for e in &self.entries {
            let tl = &e.tl;
            let a = &tl.attr;
            put_str8(out, &tl.tl_name);
            put_str8(out, &tl.dev_name);
            put_str8(out, &tl.component);
            out.push(tl.dev_type);
            for (_, v) in attrs(a) {
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            out.push(a.priority);
            out.extend_from_slice(&a.flags.bits().to_le_bytes());
            for (_, v) in limits(a) {
                out.extend_from_slice(&(v as u64).to_le_bytes());
            }
            for ops in [a.atomic32.0, a.atomic32.1, a.atomic64.0, a.atomic64.1] {
                out.push((ops.bits() & ATOMIC_KNOWN) as u8);
            }
            put_bytes16(out, &e.dev_addr);
            put_bytes16(out, &e.iface_addr);
        }
    }

    /// Reads a packed address, checking every field: the whole of `data` must be one address.
    /// Errors: `InvalidParam` for malformed input (the message names the field and the byte
    /// offset), `Unsupported` for another format version.
    pub fn unpack(data: &[u8]) -> Result<WorkerAddress> {
        let mut r = Reader {
            buf: data,
            pos: 0,
            entry: None,
        };
        r.magic()?;
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "worker address format version {version} not supported (this reader speaks \
                     version {VERSION} only): the peer runs an incompatible rucx release"
                ),
            ));
        }
        let uuid = r.u64("uuid")?;
        let name = r.name("worker name", MAX_WORKER_NAME_LEN, true)?;
        let count = r.u8("entry count")? as usize;
        check_count(count).map_err(|m| r.bad(m))?;
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            r.entry = Some(i);
            entries.push(r.entry()?);
        }
        r.entry = None;
        if r.pos != data.len() {
            return Err(r.bad(format!(
                "trailing garbage: {} more byte(s) after the last entry, from byte {}",
                data.len() - r.pos,
                r.pos
            )));
        }
        Ok(WorkerAddress { uuid, name, entries })
    }
}

impl fmt::Display for WorkerAddress {
    /// `name (uuid 0x...): tcp/lo, self/memory`, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (uuid {:#018x}):", self.name, self.uuid)?;
        for (i, e) in self.entries.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{}/{}", e.tl.tl_name, e.tl.dev_name)?;
        }
        Ok(())
    }
}

/// The performance attributes in wire order.
fn attrs(a: &TlAttr) -> [(&'static str, f64); 5] {
    [
        ("latency_c", a.latency_c),
        ("latency_m", a.latency_m),
        ("overhead", a.overhead),
        ("bw_dedicated", a.bw_dedicated),
        ("bw_shared", a.bw_shared),
    ]
}

/// The size limits in wire order.
fn limits(a: &TlAttr) -> [(&'static str, usize); 7] {
    [
        ("am_max_short", a.am_max_short),
        ("am_max_bcopy", a.am_max_bcopy),
        ("am_max_zcopy", a.am_max_zcopy),
        ("am_max_hdr", a.am_max_hdr),
        ("am_max_iov", a.am_max_iov),
        ("put_max_zcopy", a.put_max_zcopy),
        ("get_max_zcopy", a.get_max_zcopy),
    ]
}

fn put_str8(out: &mut Vec<u8>, s: &str) {
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

fn put_bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

// The checks shared by `validate` (the writer's side) and `unpack` (the reader's), so the two
// accept exactly the same addresses.

fn check_name(what: &str, s: &str, max: usize, may_be_empty: bool) -> std::result::Result<(), String> {
    if s.len() > max {
        return Err(format!("{what} of {} bytes (at most {max})", s.len()));
    }
    if s.is_empty() && !may_be_empty {
        return Err(format!("empty {what}"));
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{what} {s:?} contains a control character"));
    }
    Ok(())
}

fn check_count(n: usize) -> std::result::Result<(), String> {
    if n > MAX_ENTRIES {
        return Err(format!("{n} entries (at most {MAX_ENTRIES})"));
    }
    Ok(())
}

fn check_attr(what: &str, v: f64) -> std::result::Result<(), String> {
    // -0.0 too: the sign bit would make two encodings of one value.
    if !v.is_finite() || v.is_sign_negative() {
        return Err(format!("{what} is {v} (must be finite and >= 0)"));
    }
    Ok(())
}

fn check_addr_len(what: &str, n: usize) -> std::result::Result<(), String> {
    if n > MAX_ADDR_LEN {
        return Err(format!("{what} of {n} bytes (at most {MAX_ADDR_LEN})"));
    }
    Ok(())
}

/// A cursor over the input; errors name the field, the entry and the byte offset.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The entry being read, for error messages.
    entry: Option<usize>,
}

impl<'a> Reader<'a> {
    #[cold]
    fn bad(&self, msg: impl fmt::Display) -> Error {
        match self.entry {
            Some(i) => Error::new(
                Status::InvalidParam,
                format!("bad worker address: entry {i}: {msg}"),
            ),
            None => Error::new(Status::InvalidParam, format!("bad worker address: {msg}")),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(self.bad(format_args!(
                "truncated in the {what} at byte {} (needs {n} bytes, {left} left)",
                self.pos
            )));
        }
        let b = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.take(N, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn magic(&mut self) -> Result<()> {
        // Compare what is there before asking for more, so any non-address is "not an address"
        // rather than "truncated".
        let have = &self.buf[..self.buf.len().min(MAGIC.len())];
        if have != &MAGIC[..have.len()] {
            return Err(self.bad(format_args!(
                "magic {have:02x?} is not {MAGIC:02x?} (\"RXWA\"): not a rucx worker address"
            )));
        }
        self.take(MAGIC.len(), "magic").map(drop)
    }

    /// A u8-length UTF-8 name.
    fn name(&mut self, what: &str, max: usize, may_be_empty: bool) -> Result<String> {
        let start = self.pos;
        let len = self.u8(what)? as usize;
        if len > max {
            return Err(self.bad(format_args!(
                "{what} of {len} bytes at byte {start} (at most {max})"
            )));
        }
        let bytes = self.take(len, what)?;
        let s = std::str::from_utf8(bytes)
            .map_err(|_| self.bad(format_args!("{what} at byte {start} is not UTF-8: {bytes:02x?}")))?;
        check_name(what, s, max, may_be_empty).map_err(|m| self.bad(m))?;
        Ok(s.to_owned())
    }

    /// A u16-length address of at most [`MAX_ADDR_LEN`] bytes.
    fn addr(&mut self, what: &str) -> Result<Vec<u8>> {
        let start = self.pos;
        let len = self.u16(what)? as usize;
        check_addr_len(what, len).map_err(|m| self.bad(format_args!("{m} at byte {start}")))?;
        Ok(self.take(len, what)?.to_vec())
    }

    fn attr(&mut self, what: &str) -> Result<f64> {
        let start = self.pos;
        let v = f64::from_bits(self.u64(what)?);
        check_attr(what, v).map_err(|m| self.bad(format_args!("{m} at byte {start}")))?;
        Ok(v)
    }

    fn limit(&mut self, what: &str) -> Result<usize> {
        let start = self.pos;
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| {
            self.bad(format_args!(
                "{what} {v} at byte {start} does not fit a usize here"
            ))
        })
    }

    fn atomics(&mut self, what: &str) -> Result<AtomicOps> {
        let start = self.pos;
        let v = self.u8(what)?;
        if u64::from(v) & !ATOMIC_KNOWN != 0 {
            return Err(self.bad(format_args!(
                "{what} {v:#04x} at byte {start} has unknown operation bits (known: {ATOMIC_KNOWN:#04x})"
            )));
        }
        Ok(AtomicOps(v.into()))
    }

    fn entry(&mut self) -> Result<AddressEntry> {
        let tl_name = self.name("transport name", MAX_TL_NAME_LEN, false)?;
        let dev_name = self.name("device name", MAX_TL_NAME_LEN, false)?;
        let component = self.name("component name", MAX_TL_NAME_LEN, false)?;
        let dev_type = self.u8("device type")?;
        let latency_c = self.attr("latency_c")?;
        let latency_m = self.attr("latency_m")?;
        let overhead = self.attr("overhead")?;
        let bw_dedicated = self.attr("bw_dedicated")?;
        let bw_shared = self.attr("bw_shared")?;
        let priority = self.u8("priority")?;
        let flags = IfaceFlags(self.u64("flags")?);
        let am_max_short = self.limit("am_max_short")?;
        let am_max_bcopy = self.limit("am_max_bcopy")?;
        let am_max_zcopy = self.limit("am_max_zcopy")?;
        let am_max_hdr = self.limit("am_max_hdr")?;
        let am_max_iov = self.limit("am_max_iov")?;
        let put_max_zcopy = self.limit("put_max_zcopy")?;
        let get_max_zcopy = self.limit("get_max_zcopy")?;
        let atomic32 = (
            self.atomics("atomic32 op set")?,
            self.atomics("atomic32 fetch op set")?,
        );
        let atomic64 = (
            self.atomics("atomic64 op set")?,
            self.atomics("atomic64 fetch op set")?,
        );
        let dev_addr = self.addr("device address")?;
        let iface_addr = self.addr("interface address")?;
        Ok(AddressEntry {
            tl: TlInfo {
                tl_name,
                dev_name,
                component,
                dev_type,
                attr: TlAttr {
                    flags,
                    latency_c,
                    latency_m,
                    overhead,
                    bw_dedicated,
                    bw_shared,
                    priority,
                    am_max_bcopy,
                    am_max_short,
                    am_max_zcopy,
                    am_max_hdr,
                    am_max_iov,
                    put_max_zcopy,
                    get_max_zcopy,
                    atomic32,
                    atomic64,
                },
            },
            dev_addr,
            iface_addr,
        })
    }
}

/// Fuzz body `ucp_address` (the cargo-fuzz target and the seeded tests below): unpacking never
/// panics; an error is `InvalidParam` or `Unsupported` with a message; what unpacks is valid,
/// re-packs to the same bytes (the format is canonical) and unpacks to the same address.
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub fn fuzz_address(data: &[u8]) {
    match WorkerAddress::unpack(data) {
        Ok(a) => {
            if let Err(e) = a.validate() {
                panic!("unpacked an address validate() refuses: {e}");
            }
            assert_eq!(a.packed_len(), data.len());
            let packed = a.pack();
            assert_eq!(packed, data, "re-packing changed the bytes");
            let b = WorkerAddress::unpack(&packed).expect("a re-packed address unpacks");
            assert_eq!(a, b);
        }
        Err(e) => {
            assert!(
                matches!(e.status(), Status::InvalidParam | Status::Unsupported),
                "unexpected status {e}"
            );
            assert!(
                e.context().is_some_and(|c| !c.is_empty()),
                "an error without a message"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct::{AtomicCaps, Bandwidth, IfaceAttr, LinearFunc, OpCaps};

    /// xorshift64: a small local generator, so the seeded inputs never change.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn info(tl_name: &str, dev_name: &str, component: &str, dev_type: u8, attr: TlAttr) -> TlInfo {
        TlInfo {
            tl_name: tl_name.into(),
            dev_name: dev_name.into(),
            component: component.into(),
            dev_type,
            attr,
        }
    }

    /// The address of the golden layout test.
    fn golden() -> WorkerAddress {
        let attr = TlAttr {
            flags: IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY | IfaceFlags::AM_ZCOPY,
            latency_c: 1.0,
            latency_m: 0.0,
            overhead: 0.5,
            bw_dedicated: 2.0,
            bw_shared: 0.25,
            priority: 7,
            am_max_bcopy: 0x2000,
            am_max_short: 0x10,
            am_max_zcopy: 0x1_0000,
            am_max_hdr: 0x80,
            am_max_iov: 3,
            put_max_zcopy: 0x1_0000_0000,
            get_max_zcopy: 5,
            atomic32: (AtomicOps(0x3f), AtomicOps(0x3f)),
            atomic64: (AtomicOps::ADD, AtomicOps::SWAP | AtomicOps::CSWAP),
        };
        WorkerAddress {
            uuid: 0x1122_3344_5566_7788,
            name: "w0".into(),
            entries: vec![AddressEntry {
                tl: info("self", "memory", "self", 3, attr),
                dev_addr: vec![],
                iface_addr: vec![0xab, 0xcd],
            }],
        }
    }

    /// The golden address byte by byte, written from docs/wire-ucp.md, not by `pack`.
    #[rustfmt::skip]
    const GOLDEN: [u8; 150] = [
        b'R', b'X', b'W', b'A',                         // 0 magic
        1,                                              // 4 version
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // 5 uuid
        2, b'w', b'0',                                  // 13 worker name
        1,                                              // 16 entry count
        4, b's', b'e', b'l', b'f',                      // 17 transport name
        6, b'm', b'e', b'm', b'o', b'r', b'y',          // 22 device name
        4, b's', b'e', b'l', b'f',                      // 29 component name
        3,                                              // 34 device type
        0, 0, 0, 0, 0, 0, 0xf0, 0x3f,                   // 35 latency_c 1.0
        0, 0, 0, 0, 0, 0, 0, 0,                         // 43 latency_m 0.0
        0, 0, 0, 0, 0, 0, 0xe0, 0x3f,                   // 51 overhead 0.5
        0, 0, 0, 0, 0, 0, 0, 0x40,                      // 59 bw_dedicated 2.0
        0, 0, 0, 0, 0, 0, 0xd0, 0x3f,                   // 67 bw_shared 0.25
        7,                                              // 75 priority
        7, 0, 0, 0, 0, 0, 0, 0,                         // 76 flags
        0x10, 0, 0, 0, 0, 0, 0, 0,                      // 84 am_max_short
        0, 0x20, 0, 0, 0, 0, 0, 0,                      // 92 am_max_bcopy
        0, 0, 1, 0, 0, 0, 0, 0,                         // 100 am_max_zcopy
        0x80, 0, 0, 0, 0, 0, 0, 0,                      // 108 am_max_hdr
        3, 0, 0, 0, 0, 0, 0, 0,                         // 116 am_max_iov
        0, 0, 0, 0, 1, 0, 0, 0,                         // 124 put_max_zcopy
        5, 0, 0, 0, 0, 0, 0, 0,                         // 132 get_max_zcopy
        0x3f, 0x3f, 0x01, 0x30,                         // 140 atomic sets
        0, 0,                                           // 144 device address
        2, 0, 0xab, 0xcd,                               // 146 interface address
    ];

    fn self_entry() -> AddressEntry {
        golden().entries.remove(0)
    }

    fn tcp_entry() -> AddressEntry {
        let ops = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        let fops = ops | AtomicOps::SWAP | AtomicOps::CSWAP;
        let caps = AtomicCaps {
            op_flags: ops,
            fop_flags: fops,
        };
        let iface = IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::AM_ZCOPY
                | IfaceFlags::PUT_ZCOPY
                | IfaceFlags::GET_ZCOPY
                | IfaceFlags::ATOMIC_CPU
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::INTER_NODE,
            am: OpCaps {
                max_short: 8192,
                max_bcopy: 8192,
                max_zcopy: 65536,
                max_hdr: 128,
                max_iov: 6,
                ..OpCaps::default()
            },
            put: OpCaps {
                max_zcopy: usize::MAX,
                ..OpCaps::default()
            },
            get: OpCaps {
                max_zcopy: usize::MAX,
                ..OpCaps::default()
            },
            atomic32: caps,
            atomic64: caps,
            overhead: 50e-6,
            bandwidth: Bandwidth {
                dedicated: 0.0,
                shared: 11.91e9,
            },
            latency: LinearFunc { c: 10.96e-6, m: 0.0 },
            priority: 1,
            ..IfaceAttr::default()
        };
        let mut dev_addr = vec![4, 1, 127, 0, 0, 1];
        dev_addr.extend_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
        AddressEntry {
            tl: info("tcp", "lo", "tcp", 0, TlAttr::from_iface(&iface)),
            dev_addr,
            iface_addr: 13337u16.to_le_bytes().to_vec(),
        }
    }

    fn rc_entry() -> AddressEntry {
        let attr = TlAttr {
            flags: IfaceFlags(0x0000_0400_c000_0777) | IfaceFlags::CONNECT_TO_EP,
            latency_c: 800e-9,
            latency_m: 1e-9,
            overhead: 75e-9,
            bw_dedicated: 12.5e9 * 0.95,
            bw_shared: 0.0,
            priority: 0,
            am_max_bcopy: 8256,
            am_max_short: 124,
            am_max_zcopy: 8256,
            am_max_hdr: 127,
            am_max_iov: 8,
            put_max_zcopy: 1 << 30,
            get_max_zcopy: 1 << 30,
            atomic32: (AtomicOps::EMPTY, AtomicOps::EMPTY),
            atomic64: (AtomicOps::ADD, AtomicOps::ADD | AtomicOps::CSWAP),
        };
        AddressEntry {
            tl: info("rc_verbs", "rxe0:1", "ib", 0, attr),
            dev_addr: (0..18).collect(),
            iface_addr: vec![],
        }
    }

    /// Three entries, self, tcp and rc_verbs-like.
    fn sample() -> WorkerAddress {
        WorkerAddress {
            uuid: 0xfeed_f00d_dead_beef,
            name: "node-17.example:4242".into(),
            entries: vec![self_entry(), tcp_entry(), rc_entry()],
        }
    }

    /// The bytes of `a` as written, without `validate` (for bad input).
    fn raw(a: &WorkerAddress) -> Vec<u8> {
        let mut out = Vec::new();
        a.write(&mut out);
        out
    }

    fn unpack_err(data: &[u8]) -> (Status, String) {
        let e = WorkerAddress::unpack(data).expect_err("must be refused");
        (e.status(), e.context().expect("with a message").to_owned())
    }

    #[test]
    fn address_round_trip_several_entries() {
        let a = sample();
        a.validate().unwrap();
        let packed = a.pack();
        assert_eq!(packed.len(), a.packed_len());
        let b = WorkerAddress::unpack(&packed).unwrap();
        assert_eq!(a, b);
        // The attributes come back bit for bit, so both peers score lanes alike.
        for (x, y) in a.entries.iter().zip(&b.entries) {
            for ((_, u), (_, v)) in attrs(&x.tl.attr).iter().zip(attrs(&y.tl.attr)) {
                assert_eq!(u.to_bits(), v.to_bits());
            }
        }
        assert_eq!(b.entries[1].tl.attr.put_max_zcopy, usize::MAX);
        assert_eq!(
            b.to_string(),
            "node-17.example:4242 (uuid 0xfeedf00ddeadbeef): self/memory, tcp/lo, rc_verbs/rxe0:1"
        );
        fuzz_address(&packed);

        let empty = WorkerAddress {
            uuid: 0,
            name: String::new(),
            entries: vec![],
        };
        assert_eq!(
            empty.pack(),
            [b'R', b'X', b'W', b'A', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(WorkerAddress::unpack(&empty.pack()).unwrap(), empty);
    }

    #[test]
    fn address_round_trip_at_the_bounds() {
        let mut e = rc_entry();
        e.tl.tl_name = "t".repeat(MAX_TL_NAME_LEN);
        e.tl.dev_name = "d\u{e9}".repeat(MAX_TL_NAME_LEN / 3) + "dd";
        e.tl.component = "c".repeat(MAX_TL_NAME_LEN);
        e.dev_addr = vec![0xd5; MAX_ADDR_LEN];
        e.iface_addr = vec![0x1f; MAX_ADDR_LEN];
        let a = WorkerAddress {
            uuid: u64::MAX,
            name: "\u{1f980}".repeat(MAX_WORKER_NAME_LEN / 4),
            entries: vec![e; MAX_ENTRIES],
        };
        let packed = a.pack();
        assert_eq!(WorkerAddress::unpack(&packed).unwrap(), a);
        fuzz_address(&packed);
        for cut in [1, 100, packed.len() / 2, packed.len() - 1] {
            let (status, msg) = unpack_err(&packed[..cut]);
            assert_eq!(status, Status::InvalidParam);
            assert!(msg.contains("truncated"), "{msg}");
        }
    }

    #[test]
    fn address_golden_layout() {
        assert_eq!(
            golden().pack(),
            GOLDEN,
            "the packed format changed: bump VERSION and update docs/wire-ucp.md"
        );
        assert_eq!(WorkerAddress::unpack(&GOLDEN).unwrap(), golden());
        assert_eq!(golden().packed_len(), GOLDEN.len());
    }

    #[test]
    fn address_pack_drops_unknown_atomic_bits() {
        let mut a = golden();
        a.entries[0].tl.attr.atomic64.1 = AtomicOps(0xffff);
        let b = WorkerAddress::unpack(&a.pack()).unwrap();
        assert_eq!(b.entries[0].tl.attr.atomic64.1, AtomicOps(0x3f));
    }

    #[test]
    fn address_rejects_bad_headers() {
        let mut v2 = GOLDEN.to_vec();
        v2[4] = 2;
        let mut v0 = GOLDEN.to_vec();
        v0[4] = 0;
        let mut trailing = GOLDEN.to_vec();
        trailing.extend_from_slice(&[0, 0, 0]);
        let mut many = GOLDEN.to_vec();
        many[16] = 0xff;
        let mut name_not_utf8 = GOLDEN.to_vec();
        name_not_utf8[14] = 0xff;
        let mut tl_not_utf8 = GOLDEN.to_vec();
        tl_not_utf8[18] = 0xc3;
        let mut tl_long = GOLDEN.to_vec();
        tl_long[17] = 200;
        let mut dev_type = GOLDEN.to_vec();
        dev_type[34] = 0xff; // any device type is accepted (unknown ones read as network)
        let mut atomic = GOLDEN.to_vec();
        atomic[140] = 0x40;
        let mut iface_len = GOLDEN.to_vec();
        iface_len[146..148].copy_from_slice(&[0xff, 0xff]);
        let mut nan = GOLDEN.to_vec();
        nan[35..43].copy_from_slice(&f64::NAN.to_bits().to_le_bytes());
        let mut neg_zero = GOLDEN.to_vec();
        neg_zero[43..51].copy_from_slice(&(-0.0f64).to_bits().to_le_bytes());
        let cases: &[(&str, &[u8], Status, &str)] = &[
            (
                "empty",
                b"",
                Status::InvalidParam,
                "truncated in the magic at byte 0 (needs 4 bytes, 0 left)",
            ),
            (
                "magic",
                b"GET / HTTP/1.1",
                Status::InvalidParam,
                "not a rucx worker address",
            ),
            (
                "magic prefix",
                b"RXWB",
                Status::InvalidParam,
                "not a rucx worker address",
            ),
            (
                "short magic",
                b"RX",
                Status::InvalidParam,
                "truncated in the magic",
            ),
            (
                "version 2",
                &v2,
                Status::Unsupported,
                "version 2 not supported (this reader speaks version 1 only)",
            ),
            ("version 0", &v0, Status::Unsupported, "version 0 not supported"),
            (
                "trailing",
                &trailing,
                Status::InvalidParam,
                "trailing garbage: 3 more byte(s) after the last entry, from byte 150",
            ),
            (
                "entry count",
                &many,
                Status::InvalidParam,
                "255 entries (at most 64)",
            ),
            (
                "worker name",
                &name_not_utf8,
                Status::InvalidParam,
                "worker name at byte 13 is not UTF-8",
            ),
            (
                "tl name",
                &tl_not_utf8,
                Status::InvalidParam,
                "entry 0: transport name at byte 17 is not UTF-8",
            ),
            (
                "tl name len",
                &tl_long,
                Status::InvalidParam,
                "entry 0: transport name of 200 bytes at byte 17 (at most 32)",
            ),
            (
                "atomics",
                &atomic,
                Status::InvalidParam,
                "entry 0: atomic32 op set 0x40 at byte 140 has unknown operation bits",
            ),
            (
                "iface addr len",
                &iface_len,
                Status::InvalidParam,
                "entry 0: interface address of 65535 bytes (at most 1024) at byte 146",
            ),
            (
                "nan",
                &nan,
                Status::InvalidParam,
                "entry 0: latency_c is NaN (must be finite and >= 0) at byte 35",
            ),
            (
                "-0",
                &neg_zero,
                Status::InvalidParam,
                "entry 0: latency_m is -0 (must be finite and >= 0)",
            ),
        ];
        for (name, data, status, want) in cases {
            let (s, msg) = unpack_err(data);
            assert_eq!(s, *status, "{name}: {msg}");
            assert!(msg.contains(want), "{name}: {msg:?} lacks {want:?}");
        }
        assert_eq!(
            WorkerAddress::unpack(&dev_type).unwrap().entries[0].tl.dev_type,
            0xff
        );
    }

    #[test]
    fn address_rejects_every_truncation() {
        for full in [GOLDEN.to_vec(), sample().pack()] {
            for cut in 0..full.len() {
                let (s, msg) = unpack_err(&full[..cut]);
                assert_eq!(s, Status::InvalidParam, "cut at {cut}: {msg}");
                assert!(msg.contains("truncated"), "cut at {cut}: {msg}");
            }
        }
        let (_, msg) = unpack_err(&GOLDEN[..40]);
        assert!(
            msg.contains("entry 0: truncated in the latency_c at byte 35 (needs 8 bytes, 5 left)"),
            "{msg}"
        );
    }

    /// Addresses `validate` refuses; `unpack` refuses their bytes with the same message.
    #[test]
    fn address_rejects_out_of_bounds_values() {
        type Edit = fn(&mut WorkerAddress);
        let cases: &[(&str, Edit, &str)] = &[
            (
                "long worker name",
                |a| a.name = "x".repeat(129),
                "worker name of 129 bytes",
            ),
            (
                "control char",
                |a| a.name = "a\nb".into(),
                "worker name \"a\\nb\" contains a control character",
            ),
            (
                "long tl name",
                |a| a.entries[0].tl.tl_name = "x".repeat(33),
                "entry 0: transport name of 33 bytes",
            ),
            (
                "long dev name",
                |a| a.entries[1].tl.dev_name = "y".repeat(40),
                "entry 1: device name of 40 bytes",
            ),
            (
                "empty tl name",
                |a| a.entries[0].tl.tl_name.clear(),
                "entry 0: empty transport name",
            ),
            (
                "empty dev name",
                |a| a.entries[0].tl.dev_name.clear(),
                "entry 0: empty device name",
            ),
            (
                "empty component",
                |a| a.entries[2].tl.component.clear(),
                "entry 2: empty component name",
            ),
            (
                "dev name ctrl",
                |a| a.entries[0].tl.dev_name = "lo\u{7}".into(),
                "contains a control character",
            ),
            (
                "entries",
                |a| a.entries = vec![self_entry(); 65],
                "65 entries (at most 64)",
            ),
            (
                "dev addr",
                |a| a.entries[1].dev_addr = vec![0; 1025],
                "entry 1: device address of 1025 bytes (at most 1024)",
            ),
            (
                "iface addr",
                |a| a.entries[2].iface_addr = vec![0; 1025],
                "entry 2: interface address of 1025 bytes",
            ),
            (
                "nan",
                |a| a.entries[0].tl.attr.latency_c = f64::NAN,
                "entry 0: latency_c is NaN",
            ),
            (
                "inf",
                |a| a.entries[1].tl.attr.bw_dedicated = f64::INFINITY,
                "entry 1: bw_dedicated is inf",
            ),
            (
                "-inf",
                |a| a.entries[1].tl.attr.bw_shared = f64::NEG_INFINITY,
                "entry 1: bw_shared is -inf",
            ),
            (
                "negative",
                |a| a.entries[2].tl.attr.overhead = -1.0,
                "entry 2: overhead is -1",
            ),
            (
                "-0",
                |a| a.entries[2].tl.attr.latency_m = -0.0,
                "entry 2: latency_m is -0",
            ),
        ];
        for (name, edit, want) in cases {
            let mut a = sample();
            edit(&mut a);
            let e = a.validate().expect_err(name);
            let v = e.context().unwrap();
            assert!(v.contains(want), "{name}: validate said {v:?}, not {want:?}");
            let (s, msg) = unpack_err(&raw(&a));
            assert_eq!(s, Status::InvalidParam, "{name}");
            assert!(msg.contains(want), "{name}: unpack said {msg:?}, not {want:?}");
        }
    }

    #[test]
    #[should_panic(expected = "65 entries (at most 64)")]
    fn address_pack_panics_out_of_bounds() {
        let mut a = golden();
        a.entries = vec![self_entry(); 65];
        a.pack();
    }

    #[test]
    fn address_bounded_name() {
        assert_eq!(bounded_name("host:42"), "host:42");
        assert_eq!(bounded_name("a\tb\n"), "a?b?");
        let long = bounded_name(&"x".repeat(500));
        assert_eq!(long.len(), MAX_WORKER_NAME_LEN);
        // A multi-byte character that does not fit is left out whole.
        let s = bounded_name(&("y".repeat(MAX_WORKER_NAME_LEN - 1) + "\u{e9}"));
        assert_eq!(s, "y".repeat(MAX_WORKER_NAME_LEN - 1));
        let a = WorkerAddress {
            uuid: 1,
            name: bounded_name(&"\u{1f980}\u{1}".repeat(100)),
            entries: vec![],
        };
        a.validate().unwrap();
    }

    #[test]
    fn fuzz_address_random_bytes() {
        let mut rng = XorShift(0x5eed_add7_e55e_d001);
        for i in 0..6000 {
            let len = rng.below(320);
            let mut v = rng.bytes(len);
            if i % 2 == 1 {
                // past the magic and version, into the fields
                let head = [b'R', b'X', b'W', b'A', VERSION];
                let n = head.len().min(v.len());
                v[..n].copy_from_slice(&head[..n]);
                if v.len() > 13 {
                    let name_len = rng.below(8);
                    v[13] = name_len as u8; // a short name, so entries get read
                    if let Some(count) = v.get_mut(14 + name_len) {
                        *count = rng.below(3) as u8; // a few entries
                    }
                }
            }
            fuzz_address(&v);
        }
    }

    #[test]
    fn fuzz_address_mutations_of_valid() {
        let valid = [GOLDEN.to_vec(), sample().pack(), {
            let mut a = sample();
            a.entries.truncate(1);
            a.name.clear();
            a.pack()
        }];
        for v in &valid {
            fuzz_address(v);
            for i in 0..v.len() {
                for m in [0x01u8, 0x02, 0x10, 0x80, 0xff] {
                    let mut w = v.clone();
                    w[i] ^= m;
                    fuzz_address(&w);
                }
                for b in [0u8, 1, 0x3f, 0x40, 0x7f, 0xc3] {
                    let mut w = v.clone();
                    w[i] = b;
                    fuzz_address(&w);
                }
                let mut w = v.clone();
                w.remove(i);
                fuzz_address(&w);
                let mut w = v.clone();
                w.insert(i, 0);
                fuzz_address(&w);
            }
        }
        let mut rng = XorShift(0xadd7_0000_0000_0037);
        let mut accepted = 0;
        for i in 0..4000 {
            let mut v = valid[i % valid.len()].clone();
            match rng.below(4) {
                0 => v.truncate(rng.below(v.len() + 1)),
                1 => {
                    let n = 1 + rng.below(9);
                    v.extend(rng.bytes(n))
                }
                _ => {}
            }
            for _ in 0..rng.below(4) {
                if !v.is_empty() {
                    let j = rng.below(v.len());
                    v[j] = if rng.below(2) == 0 {
                        rng.below(8) as u8
                    } else {
                        rng.next() as u8
                    };
                }
            }
            if WorkerAddress::unpack(&v).is_ok() {
                accepted += 1;
            }
            fuzz_address(&v);
        }
        // Mutated names, values and addresses are still valid often enough to test re-packing.
        assert!(accepted > 100, "only {accepted} mutated inputs accepted");
    }
}
