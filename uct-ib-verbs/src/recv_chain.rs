//! A reusable chain of receive work requests, linked once (UCX keeps its iface's `rx.wrs` the
//! same way): a receive refill writes only the `wr_id` and SGE of the entries it posts,
//! instead of building a `MAX_RECV_BATCH` chain (kilobytes of arrays) on the stack each time.

use crate::error::{fail, rc_errno, CallKind};
use crate::wr::{RecvPostError, Sge, MAX_RECV_BATCH};
use rdma_sys::{ibv_recv_wr, ibv_sge};
use std::ptr::{null_mut, NonNull};

/// Up to `capacity` receive WRs with one or two SGEs each (fixed at creation), filled with
/// [`push`](Self::push) or [`push2`](Self::push2) and posted
/// by [`SharedReceiveQueue::post_chain`](super::SharedReceiveQueue::post_chain) or
/// [`QueuePair::post_recv_chain`](super::QueuePair::post_recv_chain).
pub struct RecvChain {
    /// `capacity` WRs; entry `i` points at its `per_wr` SGEs from `i * per_wr` on and (but
    /// the last) at WR `i + 1`.
    wrs: NonNull<ibv_recv_wr>,
    sges: NonNull<ibv_sge>,
    cap: usize,
    per_wr: usize,
    len: usize,
}

impl RecvChain {
    /// An empty chain of `capacity` entries (clamped to 1..=[`MAX_RECV_BATCH`]) of one SGE.
    pub fn new(capacity: usize) -> RecvChain {
        RecvChain::with_sges(capacity, 1)
    }

    /// An empty chain of `capacity` entries (clamped to 1..=[`MAX_RECV_BATCH`]) of `per_wr`
    /// SGEs each (clamped to 1..=2).
    pub fn with_sges(capacity: usize, per_wr: usize) -> RecvChain {
        let cap = capacity.clamp(1, MAX_RECV_BATCH);
        let per_wr = per_wr.clamp(1, 2);
        let sges: Box<[ibv_sge]> = vec![Sge::new(0, 0, 0).0; cap * per_wr].into_boxed_slice();
        let wr = ibv_recv_wr {
            wr_id: 0,
            next: null_mut(),
            sg_list: null_mut(),
            num_sge: per_wr as i32,
        };
        let wrs: Box<[ibv_recv_wr]> = vec![wr; cap].into_boxed_slice();
        // Both arrays are owned through raw pointers from here on (freed in Drop), so the
        // links below stay valid: nothing moves or reborrows them.
        let sges = NonNull::from(Box::leak(sges)).cast::<ibv_sge>();
        let wrs = NonNull::from(Box::leak(wrs)).cast::<ibv_recv_wr>();
        for i in 0..cap {
            // SAFETY: i < cap: WR i and SGEs i * per_wr.. are inside their arrays; i + 1 is
            // only linked when it is too.
            unsafe {
                let w = wrs.as_ptr().add(i);
                (*w).sg_list = sges.as_ptr().add(i * per_wr);
                (*w).next = if i + 1 < cap {
                    wrs.as_ptr().add(i + 1)
                } else {
                    null_mut()
                };
            }
        }
        RecvChain {
            wrs,
            sges,
            cap,
            per_wr,
            len: 0,
        }
    }

    /// SGEs per entry.
    pub fn sges_per_wr(&self) -> usize {
        self.per_wr
    }

    /// Entries it can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Entries filled since the last [`clear`](Self::clear).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the entries (the links stay).
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends a receive of `sge` returned with `wr_id` (a chain of one SGE per entry);
    /// `false` (nothing added) when full or the chain has two SGEs per entry.
    #[inline]
    pub fn push(&mut self, wr_id: u64, sge: Sge) -> bool {
        if self.len == self.cap || self.per_wr != 1 {
            return false;
        }
        // SAFETY: len < cap: entry `len` and its SGE are inside both arrays, which only this
        // chain uses.
        unsafe {
            (*self.wrs.as_ptr().add(self.len)).wr_id = wr_id;
            *self.sges.as_ptr().add(self.len) = sge.0;
        }
        self.len += 1;
        true
    }

