//! The self interface: a per-thread registry of interfaces that endpoints deliver to.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};

use ucs::{Error, Outcome, Result, Status};
use uct_transport::am::AmTable;
use uct_transport::callbacks::Comp;
use uct_transport::traits::{IfaceOpenParams, Transport, TransportIface};
use uct_transport::types::*;

use crate::config::SELF_CONFIG;
use crate::ep::SelfEp;
use crate::md::SelfMd;

/// The one device of the self transport.
pub const DEVICE: &str = "memory0";

static NEXT_THREAD_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Identifies this thread in device addresses: self reaches only interfaces on its thread.
    static THREAD_TOKEN: u64 = NEXT_THREAD_TOKEN.fetch_add(1, Ordering::Relaxed) | (std::process::id() as u64) << 32;
    static IFACES: RefCell<HashMap<u64, Weak<Shared>>> = RefCell::new(HashMap::new());
    static NEXT_IFACE_ID: Cell<u64> = const { Cell::new(1) };
}

/// What endpoints need of their target interface.
pub(crate) struct Shared {
    pub(crate) am: Rc<AmTable>,
    pub(crate) seg_size: usize,
    /// The interface was closed: endpoints to it fail with `Unreachable`.
    pub(crate) closed: Cell<bool>,
    /// The delivery buffer (page-aligned, [`DELIVERY_ALIGN`]). A handler that sends to this
    /// interface again while it runs (nested delivery) gets a temporary buffer instead.
    pub(crate) buf: RefCell<AlignedBuf>,
}

/// Where the delivery buffer starts: on a page. A bcopy's pack callback copies into it, and a
/// copy runs fastest when its destination sits at the source's offset in a page or a few cache
/// lines after it (likely 4K aliasing: loads of the source wait on earlier stores to the
/// destination that match them in the low 12 address bits). Large user buffers are usually
/// page-aligned (perftest's are, as UCX's), so a page-aligned destination matches them.
const DELIVERY_ALIGN: usize = 4096;

/// A heap buffer whose data starts on an `align` boundary.
pub(crate) struct AlignedBuf {
    storage: Vec<u8>,
    offset: usize,
}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> AlignedBuf {
        let mut storage = vec![0u8; len + align];
        let offset = storage.as_ptr().align_offset(align).min(align);
        // Ends exactly at the buffer's end: `get` is then one bounds check.
        storage.truncate(offset + len);
        AlignedBuf { storage, offset }
    }

    #[inline]
    pub(crate) fn get(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..]
    }
}

impl Shared {
    /// Runs `f` with a buffer of `seg_size` bytes.
    #[inline]
    pub(crate) fn with_buf<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match self.buf.try_borrow_mut() {
            Ok(mut b) => f(b.get()),
            Err(_) => f(AlignedBuf::new(self.seg_size, 64).get()),
        }
    }
}

pub struct SelfTransport;

impl Transport for SelfTransport {
    type Md = SelfMd;
    type Iface = SelfIface;
    const NAME: &'static CStr = c"self";

    fn query_devices(_md: &SelfMd) -> Result<Vec<TlResource>> {
        Ok(vec![TlResource::new("self", DEVICE, DeviceType::SelfDev)])
    }

    fn iface_open(_md: &SelfMd, params: IfaceOpenParams) -> Result<SelfIface> {
        if params.dev_name != DEVICE {
            return Err(Error::new(
                Status::NoDevice,
                format!("no device {:?}: self has one device, {DEVICE}", params.dev_name),
            ));
        }
        let seg = SELF_CONFIG
            .with(&params.config)
            .get_memunits("SEG_SIZE")?
            .bytes_or(8192);
        if !(16..=(1 << 30)).contains(&seg) {
            let msg = format!("RUCX_SELF_SEG_SIZE={seg} is invalid: expected between 16 bytes and 1g");
            ucs::error!("{msg}");
            return Err(Error::new(Status::InvalidParam, msg));
        }
        let shared = Rc::new(Shared {
            am: params.am,
            seg_size: seg as usize,
            closed: Cell::new(false),
            buf: RefCell::new(AlignedBuf::new(seg as usize, DELIVERY_ALIGN)),
        });
        let id = NEXT_IFACE_ID.with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        });
        IFACES.with(|m| m.borrow_mut().insert(id, Rc::downgrade(&shared)));
        Ok(SelfIface { id, shared })
    }
}

pub struct SelfIface {
    id: u64,
    shared: Rc<Shared>,
}

