//! `cma`: put and get zcopy between processes of one host with `process_vm_writev` /
//! `process_vm_readv` (the rendezvous path of UCP between local processes).
//!
//! Registration records a region; its packed rkey carries the owner's pid, the range, the
//! access granted and the region's slot in the owner's table of live registrations
//! (`cma_table`). The initiator checks every put/get against the rkey before the system call:
//! a range outside the registered region, another process than the endpoint's peer, or a
//! missing access right is refused with `InvalidAddr`, as the software RMA of self and tcp
//! refuses it. The target takes no part in a transfer, so a released region is caught through
//! the table: the initiator admits each transfer there (refused with `InvalidAddr` once the
//! region is deregistered), and deregistration waits for the admitted ones, so no access
//! touches memory after `mem_dereg` returned.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use slab::Slab;
use ucs::config::Overrides;
use ucs::{Error, Outcome, Result, Status};
use uct_transport::callbacks::{Comp, ErrHandler};
use uct_transport::iov::{total_len, Iov};
use uct_transport::traits::{
    EpHandle, IfaceOpenParams, Transport, TransportComponent, TransportEp, TransportIface, TransportMd,
};
use uct_transport::types::*;
use uct_transport::worker_ref::WorkerRef;

use crate::addr::{same_host, write_device_address, DEV_ADDR_LEN};
use crate::cma_table::{OwnTable, PeerTable, SlotRef, SLOTS};
use crate::config::{cma_max_iov, cma_release_timeout};
use crate::mm::DEVICE;

/// Packed rkey: pid (u32), access (u32), base (u64), length (u64), then the registration's
/// slot: table fd (u32), slot (u32), table token (u64), generation (u64).
pub const CMA_RKEY_LEN: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RemoteKey {
    pid: u32,
    access: MemAccess,
    base: u64,
    len: u64,
    slot: SlotRef,
}

/// An unpacked rkey: the key and the owner's table it is admitted through.
struct Unpacked {
    salt: u32,
    key: RemoteKey,
    table: Arc<PeerTable>,
}

/// Unpacked rkeys of the process (an rkey value is `index + 1` in the high half and a salt in
/// the low half, so stale or guessed values do not match).
static RKEYS: Mutex<Option<Slab<Unpacked>>> = Mutex::new(None);
static SALT: Mutex<u32> = Mutex::new(0x5bd1_e995);
/// Peers' tables mapped by this process, by (pid, token): shared by the rkeys naming them and
/// kept mapped after the last one goes (a rendezvous unpacks and drops a key per message: mapping
/// the table each time cost a third of cma's bandwidth). Tables no key uses are unmapped once
/// more than [`KEPT_TABLES`] peers' are mapped.
type Tables = HashMap<(u32, u64), Arc<PeerTable>>;
const KEPT_TABLES: usize = 64;
static TABLES: Mutex<Option<Tables>> = Mutex::new(None);

fn rkey_lookup(rkey: u64) -> Option<(RemoteKey, Arc<PeerTable>)> {
    let idx = (rkey >> 32).checked_sub(1)? as usize;
    let g = RKEYS.lock().ok()?;
    let u = g.as_ref()?.get(idx)?;
    (u.salt == rkey as u32).then(|| (u.key, u.table.clone()))
}

/// The table of process `pid` that `r` names, mapped once per process.
fn peer_table(pid: u32, r: &SlotRef) -> Result<Arc<PeerTable>> {
    let mut g = TABLES.lock().map_err(|_| Status::IoError)?;
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(t) = map.get(&(pid, r.token)) {
        return Ok(t.clone());
    }
    if map.len() >= KEPT_TABLES {
        map.retain(|_, t| Arc::strong_count(t) > 1);
    }
    let t = Arc::new(PeerTable::attach(pid, r)?);
    map.insert((pid, r.token), t.clone());
    Ok(t)
}

pub struct CmaComponent;

