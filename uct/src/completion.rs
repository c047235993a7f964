//! Completions: a counter of outstanding operations with first-error semantics
//! (`uct_completion_t`), made safe by ownership.
//!
//! The endpoint wrappers count operations automatically: each call that returns `InProgress`
//! adds one outstanding operation; the callback runs each time the count drops back to zero, with
//! the first error seen since the previous run (`Status::Ok` if none). Memory and result slots
//! used by the outstanding operations are kept alive by the completion until then, so buffers
//! can never be freed while a transport still reads or writes them.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell, UnsafeCell};
use std::rc::Rc;

use ucs::Status;

use crate::mem::Mem;
use uct_transport::abi::RawCompletion;

/// Something an outstanding operation needs alive (held, never read: dropping it releases it).
#[allow(dead_code)]
pub(crate) enum KeepAlive {
    Mem(Mem),
    Result(AtomicResult),
}

type CompCallback = Box<dyn FnMut(Status)>;

#[repr(C)]
pub(crate) struct CompInner {
    /// Must stay the first field: the transport's pointer is a pointer to the whole struct.
    raw: UnsafeCell<RawCompletion>,
    cb: RefCell<Option<CompCallback>>,
    keep: RefCell<Vec<KeepAlive>>,
    /// Keeps this completion alive while operations are outstanding, even if the user dropped it.
    self_ref: Cell<Option<Rc<CompInner>>>,
    fired: Cell<u64>,
    last: Cell<Status>,
}

/// A completion. Clones share the same counter.
#[derive(Clone)]
pub struct Completion {
    pub(crate) inner: Rc<CompInner>,
}

/// # Safety
/// Called only across the plugin boundary, with the handles and pointers that
/// `uct::abi`'s contract guarantees valid (see the module documentation).
unsafe extern "C" fn comp_func(raw: *mut RawCompletion) {
    // SAFETY: `raw` is the first field of a live `CompInner` (kept alive by `self_ref` while
    // operations are outstanding), so the cast recovers the struct.
    let inner = unsafe { &*(raw as *const CompInner) };
    inner.finish(true);
}

impl CompInner {
    fn raw(&self) -> *mut RawCompletion {
        self.raw.get()
    }

    /// Called when the count reached zero: releases kept objects, runs the callback (if
    /// `notify`), then drops the self-reference (which may free `self`: nothing runs after it).
    fn finish(&self, notify: bool) {
        // SAFETY: single-threaded; the transport is not touching the struct during this call.
        let status = unsafe {
            let st = Status::from_raw((*self.raw()).status);
            (*self.raw()).status = 0;
            st
        };
        self.keep.borrow_mut().clear();
        if notify {
            self.fired.set(self.fired.get() + 1);
            self.last.set(status);
            // Take the callback out while it runs, so it may use this completion again.
            let cb = self.cb.borrow_mut().take();
            if let Some(mut cb) = cb {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(status))).is_err() {
                    ucs::error!("panic in a completion callback (caught)");
                }
                let mut slot = self.cb.borrow_mut();
                if slot.is_none() {
                    *slot = Some(cb);
                }
            }
        }
        drop(self.self_ref.take());
    }
}

impl Completion {
    /// A completion that calls `cb` each time all its outstanding operations are done.
    pub fn new(cb: impl FnMut(Status) + 'static) -> Completion {
        Self::make(Some(Box::new(cb)))
    }

    /// A completion without callback: poll [`Completion::outstanding`] / [`Completion::fired`].
    pub fn counter() -> Completion {
        Self::make(None)
    }

    fn make(cb: Option<CompCallback>) -> Completion {
        Completion {
            inner: Rc::new(CompInner {
                raw: UnsafeCell::new(RawCompletion {
                    func: comp_func,
                    count: 0,
                    status: 0,
                }),
                cb: RefCell::new(cb),
                keep: RefCell::new(Vec::new()),
                self_ref: Cell::new(None),
                fired: Cell::new(0),
                last: Cell::new(Status::Ok),
            }),
        }
    }

    /// Operations started with this completion and not finished yet.
    pub fn outstanding(&self) -> i32 {
        // SAFETY: single-threaded read.
        unsafe { (*self.inner.raw()).count }
    }

    /// How many times the count dropped to zero.
    pub fn fired(&self) -> u64 {
        self.inner.fired.get()
    }

    /// The status passed to the last callback run.
    pub fn last_status(&self) -> Status {
        self.inner.last.get()
    }

    /// Before an operation: counts it and keeps `keep` alive until it finishes.
    pub(crate) fn arm(&self, keep: impl IntoIterator<Item = KeepAlive>) -> *mut RawCompletion {
        let raw = self.inner.raw();
        // SAFETY: single-threaded access to our own struct.
        unsafe {
            if (*raw).count == 0 {
                self.inner.self_ref.set(Some(self.inner.clone()));
            }
            (*raw).count += 1;
        }
        self.inner.keep.borrow_mut().extend(keep);
        raw
    }

    /// After an operation that did not return `InProgress`: it finished at once (or failed), so
    /// it is uncounted without a callback, as UCX leaves the completion untouched then.
    pub(crate) fn disarm(&self) {
        let raw = self.inner.raw();
        // SAFETY: single-threaded access to our own struct.
        let zero = unsafe {
            (*raw).count -= 1;
            (*raw).count == 0
        };
        if zero {
            self.inner.finish(false);
        }
    }
}

/// Where a fetching atomic stores the old value.
#[derive(Clone, Default)]
pub struct AtomicResult {
    pub(crate) slot: Rc<UnsafeCell<u64>>,
}

impl AtomicResult {
    /// A new slot holding 0.
    pub fn new() -> AtomicResult {
        AtomicResult::default()
    }

    /// The fetched value (meaningful once the operation completed).
    pub fn get(&self) -> u64 {
        // SAFETY: single-threaded; transports write it only during a call or a progress, never
        // concurrently with this read.
        unsafe { *self.slot.get() }
    }

    pub(crate) fn ptr(&self) -> *mut u64 {
        self.slot.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_transport::abi::completion_update;

    #[test]
    fn counts_and_fires_with_first_error() {
        let seen = Rc::new(Cell::new(None));
        let s = seen.clone();
        let c = Completion::new(move |st| s.set(Some(st)));
        let p1 = c.arm([]);
        let p2 = c.arm([]);
        assert_eq!(c.outstanding(), 2);
        // SAFETY: p1/p2 point to the live completion.
        unsafe { completion_update(p1, Status::Canceled) };
        assert_eq!(seen.get(), None);
        unsafe { completion_update(p2, Status::IoError) };
        assert_eq!(seen.get(), Some(Status::Canceled));
        assert_eq!(c.fired(), 1);
        assert_eq!(c.outstanding(), 0);
    }

    #[test]
    fn disarm_does_not_fire() {
        let c = Completion::counter();
        c.arm([]);
        c.disarm();
        assert_eq!(c.fired(), 0);
        assert_eq!(c.outstanding(), 0);
    }

    #[test]
    fn survives_user_drop_while_outstanding() {
        let fired = Rc::new(Cell::new(0));
        let f = fired.clone();
        let c = Completion::new(move |_| f.set(f.get() + 1));
        let p = c.arm([]);
        drop(c);
        // SAFETY: self_ref keeps the completion alive while outstanding.
        unsafe { completion_update(p, Status::Ok) };
        assert_eq!(fired.get(), 1);
    }
}