    /// Appends a receive into `first`, then `rest`, returned with `wr_id` (a chain of two
    /// SGEs per entry); `false` (nothing added) when full or the chain has one SGE per entry.
    #[inline]
    pub fn push2(&mut self, wr_id: u64, first: Sge, rest: Sge) -> bool {
        if self.len == self.cap || self.per_wr != 2 {
            return false;
        }
        // SAFETY: len < cap: entry `len` and its two SGEs (2 * len, 2 * len + 1) are inside
        // both arrays, which only this chain uses.
        unsafe {
            (*self.wrs.as_ptr().add(self.len)).wr_id = wr_id;
            let s = self.sges.as_ptr().add(2 * self.len);
            *s = first.0;
            *s.add(1) = rest.0;
        }
        self.len += 1;
        true
    }

    /// The `wr_id` of entry `i` (`i < len`).
    pub fn wr_id(&self, i: usize) -> u64 {
        assert!(i < self.len, "entry {i} of a chain of {}", self.len);
        // SAFETY: i < len <= cap.
        unsafe { (*self.wrs.as_ptr().add(i)).wr_id }
    }

    /// The first SGE of entry `i` (`i < len`).
    pub fn sge(&self, i: usize) -> Sge {
        self.sge_at(i, 0)
    }

    /// SGE `k` of entry `i` (`i < len`, `k < sges_per_wr`).
    pub fn sge_at(&self, i: usize, k: usize) -> Sge {
        assert!(
            i < self.len && k < self.per_wr,
            "SGE {k} of entry {i} of a chain of {}",
            self.len
        );
        // SAFETY: i < len <= cap and k < per_wr.
        Sge(unsafe { *self.sges.as_ptr().add(i * self.per_wr + k) })
    }

    /// Hands the filled entries to `post` (an `ibv_post_*recv` call) as one list: the last
    /// filled entry ends the list for the call and is linked on again after it.
    pub(crate) fn post(
        &mut self,
        call: &str,
        post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
    ) -> Result<(), RecvPostError> {
        if self.len == 0 {
            return Ok(());
        }
        let base = self.wrs.as_ptr();
        // SAFETY: len - 1 < cap.
        let last = unsafe { base.add(self.len - 1) };
        // SAFETY: `last` is an entry of this chain; its `next` is restored below.
        let next = unsafe { std::mem::replace(&mut (*last).next, null_mut()) };
        let mut bad: *mut ibv_recv_wr = null_mut();
        let rc = post(base, &mut bad);
        // SAFETY: as above; the provider does not keep the WRs after the call.
        unsafe { (*last).next = next };
        if rc == 0 {
            return Ok(());
        }
        Err(recv_post_failed(call, base, bad, self.len, rc))
    }
}

/// The error of an `ibv_post_*recv` (`call`) of `n` chained WRs at `base` that returned `rc`:
/// the WRs before the one the provider stopped at (`bad`, null for none) are posted. Logged.
#[cold]
pub(crate) fn recv_post_failed(
    call: &str,
    base: *const ibv_recv_wr,
    bad: *const ibv_recv_wr,
    n: usize,
    rc: i32,
) -> RecvPostError {
    let idx = if bad.is_null() {
        0
    } else {
        (bad as usize - base as usize) / std::mem::size_of::<ibv_recv_wr>()
    };
    let error = fail(
        call,
        format_args!("wr #{idx} of {n}"),
        rc_errno(rc),
        CallKind::Post,
    );
    RecvPostError {
        posted: idx.min(n),
        error,
    }
}

impl Drop for RecvChain {
    fn drop(&mut self) {
        // SAFETY: both pointers come from `Box::leak` of boxed slices of `cap` WRs and
        // `cap * per_wr` SGEs in `with_sges`, and are freed once, here.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.wrs.as_ptr(),
                self.cap,
            )));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.sges.as_ptr(),
                self.cap * self.per_wr,
            )));
        }
    }
}

