//! Receive-side reassembly of the tcp byte stream into handshake messages, frames and bulk data.
//!
//! The transport `recv()`s straight into [`RxParser::buf_mut`], reports the byte count with
//! [`RxParser::advance`], then drains [`RxParser::next_frame`] until it returns `None`
//! (trying [`RxParser::next_am`], the active-message fast path, before each). A
//! message may be split at any byte, including inside its header; each one is yielded once,
//! whole. The buffer (twice the largest frame) is allocated once, or lent by the owner while
//! the parser is idle ([`RxParser::take_buffer`] / [`RxParser::give_buffer`]); partial messages
//! are moved to its front when the tail runs short, so steady-state receiving allocates nothing.
//!
//! Large frames are read to their end and no further: once a frame's header says that more
//! than [`BOUNDED_MIN`] bytes of it are still to come, [`RxParser::buf_mut`] offers exactly the
//! rest, so the frame ends the buffer and the next read starts at its front, instead of leaving
//! a partial frame at the tail to be moved to the front (copied twice).
//! Likewise after a large bulk transfer (≥ [`BULK_LARGE`], received in place) the next read
//! takes only one fixed-size frame's worth ([`SMALL_READ`]): if that is the next PUT_REQ /
//! GET_REP, its bulk data then goes straight to its destination instead of through this
//! buffer.
//!
//! Bulk data after a PUT_REQ / GET_REP is handed out as [`Frame::Bulk`] chunks of whatever is
//! buffered; when nothing is buffered the transport may instead `recv()` up to
//! [`RxParser::bulk_direct_max`] bytes directly into the destination and report them with
//! [`RxParser::bulk_direct_done`], saving a copy for large transfers. Ignoring the chunks
//! discards the data (what a target does after a failed rkey check).

use ucs::Status;

use crate::wire::{
    decode_frame, decode_handshake, FrameHeader, Handshake, Msg, MsgType, WireError, AM_ID_MAX, FRAME_HDR_LEN,
};