impl TransportComponent for CmaComponent {
    type Md = CmaMd;
    const NAME: &'static CStr = c"cma";

    fn md_resources() -> Result<Vec<String>> {
        Ok(vec!["cma".into()])
    }

    fn md_open(name: &str, config: &Overrides) -> Result<CmaMd> {
        if name != "cma" {
            return Err(Error::new(
                Status::NoDevice,
                format!("no memory domain {name:?}: the cma component has one, \"cma\""),
            ));
        }
        Ok(CmaMd {
            regions: RefCell::new(Slab::new()),
            table: OwnTable::create(cma_release_timeout(config)?)?,
            next_gen: Cell::new(1),
            config: config.clone(),
        })
    }

    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)> {
        let Some(b) = packed.get(..CMA_RKEY_LEN) else {
            ucs::error!(
                len = packed.len(),
                "cma: packed rkey too short (need {CMA_RKEY_LEN} bytes)"
            );
            return Err(Status::InvalidParam.into());
        };
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let k = RemoteKey {
            pid: u32_at(0),
            access: MemAccess(u32_at(4)),
            base: u64_at(8),
            len: u64_at(16),
            slot: SlotRef {
                fd: u32_at(24),
                slot: u32_at(28),
                token: u64_at(32),
                gen: u64_at(40),
            },
        };
        if k.base.checked_add(k.len).is_none() {
            ucs::error!("cma: packed rkey with a range past the address space");
            return Err(Status::InvalidParam.into());
        }
        if k.slot.slot as usize >= SLOTS || k.slot.gen == 0 {
            ucs::error!("cma: packed rkey with a malformed registration slot");
            return Err(Status::InvalidParam.into());
        }
        let table = peer_table(k.pid, &k.slot)?;
        let salt = {
            let mut s = SALT.lock().map_err(|_| Status::IoError)?;
            *s = s.wrapping_mul(0x9E37_79B9).wrapping_add(1);
            *s
        };
        let mut g = RKEYS.lock().map_err(|_| Status::IoError)?;
        let idx = g
            .get_or_insert_with(Slab::new)
            .insert(Unpacked { salt, key: k, table });
        Ok((((idx as u64 + 1) << 32) | salt as u64, idx))
    }

    fn rkey_release(rkey: u64, handle: usize) {
        if let Ok(mut g) = RKEYS.lock() {
            if let Some(s) = g.as_mut() {
                if s.get(handle).is_some_and(|u| u.salt == rkey as u32) {
                    s.remove(handle);
                }
            }
        }
    }
}

/// The cma memory domain: registrations are ranges this process lets peers access, each
/// published in the table peers admit their transfers through.
pub struct CmaMd {
    /// By slot of the table; `None`: a slot retired because a transfer on it never ended.
    regions: RefCell<Slab<Option<RemoteKey>>>,
    table: OwnTable,
    /// The next registration's generation (unique for the domain's life).
    next_gen: Cell<u64>,
    config: Overrides,
}

impl TransportMd for CmaMd {
    fn query(&self) -> MdAttr {
        MdAttr {
            flags: MdFlags::REG | MdFlags::NEED_RKEY,
            max_reg: usize::MAX,
            rkey_packed_size: CMA_RKEY_LEN,
            reg_cost: LinearFunc { c: 5e-9, m: 0.0 },
        }
    }

    fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<usize> {
        let mut regions = self.regions.borrow_mut();
        let entry = regions.vacant_entry();
        let slot = entry.key();
        if slot >= SLOTS {
            let msg = format!("cma: {SLOTS} regions registered on this memory domain, no more");
            ucs::error!("{msg}");
            return Err(Error::new(Status::NoResource, msg));
        }
        let gen = self.next_gen.get();
        self.next_gen.set(gen + 1);
        entry.insert(Some(RemoteKey {
            pid: std::process::id(),
            access,
            base: addr as u64,
            len: len as u64,
            slot: self.table.publish(slot, gen),
        }));
        Ok(slot + 1)
    }

