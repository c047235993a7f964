//! rc_verbs through the uct API: two interfaces on one device in one process, connected
//! endpoint to endpoint. Every test prints "skipped: no RDMA device" and passes when libibverbs
//! finds no device; run them in the Soft-RoCE VM:
//!   testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1
//! `RUCX_IB_DEVICE=rxe0` picks the device (default: the first one with an active port).
//! Some tests set `RUCX_IB_*` variables for the interfaces they open (restored afterwards),
//! so run with `--test-threads=1`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use uct::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// Sets environment variables until dropped.
struct Env(Vec<(String, Option<String>)>);

impl Env {
    fn set(vars: &[(&str, &str)]) -> Env {
        let saved = vars
            .iter()
            .map(|(k, v)| {
                let old = std::env::var(k).ok();
                std::env::set_var(k, v);
                (k.to_string(), old)
            })
            .collect();
        Env(saved)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}

struct Side {
    md: Md,
    worker: Worker,
    iface: Iface,
    errors: Rc<RefCell<Vec<(EpKey, Status)>>>,
}

struct Fix {
    a: Side,
    b: Side,
    /// a -> b and b -> a.
    ab: Ep,
    ba: Ep,
}

fn context() -> Option<(Context, String)> {
    let ctx = Context::builder()
        .builtin(uct_ib::module())
        .plugins(false)
        .build();
    let want = std::env::var("RUCX_IB_DEVICE").ok();
    let res = ctx.resources().expect("resources");
    let dev = res
        .iter()
        .filter(|(_, r)| r.tl_name.as_str() == "rc_verbs")
        .map(|(_, r)| r.dev_name.as_str().to_owned())
        .find(|d| want.as_ref().is_none_or(|w| d.starts_with(&format!("{w}:"))));
    match dev {
        Some(d) => Some((ctx, d)),
        None => {
            println!("skipped: no RDMA device");
            None
        }
    }
}

fn side(ctx: &Context, dev: &str) -> Side {
    let (md, _) = ctx.find_resource("rc_verbs", dev).expect("find resource");
    let worker = Worker::new(AsyncMode::Poll, ThreadMode::Single).expect("worker");
    let errors: Rc<RefCell<Vec<(EpKey, Status)>>> = Rc::default();
    let log = errors.clone();
    let params = IfaceParams::new("rc_verbs", dev).err_handler(move |k, s| log.borrow_mut().push((k, s)));
    let iface = Iface::open(&md, &worker, params).expect("iface open");
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    Side {
        md,
        worker,
        iface,
        errors,
    }
}

fn connect(a: &Side, b: &Side) -> (Ep, Ep) {
    let ab = a.iface.ep_create().expect("ep_create a");
    let ba = b.iface.ep_create().expect("ep_create b");
    let (da, db) = (
        a.iface.device_address().unwrap(),
        b.iface.device_address().unwrap(),
    );
    assert!(a.iface.is_reachable(&db, &[]));
    ab.connect_to_ep(&db, &ba.address().unwrap())
        .expect("connect a->b");
    ba.connect_to_ep(&da, &ab.address().unwrap())
        .expect("connect b->a");
    (ab, ba)
}

fn fixture() -> Option<Fix> {
    let (ctx, dev) = context()?;
    Some(pair_on(&ctx, &dev))
}

/// Two sides on `dev`, connected (their configuration read from the environment now).
fn pair_on(ctx: &Context, dev: &str) -> Fix {
    let a = side(ctx, dev);
    let b = side(ctx, dev);
    let (ab, ba) = connect(&a, &b);
    Fix { a, b, ab, ba }
}

impl Fix {
    fn progress(&self) -> u32 {
        self.a.worker.progress() + self.b.worker.progress()
    }

    fn wait(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            self.progress();
        }
    }