/// One item out of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A complete frame.
    Msg(Msg<'a>),
    /// The next piece of the bulk data of the last PUT_REQ / GET_REP: `data` belongs at
    /// `offset` within it; `last` marks the final piece.
    Bulk { data: &'a [u8], offset: u64, last: bool },
}

/// A partial frame with at least this many bytes still to come is read to its end only.
pub const BOUNDED_MIN: usize = 16 * 1024;

/// Bulk transfers at least this long make the next read a small one ([`SMALL_READ`]).
pub const BULK_LARGE: u64 = 64 * 1024;

/// Size of the read after a large bulk transfer: a frame header and the largest fixed payload.
pub const SMALL_READ: usize = FRAME_HDR_LEN + MsgType::MAX_FIXED_PAYLOAD;

/// The reassembly state of one connection's receive direction.
pub struct RxParser {
    /// Empty while lent out (only when nothing is buffered), else `cap` bytes.
    buf: Box<[u8]>,
    cap: usize,
    /// Unparsed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    max_payload: u32,
    max_bulk: u64,
    /// The largest single item that must fit contiguously (frame or handshake message).
    max_item: usize,
    bulk_total: u64,
    bulk_done: u64,
    /// Total length of the partial frame at `start` once its header is in (0: unknown).
    want: usize,
    /// The last item was a large bulk transfer: read a small amount next (see the module docs).
    after_bulk: bool,
    /// Sticky: once the stream is broken every later call reports the same error.
    failed: Option<WireError>,
}

impl RxParser {
    /// A parser accepting AM payloads up to `max_payload` bytes (the value this side announces
    /// in its handshake). Allocates its buffer once.
    pub fn new(max_payload: u32) -> RxParser {
        let mut p = RxParser::without_buffer(max_payload);
        p.buf = vec![0u8; p.cap].into_boxed_slice();
        p
    }

    /// The same parser with its buffer still to come: lent ([`give_buffer`](Self::give_buffer))
    /// or allocated by the first [`buf_mut`](Self::buf_mut).
    pub fn without_buffer(max_payload: u32) -> RxParser {
        let frame = FRAME_HDR_LEN + (max_payload as usize).max(MsgType::MAX_FIXED_PAYLOAD);
        let max_item = frame.max(Handshake::MAX_LEN);
        RxParser {
            buf: Box::default(),
            cap: 2 * max_item,
            start: 0,
            end: 0,
            max_payload,
            max_bulk: u64::MAX,
            max_item,
            bulk_total: 0,
            bulk_done: 0,
            want: 0,
            after_bulk: false,
            failed: None,
        }
    }

    /// Changes the AM payload limit, keeping the unparsed bytes (a connection starts with a small
    /// handshake-phase parser and grows it once the handshake is done). Reallocates the buffer.
    /// With nothing buffered the new buffer is not allocated until needed (or given).
    pub fn set_max_payload(&mut self, max_payload: u32) {
        let frame = FRAME_HDR_LEN + (max_payload as usize).max(MsgType::MAX_FIXED_PAYLOAD);
        let max_item = frame.max(Handshake::MAX_LEN);
        let pending = &self.buf[self.start..self.end];
        self.cap = (2 * max_item).max(pending.len());
        if pending.is_empty() {
            self.buf = Box::default();
        } else {
            let mut buf = vec![0u8; self.cap].into_boxed_slice();
            buf[..pending.len()].copy_from_slice(pending);
            self.buf = buf;
        }
        self.end -= self.start;
        self.start = 0;
        self.max_payload = max_payload;
        self.max_item = max_item;
    }

    /// Nothing buffered, no bulk transfer or frame in progress, the buffer lent out, the
    /// stream not broken: the parser holds no state of its stream, so any other idle parser
    /// with the same limits can take its place.
    #[inline]
    pub fn is_blank(&self) -> bool {
        self.buf.is_empty()
            && self.start == self.end
            && self.bulk_total == self.bulk_done
            && self.want == 0
            && !self.after_bulk
            && self.failed.is_none()
    }

    /// True while the buffer is lent out (nothing is buffered): give one before receiving, or
    /// [`buf_mut`](Self::buf_mut) allocates it.
    #[inline]
    pub fn needs_buffer(&self) -> bool {
        self.buf.is_empty()
    }

    /// Lends `buf` (of [`capacity`](Self::capacity) bytes, contents unspecified) to a parser that
    /// [`needs_buffer`](Self::needs_buffer); any other buffer is ignored.
    #[inline]
    pub fn give_buffer(&mut self, buf: Box<[u8]>) {
        if self.buf.is_empty() && buf.len() == self.cap {
            self.buf = buf;
        }
    }

    /// Takes the buffer back when nothing is buffered (the parser keeps only its position in
    /// the stream); `None` while a partial item is held.
    #[inline]
    pub fn take_buffer(&mut self) -> Option<Box<[u8]>> {
        if self.start != self.end || self.buf.is_empty() {
            return None;
        }
        self.start = 0;
        self.end = 0;
        Some(std::mem::take(&mut self.buf))
    }

    /// Limits the bulk data length a PUT_REQ / GET_REP may announce (default: unlimited).
    pub fn with_max_bulk(mut self, max_bulk: u64) -> RxParser {
        self.max_bulk = max_bulk;
        self
    }

    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// Size of the buffer it receives into (fixed until [`set_max_payload`](Self::set_max_payload)).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Received bytes not yet handed out.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Bulk bytes of the current PUT_REQ / GET_REP not yet handed out or received directly.
    pub fn bulk_remaining(&self) -> u64 {
        self.bulk_total - self.bulk_done
    }

    /// The error that broke the stream, if any.
    pub fn error(&self) -> Option<WireError> {
        self.failed
    }

    /// Free space to `recv()` into; report what was written with [`advance`](Self::advance).
    /// Call after draining [`next_frame`](Self::next_frame): then it holds the rest of the
    /// partial frame (exactly that, when more than [`BOUNDED_MIN`] bytes of it are missing), or
    /// at least as much as the largest frame; never empty.
    #[inline]
    pub fn buf_mut(&mut self) -> &mut [u8] {
        // Everything handed out, no bulk data just ended: the whole buffer (the usual case).
        if self.start == self.end && !self.after_bulk && !self.buf.is_empty() {
            self.start = 0;
            self.end = 0;
            return &mut self.buf[..];
        }
        self.buf_mut_other()
    }

    /// `buf_mut` for a partial item, a bulk transfer just ended, or no buffer yet.
    #[inline(never)]
    fn buf_mut_other(&mut self) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0u8; self.cap].into_boxed_slice();
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.after_bulk {
                return &mut self.buf[..SMALL_READ.min(self.cap)];
            }
            return &mut self.buf[..];
        }
        let want = self.want;
        let fits = want != 0 && self.start + want <= self.buf.len();
        if !fits && self.start > 0 && self.buf.len() - self.end < self.max_item {
            // Move the partial item to the front; it is shorter than `max_item` once drained,
            // so this moves less than one item per `max_item` bytes received.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        // (A known frame fits now: want <= max_item <= half the buffer.)
        if want != 0 && self.start + want - self.end >= BOUNDED_MIN {
            let lim = self.start + want;
            return &mut self.buf[self.end..lim];
        }
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were written at the start of the last [`buf_mut`](Self::buf_mut).
    pub fn advance(&mut self, n: usize) {
        debug_assert!(n <= self.buf.len() - self.end, "advance past buf_mut()");
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Copies as much of `data` as fits (tests and fuzzing; the transport recv()s directly).
    pub fn feed(&mut self, data: &[u8]) -> usize {
        let room = self.buf_mut();
        let n = room.len().min(data.len());
        room[..n].copy_from_slice(&data[..n]);
        self.advance(n);
        n
    }

    /// The next handshake message, for a connection still in its handshake phase (frames sent
    /// right behind it stay buffered for [`next_frame`](Self::next_frame)). `None`: need more
    /// bytes.
    pub fn next_handshake(&mut self) -> Option<Result<Handshake, WireError>> {
        if let Some(e) = self.failed {
            return Some(Err(e));
        }
        match decode_handshake(&self.buf[self.start..self.end]) {
            Ok((h, used)) => {
                self.start += used;
                Some(Ok(h))
            }
            Err(WireError::Incomplete(_)) => None,
            Err(e) => self.fail(e),
        }
    }

    /// The next frame if it is a complete active message, as `(id, payload)`; `None` for
    /// anything else (bulk data due, another frame type, a partial or malformed frame, a broken
    /// stream), which [`next_frame`](Self::next_frame) then reports. The receive fast path:
    /// the frame header's checks (`FrameHeader::decode`) without building a `Msg`, whose
    /// result enums, moved through three calls, would cost more than the checks.
    #[inline(always)]
    pub fn next_am(&mut self) -> Option<(u8, &[u8])> {
        if self.failed.is_some() || self.bulk_done != self.bulk_total {
            return None;
        }
        let s = self.start;
        let h = FrameHeader::decode(&self.buf[s..self.end], self.max_payload).ok()?;
        let total = FRAME_HDR_LEN + h.len as usize;
        if h.ty >= AM_ID_MAX || self.end - s < total {
            return None;
        }
        self.start = s + total;
        self.bulk_total = 0;
        self.bulk_done = 0;
        self.want = 0;
        self.after_bulk = false;
        Some((h.ty, &self.buf[s + FRAME_HDR_LEN..s + total]))
    }

    /// The next complete frame or bulk chunk; `None`: need more bytes.
    pub fn next_frame(&mut self) -> Option<Result<Frame<'_>, WireError>> {
        if let Some(e) = self.failed {
            return Some(Err(e));
        }
        if self.bulk_done < self.bulk_total {
            let avail = self.end - self.start;
            if avail == 0 {
                return None;
            }
            let n = avail.min(usize::try_from(self.bulk_total - self.bulk_done).unwrap_or(usize::MAX));
            let (s, offset) = (self.start, self.bulk_done);
            self.start += n;
            self.bulk_done += n as u64;
            let last = self.bulk_done == self.bulk_total;
            self.after_bulk = last && self.bulk_total >= BULK_LARGE;
            return Some(Ok(Frame::Bulk {
                data: &self.buf[s..s + n],
                offset,
                last,
            }));
        }
        let s = self.start;
        if s == self.end {
            // Drained (the usual end of a receive): nothing to decode. `want` only matters
            // while a partial frame is buffered, and `buf_mut` ignores it when empty.
            return None;
        }
        match decode_frame(&self.buf[s..self.end], self.max_payload) {
            Ok((msg, used)) => {
                let bulk = msg.bulk_len();
                if bulk > self.max_bulk {
                    let e = WireError::LengthTooLarge {
                        what: "bulk data length",
                        len: bulk,
                        max: self.max_bulk,
                    };
                    self.failed = Some(e);
                    return Some(Err(e));
                }
                // (As in `next_am`; `msg` borrows the buffer, so no `&mut self` helper here.)
                self.start = s + used;
                self.bulk_total = bulk;
                self.bulk_done = 0;
                self.want = 0;
                self.after_bulk = false;
                Some(Ok(Frame::Msg(msg)))
            }
            Err(WireError::Incomplete(n)) => {
                self.want = n;
                None
            }
            Err(e) => {
                self.failed = Some(e);
                Some(Err(e))
            }
        }
    }

    /// How many bulk bytes the caller may now `recv()` directly into its destination: 0 while
    /// bulk bytes are still buffered (take those first via `next_frame`) or none is expected.
    pub fn bulk_direct_max(&self) -> u64 {
        if self.failed.is_some() || self.start != self.end {
            return 0;
        }
        self.bulk_remaining()
    }

    /// Records `n` bulk bytes received directly into the destination. Returns whether the bulk
    /// data is now complete. `InvalidParam` if `n` exceeds [`bulk_direct_max`](Self::bulk_direct_max).
    pub fn bulk_direct_done(&mut self, n: u64) -> Result<bool, Status> {
        if n > self.bulk_direct_max() {
            ucs::error!(
                n,
                allowed = self.bulk_direct_max(),
                "tcp rx: direct bulk receive beyond the allowed size; drain next_frame() first"
            );
            return Err(Status::InvalidParam);
        }
        self.bulk_done += n;
        let done = self.bulk_done == self.bulk_total;
        self.after_bulk = done && self.bulk_total >= BULK_LARGE;
        Ok(done)
    }

    fn fail<T>(&mut self, e: WireError) -> Option<Result<T, WireError>> {
        self.failed = Some(e);
        Some(Err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fuzz::{oracle, run_chunked, sample_stream, XorShift};
    use crate::wire::{encode_frame, ConnReq, ConnectMode, FrameHeader, HandshakeMsg, PutReq};

    const MAXP: u32 = 256;

    fn check_chunking(stream: &[u8], cuts: &[usize]) {
        let want = oracle(stream, MAXP);
        let mut p = RxParser::new(MAXP);
        let mut got = Vec::new();
        let mut prev = 0;
        for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
            let mut chunk = &stream[prev..c];
            while !chunk.is_empty() {
                let n = p.feed(chunk);
                chunk = &chunk[n..];
                crate::wire::fuzz::drain(&mut p, &mut got);
            }
            crate::wire::fuzz::drain(&mut p, &mut got);
            prev = c;
        }
        assert_eq!(crate::wire::fuzz::coalesce(got), want.0, "cuts {cuts:?}");
    }

    #[test]
    fn every_single_and_double_split_point() {
        let stream = sample_stream(1, 3);
        assert!(stream.len() < 400);
        for i in 0..=stream.len() {
            check_chunking(&stream, &[i]);
        }
        let small = &stream[..120];
        for i in 0..=small.len() {
            for j in i..=small.len() {
                check_chunking(small, &[i, j]);
            }
        }
    }

    #[test]
    fn random_chunkings_long_stream() {
        // Long enough (several buffer lengths, bulk larger than the buffer) to force compaction.
        let stream = sample_stream(40, 5000);
        let cap = RxParser::new(MAXP).capacity();
        assert!(stream.len() > 10 * cap);
        let want = oracle(&stream, MAXP);
        assert!(want.1.is_none());
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let seed = rng.next_u64();
            let got = run_chunked(&stream, MAXP, seed);
            assert_eq!(got, want, "seed {seed:#x}");
        }
    }

    #[test]
    fn next_am_takes_whole_ams_only_and_leaves_the_rest_to_next_frame() {
        let am = |id: u8, payload: &[u8]| {
            let m = Msg::Am { id, payload };
            let mut b = vec![0u8; m.encoded_len()];
            encode_frame(&m, &mut b).unwrap();
            b
        };
        let mut p = RxParser::new(MAXP);
        let a = am(3, b"abcdef");
        // Split inside the header, then inside the payload: nothing until it is whole.
        p.feed(&a[..5]);
        assert_eq!(p.next_am(), None);
        p.feed(&a[5..9]);
        assert_eq!(p.next_am(), None);
        assert_eq!(p.next_frame(), None);
        p.feed(&a[9..]);
        assert_eq!(p.next_am(), Some((3, &b"abcdef"[..])));
        assert_eq!(p.buffered(), 0);
        // Another frame type is next_frame's.
        let mut put = vec![0u8; 64];
        let req = PutReq {
            remote_addr: 1,
            rkey: 2,
            length: 3,
            seq: 4,
            ack_req: false,
        };
        let n = encode_frame(&Msg::PutReq(req), &mut put).unwrap();
        p.feed(&put[..n]);
        assert_eq!(p.next_am(), None);
        assert_eq!(p.next_frame(), Some(Ok(Frame::Msg(Msg::PutReq(req)))));
        // Its bulk data comes first, even when it looks like an AM.
        p.feed(&a[..3]);
        assert_eq!(p.next_am(), None);
        assert!(matches!(p.next_frame(), Some(Ok(Frame::Bulk { last: true, .. }))));
        p.feed(&a);
        assert_eq!(p.next_am(), Some((3, &b"abcdef"[..])));
        // A malformed AM header (reserved byte set) is refused by next_frame, not skipped.
        let mut bad = am(1, b"x");
        bad[2] = 1;
        p.feed(&bad);
        assert_eq!(p.next_am(), None);
        assert!(matches!(p.next_frame(), Some(Err(WireError::BadField { .. }))));
        p.feed(&am(1, b"y"));
        assert_eq!(p.next_am(), None, "a broken stream stays broken");
        // Too long for this side: refused the same way.
        let mut q = RxParser::new(MAXP);
        q.feed(&FrameHeader { ty: 2, len: MAXP + 1 }.encode());
        assert_eq!(q.next_am(), None);
        assert!(matches!(
            q.next_frame(),
            Some(Err(WireError::LengthTooLarge { .. }))
        ));
    }

    #[test]
    fn oversized_length_rejected_and_sticky() {
        let mut p = RxParser::new(MAXP);
        p.feed(&FrameHeader { ty: 5, len: MAXP + 1 }.encode());
        let e = p.next_frame().unwrap().unwrap_err();
        assert!(matches!(
            e,
            WireError::LengthTooLarge {
                len: 257,
                max: 256,
                ..
            }
        ));
        p.feed(&FrameHeader { ty: 5, len: 0 }.encode());
        assert_eq!(p.next_frame().unwrap().unwrap_err(), e);
        assert_eq!(p.error(), Some(e));
        // Detected from the header alone, before any payload arrives.
        let mut q = RxParser::new(MAXP).with_max_bulk(100);
        let mut b = [0u8; 64];
        let put = PutReq {
            remote_addr: 0,
            rkey: 0,
            length: 101,
            seq: 0,
            ack_req: false,
        };
        let n = encode_frame(&Msg::PutReq(put), &mut b).unwrap();
        q.feed(&b[..n]);
        assert!(matches!(
            q.next_frame(),
            Some(Err(WireError::LengthTooLarge { len: 101, .. }))
        ));
    }

    #[test]
    fn garbage_rejected() {
        let mut rng = XorShift::new(7);
        let mut rejected = 0;
        for _ in 0..500 {
            let mut g = [0u8; 64];
            g.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
            let mut p = RxParser::new(MAXP);
            p.feed(&g);
            let mut got = Vec::new();
            crate::wire::fuzz::drain(&mut p, &mut got);
            rejected += usize::from(p.error().is_some());
            let mut h = RxParser::new(MAXP);
            h.feed(&g);
            assert!(matches!(
                h.next_handshake(),
                Some(Err(WireError::BadMagic { .. }))
            ));
        }
        // Random headers almost always carry a bad type, reserved bytes or length.
        assert!(rejected > 450, "{rejected}");
    }

    #[test]
    fn handshake_then_frames_in_one_read() {
        let req = ConnReq {
            conn_sn: 1,
            src_ep_key: 2,
            mode: ConnectMode::ToEp { ep_key: 3 },
            listen_addr: "[::1]:4000".parse().unwrap(),
            max_payload: MAXP,
        };
        let mut bytes = req.encode().to_vec();
        bytes.extend_from_slice(&sample_stream(1, 3));
        let mut p = RxParser::new(MAXP);
        p.feed(&bytes[..10]);
        assert!(p.next_handshake().is_none());
        p.feed(&bytes[10..]);
        assert_eq!(p.next_handshake().unwrap().unwrap().msg, HandshakeMsg::Req(req));
        let mut got = Vec::new();
        crate::wire::fuzz::drain(&mut p, &mut got);
        assert_eq!(
            crate::wire::fuzz::coalesce(got),
            oracle(&sample_stream(1, 3), MAXP).0
        );
    }

    #[test]
    fn growing_keeps_unparsed_bytes() {
        let stream = sample_stream(1, 3);
        let mut p = RxParser::new(64);
        let small = p.capacity();
        p.feed(&stream[..5]);
        p.set_max_payload(4096);
        assert!(p.capacity() > small);
        assert_eq!(p.max_payload(), 4096);
        assert_eq!(p.buffered(), 5);
        let mut got = Vec::new();
        p.feed(&stream[5..]);
        crate::wire::fuzz::drain(&mut p, &mut got);
        assert_eq!(crate::wire::fuzz::coalesce(got), oracle(&stream, 4096).0);
    }

    /// A stream of AM frames with payloads of `sizes` bytes (byte `i` of frame `k` is `i ^ k`).
    fn am_stream(sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            out.extend_from_slice(&FrameHeader { ty: 3, len: n as u32 }.encode());
            out.extend((0..n).map(|i| (i ^ k) as u8));
        }
        out
    }

    #[test]
    fn large_frames_are_read_to_their_end() {
        const BIG: u32 = 65536;
        let stream = am_stream(&[40_000, 100, 65_536, 65_536, 8]);
        let mut p = RxParser::new(BIG);
        // A recv that ends inside the first frame: the next one is offered exactly its rest.
        assert_eq!(p.feed(&stream[..100]), 100);
        assert!(p.next_frame().is_none());
        assert_eq!(p.buf_mut().len(), FRAME_HDR_LEN + 40_000 - 100);
        // Fewer than BOUNDED_MIN bytes missing: the whole free space again.
        let upto = FRAME_HDR_LEN + 40_000 - BOUNDED_MIN / 2;
        assert_eq!(p.feed(&stream[100..upto]), upto - 100);
        assert!(p.next_frame().is_none());
        assert!(p.buf_mut().len() >= p.capacity() / 2);
        // The rest in chunks the size of a socket's: everything arrives whole and in order, and
        // no frame is ever split across the end of the buffer.
        let mut got = Vec::new();
        let mut pos = upto;
        while pos < stream.len() {
            let n = p.feed(&stream[pos..stream.len().min(pos + 37_000)]);
            assert!(n > 0);
            pos += n;
            crate::wire::fuzz::drain(&mut p, &mut got);
        }
        assert!(got == oracle(&stream, BIG).0, "frames differ from the oracle");
        assert_eq!(p.buffered(), 0);
    }

    #[test]
    fn random_chunkings_of_large_frames() {
        let mut rng = XorShift::new(0x5eed);
        let sizes: Vec<usize> = (0..40)
            .map(|_| match rng.below(3) {
                0 => rng.below(64),
                1 => rng.below(9000),
                _ => 16_000 + rng.below(49_537),
            })
            .collect();
        let stream = am_stream(&sizes);
        let want = oracle(&stream, 65536);
        assert_eq!(want.0.len(), sizes.len());
        for _ in 0..20 {
            let seed = rng.next_u64();
            assert!(run_chunked(&stream, 65536, seed) == want, "seed {seed:#x}");
        }
    }

    #[test]
    fn buffer_is_lent_only_while_idle() {
        let stream = sample_stream(1, 3);
        let mut p = RxParser::new(MAXP);
        p.feed(&stream[..5]);
        assert!(p.take_buffer().is_none(), "a partial item is buffered");
        assert!(!p.is_blank(), "a partial item is buffered");
        let mut got = Vec::new();
        p.feed(&stream[5..]);
        crate::wire::fuzz::drain(&mut p, &mut got);
        assert!(!p.is_blank(), "holds its buffer");
        let b = p.take_buffer().expect("idle");
        assert_eq!(b.len(), p.capacity());
        assert!(p.needs_buffer());
        assert!(
            p.is_blank(),
            "idle, buffer lent: interchangeable with any idle parser"
        );
        p.give_buffer(vec![0u8; 3].into_boxed_slice());
        assert!(p.needs_buffer(), "wrong size ignored");
        // Garbage left in a reused buffer does not matter.
        let mut b = b;
        b.fill(0xee);
        p.give_buffer(b);
        assert!(!p.needs_buffer());
        p.feed(&stream);
        crate::wire::fuzz::drain(&mut p, &mut got);
        let want = oracle(&stream, MAXP).0;
        assert_eq!(
            crate::wire::fuzz::coalesce(got),
            crate::wire::fuzz::coalesce([want.clone(), want].concat())
        );
        // Without a lent buffer the parser allocates its own.
        p.take_buffer().expect("idle");
        assert_eq!(p.feed(&stream), stream.len());
        // Growing while idle defers the allocation.
        let mut q = RxParser::new(64);
        q.set_max_payload(4096);
        assert!(q.needs_buffer());
        assert!(q.capacity() > 8192);
    }

    #[test]
    fn small_read_after_a_large_bulk_transfer() {
        let put = |len: u64| {
            let mut b = [0u8; 64];
            let req = PutReq {
                remote_addr: 0,
                rkey: 0,
                length: len,
                seq: 0,
                ack_req: true,
            };
            let n = encode_frame(&Msg::PutReq(req), &mut b).unwrap();
            b[..n].to_vec()
        };
        let mut p = RxParser::new(MAXP);
        let h = put(BULK_LARGE);
        p.feed(&h);
        assert!(matches!(p.next_frame(), Some(Ok(Frame::Msg(Msg::PutReq(_))))));
        assert_eq!(p.bulk_direct_done(BULK_LARGE), Ok(true));
        // The next read is small: the next request's header, not its data.
        assert_eq!(p.buf_mut().len(), SMALL_READ);
        let h2 = put(1000);
        assert!(h2.len() <= SMALL_READ);
        p.feed(&h2);
        assert!(matches!(p.next_frame(), Some(Ok(Frame::Msg(Msg::PutReq(_))))));
        // A small transfer (buffered here) does not change the read size.
        p.feed(&[1u8; 1000]);
        assert!(matches!(p.next_frame(), Some(Ok(Frame::Bulk { last: true, .. }))));
        assert_eq!(p.buf_mut().len(), p.capacity());
        // Nor does a large one delivered from the buffer up to its end... until it ends.
        p.feed(&h);
        assert!(matches!(p.next_frame(), Some(Ok(Frame::Msg(Msg::PutReq(_))))));
        p.feed(&[2u8; 100]);
        assert!(matches!(
            p.next_frame(),
            Some(Ok(Frame::Bulk { last: false, .. }))
        ));
        assert_eq!(p.bulk_direct_done(BULK_LARGE - 100), Ok(true));
        assert_eq!(p.buf_mut().len(), SMALL_READ);
    }

    #[test]
    fn direct_bulk_receive() {
        let mut b = [0u8; 64];
        let put = PutReq {
            remote_addr: 0,
            rkey: 0,
            length: 1000,
            seq: 0,
            ack_req: false,
        };
        let n = encode_frame(&Msg::PutReq(put), &mut b).unwrap();
        let mut p = RxParser::new(MAXP);
        p.feed(&b[..n]);
        p.feed(&[7u8; 10]);
        assert_eq!(p.bulk_direct_max(), 0);
        assert!(matches!(p.next_frame(), Some(Ok(Frame::Msg(Msg::PutReq(_))))));
        assert_eq!(p.bulk_direct_max(), 0, "10 bulk bytes are buffered");
        assert!(
            matches!(p.next_frame(), Some(Ok(Frame::Bulk { offset: 0, last: false, data })) if data.len() == 10)
        );
        assert_eq!(p.bulk_direct_max(), 990);
        assert_eq!(p.bulk_direct_done(991), Err(Status::InvalidParam));
        assert_eq!(p.bulk_direct_done(500), Ok(false));
        assert_eq!(p.bulk_direct_done(490), Ok(true));
        assert_eq!(p.bulk_remaining(), 0);
        p.feed(
            &FrameHeader {
                ty: MsgType::Fin as u8,
                len: 0,
            }
            .encode(),
        );
        assert_eq!(p.next_frame(), Some(Ok(Frame::Msg(Msg::Fin))));
        assert!(p.next_frame().is_none());
        assert!(p.buf_mut().len() >= p.capacity() / 2);
    }
}
