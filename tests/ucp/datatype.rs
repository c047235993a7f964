//! Datatypes: io-vectors and generic pack/unpack, sent and received through every protocol
//! (short, bcopy, zero-copy, fragments, rendezvous; with rendezvous from 4 KiB too), for tag
//! and active messages, posted before the message and after it (unexpected). Every byte
//! arrives once, in place, segment boundaries anywhere; an unpacker's error fails the receive.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use ucp::{AmFlags, AmHandlerFlags, Features, Issued, Pack, Status, Unpack};

use crate::harness::{pattern, Pair, Setup};
use crate::ucp_test;

const SIZES: &[usize] = &[1, 7, 100, 4000, 9000, 65_537, 300_000];

/// `data` cut in three uneven pieces (some may be empty).
fn thirds(data: &[u8]) -> [&[u8]; 3] {
    let (a, rest) = data.split_at(data.len() / 3);
    let (b, c) = rest.split_at(rest.len() * 3 / 4);
    [a, b, c]
}

/// Receive segments of `n` bytes in all, cut differently from the sender's, plus slack.
fn recv_segments(n: usize) -> Vec<Vec<u8>> {
    let a = n / 2;
    vec![
        vec![0xee; a],
        vec![],
        vec![0xee; 1.min(n - a)],
        vec![0xee; n - a - 1.min(n - a) + 16],
    ]
}

/// Packs `data` reversed (a layout that is not a plain copy).
struct Reversed(Vec<u8>);

impl Pack for Reversed {
    fn packed_size(&self) -> usize {
        self.0.len()
    }
    fn pack(&mut self, offset: usize, dst: &mut [u8]) -> usize {
        let src = self.0.iter().rev().skip(offset);
        dst.iter_mut().zip(src).map(|(d, s)| *d = *s).count()
    }
}

/// Unpacks into a buffer, reversing again, and records every byte offset it saw.
#[derive(Debug)]
struct Unreverse {
    out: Vec<u8>,
    seen: BTreeSet<usize>,
    twice: bool,
}

impl Unreverse {
    fn new(room: usize) -> Unreverse {
        Unreverse {
            out: vec![0; room],
            seen: BTreeSet::new(),
            twice: false,
        }
    }

    /// The message (of `n` bytes) it rebuilt: every byte seen once.
    fn message(&self, n: usize) -> Vec<u8> {
        assert!(!self.twice, "a byte was unpacked twice");
        assert_eq!(self.seen.len(), n, "bytes never unpacked");
        self.out[..n].iter().rev().copied().collect::<Vec<_>>()
    }
}

impl Unpack for Unreverse {
    fn packed_size(&self) -> usize {
        self.out.len()
    }
    fn unpack(&mut self, offset: usize, src: &[u8]) -> ucp::Result<()> {
        for (i, &b) in src.iter().enumerate() {
            self.twice |= !self.seen.insert(offset + i);
            self.out[offset + i] = b;
        }
        Ok(())
    }
}

/// An unpacker that refuses everything.
#[derive(Debug)]
struct Refuses;

impl Unpack for Refuses {
    fn packed_size(&self) -> usize {
        1 << 20
    }
    fn unpack(&mut self, _: usize, _: &[u8]) -> ucp::Result<()> {
        Err(ucp::Error::new(Status::InvalidParam, "refused by the test"))
    }
}

fn done<T>(p: &Pair, what: &str, r: Issued<T>) -> ucp::Result<T> {
    match r {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            p.wait_for(what, || r.is_done());
            r.take().unwrap()
        }
    }
}

fn sent(p: &Pair, r: ucp::Result<Issued<()>>) {
    let r = r.unwrap_or_else(|e| panic!("[{}] send: {e}", p.name));
    done(p, "the send", r).unwrap_or_else(|e| panic!("[{}] send: {e}", p.name));
}

