//! Datatypes beyond one contiguous buffer (UCX's `ucp_dt_make_iov` and `ucp_dt_make_generic`):
//! scatter-gather lists and the application's pack/unpack callbacks (MPI's derived datatypes).
//!
//! Sending: an io-vector ([`crate::Ep::tag_send_iov`], [`crate::Ep::am_send_iov`]) is gathered,
//! and a [`Pack`] packed, once, at the call, into one buffer the send owns; that buffer then
//! takes the protocol its length selects (short, bcopy, zero-copy, fragments, rendezvous) and
//! is read in place from there. Receiving: the message is scattered into the caller's lent
//! segments ([`crate::Worker::tag_recv_iov`]) or handed piece by piece to an [`Unpack`]
//! ([`crate::Worker::tag_recv_unpack`]) as it arrives: eager data and fragments directly, a
//! rendezvous message through the sender's DATA messages (a fetch by `get_zcopy` needs one
//! contiguous registered buffer).

use std::any::Any;

use ucs::{Error, Result, Status};
use uct::LentBytesMut;

/// The sending half of a generic datatype (UCX's `ucp_generic_dt_ops_t` `packed_size` and
/// `pack`): the application's layout, produced as contiguous packed bytes.
///
/// ```
/// /// Every other byte of `data`.
/// struct Strided<'a>(&'a [u8]);
///
/// impl ucp::Pack for Strided<'_> {
///     fn packed_size(&self) -> usize {
///         self.0.len().div_ceil(2)
///     }
///     fn pack(&mut self, offset: usize, dst: &mut [u8]) -> usize {
///         let src = self.0.iter().step_by(2).skip(offset);
///         dst.iter_mut().zip(src).map(|(d, s)| *d = *s).count()
///     }
/// }
///
/// let mut p = Strided(b"a-b-c");
/// let mut out = [0u8; 3];
/// assert_eq!(ucp::Pack::pack(&mut p, 0, &mut out), 3);
/// assert_eq!(&out, b"abc");
/// ```
pub trait Pack {
    /// The packed length in bytes.
    fn packed_size(&self) -> usize;
    /// Writes the packed bytes from `offset` on into `dst`, as many as fit; returns how many
    /// (fewer than `dst.len()` only at the end).
    fn pack(&mut self, offset: usize, dst: &mut [u8]) -> usize;
}

/// The receiving half of a generic datatype (UCX's `packed_size` and `unpack`): packed bytes
/// placed into the application's layout as they arrive.
pub trait Unpack: 'static {
    /// The most packed bytes it takes (a longer message fails with `MessageTruncated`).
    fn packed_size(&self) -> usize;
    /// Places `src`, the packed bytes from `offset` on. Every byte comes once; pieces may come
    /// in any order. An error fails the receive with it.
    fn unpack(&mut self, offset: usize, src: &[u8]) -> Result<()>;
}

/// `segments` gathered into one buffer.
pub(crate) fn gather(segments: &[&[u8]]) -> Result<Vec<u8>> {
    let n = segments.iter().map(|s| s.len()).sum();
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::new(
            Status::NoMemory,
            format!("ucp: no memory to gather {n} bytes"),
        ));
    }
    for s in segments {
        v.extend_from_slice(s);
    }
    Ok(v)
}

/// Everything `p` packs, in one buffer.
pub(crate) fn pack_all(p: &mut dyn Pack) -> Result<Vec<u8>> {
    let n = p.packed_size();
    if n > crate::am::MAX_MESSAGE as usize {
        return Err(Error::new(
            Status::ExceedsLimit,
            format!(
                "ucp: a {n}-byte packed message exceeds {}",
                crate::am::MAX_MESSAGE
            ),
        ));
    }
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::new(
            Status::NoMemory,
            format!("ucp: no memory to pack {n} bytes"),
        ));
    }
    v.resize(n, 0);
    let mut at = 0;
    while at < n {
        let k = p.pack(at, &mut v[at..]).min(n - at);
        if k == 0 {
            return Err(Error::new(
                Status::InvalidParam,
                format!("ucp: Pack::pack gave {at} of the {n} bytes packed_size promised"),
            ));
        }
        at += k;
    }
    Ok(v)
}

/// A lent scatter-gather list of any segment type.
pub(crate) trait IovSegments: 'static {
    fn count(&self) -> usize;
    fn segment(&mut self, i: usize) -> &mut [u8];
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<B: LentBytesMut> IovSegments for Vec<B> {
    fn count(&self) -> usize {
        self.len()
    }
    fn segment(&mut self, i: usize) -> &mut [u8] {
        self[i].lent_bytes_mut()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// An [`Unpack`] of any type.
pub(crate) trait ErasedUnpack: Unpack {
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<U: Unpack> ErasedUnpack for U {
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Total room of a scatter-gather list.
pub(crate) fn iov_room(segs: &mut dyn IovSegments) -> usize {
    (0..segs.count()).map(|i| segs.segment(i).len()).sum()
}

/// Calls `f(segment_part, from)` for each part of the segments that bytes `[offset, offset +
/// n)` of the message cover, `from` being the message offset the part starts at.
pub(crate) fn scatter(
    segs: &mut dyn IovSegments,
    offset: usize,
    n: usize,
    mut f: impl FnMut(&mut [u8], usize),
) {
    let end = offset + n;
    let mut start = 0;
    for i in 0..segs.count() {
        let seg = segs.segment(i);
        let seg_end = start + seg.len();
        if seg_end > offset && start < end {
            let from = offset.max(start);
            let to = end.min(seg_end);
            f(&mut seg[from - start..to - start], from);
        }
        start = seg_end;
        if start >= end {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Every2(Vec<u8>);
    impl Pack for Every2 {
        fn packed_size(&self) -> usize {
            self.0.len() / 2
        }
        fn pack(&mut self, offset: usize, dst: &mut [u8]) -> usize {
            // One byte per call: pack_all must loop.
            if let Some(d) = dst.first_mut() {
                *d = self.0[2 * offset];
                return 1;
            }
            0
        }
    }

    struct Short;
    impl Pack for Short {
        fn packed_size(&self) -> usize {
            4
        }
        fn pack(&mut self, offset: usize, dst: &mut [u8]) -> usize {
            if offset >= 2 {
                return 0;
            }
            dst[0] = 1;
            1
        }
    }

    #[test]
    fn pack_all_loops_and_refuses_a_short_packer() {
        assert_eq!(pack_all(&mut Every2(b"a.b.c.".to_vec())).unwrap(), b"abc");
        assert_eq!(pack_all(&mut Short).unwrap_err(), Status::InvalidParam);
        assert_eq!(gather(&[b"ab", b"", b"c"]).unwrap(), b"abc");
    }

    #[test]
    fn scatter_covers_segment_boundaries() {
        let mut segs: Vec<Vec<u8>> = vec![vec![0; 3], vec![], vec![0; 2], vec![0; 4]];
        assert_eq!(iov_room(&mut segs), 9);
        let msg = b"abcdefghi";
        for (off, n) in [(0, 9), (2, 3), (5, 4), (8, 1)] {
            scatter(&mut segs, off, n, |part, from| {
                part.copy_from_slice(&msg[from..from + part.len()])
            });
        }
        assert_eq!(segs.concat(), msg);
        let mut seen = Vec::new();
        scatter(&mut segs, 4, 10, |p, from| seen.push((from, p.len())));
        assert_eq!(seen, [(4, 1), (5, 4)]);
    }
}
