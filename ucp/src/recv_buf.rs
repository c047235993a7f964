//! Where received bytes go, for every receive path (eager, fragments, rendezvous by `get_zcopy`
//! or by the sender's DATA messages): a buffer the receive owns (a `Vec`, sized to the message
//! when it completes) or memory the application lends ([`uct::LentBytesMut`]: written in place,
//! never zeroed or reallocated, handed back whole with the bytes past the message untouched).

use std::any::Any;

use ucs::{Error, Result, Status};
use uct::{AmMessage, LentBytesMut};

use crate::datatype::{scatter, ErasedUnpack, IovSegments, Unpack};
use crate::request::{CompleterFrom, FromRecv};

/// A lent buffer of any type (erased so that one matcher and one rendezvous path hold them all).
pub(crate) trait ErasedLentMut: LentBytesMut {
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<B: LentBytesMut> ErasedLentMut for B {
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A receive's destination.
pub(crate) enum RecvBuf {
    /// The receive's own vector: it comes back cut (or, for `am_recv_data`, grown) to the
    /// message.
    Owned(Vec<u8>),
    /// A lent vector (kept apart so that erasing it needs no box).
    LentVec(Vec<u8>),
    /// Any other lent buffer.
    Lent(Box<dyn ErasedLentMut>),
    /// `len` bytes at `offset` of memory the worker mapped: written by copy (never through a
    /// reference, so several receives may target it at once), fetched into through its
    /// existing registrations.
    Mapped {
        mem: crate::rma::MemHandle,
        offset: usize,
        len: usize,
    },
    /// A lent scatter-gather list, filled in order (`room`: its total length).
    Iov { segs: Box<dyn IovSegments>, room: usize },
    /// A generic datatype's unpacker (`error`: the first its `unpack` returned).
    Unpack {
        u: Box<dyn ErasedUnpack>,
        room: usize,
        error: Option<Error>,
    },
}

impl RecvBuf {
    /// The application's buffer `b`, lent.
    pub fn lend<B: LentBytesMut>(b: B) -> RecvBuf {
        let mut slot = Some(b);
        if let Some(v) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Vec<u8>>>() {
            if let Some(v) = v.take() {
                return RecvBuf::LentVec(v);
            }
        }
        match slot {
            Some(b) => RecvBuf::Lent(Box::new(b)),
            None => RecvBuf::LentVec(Vec::new()),
        }
    }

    /// The application's scatter-gather list `segs`, lent.
    pub fn iov<B: LentBytesMut>(segs: Vec<B>) -> RecvBuf {
        let mut segs: Box<dyn IovSegments> = Box::new(segs);
        let room = crate::datatype::iov_room(&mut *segs);
        RecvBuf::Iov { segs, room }
    }

    /// The application's unpacker `u`.
    pub fn unpack<U: Unpack>(u: U) -> RecvBuf {
        let room = u.packed_size();
        RecvBuf::Unpack {
            u: Box::new(u),
            room,
            error: None,
        }
    }

    /// True where a fetch can write the bytes in place (one contiguous buffer).
    fn contiguous(&self) -> bool {
        !matches!(self, RecvBuf::Iov { .. } | RecvBuf::Unpack { .. })
    }

    /// The bytes a message may fill (`None` for mapped memory, written only by copy, and for
    /// the non-contiguous kinds).
    #[inline(always)]
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            RecvBuf::Owned(v) | RecvBuf::LentVec(v) => Some(v),
            RecvBuf::Lent(b) => Some(b.lent_bytes_mut()),
            RecvBuf::Mapped { .. } | RecvBuf::Iov { .. } | RecvBuf::Unpack { .. } => None,
        }
    }

    /// How many bytes fit.
    #[inline(always)]
    pub fn room(&mut self) -> usize {
        match self {
            RecvBuf::Mapped { len, .. } => *len,
            RecvBuf::Iov { room, .. } | RecvBuf::Unpack { room, .. } => *room,
            b => b.bytes_mut().map_or(0, |b| b.len()),
        }
    }

    /// Copies `bytes` to `offset`, never past the buffer.
    pub fn put(&mut self, offset: usize, bytes: &[u8]) {
        let room = self.room();
        if offset >= room {
            return;
        }
        let bytes = &bytes[..bytes.len().min(room - offset)];
        match self {
            RecvBuf::Mapped {
                mem, offset: base, ..
            } => {
                // In range: checked when the receive was posted.
                let _ = mem.write(*base + offset, bytes);
            }
            RecvBuf::Iov { segs, .. } => scatter(&mut **segs, offset, bytes.len(), |part, from| {
                part.copy_from_slice(&bytes[from - offset..from - offset + part.len()])
            }),
            RecvBuf::Unpack { u, error, .. } => {
                if error.is_none() {
                    if let Err(e) = u.unpack(offset, bytes) {
                        *error = Some(e.context_with("ucp: the receive's Unpack::unpack"));
                    }
                }
            }
            b => {
                if let Some(b) = b.bytes_mut() {
                    b[offset..offset + bytes.len()].copy_from_slice(bytes);
                }
            }
        }
    }