    fn retry<T>(&self, what: &str, mut op: impl FnMut() -> Result<T>) -> T {
        let start = Instant::now();
        loop {
            match op() {
                Ok(v) => return v,
                Err(Status::NoResource) => {
                    assert!(start.elapsed() < DEADLINE, "{what}: NoResource for too long");
                    self.progress();
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }

    /// Waits for an operation's completion when it returned InProgress.
    fn complete(&self, what: &str, st: Status, c: &Completion) {
        if st == Status::InProgress {
            self.wait(what, || c.fired() > 0);
            assert_eq!(c.last_status(), Status::Ok, "{what}");
        }
    }

    fn flush(&self) {
        let c = Completion::counter();
        let st = self.retry("flush", || self.ab.flush(FlushFlags::LOCAL, Some(&c)));
        self.complete("flush", st, &c);
    }

    fn remote(&self, len: usize) -> (Mem, Rkey) {
        let mem = Mem::alloc(&self.b.md, len, MemAccess::ALL).unwrap();
        mem.fill(0);
        let rkey = self
            .a
            .md
            .component()
            .rkey_unpack(&mem.pack_rkey().unwrap())
            .unwrap();
        (mem, rkey)
    }

    fn no_errors(&self) {
        assert_eq!(*self.a.errors.borrow(), vec![]);
        assert_eq!(*self.b.errors.borrow(), vec![]);
    }
}

type Rec = Rc<RefCell<Vec<Vec<u8>>>>;

fn record(s: &Side, id: u8) -> Rec {
    let rec: Rec = Rc::default();
    let r = rec.clone();
    s.iface
        .set_am_handler(id, AmCbFlags::SYNC, move |m| {
            r.borrow_mut().push(m.data().to_vec())
        })
        .unwrap();
    rec
}

#[test]
fn attributes_and_addresses() {
    let Some(f) = fixture() else { return };
    let at = f.a.iface.attr();
    println!("{at:#?}");
    assert!(at
        .flags
        .contains(IfaceFlags::CONNECT_TO_EP | IfaceFlags::AM_SHORT | IfaceFlags::PENDING));
    assert!(!at.flags.contains(IfaceFlags::CONNECT_TO_IFACE));
    assert!(at.flags.contains(IfaceFlags::ERRHANDLE_PEER_FAILURE));
    assert!(at.event_flags.contains(EventFlags::FD | EventFlags::RECV));
    assert_eq!(
        (at.device_addr_len, at.iface_addr_len, at.ep_addr_len),
        (20, 0, 4)
    );
    assert!(at.am.max_short >= 63 && at.am.max_bcopy == 8191 && at.put.max_short >= 64);
    assert!(at.bandwidth.dedicated > 1e8 && at.latency.c > 1e-7 && at.latency.c < 1e-5);
    assert!(at.overhead > 0.0);
    assert_eq!(f.a.iface.device_address().unwrap().len(), 20);
    assert_eq!(f.ab.address().unwrap().len(), 4);
    assert!(!f.a.iface.is_reachable(&[9; 20], &[]));
    assert_eq!(f.a.md.attr().rkey_packed_size, 8);
    assert!(f
        .a
        .iface
        .ep_create_connected(&f.b.iface.device_address().unwrap(), &[])
        .is_err());
}

#[test]
fn am_short_bcopy_zcopy_and_kept_descriptors() {
    let Some(f) = fixture() else { return };
    let rec = record(&f.b, 3);
    let kept: Rc<RefCell<Vec<RxDesc>>> = Rc::default();
    let k = kept.clone();
    f.b.iface
        .set_am_handler(4, AmCbFlags::SYNC, move |m| k.borrow_mut().push(m.keep()))
        .unwrap();
    let max_short = f.a.iface.attr().am.max_short;
    let payload: Vec<u8> = (0..max_short - 8).map(|i| i as u8).collect();
    f.retry("am_short", || f.ab.am_short(3, 0x1122_3344_5566_7788, &payload));
    f.retry("am_short_iov", || f.ab.am_short_iov(3, &[b"ab", b"", b"cde"]));
    let big: Vec<u8> = (0..8191u32).map(|i| (i * 7) as u8).collect();
    let n = f.retry("am_bcopy", || {
        f.ab.am_bcopy(3, |buf| {
            buf[..big.len()].copy_from_slice(&big);
            big.len()
        })
    });
    assert_eq!(n, 8191);
    f.retry("am_bcopy small", || {
        f.ab.am_bcopy(3, |buf| {
            buf[..3].copy_from_slice(b"xyz");
            3
        })
    });
    let src = Mem::alloc(&f.a.md, 6000, MemAccess::ALL).unwrap();
    let zdata: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8).collect();
    src.write(0, &zdata).unwrap();
    let c = Completion::counter();
    let iov = [src.iov(0, 3000).unwrap(), src.iov(3000, 3000).unwrap()];
    let st = f.retry("am_zcopy", || f.ab.am_zcopy(3, b"hdr!", &iov, Some(&c)));
    assert_eq!(st, Status::InProgress);
    f.complete("am_zcopy", st, &c);
    for i in 0..10u64 {
        f.retry("am_short to kept", || f.ab.am_short(4, i, b"keep me"));
    }
    f.wait("5 messages", || rec.borrow().len() == 5);
    f.wait("10 kept", || kept.borrow().len() == 10);
    let r = rec.borrow();
    let mut exp = 0x1122_3344_5566_7788u64.to_le_bytes().to_vec();
    exp.extend_from_slice(&payload);
    assert_eq!(r[0], exp);
    assert_eq!(r[1], b"abcde");
    assert_eq!(r[2], big);
    assert_eq!(r[3], b"xyz");
    let mut zexp = b"hdr!".to_vec();
    zexp.extend_from_slice(&zdata);
    assert_eq!(r[4], zexp);
    drop(r);
    // more traffic while descriptors are kept, then check they still hold their data
    for i in 0..200u64 {
        f.retry("am_short", || f.ab.am_short(3, i, &[0xee; 16]));
    }
    f.wait("205 messages", || rec.borrow().len() == 205);
    for (i, d) in kept.borrow().iter().enumerate() {
        assert_eq!(&d[..8], &(i as u64).to_le_bytes());
        assert_eq!(&d[8..], b"keep me");
    }
    kept.borrow_mut().clear();
    // invalid input
    assert_eq!(
        f.ab.am_short(3, 0, &vec![0; max_short]),
        Err(Status::InvalidParam)
    );
    assert_eq!(f.ab.am_short(32, 0, b""), Err(Status::InvalidParam));
    f.no_errors();
}

#[test]
fn put_get_all_flavours() {
    let Some(f) = fixture() else { return };
    let (dst, rkey) = f.remote(3 * 8192);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    let max_short = f.a.iface.attr().put.max_short;
    f.retry("put_short", || {
        f.ab.put_short(&data[..max_short], dst.addr(), &rkey)
    });
    f.retry("put_bcopy", || {
        f.ab.put_bcopy(
            |b| {
                b[..8192].copy_from_slice(&data);
                8192
            },
            dst.addr() + 8192,
            &rkey,
        )
    });
    let src = Mem::alloc(&f.a.md, 8192, MemAccess::ALL).unwrap();
    src.write(0, &data).unwrap();
    let c = Completion::counter();
    let st = f.retry("put_zcopy", || {
        f.ab.put_zcopy(
            &[src.iov(0, 4096).unwrap(), src.iov(4096, 4096).unwrap()],
            dst.addr() + 16384,
            &rkey,
            Some(&c),
        )
    });
    f.complete("put_zcopy", st, &c);
    f.flush();
    let all = dst.to_vec();
    assert_eq!(&all[..max_short], &data[..max_short]);
    assert_eq!(&all[8192..16384], &data[..]);
    assert_eq!(&all[16384..], &data[..]);

    // get_bcopy into a closure, get_zcopy into registered memory
    let got: Rc<RefCell<Vec<u8>>> = Rc::default();
    let g = got.clone();
    let c = Completion::counter();
    let st = f.retry("get_bcopy", || {
        let g = g.clone();
        f.ab.get_bcopy(
            5000,
            dst.addr() + 8192,
            &rkey,
            move |d| g.borrow_mut().extend_from_slice(d),
            Some(&c),
        )
    });
    f.complete("get_bcopy", st, &c);
    assert_eq!(&got.borrow()[..], &data[..5000]);
    let back = Mem::alloc(&f.a.md, 8192, MemAccess::ALL).unwrap();
    let c = Completion::counter();
    let st = f.retry("get_zcopy", || {
        f.ab.get_zcopy(
            &[back.iov(0, 100).unwrap(), back.iov(100, 8092).unwrap()],
            dst.addr() + 16384,
            &rkey,
            Some(&c),
        )
    });
    f.complete("get_zcopy", st, &c);
    assert_eq!(back.to_vec(), data);
    assert_eq!(
        f.ab.get_short(&mut [0u8; 8], dst.addr(), &rkey),
        Err(Status::Unsupported)
    );
    // many small puts (moderated, unsignaled) complete by one flush
    for i in 0..1000u64 {
        f.retry("put_short", || {
            f.ab.put_short(&i.to_le_bytes(), dst.addr() + (i % 100) * 8, &rkey)
        });
    }
    f.flush();
    for j in 0..100u64 {
        assert_eq!(dst.read_u64(j as usize * 8).unwrap(), 900 + j);
    }
    // flush REMOTE too, and the iface flush
    let c = Completion::counter();
    let st = f.retry("flush remote", || f.ab.flush(FlushFlags::REMOTE, Some(&c)));
    f.complete("flush remote", st, &c);
    f.retry("put", || f.ab.put_short(b"12345678", dst.addr(), &rkey));
    let c = Completion::counter();
    let st = f.retry("iface flush", || f.a.iface.flush(FlushFlags::LOCAL, Some(&c)));
    f.complete("iface flush", st, &c);
    assert_eq!(dst.read_u64(0).unwrap(), u64::from_le_bytes(*b"12345678"));
    f.no_errors();
}

#[test]
fn atomics_64_bit() {
    let Some(f) = fixture() else { return };
    let at = f.a.iface.attr();
    if !at.flags.contains(IfaceFlags::ATOMIC_DEVICE) {
        println!("skipped: device without atomics");
        return;
    }
    assert!(at.atomic64.fop_flags.contains(AtomicOps::ADD | AtomicOps::CSWAP));
    assert!(at.atomic32.op_flags.is_empty() && at.atomic32.fop_flags.is_empty());
    let (dst, rkey) = f.remote(64);
    f.retry("post add", || {
        f.ab.atomic_post(AtomicWidth::U64, AtomicOp::Add, 5, dst.addr(), &rkey)
    });
    let r = AtomicResult::new();
    let c = Completion::counter();
    let st = f.retry("fetch add", || {
        f.ab.atomic_fetch(
            AtomicWidth::U64,
            AtomicOp::Add,
            10,
            &r,
            dst.addr(),
            &rkey,
            Some(&c),
        )
    });
    f.complete("fetch add", st, &c);
    assert_eq!(r.get(), 5);
    let c = Completion::counter();
    let st = f.retry("cswap miss", || {
        f.ab.atomic_cswap(AtomicWidth::U64, 1, 99, &r, dst.addr(), &rkey, Some(&c))
    });
    f.complete("cswap", st, &c);
    assert_eq!(r.get(), 15);
    let c = Completion::counter();
    let st = f.retry("cswap hit", || {
        f.ab.atomic_cswap(AtomicWidth::U64, 15, 99, &r, dst.addr(), &rkey, Some(&c))
    });
    f.complete("cswap", st, &c);
    assert_eq!(r.get(), 15);
    f.flush();
    assert_eq!(dst.read_u64(0).unwrap(), 99);
    let r2 = AtomicResult::new();
    assert_eq!(
        f.ab.atomic_fetch(AtomicWidth::U32, AtomicOp::Add, 1, &r2, dst.addr(), &rkey, None),
        Err(Status::Unsupported)
    );
    assert_eq!(
        f.ab.atomic_post(AtomicWidth::U64, AtomicOp::Xor, 1, dst.addr(), &rkey),
        Err(Status::Unsupported)
    );
    assert_eq!(
        f.ab.atomic_post(AtomicWidth::U64, AtomicOp::Add, 1, dst.addr() + 4, &rkey),
        Err(Status::InvalidParam)
    );
    f.no_errors();
}

#[test]
fn pending_queue_under_no_resource() {
    let _env = Env::set(&[("RUCX_IB_TX_QUEUE_LEN", "8"), ("RUCX_IB_TX_CQ_MODERATION", "2")]);
    let Some(f) = fixture() else { return };
    let rec = record(&f.b, 1);
    // fill the send queue without progress
    let mut sent = 0u64;
    while f.ab.am_short(1, sent, b"x").is_ok() {
        sent += 1;
        assert!(sent < 100, "send queue never filled");
    }
    assert_eq!(f.ab.am_short(1, sent, b"x"), Err(Status::NoResource));
    // queue requests that each send one message
    let next = Rc::new(Cell::new(sent));
    let total = sent + 50;
    let ep = Rc::new(f.ab);
    let dispatched = Rc::new(Cell::new(0u32));
    let mut queued = 0;
    for _ in 0..50 {
        let (n, e, d) = (next.clone(), Rc::downgrade(&ep), dispatched.clone());
        let req = PendingRequest::new(move || {
            d.set(d.get() + 1);
            let ep = e.upgrade().expect("ep alive");
            match ep.am_short(1, n.get(), b"x") {
                Ok(()) => {
                    n.set(n.get() + 1);
                    Status::Ok
                }
                Err(e) => e,
            }
        });
        match ep.pending_add(req) {
            Ok(()) => queued += 1,
            Err((st, _)) => panic!("pending_add: {st}"),
        }
    }
    assert_eq!(queued, 50);
    // sends may not overtake the queue
    assert_eq!(ep.am_short(1, 999, b"x"), Err(Status::NoResource));
    let start = Instant::now();
    while rec.borrow().len() < total as usize {
        assert!(
            start.elapsed() < DEADLINE,
            "pending requests not dispatched: {}",
            rec.borrow().len()
        );
        f.a.worker.progress();
        f.b.worker.progress();
    }
    let order: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..total).collect::<Vec<_>>(), "messages out of order");
    assert!(dispatched.get() >= 50);
    // resources are back: pending_add says Busy
    let c = Completion::counter();
    let st = loop {
        match ep.flush(FlushFlags::LOCAL, Some(&c)) {
            Err(Status::NoResource) => {
                f.a.worker.progress();
            }
            r => break r.unwrap(),
        }
    };
    if st == Status::InProgress {
        while c.fired() == 0 {
            f.a.worker.progress();
            f.b.worker.progress();
        }
    }
    match ep.pending_add(PendingRequest::new(|| Status::Ok)) {
        Err((Status::Busy, _)) => {}
        other => panic!("pending_add with free resources: {:?}", other.map_err(|e| e.0)),
    }
    // purge hands back queued requests
    let mut purged = 0;
    ep.pending_purge(|_| purged += 1);
    assert_eq!(purged, 0);
    assert_eq!(*f.a.errors.borrow(), vec![]);
}

