//! Remote keys: the packed container a [`crate::MemHandle`] gives (docs/wire-ucp.md, "Remote
//! key"), and [`RemoteKey`], its entries unpacked for one endpoint's RMA and atomic lanes.
//!
//! The container names the worker that mapped the memory and the region's bounds, so an
//! initiator refuses an access outside the region before anything is sent (the target's
//! transport checks again: software RMA refuses it, RDMA reports a remote access error).

use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};

use crate::ep::{Ep, EpInner};

/// Version of the packed rkey container.
pub const RKEY_VERSION: u8 = 1;
/// Fixed part: version, entry count, reserved, worker id, address, length.
const FIXED_LEN: usize = 1 + 1 + 2 + 8 + 8 + 8;
/// Longest component name and packed transport key accepted.
pub const MAX_COMPONENT_NAME: usize = 64;
pub const MAX_KEY_LEN: usize = 1024;

/// One memory domain's packed key, for a resource (address entry index) of the mapping worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RkeyEntry {
    /// Index of the resource in the worker's address.
    pub resource: u8,
    /// The resource's memory-domain component (a key unpacks with that component only).
    pub component: String,
    /// The component's packed key.
    pub key: Vec<u8>,
}

/// The packed rkey container, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedRkey {
    /// Id of the worker that mapped the memory.
    pub worker: u64,
    /// The region: its address and length.
    pub addr: u64,
    pub len: u64,
    pub entries: Vec<RkeyEntry>,
}

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::new(Status::InvalidParam, format!("ucp: packed rkey: {msg}"))
}

impl PackedRkey {
    /// The canonical encoding (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            FIXED_LEN
                + self
                    .entries
                    .iter()
                    .map(|e| 4 + e.component.len() + e.key.len())
                    .sum::<usize>(),
        );
        b.push(RKEY_VERSION);
        b.push(self.entries.len() as u8);
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.worker.to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        for e in &self.entries {
            b.push(e.resource);
            b.push(e.component.len() as u8);
            b.extend_from_slice(e.component.as_bytes());
            b.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
            b.extend_from_slice(&e.key);
        }
        b
    }

    /// Decodes bytes from a peer: every length and range checked, trailing bytes refused.
    pub fn decode(b: &[u8]) -> Result<PackedRkey> {
        if b.len() < FIXED_LEN {
            return Err(bad(format_args!(
                "{} bytes, at least {FIXED_LEN} needed",
                b.len()
            )));
        }
        if b[0] != RKEY_VERSION {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "ucp: packed rkey version {}, this rucx reads version {RKEY_VERSION}",
                    b[0]
                ),
            ));
        }
        let count = usize::from(b[1]);
        if b[2] != 0 || b[3] != 0 {
            return Err(bad("reserved bytes set"));
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let (worker, addr, len) = (u64_at(4), u64_at(12), u64_at(20));
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(bad(format_args!("region of {len} bytes at {addr:#x}")));
        }
        if count > crate::address::MAX_ENTRIES {
            return Err(bad(format_args!(
                "{count} entries, at most {}",
                crate::address::MAX_ENTRIES
            )));
        }
        let mut pos = FIXED_LEN;
        let mut take = |n: usize, what: &str| -> Result<&[u8]> {
            let s = b
                .get(pos..pos + n)
                .ok_or_else(|| bad(format_args!("truncated in {what}")))?;
            pos += n;
            Ok(s)
        };
        let mut entries: Vec<RkeyEntry> = Vec::new();
        for _ in 0..count {
            let head = take(2, "an entry")?;
            let (resource, name_len) = (head[0], usize::from(head[1]));
            if name_len == 0 || name_len > MAX_COMPONENT_NAME {
                return Err(bad(format_args!("component name of {name_len} bytes")));
            }
            let name = take(name_len, "a component name")?;
            let component = std::str::from_utf8(name)
                .ok()
                .filter(|s| s.bytes().all(|c| c.is_ascii_graphic()))
                .ok_or_else(|| bad("component name is not printable ASCII"))?
                .to_owned();
            let kl = take(2, "a key length")?;
            let key_len = usize::from(u16::from_le_bytes([kl[0], kl[1]]));
            if key_len > MAX_KEY_LEN {
                return Err(bad(format_args!(
                    "a key of {key_len} bytes, at most {MAX_KEY_LEN}"
                )));
            }
            let key = take(key_len, "a key")?.to_vec();
            if entries.iter().any(|e| e.resource == resource) {
                return Err(bad(format_args!("resource {resource} twice")));
            }
            entries.push(RkeyEntry {
                resource,
                component,
                key,
            });
        }
        if pos != b.len() {
            return Err(bad(format_args!("{} bytes after the entries", b.len() - pos)));
        }
        Ok(PackedRkey {
            worker,
            addr,
            len,
            entries,
        })
    }
}