    /// Copies `m` from `at` on to `offset`, never past the buffer (the one copy of a message
    /// that may lie in shared memory).
    #[inline(always)]
    pub fn put_msg(&mut self, offset: usize, m: &AmMessage<'_>, at: usize) {
        let room = self.room();
        if offset >= room {
            return;
        }
        match self {
            RecvBuf::Mapped {
                mem, offset: base, ..
            } => mem.write_msg(*base + offset, m, at, room - offset),
            RecvBuf::Iov { segs, .. } => {
                let n = m.len().saturating_sub(at).min(room - offset);
                scatter(&mut **segs, offset, n, |part, from| {
                    m.copy_to(at + from - offset, part);
                })
            }
            RecvBuf::Unpack { .. } => {
                // The unpacker takes a slice: a message in shared memory is first copied into
                // the handler's reused staging buffer (`data`).
                let n = m.len().saturating_sub(at).min(room - offset);
                let d = m.data();
                self.put(offset, &d[at..at + n]);
            }
            b => {
                if let Some(b) = b.bytes_mut() {
                    m.copy_to(at, &mut b[offset..]);
                }
            }
        }
    }

    /// The buffer holding a `total`-byte message: an owned one cut to it; the error an
    /// unpacker returned, if it did.
    #[inline(always)]
    pub fn holding(mut self, total: usize) -> Result<RecvBuf> {
        match &mut self {
            RecvBuf::Owned(v) => v.truncate(total),
            RecvBuf::Unpack { error, .. } => {
                if let Some(e) = error.take() {
                    return Err(e);
                }
            }
            _ => {}
        }
        Ok(self)
    }

    /// The buffer back as the type it was given as.
    #[inline(always)]
    pub fn into_lent<B: 'static>(self) -> Result<B> {
        let back = match self {
            RecvBuf::Owned(v) | RecvBuf::LentVec(v) => {
                let mut slot = Some(v);
                (&mut slot as &mut dyn Any)
                    .downcast_mut::<Option<B>>()
                    .and_then(Option::take)
            }
            RecvBuf::Lent(b) => <dyn ErasedLentMut>::into_any(b).downcast::<B>().ok().map(|b| *b),
            RecvBuf::Iov { segs, .. } => segs.into_any().downcast::<B>().ok().map(|b| *b),
            RecvBuf::Unpack { u, .. } => <dyn ErasedUnpack>::into_any(u).downcast::<B>().ok().map(|b| *b),
            RecvBuf::Mapped { mem, .. } => {
                let mut slot = Some(mem);
                (&mut slot as &mut dyn Any)
                    .downcast_mut::<Option<B>>()
                    .and_then(Option::take)
            }
        };
        back.ok_or_else(|| {
            Error::new(
                Status::IoError,
                "ucp: internal error: a receive buffer came back as another type",
            )
        })
    }
}

/// `am_recv_data`'s value: the buffer, as the type it was given as.
impl<B: 'static> FromRecv<RecvBuf> for B {
    fn from_recv(b: RecvBuf) -> Result<B> {
        b.into_lent()
    }
}

/// A receive buffer registered for transports to write into (a rendezvous fetch).
pub(crate) struct RegisteredBuf {
    mem: uct::Mem,
    /// Where the buffer starts in `mem`.
    base: usize,
    kind: Kind,
}

/// How a registered buffer was given.
enum Kind {
    /// A vector, lent (`true`) or owned.
    Vec(bool),
    /// A boxed lent buffer.
    Lent,
    /// Mapped memory (already registered: nothing to undo).
    Mapped(crate::rma::MemHandle, usize),
}

impl RecvBuf {
    /// Registers the buffer with `md`; it comes back with the error when that fails.
    pub fn register(
        self,
        md: &uct::Md,
        access: uct::MemAccess,
    ) -> std::result::Result<RegisteredBuf, (Error, RecvBuf)> {
        let reg = |mem, kind| RegisteredBuf { mem, base: 0, kind };
        if !self.contiguous() {
            let e = Error::new(
                Status::Unsupported,
                "a non-contiguous receive is not fetched in place",
            );
            return Err((e, self));
        }
        match self {
            RecvBuf::Owned(v) => uct::Mem::try_register(md, v, access)
                .map(|mem| reg(mem, Kind::Vec(false)))
                .map_err(|(e, v)| (e, RecvBuf::Owned(v))),
            RecvBuf::LentVec(v) => uct::Mem::try_register(md, v, access)
                .map(|mem| reg(mem, Kind::Vec(true)))
                .map_err(|(e, v)| (e, RecvBuf::LentVec(v))),
            RecvBuf::Lent(b) => uct::Mem::try_register_lent_mut(md, b, access)
                .map(|mem| reg(mem, Kind::Lent))
                .map_err(|(e, b)| (e, RecvBuf::Lent(b))),
            RecvBuf::Mapped { mem, offset, len } => match mem.reg_on(md) {
                Some(m) => Ok(RegisteredBuf {
                    mem: m.clone(),
                    base: offset,
                    kind: Kind::Mapped(mem, len),
                }),
                None => {
                    let e = Error::new(
                        Status::Unsupported,
                        format!("the mapped memory is not registered on {}", md.name()),
                    );
                    Err((e, RecvBuf::Mapped { mem, offset, len }))
                }
            },
            other => Err((Error::new(Status::Unsupported, "not contiguous"), other)),
        }
    }
}

