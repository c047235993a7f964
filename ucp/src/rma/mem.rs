//! Mapped memory: a buffer registered on every memory domain of the worker whose transports do
//! put/get or atomics, so any of its endpoints' RMA and atomic lanes can reach it, and the
//! packed key a peer unpacks to access it.
//!
//! Memory domains are opened per worker, so mapping is a worker's operation (UCX maps on the
//! context, registering on the memory domains that need it; here those belong to the worker).
//! Peers may write the memory at any time: it is never lent out as a Rust reference; data
//! moves in and out by copy.

use std::rc::Rc;

use ucs::{Error, Result, Status};
use uct::{IfaceFlags, MemAccess};

use super::rkey::{PackedRkey, RkeyEntry};
use crate::worker::{Worker, WorkerInner};

/// Interface flags that make a resource's memory domain one to register on.
const RMA_AMO: IfaceFlags = IfaceFlags(
    IfaceFlags::PUT_SHORT.0
        | IfaceFlags::PUT_BCOPY.0
        | IfaceFlags::PUT_ZCOPY.0
        | IfaceFlags::GET_SHORT.0
        | IfaceFlags::GET_BCOPY.0
        | IfaceFlags::GET_ZCOPY.0
        | IfaceFlags::ATOMIC_CPU.0
        | IfaceFlags::ATOMIC_DEVICE.0,
);

/// Memory mapped for remote access ([`Worker::mem_map`], [`Worker::mem_alloc`]). Cheap to
/// clone; unmapped (deregistered, then freed) when the last clone is dropped or
/// [`MemHandle::into_vec`] takes it back: peers' later accesses through keys they still hold
/// fail and never touch the memory (docs/architecture.md, "Released memory is never
/// accessed"). Each transport's deregistration returns only once no peer can reach the memory
/// (cma waits for peers' copies in flight); where one cannot make sure, the memory is kept
/// allocated for the life of the process rather than freed.
#[derive(Clone)]
pub struct MemHandle {
    inner: Rc<MemInner>,
}

struct MemInner {
    uuid: u64,
    /// One registration per memory domain; the first owns the bytes.
    regs: Vec<uct::Mem>,
    /// Per registration: the worker's resources (address entry indices) on its memory domain.
    resources: Vec<Vec<u8>>,
}

impl Worker {
    /// Maps `buf` (taken over; [`MemHandle::into_vec`] gives it back) for remote access by
    /// this worker's endpoints' peers, or as the destination of receives
    /// ([`Worker::tag_recv_mapped`], [`Worker::am_recv_data_mapped`]). `InvalidParam` for an empty buffer; `Unsupported` when
    /// none of the worker's transports does put/get or atomics.
    pub fn mem_map(&self, buf: Vec<u8>) -> Result<MemHandle> {
        map(&self.inner, Some(buf), 0)
    }

    /// Maps `len` zeroed bytes allocated by rucx (aligned to [`uct::MEM_ALIGN`], as atomics
    /// need).
    pub fn mem_alloc(&self, len: usize) -> Result<MemHandle> {
        map(&self.inner, None, len)
    }
}

fn map(w: &WorkerInner, buf: Option<Vec<u8>>, len: usize) -> Result<MemHandle> {
    use crate::Features;
    super::require(
        w,
        &[
            Features::RMA,
            Features::AMO32,
            Features::AMO64,
            Features::TAG,
            Features::AM,
        ],
        "Features::RMA, AMO32, AMO64, TAG or AM",
        "mem_map",
    )?;
    if buf.as_ref().map_or(len, Vec::len) == 0 {
        return Err(Error::new(Status::InvalidParam, "ucp: mem_map: an empty region"));
    }
    // The memory domains to register on, each with the resources it serves.
    let mut mds: Vec<(&uct::Md, Vec<u8>)> = Vec::new();
    for (i, wi) in w.ifaces.iter().enumerate() {
        if wi.aux_only || !wi.info.attr.flags.intersects(RMA_AMO) {
            continue;
        }
        if !wi.md.attr().flags.contains(uct::MdFlags::REG) {
            continue;
        }
        match mds.iter_mut().find(|(md, _)| md.same(&wi.md)) {
            Some((_, res)) => res.push(i as u8),
            None => mds.push((&wi.md, vec![i as u8])),
        }
    }
    let Some(((first, _), rest)) = mds.split_first() else {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "ucp: mem_map: none of this worker's transports {:?} does put/get or atomics \
                 (RUCX_TLS)",
                w.ifaces
                    .iter()
                    .map(|i| format!("{}/{}", i.info.tl_name, i.info.dev_name))
                    .collect::<Vec<_>>()
            ),
        ));
    };
    let access = MemAccess::ALL;
    let base = match buf {
        Some(b) => uct::Mem::register(first, b, access),
        None => uct::Mem::alloc(first, len, access),
    }
    .map_err(|e| e.context_with(format_args!("ucp: mem_map on {}", first.name())))?;
    let mut regs = vec![base.clone()];
    for (md, _) in rest {
        regs.push(
            base.register_on(md, access)
                .map_err(|e| e.context_with(format_args!("ucp: mem_map on {}", md.name())))?,
        );
    }
    Ok(MemHandle {
        inner: Rc::new(MemInner {
            uuid: w.uuid,
            regs,
            resources: mds.into_iter().map(|(_, r)| r).collect(),
        }),
    })
}