    /// Revokes the region in the table and waits for peers' transfers in flight on it; when
    /// one does not end, the slot is retired and `Busy` tells the host to keep the memory.
    fn mem_dereg(&self, memh: usize) -> Result<()> {
        let idx = memh.checked_sub(1).ok_or(Status::InvalidParam)?;
        let live = self.regions.borrow().get(idx).is_some_and(Option::is_some);
        if !live {
            ucs::error!(memh, "cma: deregistering unknown memory handle");
            return Err(Status::InvalidParam.into());
        }
        match self.table.revoke(idx) {
            Ok(()) => {
                self.regions.borrow_mut().remove(idx);
                Ok(())
            }
            Err(e) => {
                self.regions.borrow_mut()[idx] = None;
                Err(e)
            }
        }
    }

    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        let regions = self.regions.borrow();
        let k = memh
            .checked_sub(1)
            .and_then(|i| regions.get(i))
            .and_then(Option::as_ref)
            .ok_or(Status::InvalidParam)?;
        let out = buf.get_mut(..CMA_RKEY_LEN).ok_or(Status::BufferTooSmall)?;
        out[..4].copy_from_slice(&k.pid.to_le_bytes());
        out[4..8].copy_from_slice(&k.access.0.to_le_bytes());
        out[8..16].copy_from_slice(&k.base.to_le_bytes());
        out[16..24].copy_from_slice(&k.len.to_le_bytes());
        out[24..28].copy_from_slice(&k.slot.fd.to_le_bytes());
        out[28..32].copy_from_slice(&k.slot.slot.to_le_bytes());
        out[32..40].copy_from_slice(&k.slot.token.to_le_bytes());
        out[40..48].copy_from_slice(&k.slot.gen.to_le_bytes());
        Ok(())
    }
}

pub struct CmaTransport;

impl Transport for CmaTransport {
    type Md = CmaMd;
    type Iface = CmaIface;
    const NAME: &'static CStr = c"cma";

    fn query_devices(_md: &CmaMd) -> Result<Vec<TlResource>> {
        Ok(vec![TlResource::new("cma", DEVICE, DeviceType::Shm)])
    }

    fn iface_open(md: &CmaMd, params: IfaceOpenParams) -> Result<CmaIface> {
        if params.dev_name != DEVICE {
            return Err(Error::new(
                Status::NoDevice,
                format!("no device {:?}: cma has one device, {DEVICE}", params.dev_name),
            ));
        }
        let max_iov = cma_max_iov(&md.config.merged(&params.config))?;
        Ok(CmaIface {
            err: params.err_handler,
            worker: params.worker,
            max_iov,
        })
    }
}

pub struct CmaIface {
    err: ErrHandler,
    worker: WorkerRef,
    max_iov: usize,
}

impl TransportIface for CmaIface {
    type Ep = CmaEp;
    const NEEDS_PROGRESS: bool = false;

