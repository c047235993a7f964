//! Target `ucp_frames` (stateful): a sequence of UCP frames sent into one worker over the
//! self transport, with the application's receives interleaved, under small budgets. Whatever
//! the sequence, nothing panics, what the worker holds stays within its budgets, and the
//! worker still answers its own endpoint afterwards (or reports that endpoint failed).
//!
//! Input: frames of `[uct AM id, flags, length (u16 LE), bytes]`. Flag bits: 0 and 1 write the
//! worker's own id over bytes 0..8 and 8..16 (where the formats name their sender: frames that
//! pass the known-peer checks), 2 posts a tag receive of `length` bytes, 3 takes a matching
//! unexpected message, 4 reads the stream, 5 progresses the worker a few more times.

use std::cell::RefCell;
use std::rc::Rc;

use crate::{AmFlags, Context, Features, Worker, WorkerAddress};

/// The budgets the target runs under (small, so that sequences reach them).
const LIMITS: &[(&str, &str)] = &[
    ("REASM_PEER_LIMIT", "64k"),
    ("REASM_WORKER_LIMIT", "128k"),
    ("REASM_TIMEOUT", "50ms"),
    ("TAG_UNEXP_PEER_LIMIT", "64k"),
    ("TAG_UNEXP_WORKER_LIMIT", "128k"),
    ("STREAM_PEER_LIMIT", "64k"),
    ("STREAM_WORKER_LIMIT", "128k"),
    ("RNDV_TIMEOUT", "50ms"),
    ("PASSIVE_PEER_LIMIT", "8"),
    ("PASSIVE_WORKER_LIMIT", "16"),
];

/// What a budget of `limit` may hold at most: the limit, and one message's entry cost
/// (a charge is checked before it is made, never after).
fn within(what: &str, held: usize, limit: usize) {
    assert!(
        held <= limit,
        "{what}: {held} bytes held, over the {limit}-byte budget"
    );
}

pub fn fuzz_frames(data: &[u8]) {
    let uct = uct::Context::builder()
        .builtin(uct_self::module())
        .plugins(false)
        .build();
    let ctx = LIMITS
        .iter()
        .fold(Context::builder(uct.clone()), |b, (k, v)| b.config(k, v))
        .features(Features::AM | Features::TAG | Features::STREAM)
        .build()
        .expect("the target's configuration is valid");
    let w = Worker::new(&ctx).expect("a worker on self");
    let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let g = got.clone();
    w.set_am_handler(2, move |m| g.borrow_mut().push(m.data().to_vec()))
        .expect("AM is on");
    let ep = w.connect(w.address()).expect("an endpoint to itself");
    let me = WorkerAddress::unpack(w.address()).expect("its own address");
    let entry = me
        .entries
        .iter()
        .find(|e| e.tl.tl_name == "self")
        .expect("a self entry");
    let (md, _) = uct
        .find_resource(&entry.tl.tl_name, &entry.tl.dev_name)
        .expect("the self resource");
    let iface = uct::Iface::open(
        &md,
        w.uct(),
        uct::IfaceParams::new(&entry.tl.tl_name, &entry.tl.dev_name),
    )
    .expect("a second self interface");
    let raw = iface
        .ep_create_connected(&entry.dev_addr, &entry.iface_addr)
        .expect("a raw endpoint");
    let mut recvs = Vec::new();
    let mut at = 0;
    while data.len() - at >= 4 {
        let (id, flags) = (data[at], data[at + 1]);
        let len = usize::from(u16::from_le_bytes([data[at + 2], data[at + 3]]));
        at += 4;
        let mut frame = data[at..(at + len).min(data.len())].to_vec();
        at = (at + len).min(data.len());
        for (bit, off) in [(1u8, 0usize), (2, 8)] {
            if flags & bit != 0 && frame.len() >= off + 8 {
                frame[off..off + 8].copy_from_slice(&me.uuid.to_le_bytes());
            }
        }
        // A refused frame (too long for the lane, no resources) is simply not sent.
        let _ = raw.am_bcopy(id % 16, |b| {
            let n = frame.len().min(b.len());
            b[..n].copy_from_slice(&frame[..n]);
            n
        });
        if flags & 4 != 0 {
            if let Ok(crate::Issued::Pending(r)) = w.tag_recv(0, 0, vec![0; len]) {
                recvs.push(r);
            }
        }
        if flags & 8 != 0 {
            let _ = w.tag_recv(u64::from(id), u64::MAX, vec![0; 64]);
        }
        if flags & 16 != 0 {
            let _ = ep.stream_recv(vec![0; 64], false);
        }
        for _ in 0..if flags & 32 != 0 { 8 } else { 1 } {
            w.progress();
        }
        within("reassembly", w.reassembly().bytes, 128 << 10);
        within("unexpected tags", w.tag_unexpected().bytes, 128 << 10);
        within("unread streams", w.stream_unread().bytes, 128 << 10);
        assert!(
            w.passive_endpoints() <= 16,
            "{} passive endpoints",
            w.passive_endpoints()
        );
    }
    // The worker still serves: over its endpoint, or, when the sequence failed that (frames
    // in the worker's own name over a budget or against the rules fail its endpoints toward
    // itself, by design), over a new one.
    let ep = if ep.error().is_some() {
        w.connect(w.address()).expect("a new endpoint to itself")
    } else {
        ep
    };
    let sent = ep.am_send(2, b"", b"still here", AmFlags::default());
    assert!(sent.is_ok(), "a send on a fresh endpoint: {sent:?}");
    for _ in 0..10_000 {
        if got.borrow().iter().any(|m| m == b"still here") {
            break;
        }
        w.progress();
    }
    assert!(
        got.borrow().iter().any(|m| m == b"still here"),
        "the worker stopped serving its endpoint ({:?})",
        ep.error()
    );
    drop(recvs);
}