impl Drop for SelfIface {
    fn drop(&mut self) {
        IFACES.with(|m| m.borrow_mut().remove(&self.id));
        // Endpoints may outlive us: make them fail, and forget the handlers the host frees next.
        self.shared.closed.set(true);
        self.shared.am.clear();
    }
}

fn find(dev: &[u8], iface: &[u8]) -> Option<Rc<Shared>> {
    let token = u64::from_le_bytes(dev.try_into().ok()?);
    let id = u64::from_le_bytes(iface.try_into().ok()?);
    if token != THREAD_TOKEN.with(|t| *t) {
        return None;
    }
    IFACES.with(|m| m.borrow().get(&id).and_then(Weak::upgrade))
}

impl TransportIface for SelfIface {
    type Ep = SelfEp;
    const NEEDS_PROGRESS: bool = false;

    fn query(&self) -> IfaceAttr {
        let seg = self.shared.seg_size;
        let all = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        let fetch = all | AtomicOps::SWAP | AtomicOps::CSWAP;
        IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::AM_ZCOPY
                | IfaceFlags::PENDING
                | IfaceFlags::PUT_SHORT
                | IfaceFlags::PUT_BCOPY
                | IfaceFlags::PUT_ZCOPY
                | IfaceFlags::GET_SHORT
                | IfaceFlags::GET_BCOPY
                | IfaceFlags::GET_ZCOPY
                | IfaceFlags::ATOMIC_CPU
                | IfaceFlags::ERRHANDLE_SHORT_BUF
                | IfaceFlags::ERRHANDLE_BCOPY_BUF
                | IfaceFlags::ERRHANDLE_ZCOPY_BUF
                | IfaceFlags::ERRHANDLE_AM_ID
                | IfaceFlags::ERRHANDLE_REMOTE_MEM
                | IfaceFlags::ERRHANDLE_BCOPY_LEN
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::CB_SYNC,
            event_flags: EventFlags::EMPTY,
            am: OpCaps {
                max_short: seg,
                max_bcopy: seg,
                max_zcopy: seg,
                max_hdr: seg,
                max_iov: uct_transport::types::MAX_IOV,
                ..Default::default()
            },
            put: OpCaps {
                max_short: usize::MAX,
                max_bcopy: seg,
                max_zcopy: usize::MAX,
                max_iov: uct_transport::types::MAX_IOV,
                ..Default::default()
            },
            get: OpCaps {
                max_short: usize::MAX,
                max_bcopy: seg,
                max_zcopy: usize::MAX,
                max_iov: uct_transport::types::MAX_IOV,
                ..Default::default()
            },
            atomic32: AtomicCaps {
                op_flags: all,
                fop_flags: fetch,
            },
            atomic64: AtomicCaps {
                op_flags: all,
                fop_flags: fetch,
            },
            device_addr_len: 8,
            iface_addr_len: 8,
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 10e-9,
            bandwidth: Bandwidth {
                dedicated: 10e9,
                shared: 0.0,
            },
            latency: LinearFunc { c: 0.0, m: 0.0 },
            priority: 0,
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..8).ok_or(Status::BufferTooSmall)?;
        out.copy_from_slice(&THREAD_TOKEN.with(|t| *t).to_le_bytes());
        Ok(())
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..8).ok_or(Status::BufferTooSmall)?;
        out.copy_from_slice(&self.id.to_le_bytes());
        Ok(())
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        find(dev, iface).is_some()
    }

    fn progress(&self) -> u32 {
        0
    }

    fn flush(&self, _flags: FlushFlags, _comp: Comp) -> Result<Outcome> {
        Ok(Outcome::Done)
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<SelfEp> {
        match find(dev, iface) {
            Some(target) => Ok(SelfEp::new(target)),
            None => {
                ucs::error!(
                    "self: the peer is not an interface of this thread; self only connects within a thread"
                );
                Err(Status::Unreachable.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_starts_on_its_boundary_and_holds_len_bytes() {
        for (len, align) in [(8192, DELIVERY_ALIGN), (8192, 64), (16, DELIVERY_ALIGN), (1, 64)] {
            let mut b = AlignedBuf::new(len, align);
            let s = b.get();
            assert_eq!(s.as_ptr() as usize % align, 0, "len {len} align {align}");
            assert_eq!(s.len(), len);
            assert!(s.iter().all(|&x| x == 0));
        }
    }
}
