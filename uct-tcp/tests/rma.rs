//! Put, get and atomics over tcp: data lands exactly, targets outside registered memory are
//! refused (nothing written, the initiator sees the error), flush waits for remote completion.

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::data::pattern;
use rucx_testkit::{modules, tcp, Connect, Remote, Setup, Workers};
use ucs::Outcome;
use uct::*;

/// tcp on `lo`, linked in.
fn lo() -> Setup {
    tcp::lo(&modules::builtin(uct_tcp::module()))
}

#[test]
fn put_and_get_all_flavors() {
    for model in [Connect::ToIface, Connect::ToEp] {
        let p = lo().layout(model, Workers::Separate).pair();
        let Remote { mem, rkey } = p.remote_mem(200_000, 0xEE);
        let base = mem.addr();
        // put_short / put_bcopy.
        let d = pattern(100, 1);
        p.retry("put_short", || p.ep().put_short(&d, base + 3, &rkey))
            .unwrap();
        let d2 = pattern(8192, 2);
        let n = p.retry("put_bcopy", || {
            p.ep().put_bcopy(
                |b| {
                    b[..8192].copy_from_slice(&d2);
                    8192
                },
                base + 1000,
                &rkey,
            )
        });
        assert_eq!(n, Ok(8192));
        // put_zcopy, large and scattered.
        let src = p.local_mem(150_000, 0);
        let d3 = pattern(140_000, 3);
        src.write(0, &d3[..70_000]).unwrap();
        src.write(80_000, &d3[70_000..]).unwrap();
        let iov = [src.iov(0, 70_000).unwrap(), src.iov(80_000, 70_000).unwrap()];
        let c = Completion::counter();
        let r = p.retry("put_zcopy", || {
            p.ep().put_zcopy(&iov, base + 20_000, &rkey, Some(&c))
        });
        assert_eq!(p.outcome(r, &c), Status::Ok);
        // Remote flush: everything landed.
        p.flush_ep();
        let all = mem.to_vec();
        assert_eq!(&all[3..103], &d[..]);
        assert_eq!(all[2], 0xEE);
        assert_eq!(all[103], 0xEE);
        assert_eq!(&all[1000..9192], &d2[..]);
        assert_eq!(&all[20_000..160_000], &d3[..]);
        assert_eq!(all[160_000], 0xEE);
        // get_bcopy and get_zcopy read it back.
        let got: Rc<RefCell<Vec<u8>>> = Rc::default();
        let g = got.clone();
        let c = Completion::counter();
        let r = p.retry("get_bcopy", || {
            let g = g.clone();
            p.ep().get_bcopy(
                8192,
                base + 1000,
                &rkey,
                move |b| *g.borrow_mut() = b.to_vec(),
                Some(&c),
            )
        });
        assert_eq!(p.outcome(r, &c), Status::Ok);
        assert_eq!(*got.borrow(), d2);
        let dst = p.local_mem(150_000, 0x11);
        let iov = [dst.iov(5, 100_000).unwrap(), dst.iov(110_000, 40_000).unwrap()];
        let c = Completion::counter();
        let r = p.retry("get_zcopy", || {
            p.ep().get_zcopy(&iov, base + 20_000, &rkey, Some(&c))
        });
        assert_eq!(p.outcome(r, &c), Status::Ok);
        let back = dst.to_vec();
        assert_eq!(&back[5..100_005], &d3[..100_000]);
        assert_eq!(&back[110_000..150_000], &d3[100_000..]);
        assert_eq!(back[4], 0x11);
        assert_eq!(back[100_005], 0x11);
        assert!(p.tx.errors.borrow().is_empty());
    }
}

