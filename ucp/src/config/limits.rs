//! The limits on what peers may make a worker hold, and for how long: messages under
//! reassembly (`RUCX_REASM_*`), unexpected tag messages (`RUCX_TAG_UNEXP_*`), rendezvous
//! receives waiting for data (`RUCX_RNDV_TIMEOUT`), stream bytes not read (`RUCX_STREAM_*`),
//! endpoints made by peers' wireup requests (`RUCX_PASSIVE_*`), data queued toward a peer that
//! does not read (`RUCX_EP_SEND_QUEUE_LIMIT`).

use std::time::Duration;

use ucs::config::{MemUnits, TimeValue};
use ucs::Result;

use super::Reader;

/// `REASM_TIMEOUT=auto` and `RNDV_TIMEOUT=auto`.
pub const DEFAULT_REASM_TIMEOUT: Duration = Duration::from_secs(30);

/// `RUCX_REASM_*`: what messages arriving in fragments may hold in a worker, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasmLimits {
    /// All messages under reassembly in one worker (`RUCX_REASM_WORKER_LIMIT`).
    pub worker_bytes: usize,
    /// Those from one peer worker (`RUCX_REASM_PEER_LIMIT`).
    pub peer_bytes: usize,
    /// A message that receives nothing for this long is dropped; `None`: never
    /// (`RUCX_REASM_TIMEOUT`).
    pub timeout: Option<Duration>,
}

/// A per-peer and a per-worker byte limit (`RUCX_TAG_UNEXP_*`, `RUCX_STREAM_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteLimits {
    /// What one peer worker may make this worker hold.
    pub peer_bytes: usize,
    /// What all peers together may.
    pub worker_bytes: usize,
}

/// `RUCX_PASSIVE_*`: endpoints peers' wireup requests may make here before the application
/// adopts them (with `Worker::connect` toward that peer) or they close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassiveLimits {
    /// From one peer worker (`RUCX_PASSIVE_PEER_LIMIT`).
    pub per_peer: usize,
    /// From all peers (`RUCX_PASSIVE_WORKER_LIMIT`).
    pub per_worker: usize,
}

/// A count of at least 1.
fn count(r: &Reader<'_>, name: &str) -> Result<usize> {
    match r.t().get_uint(name)? {
        0 => Err(r.invalid(name, "a count of at least 1")),
        n => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

/// `RUCX_PASSIVE_PEER_LIMIT`, `RUCX_PASSIVE_WORKER_LIMIT`.
pub(super) fn passive(r: &Reader<'_>) -> Result<PassiveLimits> {
    Ok(PassiveLimits {
        per_peer: count(r, "PASSIVE_PEER_LIMIT")?,
        per_worker: count(r, "PASSIVE_WORKER_LIMIT")?,
    })
}

/// A size limit of at least 4 KiB, or `inf`.
fn bytes(r: &Reader<'_>, name: &str, auto: usize) -> Result<usize> {
    match r.t().get_memunits(name)? {
        MemUnits::Auto => Ok(auto),
        MemUnits::Inf => Ok(usize::MAX),
        MemUnits::Bytes(b) if b >= 4096 => Ok(usize::try_from(b).unwrap_or(usize::MAX)),
        MemUnits::Bytes(_) => Err(r.invalid(name, "a size of at least 4k, or inf")),
    }
}

/// A positive time, or `inf` (`None`).
fn timeout(r: &Reader<'_>, name: &str, auto: Duration) -> Result<Option<Duration>> {
    Ok(match r.t().get_time(name)? {
        TimeValue::Inf => None,
        TimeValue::Auto => Some(auto),
        TimeValue::Dur(d) if !d.is_zero() => Some(d),
        TimeValue::Dur(_) => return Err(r.invalid(name, "a positive time like 30s, or inf")),
    })
}

/// `RUCX_REASM_PEER_LIMIT`, `RUCX_REASM_WORKER_LIMIT`, `RUCX_REASM_TIMEOUT`.
pub(super) fn reasm(r: &Reader<'_>) -> Result<ReasmLimits> {
    Ok(ReasmLimits {
        peer_bytes: bytes(r, "REASM_PEER_LIMIT", 256 << 20)?,
        worker_bytes: bytes(r, "REASM_WORKER_LIMIT", 1 << 30)?,
        timeout: timeout(r, "REASM_TIMEOUT", DEFAULT_REASM_TIMEOUT)?,
    })
}

/// `RUCX_TAG_UNEXP_PEER_LIMIT`, `RUCX_TAG_UNEXP_WORKER_LIMIT`.
pub(super) fn tag_unexp(r: &Reader<'_>) -> Result<ByteLimits> {
    Ok(ByteLimits {
        peer_bytes: bytes(r, "TAG_UNEXP_PEER_LIMIT", 256 << 20)?,
        worker_bytes: bytes(r, "TAG_UNEXP_WORKER_LIMIT", 1 << 30)?,
    })
}

/// `RUCX_STREAM_PEER_LIMIT`, `RUCX_STREAM_WORKER_LIMIT`.
pub(super) fn stream_unread(r: &Reader<'_>) -> Result<ByteLimits> {
    Ok(ByteLimits {
        peer_bytes: bytes(r, "STREAM_PEER_LIMIT", 256 << 20)?,
        worker_bytes: bytes(r, "STREAM_WORKER_LIMIT", 1 << 30)?,
    })
}

/// `RUCX_EP_SEND_QUEUE_LIMIT`.
pub(super) fn send_queue(r: &Reader<'_>) -> Result<usize> {
    bytes(r, "EP_SEND_QUEUE_LIMIT", 1 << 30)
}

/// `RUCX_RNDV_TIMEOUT`.
pub(super) fn rndv_timeout(r: &Reader<'_>) -> Result<Option<Duration>> {
    timeout(r, "RNDV_TIMEOUT", DEFAULT_REASM_TIMEOUT)
}
