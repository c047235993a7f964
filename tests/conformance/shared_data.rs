//! Handlers installed with `AmCbFlags::SHARED_DATA` (they read a message where a shared-memory
//! transport received it, copying once): every way of reading the message (`copy_to` at
//! offsets, `extend_vec`, `header`, `data`) gives the bytes sent, `keep` gives a copy that
//! stays intact after the element is reused, and the shared-memory FIFOs (posix, sysv) hand
//! over every message in place (`is_shared`), while other transports hand private data.

use std::cell::RefCell;
use std::rc::Rc;

use rucx_testkit::data::{assert_bytes, pattern};
use rucx_testkit::{Pair, Setup};
use uct::{AmCbFlags, IfaceFlags, RxDesc};

const ID: u8 = 11;

/// What the handler read from one message, each way.
#[derive(Default)]
struct Seen {
    shared: bool,
    len: usize,
    header: u64,
    /// `copy_to` in two pieces split at `len / 3`.
    pieces: Vec<u8>,
    extended: Vec<u8>,
    data: Vec<u8>,
    kept: Option<RxDesc>,
}

type Log = Rc<RefCell<Vec<Seen>>>;

fn install(p: &Pair) -> Log {
    let log: Log = Rc::default();
    let l = log.clone();
    p.rx.iface
        .set_am_handler(ID, p.am_flags() | AmCbFlags::SHARED_DATA, move |m| {
            let i = l.borrow().len();
            let len = m.len();
            let cut = len / 3;
            let mut pieces = vec![0u8; len];
            let a = m.copy_to(0, &mut pieces[..cut]);
            let b = m.copy_to(cut, &mut pieces[cut..]);
            pieces.truncate(a + b);
            let mut extended = b"prefix".to_vec();
            m.extend_vec(0, &mut extended);
            let seen = Seen {
                shared: m.is_shared(),
                len,
                header: m.header(),
                pieces,
                extended,
                data: m.data().to_vec(),
                kept: i.is_multiple_of(4).then(|| m.keep()),
            };
            l.borrow_mut().push(seen);
        })
        .unwrap();
    log
}

/// The shared-memory FIFOs hand messages over in place; every other transport copies first.
fn in_place(s: &Setup) -> bool {
    matches!(s.tl(), "posix" | "sysv")
}

fn check(p: &Pair, in_place: bool, log: &Log, want: &dyn Fn(usize) -> Vec<u8>) {
    let n = p.name();
    for (i, s) in log.borrow().iter().enumerate() {
        let w = want(i);
        let what = |how: &str| format!("[{n}] message {i} ({} bytes) by {how}", w.len());
        assert_eq!(s.shared, in_place && s.len > 0, "{}", what("is_shared"));
        assert_eq!(s.len, w.len(), "{}", what("len"));
        assert_bytes(&what("copy_to"), &s.pieces, &w);
        assert_bytes(&what("extend_vec"), &s.extended[6..], &w);
        assert_eq!(&s.extended[..6], b"prefix", "{}", what("extend_vec"));
        assert_bytes(&what("data"), &s.data, &w);
        let h = w
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        assert_eq!(s.header, h, "{}", what("header"));
        if let Some(k) = &s.kept {
            assert_bytes(&what("keep"), k, &w);
            if s.shared {
                assert!(!k.is_zero_copy(), "{}", what("keep (shared data lent)"));
            }
        }
    }
}

fn am_short_shared(s: &Setup) {
    let p = s.pair();
    if !p.supports(IfaceFlags::AM_SHORT, "am_short_shared") {
        return;
    }
    let max = (p.attr().am.max_short - 8).min(200);
    let want = move |i: usize| {
        let mut v = (i as u64 * 0x0101_0101).to_le_bytes().to_vec();
        v.extend(pattern(i % (max + 1), i as u64));
        v
    };
    let log = install(&p);
    let ep = p.ep().clone();
    let count = 300; // more than a FIFO holds: elements are reused under kept copies
    for i in 0..count {
        let w = want(i);
        p.retry("am_short", || ep.am_short(ID, i as u64 * 0x0101_0101, &w[8..]))
            .unwrap();
    }
    p.wait_for("every message", || log.borrow().len() >= count);
    check(&p, in_place(s), &log, &want);
    log.borrow_mut().clear(); // kept descriptors go before the interface
}

fn am_bcopy_shared(s: &Setup) {
    let p = s.pair();
    if !p.supports(IfaceFlags::AM_BCOPY, "am_bcopy_shared") {
        return;
    }
    let max = p.attr().am.max_bcopy;
    let want = move |i: usize| pattern([0, 1, 7, 8, 9, 100, 4000, max][i % 8].min(max), i as u64);
    let log = install(&p);
    let ep = p.ep().clone();
    let count = 200;
    for i in 0..count {
        let w = want(i);
        let r = p.retry("am_bcopy", || {
            ep.am_bcopy(ID, |b| {
                b[..w.len()].copy_from_slice(&w);
                w.len()
            })
        });
        assert_eq!(r, Ok(w.len()), "[{}] am_bcopy {i}", p.name());
    }
    p.wait_for("every message", || log.borrow().len() >= count);
    check(&p, in_place(s), &log, &want);
    log.borrow_mut().clear(); // kept descriptors go before the interface
}

conformance_test!(am_short_shared, am_bcopy_shared);