fn tag_datatypes(s: &Setup) {
    for rndv in ["auto", "4096"] {
        let Some(p) = s.with("RNDV_THRESH", rndv).pair_with(Features::TAG) else {
            return;
        };
        for (i, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, i);
            let what = format!("{n} B (rndv {rndv})");

            // iov -> iov, posted first.
            let r = p.b.tag_recv_iov(1, u64::MAX, recv_segments(n)).unwrap();
            sent(&p, p.ep.tag_send_iov(1, &thirds(&data)));
            let got = done(&p, "an iov receive", r).unwrap_or_else(|e| panic!("[{}] {what}: {e}", p.name));
            assert_eq!(got.length, n);
            let flat = got.data.concat();
            assert!(
                flat[..n] == data[..],
                "[{}] {what}: iov -> iov {:?} {:?}",
                p.name,
                &flat[..n.min(8)],
                &data[..n.min(8)]
            );
            assert!(
                flat[n..].iter().all(|&b| b == 0xee),
                "[{}] {what}: written past",
                p.name
            );

            // packed -> unpack, sent first (unexpected; a rendezvous send waits for the match).
            let s = p.ep.tag_send_packed(2, &mut Reversed(data.clone())).unwrap();
            p.wait_for("the message", || {
                p.b.tag_probe(2, u64::MAX, false).unwrap().is_some()
            });
            let r = p.b.tag_recv_unpack(2, u64::MAX, Unreverse::new(n + 3)).unwrap();
            let got = done(&p, "an unpack receive", r).unwrap_or_else(|e| panic!("[{}] {what}: {e}", p.name));
            done(&p, "the send", s).unwrap();
            assert_eq!(got.length, n);
            assert!(
                got.data.message(n) == data,
                "[{}] {what}: packed -> unpack",
                p.name
            );

            // iov -> contiguous, and packed -> iov.
            let r = p.b.tag_recv(3, u64::MAX, vec![0; n]).unwrap();
            sent(&p, p.ep.tag_send_iov(3, &thirds(&data)));
            assert!(
                done(&p, "a receive", r).unwrap().data == data,
                "[{}] {what}: iov -> contig",
                p.name
            );
            let r = p.b.tag_recv_iov(4, u64::MAX, recv_segments(n)).unwrap();
            sent(&p, p.ep.tag_send_packed(4, &mut Reversed(data.clone())));
            let flat = done(&p, "an iov receive", r).unwrap().data.concat();
            let back: Vec<u8> = flat[..n].iter().rev().copied().collect();
            assert!(back == data, "[{}] {what}: packed -> iov", p.name);

            // Too long for the segments; an unpacker that refuses.
            let r = p.b.tag_recv_iov(5, u64::MAX, vec![vec![0u8; n - 1]]).unwrap();
            let _ = p.ep.tag_send(5, &data).unwrap();
            let e = done(&p, "a truncated receive", r).expect_err("truncated");
            assert_eq!(e.status(), Status::MessageTruncated, "[{}] {what}: {e}", p.name);
            let r = p.b.tag_recv_unpack(6, u64::MAX, Refuses).unwrap();
            let _ = p.ep.tag_send(6, &data).unwrap();
            let e = done(&p, "a refused receive", r).expect_err("refused");
            assert_eq!(e.status(), Status::InvalidParam, "[{}] {what}: {e}", p.name);
        }
    }
}

fn am_datatypes(s: &Setup) {
    let Some(p) = s.pair() else { return };
    let plain = p.inbox(1);
    type Got = Rc<RefCell<Vec<Vec<u8>>>>;
    let got: Got = Rc::default();
    let g = got.clone();
    let w = p.b.downgrade();
    let name = p.name;
    let flip = Rc::new(std::cell::Cell::new(false));
    let f = flip.clone();
    p.b.set_am_handler_with(2, AmHandlerFlags::RNDV_DESC, move |m| {
        let Some(desc) = m.take_data_desc() else {
            g.borrow_mut().push(m.data().to_vec());
            return;
        };
        let (w, g, n) = (w.upgrade().unwrap(), g.clone(), desc.len());
        f.set(!f.get());
        if f.get() {
            w.am_recv_data_iov(desc, recv_segments(n))
                .unwrap_or_else(|e| panic!("[{name}] am_recv_data_iov: {e}"))
                .on_complete(move |r| g.borrow_mut().push(r.unwrap().concat()[..n].to_vec()));
        } else {
            w.am_recv_data_unpack(desc, Unreverse::new(n))
                .unwrap_or_else(|e| panic!("[{name}] am_recv_data_unpack: {e}"))
                .on_complete(move |r| {
                    // The sender did not reverse: un-reversing twice is the identity.
                    let m: Vec<u8> = r.unwrap().message(n).into_iter().rev().collect();
                    g.borrow_mut().push(m)
                });
        }
    })
    .unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        let data = pattern(n, i);
        for flags in [AmFlags::default(), AmFlags::RNDV] {
            sent(&p, p.ep.am_send_iov(1, b"h", &thirds(&data), flags));
            sent(
                &p,
                p.ep.am_send_packed(1, b"h", &mut Reversed(data.clone()), flags),
            );
            p.wait_for("the plain messages", || plain.borrow().len() == 2);
            let rev: Vec<u8> = data.iter().rev().copied().collect();
            let ms: Vec<_> = plain.borrow_mut().drain(..).collect();
            assert!(
                ms[0].1 == data && ms[1].1 == rev,
                "[{}] {n} B {flags:?}: am iov/packed",
                p.name
            );

            sent(&p, p.ep.am_send_iov(2, b"", &thirds(&data), flags));
            p.wait_for("the descriptor message", || got.borrow().len() == 1);
            let m = got.borrow_mut().pop().unwrap();
            assert!(m == data, "[{}] {n} B {flags:?}: into iov/unpack", p.name);
        }
    }
}

/// A stream's io-vector sends arrive as their concatenation, in order.
fn stream_iov(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM | Features::STREAM) else {
        return;
    };
    let rx = if p.a.id() == p.b.id() {
        p.ep.clone()
    } else {
        crate::stream::back_ep(&p)
    };
    let mut all = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let data = pattern(n, i);
        sent(&p, p.ep.stream_send_iov(&thirds(&data)));
        all.extend_from_slice(&data);
    }
    let r = rx.stream_recv(vec![0; all.len()], true).unwrap();
    let got = done(&p, "the stream", r).unwrap();
    assert!(got == all, "[{}] stream iov", p.name);
}

ucp_test!(tag_datatypes, am_datatypes, stream_iov);