#[cold]
fn out_of_range(offset: usize, n: usize, len: usize) -> Error {
    Error::new(
        Status::OutOfRange,
        format!("ucp: {n} bytes at offset {offset} of a {len}-byte mapped region"),
    )
}

impl MemHandle {
    fn base(&self) -> &uct::Mem {
        &self.inner.regs[0]
    }

    fn check(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(out_of_range(offset, n, self.len())),
        }
    }

    /// The address peers pass as `remote_addr` (with the packed key).
    pub fn addr(&self) -> u64 {
        self.base().addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.base().len()
    }

    /// Never true: a mapped region is not empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Packs the key peers unpack with [`crate::Ep::rkey_unpack`] (docs/wire-ucp.md): this
    /// worker's id, the region, and each memory domain's key for the resources it serves.
    pub fn rkey_pack(&self) -> Result<Vec<u8>> {
        let mut entries = Vec::new();
        for (m, res) in self.inner.regs.iter().zip(&self.inner.resources) {
            let key = m.pack_rkey()?;
            for &r in res {
                entries.push(RkeyEntry {
                    resource: r,
                    component: m.md().component().name().to_owned(),
                    key: key.clone(),
                });
            }
        }
        Ok(PackedRkey {
            worker: self.inner.uuid,
            addr: self.addr(),
            len: self.len() as u64,
            entries,
        }
        .encode())
    }

    /// Copies `out.len()` bytes from `offset` (a snapshot: peers may be writing).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        self.base().read(offset, out)
    }

    /// Copies `data` to `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        self.base().write(offset, data)
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        self.base().to_vec()
    }

    /// The little-endian u64 at `offset`.
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The little-endian u32 at `offset`.
    pub fn read_u32(&self, offset: usize) -> Result<u32> {
        let mut b = [0; 4];
        self.read(offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Fills the region with `byte`.
    pub fn fill(&self, byte: u8) {
        self.base().fill(byte)
    }

    /// Unmaps and gives the bytes back (the buffer given to [`Worker::mem_map`] itself when
    /// registered on one memory domain, else a copy) when this is the last handle and no
    /// local operation uses it; otherwise `Err(self)`.
    pub fn into_vec(self) -> std::result::Result<Vec<u8>, MemHandle> {
        match Rc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                // The aliases first: each keeps the owning registration alive.
                let base = inner.regs.remove(0);
                inner.regs.clear();
                base.into_vec().map_err(|m| MemHandle {
                    inner: Rc::new(MemInner {
                        uuid: inner.uuid,
                        regs: vec![m],
                        resources: inner.resources.drain(..1).collect(),
                    }),
                })
            }
            Err(inner) => Err(MemHandle { inner }),
        }
    }
}

impl MemHandle {
    /// Checks that `[offset, offset + len)` lies in the region and that worker `w` mapped it
    /// (a receive into it uses its registrations).
    pub(crate) fn check_recv(&self, w: &WorkerInner, offset: usize, len: usize) -> Result<()> {
        if self.inner.uuid != w.uuid {
            return Err(Error::new(
                Status::InvalidParam,
                format!(
                    "ucp: a receive on worker {:#x} into memory worker {:#x} mapped",
                    w.uuid, self.inner.uuid
                ),
            ));
        }
        self.check(offset, len)
    }

    /// This region's registration on `md`, if it has one.
    pub(crate) fn reg_on(&self, md: &uct::Md) -> Option<&uct::Mem> {
        self.inner.regs.iter().find(|m| m.md().same(md))
    }

    /// Copies message `m` from `at` on to `offset`, at most `cap` bytes (one copy).
    pub(crate) fn write_msg(&self, offset: usize, m: &uct::AmMessage<'_>, at: usize, cap: usize) {
        self.base().write_msg(offset, m, at, cap);
    }
}

impl std::fmt::Debug for MemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemHandle({:#x}, {} bytes, on {:?})",
            self.addr(),
            self.len(),
            self.inner
                .regs
                .iter()
                .map(|m| m.md().name().to_owned())
                .collect::<Vec<_>>()
        )
    }
}