#[test]
fn flow_control_slow_receiver() {
    // a small receive queue, a window that fits in it, and no RNR retries: any receiver-not-ready
    // NAK would fail the endpoint
    let _env = Env::set(&[
        ("RUCX_IB_RX_QUEUE_LEN", "64"),
        ("RUCX_IB_RX_MAX_BATCH", "8"),
        ("RUCX_IB_FC_WND_SIZE", "32"),
        ("RUCX_IB_RNR_RETRY_COUNT", "0"),
        ("RUCX_IB_RNR_TIMEOUT", "10us"),
    ]);
    let Some(f) = fixture() else { return };
    let rec = record(&f.b, 2);
    let total = 3000u64;
    let mut i = 0;
    let mut no_res = 0;
    let mut loops = 0u64;
    let start = Instant::now();
    while rec.borrow().len() < total as usize {
        assert!(
            start.elapsed() < DEADLINE * 2,
            "only {} of {total} delivered",
            rec.borrow().len()
        );
        if i < total {
            match f.ab.am_bcopy(2, |b| {
                b[..8].copy_from_slice(&i.to_le_bytes());
                200
            }) {
                Ok(_) => i += 1,
                Err(Status::NoResource) => no_res += 1,
                Err(e) => panic!("am_bcopy: {e}"),
            }
        }
        f.a.worker.progress();
        loops += 1;
        // the receiver progresses only every 50th round
        if loops.is_multiple_of(50) || i == total {
            f.b.worker.progress();
        }
        assert_eq!(*f.a.errors.borrow(), vec![], "sender failed (RNR?)");
    }
    let order: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..total).collect::<Vec<_>>());
    assert!(no_res > 0, "the window never closed: flow control not exercised");
    println!("{total} AMs delivered, {no_res} NoResource from the window");
    f.no_errors();
}

