//! Copies out of shared memory, counted (uct's `copy-stats` feature): over posix, every
//! receive path copies a message's bytes out of the peer's FIFO once, to where they go — the
//! posted tag or stream buffer, the unexpected message, the reassembly buffer — and never
//! first into a staging buffer. (A single active message is the transport's own copy, in a
//! descriptor its handler may keep.)

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{AmFlags, Features, Issued};
use uct::copy_stats::{self, CopyStats};

use crate::harness::{pattern, Pair, Setup};

/// Sizes: one `am_short`, one bcopy segment (posix's is 8 KiB), fragments.
const SIZES: &[usize] = &[8, 4000, 100_000];

/// Bytes each transport message adds to its data at most (UCP's prefixes, the user header).
const PER_MESSAGE: u64 = 64;

fn pair() -> Option<Pair> {
    let t = crate::harness::TARGETS
        .iter()
        .find(|t| t.name == "posix")
        .expect("the posix target");
    let s = Setup {
        t,
        extra: vec![("RNDV_THRESH", "1m".to_string())],
    };
    let p = s.pair_with(Features::TAG | Features::STREAM | Features::AM)?;
    // Wired both ways before anything is counted.
    let r = p.b.tag_recv(1, u64::MAX, vec![0; 8]).unwrap();
    send(&p, p.ep.tag_send(1, b"warm-up!").unwrap());
    done(&p, r);
    copy_stats::take();
    Some(p)
}

fn send<T>(p: &Pair, r: Issued<T>) {
    if let Issued::Pending(mut r) = r {
        p.wait_for("a send", || r.is_done());
        r.take().unwrap().unwrap();
    }
}

fn done<T>(p: &Pair, r: Issued<T>) -> T {
    match r {
        Issued::Done(v) => v,
        Issued::Pending(mut r) => {
            p.wait_for("a receive", || r.is_done());
            r.take().unwrap().unwrap()
        }
    }
}

/// Progresses until `n` bytes came out of shared memory (a message that waits unexpected).
fn arrived(p: &Pair, n: usize) -> CopyStats {
    p.wait_for("the message's bytes", || {
        copy_stats::peek().from_shared >= n as u64
    });
    copy_stats::take()
}

/// The message of `n` bytes came out of shared memory once: all of it was read from there,
/// no more than one copy's worth, and (unless `staged_ok`) nothing through a staging buffer.
fn once(what: &str, n: usize, c: CopyStats, staged_ok: bool) {
    assert!(
        c.messages >= 1 && c.from_shared >= n as u64,
        "{what} ({n} B): not read out of shared memory: {c:?}"
    );
    assert!(
        c.from_shared <= n as u64 + PER_MESSAGE * c.messages,
        "{what} ({n} B): copied out of shared memory more than once: {c:?}"
    );
    if !staged_ok {
        assert_eq!(
            c.staged, 0,
            "{what} ({n} B): staged before it went where it goes: {c:?}"
        );
    }
}

#[test]
fn tag_posted_and_unexpected() {
    let Some(p) = pair() else { return };
    for &n in SIZES {
        let data = pattern(n, n);
        let r = p.b.tag_recv(7, u64::MAX, vec![0; n]).unwrap();
        send(&p, p.ep.tag_send(7, &data).unwrap());
        assert_eq!(done(&p, r).data, data);
        once("posted tag receive", n, copy_stats::take(), false);

        send(&p, p.ep.tag_send(8, &data).unwrap());
        let c = arrived(&p, n);
        let r = p.b.tag_recv(8, u64::MAX, vec![0; n]).unwrap();
        assert_eq!(done(&p, r).data, data);
        once("unexpected tag message", n, c, false);
    }
}

#[test]
fn stream_posted_and_queued() {
    let Some(p) = pair() else { return };
    let rx = p.b.connect(p.a.address()).unwrap();
    // The receiver's endpoint toward the sender must know its peer: one exchange back.
    send(&p, rx.stream_send(b"hello").unwrap());
    let back = p.ep.stream_recv(vec![0; 5], true).unwrap();
    assert_eq!(done(&p, back), b"hello");
    copy_stats::take();
    for &n in SIZES {
        let data = pattern(n, n);
        let r = rx.stream_recv(vec![0; n], true).unwrap();
        send(&p, p.ep.stream_send(&data).unwrap());
        assert_eq!(done(&p, r), data);
        once("posted stream receive", n, copy_stats::take(), false);

        send(&p, p.ep.stream_send(&data).unwrap());
        let c = arrived(&p, n);
        let r = rx.stream_recv(vec![0; n], true).unwrap();
        assert_eq!(done(&p, r), data);
        once("queued stream bytes", n, c, false);
    }
}

#[test]
fn am_single_and_fragments() {
    let Some(p) = pair() else { return };
    let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let g = got.clone();
    p.b.set_am_handler(3, move |m| g.borrow_mut().push(m.data().to_vec()))
        .unwrap();
    for &n in SIZES {
        let data = pattern(n, n);
        send(&p, p.ep.am_send(3, b"hdr", &data, AmFlags::default()).unwrap());
        p.wait_for("the active message", || !got.borrow().is_empty());
        assert_eq!(got.borrow_mut().pop().unwrap(), data);
        let c = copy_stats::take();
        if c.messages == 0 {
            // One segment: the transport copied it into its own descriptor, which the
            // handler reads (and may keep) as it is.
            assert!(n <= 8192, "[posix] {n} B in one segment");
            continue;
        }
        // Fragments are reassembled straight from the FIFO.
        once("fragmented active message", n, c, false);
    }
}