/// A peer's memory region as one endpoint reaches it: the transport key of each of the
/// endpoint's RMA and atomic lanes ([`Ep::rkey_unpack`]). Usable with that endpoint only.
pub struct RemoteKey {
    pub(crate) inner: Rc<RkeyInner>,
}

pub(crate) struct RkeyInner {
    pub ep: Weak<EpInner>,
    pub addr: u64,
    pub len: u64,
    /// Per lane of the endpoint: the unpacked key (none for lanes without RMA/atomics or
    /// without an entry).
    pub keys: Vec<Option<uct::Rkey>>,
}

impl RemoteKey {
    /// Start of the remote region.
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// Length of the remote region in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Never true: regions are not empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteKey({:#x}, {} bytes)", self.inner.addr, self.inner.len)
    }
}

impl RkeyInner {
    /// `[raddr, raddr + n)` lies in the region and the key belongs to `ep`.
    pub fn check(&self, ep: &Rc<EpInner>, raddr: u64, n: u64, what: &str) -> Result<()> {
        if self.ep.as_ptr() != Rc::as_ptr(ep) {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: {what}: the RemoteKey was unpacked by another endpoint; unpack it with \
                     this one (Ep::rkey_unpack)"
                ),
            ));
        }
        let end = raddr.checked_add(n);
        if raddr < self.addr || end.is_none_or(|e| e > self.addr + self.len) {
            return Err(Error::new(
                Status::OutOfRange,
                format!(
                    "ucp: {what} of {n} bytes at {raddr:#x} is outside the remote region \
                     [{:#x}, {:#x}) of its RemoteKey",
                    self.addr,
                    self.addr + self.len
                ),
            ));
        }
        Ok(())
    }
}

/// The lanes of `ep` that may carry RMA or atomics.
pub(crate) fn rma_amo_lanes(ep: &EpInner) -> impl Iterator<Item = usize> + '_ {
    let l = &ep.route.lanes;
    (0..l.lanes.len()).filter(|i| l.rma.contains(i) || l.rma_bw.contains(i) || l.amo == Some(*i))
}

#[cold]
pub(crate) fn no_lanes(ep: &EpInner, what: &str) -> Error {
    Error::new(
        Status::Unsupported,
        format!(
            "ucp: {what}: the endpoint to worker {:#x} has no lane for it (no transport pair \
             both workers use supports it, or the context was built without Features::RMA / \
             AMO32 / AMO64)",
            ep.remote.uuid
        ),
    )
}

