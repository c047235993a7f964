use super::*;
use crate::iface_common::BUF_DATA_OFFSET;
use ucs::mpool::{HeapAllocator, MemPoolParams};
use ucs::Status;
use uct_ib_verbs::RX_HEAD;

fn heap_pool(n: usize) -> MemPool {
    let mut p = MemPoolParams::new("rx-test", BUF_DATA_OFFSET + 128);
    p.alignment = 64;
    p.max_elems = n;
    p.allocator = Some(Box::new(HeapAllocator));
    MemPool::new(p).unwrap()
}

#[test]
fn ring_refills_in_batches_and_finds_buffers_by_wr_id() {
    let ring = RxRing::new(heap_pool(100), 10, 4, BUF_DATA_OFFSET, 128).unwrap();
    let batches = RefCell::new(Vec::new());
    let n = ring
        .refill(|chain| {
            batches
                .borrow_mut()
                .push((0..chain.len()).map(|i| chain.wr_id(i)).collect::<Vec<_>>());
            assert_eq!(chain.capacity(), 4, "one batch per post");
            assert!((0..chain.len()).all(|i| chain.sge(i).length() == 128));
            Ok(())
        })
        .unwrap();
    assert_eq!(n, 10);
    assert_eq!(
        batches.borrow().iter().map(|b| b.len()).collect::<Vec<_>>(),
        vec![4, 4, 2]
    );
    assert!(!ring.needs_refill(false) && !ring.needs_refill(true));
    let first = batches.borrow()[0][0];
    let buf = ring.take_buf(first).unwrap();
    assert!(ring.take_buf(first).is_none(), "a wr_id completes once");
    assert!(ring.take_buf(999).is_none());
    drop(buf);
    for id in batches.borrow()[1].clone() {
        ring.take_buf(id).unwrap();
    }
    assert_eq!(ring.posted(), 5);
    // half this small ring missing: also a poll that delivered messages reposts
    assert!(ring.needs_refill(false) && ring.needs_refill(true));
    // a post that fails at once counts nothing and returns the buffers
    let fail_at = |posted| {
        move |_: &mut RecvChain| {
            Err(RecvPostError {
                posted,
                error: Status::NoResource.into(),
            })
        }
    };
    assert_eq!(ring.refill(fail_at(0)), Err(Status::NoResource.into()));
    assert_eq!(ring.posted(), 5);
    // one that fails part way counts the requests the provider took
    let taken = RefCell::new(Vec::new());
    let r = ring.refill(|chain| {
        taken.borrow_mut().extend((0..2).map(|i| chain.wr_id(i)));
        fail_at(2)(chain)
    });
    assert_eq!(r, Err(Status::NoResource.into()));
    assert_eq!(ring.posted(), 7);
    for id in taken.borrow().iter() {
        assert!(ring.take_buf(*id).is_some(), "a posted request keeps its buffer");
    }
    assert_eq!(ring.posted(), 5);
    assert_eq!(ring.refill(|_| Ok(())).unwrap(), 5);
    assert_eq!(ring.posted(), 10);
}

/// A poll that delivered messages leaves the repost to a poll that finds nothing until four
/// batches (at most half the ring) are missing.
#[test]
fn refill_after_deliveries_waits_for_four_batches() {
    let ring = RxRing::new(heap_pool(100), 64, 4, BUF_DATA_OFFSET, 128).unwrap();
    let ids = RefCell::new(Vec::new());
    ring.refill(|chain| {
        ids.borrow_mut().extend((0..chain.len()).map(|i| chain.wr_id(i)));
        Ok(())
    })
    .unwrap();
    let ids = ids.into_inner();
    for (taken, id) in ids.iter().enumerate() {
        let missing = taken;
        assert_eq!(
            ring.needs_refill(false),
            missing >= 4,
            "{missing} missing, idle poll"
        );
        assert_eq!(
            ring.needs_refill(true),
            missing >= 16,
            "{missing} missing, after deliveries"
        );
        if missing == 20 {
            break;
        }
        ring.take_buf(*id).unwrap();
    }
}

