//! Send and receive buffers, lent to a connection only while it uses them.
//!
//! A connection needs a send buffer while it packs a message or holds an unsent remainder, and a
//! receive buffer while a partial frame waits for its rest; an idle connection holds neither
//! (as UCX's tcp takes both from interface pools). So an idle endpoint costs about a kilobyte
//! instead of the ~140 KiB of its two full-size buffers. The pool keeps one buffer in a `Cell`
//! for the common case (one connection sending or receiving at a time: take and give back are
//! a few instructions) and a few spares behind it. The interface's only connection keeps its
//! buffers ([`Shared::lends_buffers`]): there is no one to lend them to, and the round trip
//! through the pool is on every message's path.

use std::cell::{Cell, RefCell};

pub struct BufPool {
    hot: Cell<Option<Box<[u8]>>>,
    spare: RefCell<Vec<Box<[u8]>>>,
    size: usize,
    keep: usize,
}

impl BufPool {
    /// A pool of `size`-byte buffers that keeps up to `keep` idle ones besides the hot one.
    pub fn new(size: usize, keep: usize) -> BufPool {
        BufPool {
            hot: Cell::new(None),
            spare: RefCell::new(Vec::new()),
            size,
            keep,
        }
    }

    /// Length of the buffers.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A buffer of [`size`](Self::size) bytes (contents unspecified).
    #[inline]
    pub fn take(&self) -> Box<[u8]> {
        match self.hot.take() {
            Some(b) => b,
            None => self.take_slow(),
        }
    }

    #[cold]
    fn take_slow(&self) -> Box<[u8]> {
        self.spare
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| vec![0u8; self.size].into_boxed_slice())
    }

    /// Returns a buffer; one of another size (or an empty one) is dropped.
    #[inline]
    pub fn give(&self, b: Box<[u8]>) {
        if b.len() != self.size {
            return;
        }
        if let Some(old) = self.hot.replace(Some(b)) {
            self.give_slow(old);
        }
    }

    #[cold]
    fn give_slow(&self, b: Box<[u8]>) {
        let mut s = self.spare.borrow_mut();
        if s.len() < self.keep {
            s.push(b);
        }
    }

    /// Idle buffers held (tests).
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        let hot = self.hot.take();
        let n = usize::from(hot.is_some()) + self.spare.borrow().len();
        self.hot.set(hot);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_and_bounds_idle_buffers() {
        let p = BufPool::new(100, 2);
        let a = p.take();
        assert_eq!(a.len(), 100);
        let ptr = a.as_ptr();
        p.give(a);
        let b = p.take();
        assert_eq!(b.as_ptr(), ptr, "the hot buffer comes back");
        let more: Vec<_> = (0..5).map(|_| p.take()).collect();
        p.give(b);
        for m in more {
            p.give(m);
        }
        assert_eq!(p.idle(), 3, "hot + keep");
        p.give(vec![0u8; 7].into_boxed_slice());
        p.give(Box::default());
        assert_eq!(p.idle(), 3, "wrong sizes are dropped");
    }
}

#[cfg(test)]
mod size_tests {
    /// What an idle connection holds besides its socket: its state (no buffers, `bufs.rs`;
    /// no zcopy entry array, `conn.rs`). ep-cost measures the whole endpoint.
    #[test]
    fn idle_connection_state_stays_small() {
        let conn = std::mem::size_of::<crate::conn::Conn>();
        let rx = std::mem::size_of::<crate::conn::Rx>();
        assert!(conn <= 384, "Conn is {conn} bytes");
        assert!(rx <= 256, "Rx is {rx} bytes");
    }
}

impl crate::iface::Shared {
    /// Whether an idle connection gives its buffers back to the pools: not while it is the
    /// interface's only one (it would get the same buffer back on its next message; keeping it
    /// takes the round trip through the pool off every message's path and holds no more memory
    /// than the pool would). A connection keeping them gives them back once it is idle with
    /// others present.
    #[inline]
    pub fn lends_buffers(&self) -> bool {
        self.conns.try_borrow().map_or(true, |c| c.len() > 1)
    }
}