#[test]
fn bogus_peer_qp_fails_the_endpoint() {
    let _env = Env::set(&[("RUCX_IB_TIMEOUT", "10ms"), ("RUCX_IB_RETRY_COUNT", "1")]);
    let Some((ctx, dev)) = context() else { return };
    let a = side(&ctx, &dev);
    let b = side(&ctx, &dev);
    let ep = a.iface.ep_create().unwrap();
    // a QP number nobody has
    ep.connect_to_ep(&b.iface.device_address().unwrap(), &[1, 0xfe, 0xff, 0xff])
        .unwrap();
    assert_eq!(
        ep.connect_to_ep(&b.iface.device_address().unwrap(), &[1, 0, 0, 0]),
        Err(Status::InvalidParam)
    );
    let src = Mem::alloc(&a.md, 64, MemAccess::ALL).unwrap();
    let (dst_mem, rkey) = {
        let m = Mem::alloc(&b.md, 64, MemAccess::ALL).unwrap();
        let r = a.md.component().rkey_unpack(&m.pack_rkey().unwrap()).unwrap();
        (m, r)
    };
    ep.am_short(0, 1, b"hello?").unwrap();
    let c = Completion::counter();
    assert_eq!(
        ep.put_zcopy(&[src.iov(0, 64).unwrap()], dst_mem.addr(), &rkey, Some(&c)),
        Ok(Status::InProgress)
    );
    let start = Instant::now();
    while a.errors.borrow().is_empty() {
        assert!(start.elapsed() < DEADLINE, "no error reported for a bogus peer");
        a.worker.progress();
        b.worker.progress();
    }
    let errs = a.errors.borrow().clone();
    assert_eq!(errs.len(), 1, "reported once: {errs:?}");
    assert_eq!(errs[0].0, ep.key());
    assert_eq!(errs[0].1, Status::EndpointTimeout);
    assert_eq!(c.fired(), 1);
    assert!(c.last_status().is_err());
    // later operations fail with the endpoint's status
    assert_eq!(ep.am_short(0, 1, b"x"), Err(Status::EndpointTimeout));
    assert_eq!(ep.flush(FlushFlags::LOCAL, None), Err(Status::EndpointTimeout));
    match ep.pending_add(PendingRequest::new(|| Status::Ok)) {
        Err((Status::EndpointTimeout, _)) => {}
        other => panic!("pending_add on a failed ep: {:?}", other.map_err(|e| e.0)),
    }
    for _ in 0..100 {
        a.worker.progress();
    }
    assert_eq!(a.errors.borrow().len(), 1, "reported once");
    drop(ep);
}