#[cfg(test)]
mod tests {
    /// xorshift64.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// One frame: mostly well-formed headers of UCP's kinds (the worker id patched in by the
    /// flags, message ids, offsets and totals from small sets so that fragments continue
    /// each other), sometimes random bytes.
    fn frame(next: &mut impl FnMut() -> u64, out: &mut Vec<u8>) {
        let r = next();
        let le = |v: u64| v.to_le_bytes();
        let small = |v: u64, n: u64| v % n;
        let data: Vec<u8> = (0..small(r >> 40, 600)).map(|i| i as u8).collect();
        let (id, patch, body): (u8, u8, Vec<u8>) = match r % 9 {
            // AM first fragment: word (handler 2), worker, message id, total
            0 => (
                3,
                2,
                [
                    &le(2)[..],
                    &le(0),
                    &le(small(r >> 8, 4)),
                    &le(small(r >> 12, 3000)),
                    &data,
                ]
                .concat(),
            ),
            // AM later fragment: worker, message id, offset
            1 => (
                4,
                1,
                [
                    &le(0)[..],
                    &le(small(r >> 8, 4)),
                    &le(small(r >> 12, 4) * 300),
                    &data,
                ]
                .concat(),
            ),
            // tag eager
            2 => (9, 0, [&le(small(r >> 8, 3))[..], &data].concat()),
            // tag first fragment: tag, worker, message id, total, two reserved words
            3 => (
                11,
                2,
                [
                    &le(small(r >> 8, 3))[..],
                    &le(0),
                    &le(small(r >> 12, 4)),
                    &le(small(r >> 16, 3000)),
                    &le(0),
                    &le(0),
                    &data,
                ]
                .concat(),
            ),
            // tag later fragment
            4 => (
                12,
                1,
                [
                    &le(0)[..],
                    &le(small(r >> 8, 4)),
                    &le(small(r >> 12, 4) * 300),
                    &data,
                ]
                .concat(),
            ),
            // tag rendezvous announcement without resource
            5 => (
                14,
                2,
                [
                    &le(small(r >> 8, 3))[..],
                    &le(0),
                    &le(1),
                    &le(small(r >> 12, 8)),
                    &le(small(r >> 16, 5000)),
                    &le(0x1000),
                    &[0, 0, 255, 0, 0, 0, 0, 0][..],
                ]
                .concat(),
            ),
            // stream bytes: worker, endpoint
            6 => (15, 1, [&le(0)[..], &le(small(r >> 8, 3)), &data].concat()),
            // rendezvous DATA: receive id, worker, offset
            7 => (
                8,
                2,
                [
                    &le(small(r >> 8, 4))[..],
                    &le(0),
                    &le(small(r >> 12, 4) * 300),
                    &data,
                ]
                .concat(),
            ),
            _ => (1 + small(r >> 8, 15) as u8, 0, data),
        };
        // Flags: the patches, and now and then a receive, a take, a stream read, more progress.
        let flags = patch | (next() as u8 & 0b11_1100);
        out.push(id);
        out.push(flags);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(&body);
    }

    #[test]
    fn seeded_sequences() {
        for seed in 1..=24u64 {
            let mut next = rng(seed);
            let mut input = Vec::new();
            for _ in 0..300 {
                frame(&mut next, &mut input);
            }
            super::fuzz_frames(&input);
        }
    }
}
