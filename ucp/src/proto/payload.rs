//! What a send holds of its payload until it completes: its own copy of bytes the caller only
//! showed it, or the caller's buffer ([`uct::LentBytes`]: a `Vec`, an `Arc<[u8]>` sent many
//! times at once, ...), read in place and given back, as its own type, on completion.

use std::any::Any;

use ucs::{Error, Result, Status};
use uct::{LentBytes, Mem, MemAccess};

/// A lent buffer of any type, kept behind one pointer.
pub(crate) trait Lent: LentBytes {
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<B: LentBytes> Lent for B {
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A send's payload.
pub(crate) enum Held {
    /// Ours (a copy of borrowed bytes).
    Copy(Vec<u8>),
    /// The caller's.
    Lent(Box<dyn Lent>),
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Copy(v) => write!(f, "Held::Copy({} B)", v.len()),
            Held::Lent(b) => write!(f, "Held::Lent({} B)", b.lent_bytes().len()),
        }
    }
}

impl Held {
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        match self {
            Held::Copy(v) => v,
            Held::Lent(b) => b.lent_bytes(),
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Registered with `md` for reading in place (zero-copy, rendezvous); the payload back
    /// with the error when it cannot be.
    pub fn register(self, md: &uct::Md, access: MemAccess) -> std::result::Result<Mem, (Error, Held)> {
        match self {
            Held::Copy(v) => Mem::try_register(md, v, access).map_err(|(e, v)| (e, Held::Copy(v))),
            Held::Lent(b) => Mem::try_register_lent(md, b, access).map_err(|(e, b)| (e, Held::Lent(b))),
        }
    }

    /// The payload a registration held, once no operation uses it. Lent bytes that a peer
    /// may still reach (a deregistration that failed) stay registered for good; the caller
    /// gets an error instead of them.
    pub fn from_mem(m: Mem) -> Result<Held> {
        if !m.is_lent() {
            return Ok(Held::Copy(m.into_vec().unwrap_or_else(|m| m.to_vec())));
        }
        m.into_lent::<Box<dyn Lent>>().map(Held::Lent).map_err(|_| {
            Error::new(
                Status::Busy,
                "ucp: the lent buffer is still registered (a transfer from it did not end): kept",
            )
        })
    }

    /// The caller's buffer as the type it lent (a copy comes back as a `Vec<u8>`).
    pub fn into_typed<B: 'static>(self) -> Result<B> {
        let any: Box<dyn Any> = match self {
            Held::Lent(b) => b.into_any(),
            Held::Copy(v) => Box::new(v),
        };
        any.downcast::<B>()
            .map(|b| *b)
            .map_err(|_| Error::new(Status::NoResource, "ucp: the lent buffer was not kept"))
    }
}

/// A completion that gives the lent buffer back as a `B`.
pub(crate) fn give_back<B: 'static>(c: crate::request::Completer<B>) -> super::op::Done {
    super::op::Done::Back(Box::new(move |r: Result<Held>| {
        c.complete(r.and_then(Held::into_typed::<B>))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lent_buffer_comes_back_as_its_type() {
        let a: Arc<[u8]> = Arc::from(&b"shared"[..]);
        let h = Held::Lent(Box::new(a.clone()));
        assert_eq!(h.bytes(), b"shared");
        let back: Arc<[u8]> = h.into_typed().unwrap();
        assert!(Arc::ptr_eq(&back, &a));
        let v: Vec<u8> = Held::Copy(b"copy".to_vec()).into_typed().unwrap();
        assert_eq!(v, b"copy");
        assert!(Held::Copy(vec![1]).into_typed::<Arc<[u8]>>().is_err());
    }

    #[test]
    fn registered_and_back() {
        let ctx = uct::Context::builder()
            .builtin(uct_self::module())
            .plugins(false)
            .build();
        let (md, _) = ctx.find_resource("self", "memory0").unwrap();
        let a: Arc<[u8]> = Arc::from(vec![7u8; 100]);
        let m = Held::Lent(Box::new(a.clone()))
            .register(&md, MemAccess::LOCAL_READ | MemAccess::REMOTE_GET)
            .unwrap();
        assert_eq!(m.addr(), a.as_ptr() as u64);
        assert!(m.write(0, b"x").is_err(), "lent bytes are read-only");
        let back: Arc<[u8]> = Held::from_mem(m).unwrap().into_typed().unwrap();
        assert!(Arc::ptr_eq(&back, &a));
        // Write access is refused for lent bytes.
        assert!(Held::Lent(Box::new(a)).register(&md, MemAccess::ALL).is_err());
    }
}