/// The posted ids come back oldest first; an out-of-order completion leaves the rest in
/// order, and the ring never holds more than its capacity.
#[test]
fn post_order_tracks_the_oldest_posted_id() {
    let mut o = PostOrder::new(4);
    assert_eq!(o.oldest(), None);
    assert!(!o.remove(7), "nothing posted");
    for id in [10, 11, 12, 13, 14] {
        o.push(id); // 14 does not fit
    }
    assert_eq!(o.oldest(), Some(10));
    o.remove(10);
    assert_eq!(o.oldest(), Some(11));
    o.remove(13); // out of order: 11 and 12 stay first, in order
    assert_eq!(o.oldest(), Some(11));
    assert!(!o.remove(99), "unknown");
    o.push(20); // wraps around
    let mut seen = Vec::new();
    while let Some(id) = o.oldest() {
        seen.push(id);
        o.remove(id);
    }
    assert_eq!(seen, vec![11, 12, 20]);
}

/// `touch_next` reads the oldest posted buffer once per completion and copes with an
/// empty ring.
#[test]
fn touch_next_follows_the_post_order() {
    let ring = RxRing::new(heap_pool(8), 4, 4, BUF_DATA_OFFSET, 128).unwrap();
    ring.touch_next(); // nothing posted
    let posted = RefCell::new(Vec::new());
    ring.refill(|chain| {
        posted
            .borrow_mut()
            .extend((0..chain.len()).map(|i| chain.wr_id(i)));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        ring.slots.borrow().order.oldest(),
        Some(posted.borrow()[0] as u32)
    );
    ring.touch_next();
    assert!(ring.warm.get());
    let first = posted.borrow()[0];
    drop(ring.take_buf(first).unwrap());
    assert!(!ring.warm.get(), "a completion makes the next buffer cold again");
    assert_eq!(
        ring.slots.borrow().order.oldest(),
        Some(posted.borrow()[1] as u32)
    );
    ring.touch_next();
    assert!(ring.warm.get());
}

fn heads(count: usize) -> RxHeads {
    let mut p = MemPoolParams::new("rx-heads-test", count * RX_HEAD);
    p.alignment = 64;
    p.max_elems = 1;
    p.allocator = Some(Box::new(HeapAllocator));
    RxHeads::new(MemPool::new(p).unwrap(), count).unwrap()
}

/// Four receives of 128 bytes (from [`BUF_DATA_OFFSET`]), each with a head slot.
fn ring_with_heads() -> RxRing {
    RxRing::new(heap_pool(8), 4, 4, BUF_DATA_OFFSET, 128)
        .unwrap()
        .with_heads(heads(4))
        .unwrap()
}

/// Writes `msg` where a device would: the head slot, then the rest of the buffer.
fn land(ring: &RxRing, id: u64, msg: &[u8]) {
    ring.heads.as_ref().unwrap().land(id as u32, msg);
    if msg.len() > RX_HEAD {
        let mut slots = ring.slots.borrow_mut();
        let buf = slots.bufs[id as usize].as_mut().unwrap();
        buf.write_at(BUF_DATA_OFFSET + RX_HEAD, &msg[RX_HEAD..]);
    }
}

/// With heads, each receive is two SGEs; a message that fits its slot comes back as a
/// copy and leaves its buffer in the ring for the next post, a longer one comes back in
/// its buffer, contiguous.
#[test]
fn heads_take_small_messages_out_of_the_slot() {
    let ring = ring_with_heads();
    assert_eq!(ring.head_size(), RX_HEAD);
    let posts = RefCell::new(Vec::new());
    let record = |chain: &mut RecvChain| {
        assert_eq!(chain.sges_per_wr(), 2);
        posts.borrow_mut().extend((0..chain.len()).map(|i| {
            let (h, rest) = (chain.sge_at(i, 0), chain.sge_at(i, 1));
            assert_eq!(
                (h.length(), rest.length()),
                (RX_HEAD as u32, 128 - RX_HEAD as u32)
            );
            (chain.wr_id(i), h.addr(), rest.addr())
        }));
        Ok(())
    };
    assert_eq!(ring.refill(record).unwrap(), 4);
    let first = posts.borrow().clone();
    let slot0 = heads_base(&first);
    for &(id, h, _) in &first {
        assert_eq!(h, slot0 + id * RX_HEAD as u64, "slot by wr_id");
    }
    let (small_id, _, small_rest) = first[0];
    land(&ring, small_id, b"hello");
    match ring.take(small_id, Some(5)) {
        Some(Received::Head(c)) => assert_eq!(c.bytes(), b"hello"),
        _ => panic!("a 5-byte message comes from its slot"),
    }
    assert!(ring.take(small_id, Some(5)).is_none(), "completes once");
    let long: Vec<u8> = (0..100u8).collect();
    let (long_id, _, _) = first[1];
    land(&ring, long_id, &long);
    match ring.take(long_id, Some(long.len())) {
        Some(Received::Buf(buf)) => assert_eq!(&buf[BUF_DATA_OFFSET..BUF_DATA_OFFSET + 100], &long[..]),
        _ => panic!("a 100-byte message comes in its buffer"),
    }
    // a failed receive gives its buffer back as it is
    assert!(matches!(ring.take(first[2].0, None), Some(Received::Buf(_))));
    assert_eq!(ring.posted(), 1);
    posts.borrow_mut().clear();
    assert_eq!(ring.refill(record).unwrap(), 3);
    let again = posts.borrow().clone();
    let reposted = again
        .iter()
        .find(|e| e.0 == small_id)
        .expect("the slot is posted again");
    assert_eq!(reposted.2, small_rest, "with the buffer it kept");
    assert!(
        RxRing::new(heap_pool(8), 8, 4, BUF_DATA_OFFSET, 128)
            .unwrap()
            .with_heads(heads(4))
            .is_err(),
        "a slot per receive"
    );
}

/// `with_head` hands a small message over in its slot, frees the slot only after the
/// closure (a refill inside it cannot post the slot again), and leaves everything else
/// (longer messages, unknown ids) to `take`.
#[test]
fn with_head_reads_small_messages_in_place() {
    let ring = ring_with_heads();
    let posts = RefCell::new(Vec::new());
    let record = |chain: &mut RecvChain| {
        posts
            .borrow_mut()
            .extend((0..chain.len()).map(|i| chain.wr_id(i)));
        Ok(())
    };
    assert_eq!(ring.refill(record).unwrap(), 4);
    let ids = posts.borrow().clone();
    land(&ring, ids[0], b"hello");
    let slot_addr = ring.heads.as_ref().unwrap().sge(ids[0] as u32).addr();
    let got = ring.with_head(ids[0], 5, |b| {
        assert_eq!(b.as_ptr() as u64, slot_addr, "in place, not a copy");
        assert_eq!(ring.posted(), 3);
        // a refill from inside (a handler that progresses) must not post the slot in use
        posts.borrow_mut().clear();
        assert_eq!(ring.refill(record).unwrap(), 0, "no free id yet");
        b.to_vec()
    });
    assert_eq!(got.as_deref(), Some(&b"hello"[..]));
    assert_eq!(ring.with_head(ids[0], 5, |_| ()), None, "completes once");
    assert!(ring.take(ids[0], Some(5)).is_none());
    assert_eq!(ring.refill(record).unwrap(), 1, "free after the closure");
    assert_eq!(posts.borrow().as_slice(), &[ids[0]]);
    // longer than a slot: not taken, `take` gets it
    land(&ring, ids[1], &[7u8; 100]);
    assert_eq!(ring.with_head(ids[1], 100, |_| ()), None);
    assert!(matches!(ring.take(ids[1], Some(100)), Some(Received::Buf(_))));
    assert_eq!(ring.with_head(99, 5, |_| ()), None, "an id never posted");
    // without heads there is no slot to read
    let plain = RxRing::new(heap_pool(8), 4, 4, BUF_DATA_OFFSET, 128).unwrap();
    assert_eq!(plain.refill(|_| Ok(())).unwrap(), 4);
    assert_eq!(plain.with_head(0, 5, |_| ()), None);
    assert_eq!(plain.posted(), 4);
}

fn heads_base(posts: &[(u64, u64, u64)]) -> u64 {
    posts
        .iter()
        .map(|&(id, h, _)| h - id * RX_HEAD as u64)
        .min()
        .unwrap()
}

#[test]
fn ring_stops_when_the_pool_is_empty() {
    let ring = RxRing::new(heap_pool(3), 10, 4, BUF_DATA_OFFSET, 128).unwrap();
    assert_eq!(ring.refill(|_| Ok(())).unwrap(), 3);
    assert!(
        RxRing::new(heap_pool(3), 10, 4, 0, 128).is_err(),
        "the SGE must not cover the header"
    );
}