impl Ep {
    /// Unpacks a peer's [`crate::MemHandle::rkey_pack`] for this endpoint: a key for each of
    /// its RMA and atomic lanes. `InvalidParam` for malformed bytes or a key of another worker
    /// than this endpoint's peer; `Unsupported` when the endpoint has no RMA or atomic lane.
    pub fn rkey_unpack(&self, packed: &[u8]) -> Result<RemoteKey> {
        let ep = self.connected_ep("Ep::rkey_unpack")?;
        let p = PackedRkey::decode(packed)?;
        if p.worker != ep.remote.uuid {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: rkey_unpack: the key is for memory of worker {:#x}, this endpoint's peer \
                     is {:#x}",
                    p.worker, ep.remote.uuid
                ),
            ));
        }
        let w = ep
            .worker
            .upgrade()
            .ok_or_else(|| Error::new(Status::NotConnected, "ucp: rkey_unpack: the worker is gone"))?;
        use crate::Features;
        super::require(
            &w,
            &[Features::RMA, Features::AMO32, Features::AMO64],
            "Features::RMA, AMO32 or AMO64",
            "rkey_unpack",
        )?;
        let mut keys: Vec<Option<uct::Rkey>> = (0..ep.route.lanes.lanes.len()).map(|_| None).collect();
        let mut any_lane = false;
        for i in rma_amo_lanes(ep) {
            any_lane = true;
            let lane = &ep.route.lanes.lanes[i];
            let Some(e) = p.entries.iter().find(|e| usize::from(e.resource) == lane.remote) else {
                continue;
            };
            let remote_comp = &ep.remote.entries[lane.remote].tl.component;
            let md = &w.ifaces[lane.local].md;
            if e.component != *remote_comp || md.component().name() != remote_comp.as_str() {
                return Err(Error::new(
                    Status::InvalidParam,
                    format!(
                        "ucp: rkey_unpack: the entry of resource {} is a {} key, the resource's \
                         component is {remote_comp}",
                        e.resource, e.component
                    ),
                ));
            }
            keys[i] = Some(
                md.component()
                    .rkey_unpack(&e.key)
                    .map_err(|err| err.context_with("ucp: rkey_unpack"))?,
            );
        }
        if !any_lane {
            return Err(no_lanes(ep, "rkey_unpack"));
        }
        if keys.iter().all(Option::is_none) {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: rkey_unpack: the key has no entry for any RMA/atomic lane of this \
                     endpoint ({})",
                    rma_amo_lanes(ep)
                        .map(|i| ep.remote.entries[ep.route.lanes.lanes[i].remote]
                            .tl
                            .tl_name
                            .clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(RemoteKey {
            inner: Rc::new(RkeyInner {
                ep: Rc::downgrade(ep),
                addr: p.addr,
                len: p.len,
                keys,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PackedRkey {
        PackedRkey {
            worker: 0x1234,
            addr: 0x7000_0000,
            len: 4096,
            entries: vec![
                RkeyEntry {
                    resource: 1,
                    component: "tcp".into(),
                    key: vec![1, 2, 3, 4, 5, 6, 7, 8],
                },
                RkeyEntry {
                    resource: 0,
                    component: "self".into(),
                    key: vec![9; 8],
                },
            ],
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let p = sample();
        let b = p.encode();
        assert_eq!(b[0], RKEY_VERSION);
        assert_eq!(b[1], 2);
        assert_eq!(&b[4..12], &0x1234u64.to_le_bytes());
        assert_eq!(b[FIXED_LEN], 1);
        assert_eq!(b[FIXED_LEN + 1], 3);
        assert_eq!(&b[FIXED_LEN + 2..FIXED_LEN + 5], b"tcp");
        assert_eq!(PackedRkey::decode(&b).unwrap(), p);
    }

    #[test]
    fn refuses_malformed() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert_eq!(
                PackedRkey::decode(&b[..n]).unwrap_err(),
                Status::InvalidParam,
                "cut at {n}"
            );
        }
        let mut v = b.clone();
        v[0] = 2;
        assert_eq!(PackedRkey::decode(&v).unwrap_err(), Status::Unsupported);
        let mut v = b.clone();
        v.push(0);
        assert_eq!(PackedRkey::decode(&v).unwrap_err(), Status::InvalidParam);
        let mut v = b.clone();
        v[2] = 1;
        assert_eq!(PackedRkey::decode(&v).unwrap_err(), Status::InvalidParam);
        // overflowing region
        let mut p = sample();
        p.addr = u64::MAX - 10;
        assert!(PackedRkey::decode(&p.encode()).is_err());
        // duplicate resource
        let mut p = sample();
        p.entries[1].resource = 1;
        assert!(PackedRkey::decode(&p.encode()).is_err());
    }
}