#[test]
fn bad_rkey_is_an_error_completion() {
    let Some(f) = fixture() else { return };
    let (dst, rkey) = f.remote(64);
    let bad =
        f.a.md
            .component()
            .rkey_unpack(&[1, 7, 0, 0, 0x78, 0x56, 0x34, 0x12])
            .unwrap();
    assert_ne!(bad.raw(), rkey.raw());
    assert!(f.a.md.component().rkey_unpack(&[0; 3]).is_err());
    let src = Mem::alloc(&f.a.md, 64, MemAccess::ALL).unwrap();
    let c = Completion::counter();
    let st =
        f.ab.put_zcopy(&[src.iov(0, 64).unwrap()], dst.addr(), &bad, Some(&c))
            .unwrap();
    assert_eq!(st, Status::InProgress);
    f.wait("error completion", || c.fired() > 0);
    assert_eq!(c.last_status(), Status::IoError);
    assert_eq!(*f.a.errors.borrow(), vec![(f.ab.key(), Status::IoError)]);
    assert_eq!(f.ab.put_short(b"x", dst.addr(), &rkey), Err(Status::IoError));
    for _ in 0..100 {
        f.progress();
    }
    assert_eq!(f.a.errors.borrow().len(), 1, "reported once");
    // the interfaces are fine: a new connection works
    let (ab2, _ba2) = connect(&f.a, &f.b);
    let rec = record(&f.b, 5);
    f.retry("am on a new endpoint", || ab2.am_short(5, 7, b""));
    f.wait("am on a new endpoint", || rec.borrow().len() == 1);
}