    fn query(&self) -> IfaceAttr {
        IfaceAttr {
            flags: IfaceFlags::PUT_ZCOPY
                | IfaceFlags::GET_ZCOPY
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::CB_SYNC
                | IfaceFlags::ERRHANDLE_PEER_FAILURE
                | IfaceFlags::ERRHANDLE_REMOTE_MEM
                | IfaceFlags::ERRHANDLE_ZCOPY_BUF,
            event_flags: EventFlags::EMPTY,
            put: OpCaps {
                max_zcopy: usize::MAX,
                max_iov: self.max_iov,
                ..Default::default()
            },
            get: OpCaps {
                max_zcopy: usize::MAX,
                max_iov: self.max_iov,
                ..Default::default()
            },
            device_addr_len: DEV_ADDR_LEN,
            iface_addr_len: 4,
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 2000e-9,
            bandwidth: Bandwidth {
                dedicated: 11145.0 * 1024.0 * 1024.0,
                shared: 0.0,
            },
            latency: LinearFunc { c: 80e-9, m: 0.0 },
            priority: 0,
            ..Default::default()
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        write_device_address(buf)
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        buf.get_mut(..4)
            .ok_or(Status::BufferTooSmall)?
            .copy_from_slice(&std::process::id().to_le_bytes());
        Ok(())
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        same_host(dev) && iface.len() == 4
    }

    fn progress(&self) -> u32 {
        0
    }

    fn flush(&self, _flags: FlushFlags, _comp: Comp) -> Result<Outcome> {
        Ok(Outcome::Done)
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<CmaEp> {
        if !same_host(dev) {
            let msg = "cma: the peer is on another host (or in other namespaces)";
            ucs::error!("{msg}");
            return Err(Error::new(Status::Unreachable, msg));
        }
        let pid = iface
            .try_into()
            .map(u32::from_le_bytes)
            .map_err(|_| Error::new(Status::InvalidAddr, "cma: malformed interface address"))?;
        Ok(CmaEp {
            pid,
            max_iov: self.max_iov,
            err: self.err,
            worker: self.worker,
            failed: Cell::new(None),
            handle: Cell::new(0),
        })
    }
}

pub struct CmaEp {
    pid: u32,
    max_iov: usize,
    err: ErrHandler,
    worker: WorkerRef,
    failed: Cell<Option<Status>>,
    handle: Cell<usize>,
}

impl CmaEp {
    /// The rkey's region and the owner's table, when the access is allowed by the rkey.
    fn check(
        &self,
        iov: &[Iov],
        raddr: u64,
        rkey: u64,
        need: MemAccess,
    ) -> Result<(RemoteKey, Arc<PeerTable>)> {
        if let Some(st) = self.failed.get() {
            return Err(st.into());
        }
        if iov.len() > self.max_iov {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "cma: {} iov entries, at most {} (RUCX_CMA_MAX_IOV)",
                    iov.len(),
                    self.max_iov
                ),
            ));
        }
        let len = total_len(iov) as u64;
        let Some((k, table)) = rkey_lookup(rkey) else {
            return Err(refuse(format!(
                "cma: unknown or released rkey {rkey:#x}: refused"
            )));
        };
        if k.pid != self.pid {
            return Err(refuse(format!(
                "cma: the rkey names memory of process {}, the endpoint's peer is {}: refused",
                k.pid, self.pid
            )));
        }
        let inside = raddr >= k.base && raddr.checked_add(len).is_some_and(|e| e <= k.base + k.len);
        if !inside {
            return Err(refuse(format!(
                "cma: remote access [{raddr:#x}, +{len}) outside registered [{:#x}, +{}): refused",
                k.base, k.len
            )));
        }
        if !k.access.contains(need) {
            return Err(refuse(format!(
                "cma: remote access {need:?} not granted by the registration ({:?}): refused",
                k.access
            )));
        }
        Ok((k, table))
    }

    fn transfer(&self, iov: &[Iov], raddr: u64, rkey: u64, write: bool) -> Result<Outcome> {
        let need = if write {
            MemAccess::REMOTE_PUT
        } else {
            MemAccess::REMOTE_GET
        };
        let (k, table) = self.check(iov, raddr, rkey, need)?;
        let mut local: Vec<libc::iovec> = iov
            .iter()
            .filter(|v| !v.is_empty())
            .map(|v| libc::iovec {
                iov_base: v.addr().cast(),
                iov_len: v.len(),
            })
            .collect();
        if local.is_empty() {
            return Ok(Outcome::Done);
        }
        // Admitted until the copy is done: the target cannot finish deregistering meanwhile.
        let Some(_admitted) = table.admit(&k.slot) else {
            return Err(refuse(format!(
                "cma: remote access [{raddr:#x}, +{}) with the rkey of a region process {} \
                 released: refused",
                total_len(iov),
                self.pid
            )));
        };
        // SAFETY: the host keeps every iov's memory valid (and writable for a get) for the
        // duration of the operation, which completes within this call.
        match unsafe { crate::sys::cma_copy(self.pid, &mut local, raddr, write) } {
            Ok(()) => Ok(Outcome::Done),
            Err(libc::ESRCH) => {
                self.fail(Status::ConnectionReset);
                Err(Error::new(
                    Status::ConnectionReset,
                    format!("cma: peer process {} is gone", self.pid),
                ))
            }
            Err(e) => {
                let msg = format!(
                    "cma: {} of process {} at {raddr:#x} failed: {}",
                    if write { "write" } else { "read" },
                    self.pid,
                    std::io::Error::from_raw_os_error(e)
                );
                ucs::error_limited!("{msg}");
                Err(Error::new(
                    if e == libc::EFAULT {
                        Status::InvalidAddr
                    } else {
                        Status::IoError
                    },
                    msg,
                ))
            }
        }
    }

    /// Marks the endpoint failed and reports it from the next progress (not inside the call).
    fn fail(&self, st: Status) {
        if self.failed.replace(Some(st)).is_some() {
            return;
        }
        let (err, handle, pid) = (self.err, self.handle.get(), self.pid);
        self.worker.oneshot_add(handle as u64, move || {
            if !err.report(EpHandle(handle), st) {
                ucs::error!("cma: endpoint to process {pid} failed: {st} (no error handler took it)");
            }
        });
    }
}