impl std::fmt::Debug for RecvChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvChain")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the list a provider would see and returns (wr_id, sge addr, length) per entry.
    fn walk(head: *mut ibv_recv_wr) -> Vec<(u64, u64, u32)> {
        let mut out = Vec::new();
        let mut w = head;
        while !w.is_null() {
            // SAFETY: the chain under test links only its own entries and ends with null.
            unsafe {
                assert_eq!((*w).num_sge, 1);
                let s = &*(*w).sg_list;
                out.push(((*w).wr_id, s.addr, s.length));
                w = (*w).next;
            }
        }
        out
    }

    #[test]
    fn posts_only_the_filled_entries_and_relinks() {
        let mut c = RecvChain::new(4);
        assert_eq!(c.capacity(), 4);
        assert_eq!(
            c.post("test", |_, _| panic!("an empty chain is not posted")),
            Ok(())
        );
        assert!(c.push(7, Sge::new(0x1000, 64, 1)));
        assert!(c.push(9, Sge::new(0x2000, 32, 1)));
        let seen = std::cell::RefCell::new(Vec::new());
        c.post("test", |head, _| {
            *seen.borrow_mut() = walk(head);
            0
        })
        .unwrap();
        assert_eq!(*seen.borrow(), vec![(7, 0x1000, 64), (9, 0x2000, 32)]);
        // refilled to capacity: the list runs through the entry that ended the last one
        c.clear();
        for i in 0..4 {
            assert!(c.push(i, Sge::new(i * 0x100, 8, 2)));
        }
        assert!(!c.push(99, Sge::new(0, 0, 0)), "full");
        c.post("test", |head, _| {
            *seen.borrow_mut() = walk(head);
            0
        })
        .unwrap();
        assert_eq!(
            seen.borrow().iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(c.wr_id(3), 3);
    }

    #[test]
    fn a_failed_post_reports_the_entry_the_provider_stopped_at() {
        let mut c = RecvChain::new(8);
        for i in 0..5 {
            c.push(100 + i, Sge::new(0, 8, 0));
        }
        let r = c.post("test", |head, bad| {
            // SAFETY: entry 3 exists in this 5-entry list.
            unsafe { *bad = (*(*(*head).next).next).next };
            libc_enomem()
        });
        assert_eq!(r.unwrap_err().posted, 3);
        assert_eq!(c.wr_id(3), 103);
    }

    #[test]
    fn two_sge_entries_point_at_their_own_pair() {
        let mut c = RecvChain::with_sges(3, 2);
        assert!(!c.push(1, Sge::new(0, 8, 0)), "one SGE into a two-SGE chain");
        for i in 0..3u64 {
            assert!(c.push2(i, Sge::new(0x100 * i, 64, 1), Sge::new(0x10000 * i, 4096, 2)));
        }
        assert!(!c.push2(9, Sge::new(0, 0, 0), Sge::new(0, 0, 0)), "full");
        let mut seen = Vec::new();
        c.post("test", |head, _| {
            let mut w = head;
            while !w.is_null() {
                // SAFETY: the chain links only its own entries and ends with null; each has
                // num_sge SGEs.
                unsafe {
                    let s = std::slice::from_raw_parts((*w).sg_list, (*w).num_sge as usize);
                    seen.push((
                        (*w).wr_id,
                        s.iter().map(|g| (g.addr, g.length, g.lkey)).collect::<Vec<_>>(),
                    ));
                    w = (*w).next;
                }
            }
            0
        })
        .unwrap();
        assert_eq!(seen.len(), 3);
        for (i, (id, sges)) in seen.iter().enumerate() {
            let i = i as u64;
            assert_eq!(*id, i);
            assert_eq!(sges, &vec![(0x100 * i, 64, 1), (0x10000 * i, 4096, 2)]);
        }
        assert_eq!(c.sge_at(2, 1).length(), 4096);
    }

    fn libc_enomem() -> i32 {
        12
    }
}