#[test]
fn events_through_the_completion_channel() {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::BorrowedFd;
    let Some(f) = fixture() else { return };
    let rec = record(&f.b, 6);
    let fd = f.b.iface.event_fd().unwrap();
    // drain anything from connection setup, then arm
    let start = Instant::now();
    loop {
        f.progress();
        match f.b.iface.event_arm(ArmEvents::RECV) {
            Ok(()) => break,
            Err(Status::Busy) => assert!(start.elapsed() < DEADLINE),
            Err(e) => panic!("event_arm: {e}"),
        }
    }
    // SAFETY: the fd stays open while the iface lives.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    assert_eq!(
        poll(&mut fds, PollTimeout::ZERO).unwrap(),
        0,
        "no event before a message"
    );
    f.ab.am_short(6, 1, b"wake up").unwrap();
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    assert_eq!(
        poll(&mut fds, PollTimeout::from(5000u16)).unwrap(),
        1,
        "the receive raised an event"
    );
    // the event is pending: arming again says Busy until progress consumed everything
    assert_eq!(f.b.iface.event_arm(ArmEvents::RECV), Err(Status::Busy));
    f.wait("message", || rec.borrow().len() == 1);
    // a completion that arrived before arming is reported as Busy (it raises no event)
    f.ab.am_short(6, 2, b"again").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    match f.b.iface.event_arm(ArmEvents::RECV) {
        Err(Status::Busy) => {}
        Ok(()) => {
            // it had not arrived yet: then it raises the event
            let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
            assert_eq!(
                poll(&mut fds, PollTimeout::from(5000u16)).unwrap(),
                1,
                "armed, no event"
            );
        }
        Err(e) => panic!("event_arm: {e}"),
    }
    f.wait("second message", || rec.borrow().len() == 2);
    f.no_errors();
}