#[test]
fn atomics_execute_on_the_target() {
    let p = lo().layout(Connect::ToIface, Workers::Separate).pair();
    let Remote { mem, rkey } = p.remote_mem(64, 0);
    let a = mem.addr();
    mem.write(8, &10u64.to_le_bytes()).unwrap();
    mem.write(20, &7u32.to_le_bytes()).unwrap();
    p.retry("post", || {
        p.ep()
            .atomic_post(AtomicWidth::U64, AtomicOp::Add, 5, a + 8, &rkey)
    })
    .unwrap();
    p.retry("post", || {
        p.ep()
            .atomic_post(AtomicWidth::U32, AtomicOp::Xor, 1, a + 20, &rkey)
    })
    .unwrap();
    let c = Completion::counter();
    let r = p.retry("remote flush", || p.ep().flush(FlushFlags::REMOTE, Some(&c)));
    assert_eq!(p.outcome(r, &c), Status::Ok);
    assert_eq!(mem.read_u64(8).unwrap(), 15);
    let res = AtomicResult::new();
    let c = Completion::counter();
    let r = p.retry("fetch", || {
        p.ep()
            .atomic_fetch(AtomicWidth::U64, AtomicOp::Swap, 99, &res, a + 8, &rkey, Some(&c))
    });
    assert_eq!(p.outcome(r, &c), Status::Ok);
    assert_eq!(res.get(), 15);
    let c = Completion::counter();
    let r = p.retry("cswap", || {
        p.ep()
            .atomic_cswap(AtomicWidth::U32, 6, 1234, &res, a + 20, &rkey, Some(&c))
    });
    assert_eq!(p.outcome(r, &c), Status::Ok);
    assert_eq!(res.get(), 6);
    let mut w = [0u8; 4];
    mem.read(20, &mut w).unwrap();
    assert_eq!(u32::from_le_bytes(w), 1234);
    assert_eq!(mem.read_u64(8).unwrap(), 99);
    assert_eq!(
        p.ep()
            .atomic_post(AtomicWidth::U64, AtomicOp::Swap, 1, a + 8, &rkey),
        Err(Status::InvalidParam.into())
    );
    assert_eq!(
        p.ep()
            .atomic_post(AtomicWidth::U64, AtomicOp::Add, 1, a + 9, &rkey),
        Err(Status::InvalidParam.into())
    );
}

/// Requests outside what the target registered are refused: the completion gets the error,
/// memory is untouched, and (for operations without completion) the error handler fires.
#[test]
fn out_of_bounds_requests_are_refused() {
    // With a completion: the error comes back in it and the endpoint keeps working.
    let p = lo().layout(Connect::ToIface, Workers::Separate).pair();
    let Remote { mem, rkey } = p.remote_mem(64, 0);
    let a = mem.addr();
    let src = p.local_mem(16, 9);
    let c = Completion::counter();
    let r = p.retry("put_zcopy", || {
        p.ep().put_zcopy(&[src.whole()], a + 56, &rkey, Some(&c))
    });
    assert!(p.outcome(r, &c).is_err(), "put crossing the end");
    let c = Completion::counter();
    let r = p.retry("get_zcopy", || {
        p.ep().get_zcopy(&[src.whole()], a - 8, &rkey, Some(&c))
    });
    assert!(p.outcome(r, &c).is_err(), "get before the start");
    assert_eq!(src.to_vec(), vec![9; 16], "refused get wrote the buffer");
    let unpacked = Rc::new(std::cell::Cell::new(false));
    let u = unpacked.clone();
    let c = Completion::counter();
    let r = p.retry("get_bcopy", || {
        let u = u.clone();
        p.ep().get_bcopy(8, 8, &rkey, move |_| u.set(true), Some(&c))
    });
    assert!(p.outcome(r, &c).is_err(), "get far away");
    assert!(!unpacked.get());
    let res = AtomicResult::new();
    let c = Completion::counter();
    let r = p.retry("fetch", || {
        p.ep()
            .atomic_fetch(AtomicWidth::U64, AtomicOp::Add, 1, &res, a + 64, &rkey, Some(&c))
    });
    assert!(p.outcome(r, &c).is_err(), "atomic past the end");
    // A stale key.
    let Remote {
        mem: gone,
        rkey: stale,
    } = p.remote_mem(64, 0);
    let ga = gone.addr();
    drop(gone);
    let c = Completion::counter();
    let r = p.retry("put_zcopy", || {
        p.ep().put_zcopy(&[src.whole()], ga, &stale, Some(&c))
    });
    assert!(p.outcome(r, &c).is_err(), "stale rkey");
    assert_eq!(mem.to_vec(), vec![0; 64]);
    assert!(
        p.tx.errors.borrow().is_empty(),
        "errors with a completion must not fail the endpoint"
    );
    // The endpoint still works.
    p.retry("put_short", || p.ep().put_short(&[1; 8], a, &rkey))
        .unwrap();
    p.flush_ep();
    assert_eq!(mem.to_vec()[..8], [1; 8]);

    // Without completion (posted): the refusal is reported by the next flush, once, and the
    // endpoint keeps working; nothing reaches the error handler.
    let q = lo().layout(Connect::ToIface, Workers::Separate).pair();
    let Remote { mem, rkey } = q.remote_mem(64, 0);
    q.retry("put_short", || q.ep().put_short(&[5; 8], mem.addr() + 60, &rkey))
        .unwrap();
    let c = Completion::counter();
    let r = q.retry("flush", || q.ep().flush(FlushFlags::LOCAL, Some(&c)));
    assert_eq!(r, Ok(Outcome::InProgress));
    q.wait_for("flush", || c.fired() > 0);
    assert_eq!(
        c.last_status(),
        Status::InvalidAddr,
        "the flush reports the refused put"
    );
    // Reported once: the next flush is clean.
    let c = Completion::counter();
    q.retry("put_short", || q.ep().put_short(&[6; 8], mem.addr(), &rkey))
        .unwrap();
    let r = q.retry("flush", || q.ep().flush(FlushFlags::LOCAL, Some(&c)));
    assert_eq!(q.outcome(r, &c), Status::Ok);
    assert_eq!(mem.to_vec()[..8], [6; 8]);
    assert_eq!(mem.to_vec()[8..], vec![0; 56]);
    // A flush without a completion, polled: it returns the refusal once nothing is outstanding.
    q.retry("put_short", || q.ep().put_short(&[5; 8], mem.addr() + 60, &rkey))
        .unwrap();
    let mut polled = Ok(Outcome::InProgress);
    q.wait_for("polled flush", || {
        polled = q.ep().flush(FlushFlags::LOCAL, None);
        !matches!(polled, Ok(Outcome::InProgress)) && polled != Err(Status::NoResource.into())
    });
    assert_eq!(polled, Err(Status::InvalidAddr.into()));
    let e = polled.unwrap_err();
    assert!(e.context().is_some_and(|c| c.contains("refused")), "{e}");
    assert!(
        q.tx.errors.borrow().is_empty(),
        "a refused posted put does not fail the endpoint"
    );
    q.retry("am_short", || q.ep().am_short(1, 0, b"x")).unwrap();
}