#[cold]
fn refuse(msg: String) -> Error {
    ucs::error_limited!("{msg}");
    Error::new(Status::InvalidAddr, msg)
}

impl TransportEp for CmaEp {
    fn on_created(&self, handle: EpHandle) {
        self.handle.set(handle.0);
    }

    fn query(&self) -> EpAttr {
        EpAttr {
            peer_am_max: 0,
            connected: true,
        }
    }

    fn put_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, _comp: Comp) -> Result<Outcome> {
        self.transfer(iov, raddr, rkey, true)
    }

    fn get_zcopy(&self, iov: &[Iov], raddr: u64, rkey: u64, _comp: Comp) -> Result<Outcome> {
        self.transfer(iov, raddr, rkey, false)
    }

    fn flush(&self, _flags: FlushFlags, _comp: Comp) -> Result<Outcome> {
        match self.failed.get() {
            Some(st) => Err(st.into()),
            None => Ok(Outcome::Done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md() -> CmaMd {
        let mut o = Overrides::default();
        o.set("CMA_RELEASE_TIMEOUT", "50ms");
        CmaComponent::md_open("cma", &o).unwrap()
    }

    fn unpack(md: &CmaMd, memh: usize) -> (u64, usize) {
        let mut packed = [0u8; CMA_RKEY_LEN];
        md.mkey_pack(memh, &mut packed).unwrap();
        CmaComponent::rkey_unpack(&packed).unwrap()
    }

    #[test]
    fn a_transfer_that_never_ends_retires_the_slot() {
        let md = md();
        let mut buf = [0u8; 64];
        let h = md.mem_reg(buf.as_mut_ptr(), 64, MemAccess::ALL).unwrap();
        let (rkey, handle) = unpack(&md, h);
        let (k, table) = rkey_lookup(rkey).unwrap();
        let inflight = table.admit(&k.slot).expect("live");
        assert_eq!(md.mem_dereg(h), Err(Status::Busy.into()));
        assert!(table.admit(&k.slot).is_none(), "released");
        let mut out = [0u8; CMA_RKEY_LEN];
        assert!(md.mkey_pack(h, &mut out).is_err(), "retired");
        assert_eq!(md.mem_dereg(h), Err(Status::InvalidParam.into()), "twice");
        let h2 = md.mem_reg(buf.as_mut_ptr(), 64, MemAccess::ALL).unwrap();
        assert_ne!(h2, h, "a retired slot is not reused");
        drop(inflight);
        md.mem_dereg(h2).unwrap();
        CmaComponent::rkey_release(rkey, handle);
    }
}
