//! The cma memory domain's table of live registrations, in a shared segment its peers map:
//! what makes a released region unreachable although the target takes no part in a transfer.
//!
//! Each registration has a slot holding its generation while it is live (0 once released)
//! and a count of transfers in flight. An initiator raises the count, then checks the
//! generation its rkey names, copies with `process_vm_*`, and lowers the count. Deregistration
//! stores 0, then waits until the count is 0: both sides write before they read (sequentially
//! consistent atomics), so either the initiator sees 0 and refuses, or the target sees its
//! transfer and waits for it. Once `mem_dereg` returns, no peer touches the memory again and
//! the host may free it. A count that does not drop within `RUCX_CMA_RELEASE_TIMEOUT` (an
//! initiator killed or stopped inside a copy) retires the slot for good and fails the
//! deregistration; the host then never frees that memory (uct's `Mem` keeps it).
//!
//! Peers map the segment through `/proc/<pid>/fd` (cma needs ptrace access to the target
//! anyway); the rkey carries the fd and a random token the segment's header repeats, so a
//! reused fd or pid is not mistaken for the table. A peer can write the table; it can write
//! all of the target's memory with cma anyway, so the table guards against mistakes (stale
//! keys), not against hostile peers.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use ucs::{Error, Result, Status};

use crate::sys::{posix_attach, posix_create, Mapping, PosixSeg};

/// Registrations one cma memory domain can hold at once (the segment is sparse: only slots in
/// use take memory).
pub const SLOTS: usize = 1 << 16;

const MAGIC: u64 = 0x7275_6378_636d_6101; // "rucxcma" v1
const HEADER: usize = 64;
const SLOT_LEN: usize = 16;
const SEG_LEN: usize = HEADER + SLOTS * SLOT_LEN;

/// Where a registration's slot is: what the rkey carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRef {
    /// The fd of the table's segment in the target process.
    pub fd: u32,
    /// The table's token.
    pub token: u64,
    pub slot: u32,
    /// The registration's generation (never 0).
    pub gen: u64,
}

/// A view of the segment's words. Every access is atomic: other processes change them.
struct Words<'a>(&'a Mapping);

impl Words<'_> {
    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.0.len(),
            "table word out of range"
        );
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); the mapping lives as
        // long as the borrow; shared memory other processes write is accessed only atomically
        // (lock-free `AtomicU64` is address-free, so it works across processes).
        unsafe { AtomicU64::from_ptr(self.0.as_ptr().add(off).cast()) }
    }

    fn state(&self, slot: u32) -> &AtomicU64 {
        self.word(HEADER + slot as usize * SLOT_LEN)
    }

    fn inflight(&self, slot: u32) -> &AtomicU64 {
        self.word(HEADER + slot as usize * SLOT_LEN + 8)
    }
}

/// The table of the target side (owned by its memory domain).
pub struct OwnTable {
    seg: PosixSeg,
    token: u64,
    /// How long `revoke` waits for transfers in flight.
    timeout: Duration,
}

impl OwnTable {
    /// Creates the segment; `revoke` waits up to `timeout`.
    pub fn create(timeout: Duration) -> Result<OwnTable> {
        let seg = posix_create(SEG_LEN, true)
            .map_err(|e| e.context_with(format_args!("cma: the registration table")))?;
        let token = random_token();
        let w = Words(&seg.map);
        w.word(8).store(token, SeqCst);
        w.word(0).store(MAGIC, SeqCst);
        Ok(OwnTable { seg, token, timeout })
    }

    /// Marks `slot` live with generation `gen`; returns what the rkey carries.
    pub fn publish(&self, slot: usize, gen: u64) -> SlotRef {
        debug_assert!(slot < SLOTS && gen != 0);
        let w = Words(&self.seg.map);
        w.state(slot as u32).store(gen, SeqCst);
        SlotRef {
            fd: self.seg.fd.as_raw_fd() as u32,
            token: self.token,
            slot: slot as u32,
            gen,
        }
    }