/// Flush waits for zcopy operations; flush with CANCEL completes waiting operations with
/// Canceled; iface flush covers every endpoint.
#[test]
fn flush_variants() {
    let p = lo().layout(Connect::ToEp, Workers::Separate).pair();
    let Remote { mem, rkey } = p.remote_mem(1 << 20, 0);
    let src = p.local_mem(1 << 20, 3);
    let mut comps = Vec::new();
    for i in 0..8 {
        let c = Completion::counter();
        let r = p.retry("put_zcopy", || {
            p.ep().put_zcopy(
                &[src.iov(0, 1 << 17).unwrap()],
                mem.addr() + (i << 17),
                &rkey,
                Some(&c),
            )
        });
        assert_eq!(r, Ok(Outcome::InProgress));
        comps.push(c);
    }
    let c = Completion::counter();
    let r = p.retry("iface flush", || p.tx.iface.flush(FlushFlags::LOCAL, Some(&c)));
    assert_eq!(p.outcome(r, &c), Status::Ok);
    assert!(comps
        .iter()
        .all(|c| c.fired() == 1 && c.last_status() == Status::Ok));
    assert!(mem.to_vec().iter().all(|&b| b == 3));
    assert_eq!(p.tx.iface.flush(FlushFlags::LOCAL, None), Ok(Outcome::Done));

    // Cancel: gets waiting for their replies complete with Canceled.
    let dst = p.local_mem(64, 0);
    let cs: Vec<Completion> = (0..4)
        .map(|_| {
            let c = Completion::counter();
            assert_eq!(
                p.retry("get", || p.ep().get_zcopy(
                    &[dst.whole()],
                    mem.addr(),
                    &rkey,
                    Some(&c)
                )),
                Ok(Outcome::InProgress)
            );
            c
        })
        .collect();
    assert_eq!(
        p.retry("cancel", || p.ep().flush(FlushFlags::CANCEL, None)),
        Ok(Outcome::Done)
    );
    assert!(cs
        .iter()
        .all(|c| c.fired() == 1 && c.last_status() == Status::Canceled));
    // Late replies are absorbed; the endpoint still works.
    for _ in 0..100 {
        p.progress();
    }
    p.flush_ep();
    assert!(p.tx.errors.borrow().is_empty());
}
