//! `loopq`: a queued loopback transport that exists only to test this suite.
//!
//! `self` completes everything inside the call, so on its own it never exercises the suite's
//! asynchronous paths. `loopq` behaves like a network transport inside one thread: sends are
//! queued in the receiver's inbox and delivered by the receiver's progress; each endpoint has a
//! small number of send credits (then `NoResource`), returned by acknowledgements processed in
//! the sender's progress, which also completes zcopy/get/fetch operations (`InProgress`),
//! flushes, and dispatches the pending queue. zcopy payloads are read at delivery time, so a
//! host that freed the memory early would be caught. Both connection models are offered; a peer
//! interface that disappears is reported through the error handler. Limits are deliberately small
//! (4 iov entries, 32-bit atomics limited to add/swap/cswap, no get_short) to exercise the
//! suite's limit and `Unsupported` checks.
//!
//! It is a test double, not a transport: single thread, no wire format, RMA checked against the
//! thread's registrations (like `self`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};

use uct::am::AmTable;
use uct::callbacks::{Comp, ErrHandler, ResultPtr, UnpackCb};
use uct::iov::Iov;
use uct::rma::{RegionTable, PACKED_RKEY_LEN};
use uct::transport::{self, AtomicSize, EpHandle, IfaceParams};
use uct::types::*;
use uct::{Result, Status};

mod ep;
use ep::{EpShared, QEp};

const NAME: &str = "loopq";
const DEVICE: &str = "q0";
/// Operations an endpoint may have in flight.
const CREDITS: usize = 32;
const MAX_IOV: usize = 4;
const AM_SHORT: usize = 256;
const AM_BCOPY: usize = 1024;
const AM_ZCOPY: usize = 4096;
const AM_HDR: usize = 64;
const RMA_SHORT: usize = 128;
const RMA_BCOPY: usize = 1024;
const RMA_ZCOPY: usize = 8192;

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static REGIONS: RegionTable = RegionTable::new();
    static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) | 0x1009_0000_0000_0000;
    static IFACES: RefCell<HashMap<u64, Weak<IfShared>>> = RefCell::new(HashMap::new());
    static EPS: RefCell<HashMap<u64, Weak<EpShared>>> = RefCell::new(HashMap::new());
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

fn next_id() -> u64 {
    NEXT_ID.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    })
}

fn token() -> u64 {
    TOKEN.with(|t| *t)
}