impl RegisteredBuf {
    /// The I/O-vector entry for `n` bytes at `offset` of the buffer.
    pub fn iov(&self, offset: usize, n: usize) -> Result<uct::MemIov> {
        self.mem.iov(self.base + offset, n)
    }

    /// The buffer back, deregistered. An owned vector that a transport may still reach comes
    /// back as a copy; lent memory in that state stays registered for good and the receive
    /// fails (it cannot be given back safely).
    pub fn unregister(self) -> Result<RecvBuf> {
        match self.kind {
            Kind::Mapped(mem, len) => Ok(RecvBuf::Mapped {
                mem,
                offset: self.base,
                len,
            }),
            Kind::Vec(lent) => {
                let v = self.mem.into_vec().unwrap_or_else(|m| m.to_vec());
                Ok(if lent {
                    RecvBuf::LentVec(v)
                } else {
                    RecvBuf::Owned(v)
                })
            }
            Kind::Lent => self
                .mem
                .into_lent::<Box<dyn ErasedLentMut>>()
                .map(RecvBuf::Lent)
                .map_err(|_| {
                    Error::new(
                        Status::IoError,
                        "ucp: the lent receive buffer could not be deregistered (a transfer may \
                         still reach it): it stays registered and is not given back",
                    )
                }),
        }
    }
}

/// What a tag receive produces, whatever its buffer: the sender's tag, the message's length
/// and the buffer.
pub(crate) struct Received {
    pub tag: u64,
    pub length: usize,
    pub buf: RecvBuf,
}

/// Whom a rendezvous receive completes: `am_recv_data`'s request (the buffer) or a tag
/// receive's (the buffer with its tag).
pub(crate) enum RecvDone {
    Data(CompleterFrom<RecvBuf>),
    Tag(u64, CompleterFrom<Received>),
}

impl RecvDone {
    /// Completes with `r`, a `length`-byte message's buffer.
    pub fn complete(self, r: Result<RecvBuf>, length: usize) {
        match self {
            RecvDone::Data(c) => c.complete(r.and_then(|b| b.holding(length))),
            RecvDone::Tag(tag, c) => c.complete(r.and_then(|b| {
                Ok(Received {
                    tag,
                    length,
                    buf: b.holding(length)?,
                })
            })),
        }
    }

    /// Fails the receive.
    pub fn fail(self, e: Error) {
        self.complete(Err(e), 0)
    }
}

/// A `total`-byte message for a `room`-byte lent buffer.
pub(crate) fn truncated(what: &str, total: usize, room: usize) -> Error {
    Error::new(
        Status::MessageTruncated,
        format!("ucp: a {total}-byte {what} for a {room}-byte receive buffer"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_buffers_come_back_as_given_and_untouched_past_the_message() {
        let mut v = RecvBuf::lend(vec![9u8; 8]);
        assert!(matches!(v, RecvBuf::LentVec(_)));
        v.put(2, b"abcdefghij");
        let v: Vec<u8> = v.holding(3).unwrap().into_lent().unwrap();
        assert_eq!(v, b"\x09\x09abcdef");

        let mut b = RecvBuf::lend(vec![1u8; 4].into_boxed_slice());
        assert!(matches!(b, RecvBuf::Lent(_)));
        assert_eq!(b.room(), 4);
        b.put(9, b"x"); // past the end: nothing written
        b.put(0, b"xy");
        assert!(RecvBuf::lend(vec![0u8; 1]).into_lent::<Box<[u8]>>().is_err());
        let b: Box<[u8]> = b.into_lent().unwrap();
        assert_eq!(&b[..], b"xy\x01\x01");
    }

    #[test]
    fn owned_buffers_are_cut_to_the_message() {
        let mut o = RecvBuf::Owned(vec![0u8; 8]);
        o.put(0, b"hey");
        let v: Vec<u8> = o.holding(3).unwrap().into_lent().unwrap();
        assert_eq!(v, b"hey");
    }
}