#[test]
fn destroy_with_outstanding_operations() {
    let Some(f) = fixture() else { return };
    let (dst, rkey) = f.remote(1 << 16);
    let src = Mem::alloc(&f.a.md, 1 << 16, MemAccess::ALL).unwrap();
    let comps: Vec<Completion> = (0..8).map(|_| Completion::counter()).collect();
    for c in &comps {
        let st = f.retry("put_zcopy", || {
            f.ab.put_zcopy(&[src.whole()], dst.addr(), &rkey, Some(c))
        });
        assert_eq!(st, Status::InProgress);
    }
    let Fix { a, b, ab, ba } = f;
    drop(ab);
    let start = Instant::now();
    while comps.iter().any(|c| c.fired() == 0) {
        assert!(
            start.elapsed() < DEADLINE,
            "completions of a destroyed endpoint never fired"
        );
        a.worker.progress();
        b.worker.progress();
    }
    assert!(a.errors.borrow().is_empty(), "destroying is not a peer failure");
    drop(ba);
    drop(a);
    drop(b);
}

/// Pending requests wait for the connection, and for credits when the window is closed; a
/// grant from the receiver dispatches them, in order.
#[test]
fn pending_before_connect_and_behind_the_window() {
    let _env = Env::set(&[("RUCX_IB_FC_WND_SIZE", "8")]);
    let Some((ctx, dev)) = context() else { return };
    let a = side(&ctx, &dev);
    let b = side(&ctx, &dev);
    let rec = record(&b, 9);
    let ab = Rc::new(a.iface.ep_create().unwrap());
    let ba = b.iface.ep_create().unwrap();
    // not connected yet: sends wait, pending requests are kept
    assert_eq!(ab.am_short(9, 0, b""), Err(Status::NoResource));
    let next = Rc::new(Cell::new(0u64));
    let add = |n: usize| {
        for _ in 0..n {
            let (nx, e) = (next.clone(), Rc::downgrade(&ab));
            let r = ab.pending_add(PendingRequest::new(move || {
                let ep = e.upgrade().expect("ep");
                match ep.am_short(9, nx.get(), b"p") {
                    Ok(()) => {
                        nx.set(nx.get() + 1);
                        Status::Ok
                    }
                    Err(e) => e,
                }
            }));
            assert!(r.is_ok(), "pending_add");
        }
    };
    add(20);
    ab.connect_to_ep(&b.iface.device_address().unwrap(), &ba.address().unwrap())
        .unwrap();
    ba.connect_to_ep(&a.iface.device_address().unwrap(), &ab.address().unwrap())
        .unwrap();
    // only the sender progresses: the window (8) lets some go, then it closes
    for _ in 0..2000 {
        a.worker.progress();
    }
    let first = next.get();
    assert!(first > 0, "nothing dispatched after connect");
    assert!(first < 20, "the window never closed ({first} sent)");
    // the receiver answers the hard request with a grant: the rest goes
    let start = Instant::now();
    while rec.borrow().len() < 20 {
        assert!(start.elapsed() < DEADLINE, "stuck at {}", rec.borrow().len());
        a.worker.progress();
        b.worker.progress();
    }
    let order: Vec<u64> = rec
        .borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..20).collect::<Vec<_>>());
    assert_eq!(*a.errors.borrow(), vec![]);
}