fn le(b: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

// ---------------------------------------------------------------- component and md

pub struct QComponent;

impl transport::Component for QComponent {
    type Md = QMd;
    const NAME: &'static CStr = c"loopq";
    fn md_resources() -> Result<Vec<String>> {
        Ok(vec![NAME.into()])
    }
    fn md_open(name: &str) -> Result<QMd> {
        if name == NAME {
            Ok(QMd)
        } else {
            Err(Status::NoDevice)
        }
    }
    fn rkey_unpack(packed: &[u8]) -> Result<(u64, usize)> {
        Ok((RegionTable::unpack(packed)?, 0))
    }
}

pub struct QMd;

impl transport::Md for QMd {
    fn query(&self) -> MdAttr {
        MdAttr {
            flags: MdFlags::REG | MdFlags::NEED_RKEY,
            max_reg: usize::MAX,
            rkey_packed_size: PACKED_RKEY_LEN,
            reg_cost: LinearFunc::default(),
        }
    }
    fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<usize> {
        Ok(REGIONS.with(|t| t.register(addr, len, access)))
    }
    fn mem_dereg(&self, memh: usize) -> Result<()> {
        REGIONS.with(|t| t.deregister(memh))
    }
    fn mkey_pack(&self, memh: usize, buf: &mut [u8]) -> Result<()> {
        REGIONS.with(|t| t.pack(memh, buf))
    }
}

// ---------------------------------------------------------------- messages

enum Op {
    Am {
        id: u8,
        data: Vec<u8>,
    },
    AmZcopy {
        id: u8,
        hdr: Vec<u8>,
        iov: Vec<Iov<'static>>,
    },
    Put {
        key: u64,
        addr: u64,
        data: Vec<u8>,
    },
    PutZcopy {
        key: u64,
        addr: u64,
        iov: Vec<Iov<'static>>,
    },
    Get {
        key: u64,
        addr: u64,
        len: usize,
    },
    Atomic {
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        compare: u64,
        key: u64,
        addr: u64,
    },
}

struct Msg {
    seq: u64,
    from: Weak<EpShared>,
    op: Op,
}

enum Reply {
    Done,
    Data(Vec<u8>),
    Value(u64),
    Failed(Status),
}

/// What the sender does when an operation is acknowledged.
enum Done {
    Plain,
    GetBcopy(UnpackCb),
    GetZcopy(Vec<Iov<'static>>),
    Fetch(ResultPtr),
}

struct Outstanding {
    comp: Comp,
    done: Done,
}

fn gather(iov: &[Iov<'static>], out: &mut Vec<u8>) {
    for e in iov {
        out.extend_from_slice(e.bytes());
    }
}

// ---------------------------------------------------------------- interface

struct IfShared {
    am: Rc<AmTable>,
    err: ErrHandler,
    inbox: RefCell<VecDeque<Msg>>,
    eps: RefCell<Vec<Weak<EpShared>>>,
    /// Interface flushes waiting for every endpoint to go idle.
    flushes: RefCell<Vec<Comp>>,
}

impl IfShared {
    /// Receiver role: executes what arrived and acknowledges it.
    fn deliver(&self) -> u32 {
        let mut work = 0;
        loop {
            let m = self.inbox.borrow_mut().pop_front();
            let Some(m) = m else { break };
            work += 1;
            let reply = match m.op {
                Op::Am { id, data } => {
                    let _ = self.am.invoke(id, &data, None);
                    Reply::Done
                }
                Op::AmZcopy { id, hdr, iov } => {
                    let mut data = hdr;
                    gather(&iov, &mut data);
                    let _ = self.am.invoke(id, &data, None);
                    Reply::Done
                }
                Op::Put { key, addr, data } => match REGIONS.with(|r| r.write(key, addr, &data)) {
                    Ok(()) => Reply::Done,
                    Err(e) => Reply::Failed(e),
                },
                Op::PutZcopy { key, addr, iov } => {
                    let mut data = Vec::new();
                    gather(&iov, &mut data);
                    match REGIONS.with(|r| r.write(key, addr, &data)) {
                        Ok(()) => Reply::Done,
                        Err(e) => Reply::Failed(e),
                    }
                }
                Op::Get { key, addr, len } => {
                    let mut data = vec![0; len];
                    match REGIONS.with(|r| r.read(key, addr, &mut data)) {
                        Ok(()) => Reply::Data(data),
                        Err(e) => Reply::Failed(e),
                    }
                }
                Op::Atomic {
                    size,
                    op,
                    value,
                    compare,
                    key,
                    addr,
                } => match REGIONS.with(|r| r.atomic(key, addr, size, op, value, compare)) {
                    Ok(v) => Reply::Value(v),
                    Err(e) => Reply::Failed(e),
                },
            };
            if let Some(from) = m.from.upgrade() {
                // The send resource is free as soon as the receiver consumed the message (like a
                // drained socket); the completion waits for the sender's progress.
                from.in_flight.set(from.in_flight.get() - 1);
                from.acks.borrow_mut().push_back((m.seq, reply));
            }
        }
        work
    }
}

pub struct QTransport;

impl transport::Transport for QTransport {
    type Md = QMd;
    type Iface = QIface;
    const NAME: &'static CStr = c"loopq";
    fn query_devices(_md: &QMd) -> Result<Vec<TlResource>> {
        Ok(vec![TlResource::new(NAME, DEVICE, DeviceType::Shm)])
    }
    fn iface_open(_md: &QMd, params: IfaceParams) -> Result<QIface> {
        if params.dev_name != DEVICE {
            return Err(Status::NoDevice);
        }
        let id = next_id();
        let sh = Rc::new(IfShared {
            am: params.am,
            err: params.err_handler,
            inbox: RefCell::default(),
            eps: RefCell::default(),
            flushes: RefCell::default(),
        });
        IFACES.with(|m| m.borrow_mut().insert(id, Rc::downgrade(&sh)));
        Ok(QIface { id, sh })
    }
}

pub struct QIface {
    id: u64,
    sh: Rc<IfShared>,
}

impl Drop for QIface {
    fn drop(&mut self) {
        IFACES.with(|m| m.borrow_mut().remove(&self.id));
    }
}

fn find_iface(dev: &[u8], iface: &[u8]) -> Option<Weak<IfShared>> {
    if le(dev)? != token() {
        return None;
    }
    let id = le(iface)?;
    IFACES.with(|m| m.borrow().get(&id).filter(|w| w.strong_count() > 0).cloned())
}

impl QIface {
    fn new_ep(&self, target: Option<Weak<IfShared>>) -> QEp {
        let id = next_id();
        let sh = Rc::new(EpShared {
            id,
            iface: Rc::downgrade(&self.sh),
            handle: Cell::new(EpHandle(0)),
            connected: Cell::new(target.is_some()),
            target: RefCell::new(target),
            next_seq: Cell::new(0),
            in_flight: Cell::new(0),
            outstanding: RefCell::default(),
            acks: RefCell::default(),
            pending: RefCell::default(),
            dispatching: Cell::new(false),
            flushes: RefCell::default(),
            failed: Cell::new(None),
        });
        self.sh.eps.borrow_mut().push(Rc::downgrade(&sh));
        EPS.with(|m| m.borrow_mut().insert(id, Rc::downgrade(&sh)));
        QEp { sh }
    }
}

impl QIface {
    fn busy(&self) -> bool {
        self.sh
            .eps
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .any(|e| !e.outstanding.borrow().is_empty())
    }
}

impl transport::Iface for QIface {
    type Ep = QEp;

    fn query(&self) -> IfaceAttr {
        let ops64 = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::AM_ZCOPY
                | IfaceFlags::PENDING
                | IfaceFlags::PUT_SHORT
                | IfaceFlags::PUT_BCOPY
                | IfaceFlags::PUT_ZCOPY
                | IfaceFlags::GET_BCOPY
                | IfaceFlags::GET_ZCOPY
                | IfaceFlags::ATOMIC_CPU
                | IfaceFlags::ERRHANDLE_AM_ID
                | IfaceFlags::ERRHANDLE_REMOTE_MEM
                | IfaceFlags::ERRHANDLE_BCOPY_LEN
                | IfaceFlags::ERRHANDLE_PEER_FAILURE
                | IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::CONNECT_TO_EP
                | IfaceFlags::CB_SYNC,
            event_flags: EventFlags::EMPTY,
            am: OpCaps {
                max_short: AM_SHORT,
                max_bcopy: AM_BCOPY,
                max_zcopy: AM_ZCOPY,
                max_hdr: AM_HDR,
                max_iov: MAX_IOV,
                ..Default::default()
            },
            put: OpCaps {
                max_short: RMA_SHORT,
                max_bcopy: RMA_BCOPY,
                max_zcopy: RMA_ZCOPY,
                max_iov: MAX_IOV,
                ..Default::default()
            },
            get: OpCaps {
                max_bcopy: RMA_BCOPY,
                max_zcopy: RMA_ZCOPY,
                max_iov: MAX_IOV,
                ..Default::default()
            },
            atomic32: AtomicCaps {
                op_flags: AtomicOps::ADD,
                fop_flags: AtomicOps::ADD | AtomicOps::SWAP | AtomicOps::CSWAP,
            },
            atomic64: AtomicCaps {
                op_flags: ops64,
                fop_flags: ops64 | AtomicOps::SWAP | AtomicOps::CSWAP,
            },
            device_addr_len: 8,
            iface_addr_len: 8,
            ep_addr_len: 8,
            max_num_eps: usize::MAX,
            overhead: 1e-7,
            bandwidth: Bandwidth {
                dedicated: 1e9,
                shared: 0.0,
            },
            latency: LinearFunc { c: 1e-6, m: 0.0 },
            priority: 0,
        }
    }

    fn device_address(&self, buf: &mut [u8]) -> Result<()> {
        buf.get_mut(..8)
            .ok_or(Status::BufferTooSmall)?
            .copy_from_slice(&token().to_le_bytes());
        Ok(())
    }

    fn iface_address(&self, buf: &mut [u8]) -> Result<()> {
        buf.get_mut(..8)
            .ok_or(Status::BufferTooSmall)?
            .copy_from_slice(&self.id.to_le_bytes());
        Ok(())
    }

    fn is_reachable(&self, dev: &[u8], iface: &[u8]) -> bool {
        find_iface(dev, iface).is_some()
    }

    fn progress(&self) -> u32 {
        let mut work = self.sh.deliver();
        let eps: Vec<Rc<EpShared>> = self.sh.eps.borrow().iter().filter_map(Weak::upgrade).collect();
        for ep in eps {
            work += ep.progress(&self.sh);
        }
        self.sh.eps.borrow_mut().retain(|w| w.strong_count() > 0);
        if !self.busy() {
            let f = std::mem::take(&mut *self.sh.flushes.borrow_mut());
            for c in f {
                c.complete(Status::Ok);
            }
        }
        work
    }

    fn flush(&self, _flags: FlushFlags, comp: Comp) -> Result<Status> {
        if !self.busy() {
            return Ok(Status::Ok);
        }
        if !comp.is_none() {
            self.sh.flushes.borrow_mut().push(comp);
        }
        Ok(Status::InProgress)
    }

    fn ep_create(&self) -> Result<QEp> {
        Ok(self.new_ep(None))
    }

    fn ep_create_connected(&self, dev: &[u8], iface: &[u8]) -> Result<QEp> {
        let t = find_iface(dev, iface).ok_or(Status::Unreachable)?;
        Ok(self.new_ep(Some(t)))
    }
}

static MD_OPS: uct::abi::RawMdOps = uct::abi::export::md_ops::<QMd>();
static IFACE_OPS: uct::abi::RawIfaceOps = uct::abi::export::iface_ops::<QIface>();
static TRANSPORTS: [uct::abi::RawTransport; 1] = [uct::abi::export::transport::<QTransport>(&IFACE_OPS)];
static COMPONENTS: [uct::abi::RawComponent; 1] =
    [uct::abi::export::component::<QComponent>(&MD_OPS, &TRANSPORTS)];

uct::declare_module!(loopq, COMPONENTS, []);