    /// Revokes `slot` and waits for the transfers in flight on it. `Err` (`Busy`) when some
    /// did not finish in time: the slot must not be reused, nor the memory
    /// freed.
    pub fn revoke(&self, slot: usize) -> Result<()> {
        let w = Words(&self.seg.map);
        let slot = slot as u32;
        w.state(slot).store(0, SeqCst);
        let start = Instant::now();
        let mut spins = 0u32;
        while w.inflight(slot).load(SeqCst) != 0 {
            if start.elapsed() > self.timeout {
                let msg = format!(
                    "cma: a peer's transfer on a released region did not finish in {:?} \
                     (a peer killed or stopped inside process_vm_*; RUCX_CMA_RELEASE_TIMEOUT): the memory is \
                     kept, never freed",
                    self.timeout
                );
                ucs::warn!("{msg}");
                return Err(Error::new(Status::Busy, msg));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// A peer's table, mapped by an initiator.
pub struct PeerTable {
    map: Mapping,
}

// SAFETY: the mapping is shared memory that is only accessed through atomics (`Words`), and
// unmapped once, when the last owner drops it.
unsafe impl Send for PeerTable {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for PeerTable {}

impl PeerTable {
    /// Maps the table of process `pid` named by `r`, checking its header.
    pub fn attach(pid: u32, r: &SlotRef) -> Result<PeerTable> {
        // The rkey comes from a peer: open nothing but a segment of exactly the table's size
        // (not a device or a pipe some other fd number names).
        let path = format!("/proc/{pid}/fd/{}", r.fd);
        let is_table = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == SEG_LEN as u64);
        if !is_table {
            return Err(Error::new(
                Status::Unreachable,
                format!("cma: {path} is not a registration table (the process or its memory domain is gone, or no ptrace access)"),
            ));
        }
        let map = posix_attach(pid, r.fd as u64, SEG_LEN, true)
            .map_err(|e| e.context_with(format_args!("cma: the peer's registration table")))?;
        let w = Words(&map);
        if w.word(0).load(SeqCst) != MAGIC || w.word(8).load(SeqCst) != r.token {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "cma: fd {} of process {pid} is not the registration table the rkey names \
                     (the process or its memory domain is gone)",
                    r.fd
                ),
            ));
        }
        Ok(PeerTable { map })
    }

    /// Admits a transfer on the region of `r`: `None` when it was released. The transfer
    /// must end (the [`Admitted`] dropped) before the region can be freed.
    pub fn admit(&self, r: &SlotRef) -> Option<Admitted<'_>> {
        let w = Words(&self.map);
        w.inflight(r.slot).fetch_add(1, SeqCst);
        let a = Admitted {
            t: self,
            slot: r.slot,
        };
        (w.state(r.slot).load(SeqCst) == r.gen).then_some(a)
    }
}

/// A transfer in flight on a live region (lowers the count when dropped).
pub struct Admitted<'a> {
    t: &'a PeerTable,
    slot: u32,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        Words(&self.t.map).inflight(self.slot).fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_slots_refuse_and_revoke_waits_for_transfers() {
        let own = OwnTable::create(Duration::from_millis(50)).unwrap();
        let r = own.publish(3, 7);
        let peer = PeerTable::attach(std::process::id(), &r).unwrap();
        assert!(peer.admit(&r).is_some());
        assert!(
            peer.admit(&SlotRef { gen: 8, ..r }).is_none(),
            "another generation"
        );
        let a = peer.admit(&r).unwrap();
        // A transfer in flight: revoke waits; here it is never finished, so revoke gives up.
        let t0 = Instant::now();
        assert_eq!(own.revoke(3), Err(Status::Busy.into()));
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(peer.admit(&r).is_none(), "released");
        drop(a);
        assert_eq!(own.revoke(3), Ok(()));
        // A wrong token is refused.
        assert!(PeerTable::attach(std::process::id(), &SlotRef { token: 2, ..r }).is_err());
    }
}