/// Packets the port has sent, from Soft-RoCE's counters (`None` elsewhere).
fn sent_pkts(dev: &str) -> Option<u64> {
    let (name, port) = dev.split_once(':')?;
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{name}/ports/{port}/hw_counters/sent_pkts"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// Sends `n` 8000-byte AMs a -> b over a fresh pair and returns the port's packets per message
/// (data and the responder's ACKs: both QPs are on this port).
fn packets_per_message(ctx: &Context, dev: &str, n: usize) -> f64 {
    let f = pair_on(ctx, dev);
    let rec = record(&f.b, 5);
    let data = vec![0x5au8; 8000];
    let before = sent_pkts(dev).expect("counters");
    for _ in 0..n {
        f.retry("am_bcopy", || {
            f.ab.am_bcopy(5, |buf| {
                buf[..data.len()].copy_from_slice(&data);
                data.len()
            })
        });
    }
    f.wait("all AMs", || rec.borrow().len() == n);
    f.flush();
    assert!(rec.borrow().iter().all(|m| m[..] == data[..]));
    f.no_errors();
    (sent_pkts(dev).expect("counters") - before) as f64 / n as f64
}

#[test]
fn a_peer_on_the_same_soft_roce_port_gets_the_largest_mtu() {
    let Some((ctx, dev)) = context() else { return };
    if sent_pkts(&dev).is_none() {
        println!("skipped: {dev} is not Soft-RoCE (no hw_counters/sent_pkts)");
        return;
    }
    // auto (the default): MTU 4096 between two QPs of this port, 2 data packets per 8000 B.
    let auto = packets_per_message(&ctx, &dev, 64);
    // default: the port's active MTU (1024 on rxe over a 1500-byte netdev): 8 data packets.
    let active = {
        let _env = Env::set(&[("RUCX_IB_PATH_MTU", "default")]);
        packets_per_message(&ctx, &dev, 64)
    };
    println!("packets per 8000-byte message: auto {auto:.2}, default {active:.2}");
    assert!(auto < 4.0, "auto: {auto} packets per 8000-byte message");
    assert!(active >= 8.0, "default: {active} packets per 8000-byte message");
}
