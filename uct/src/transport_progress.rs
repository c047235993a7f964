//! The transports' progress functions, called straight from [`Worker::progress`]
//! (super::worker::Worker::progress): one indirect call each, as UCX's callbackq calls an
//! iface's progress. They used to sit in the general callback queue behind a boxed closure,
//! two indirect calls per progress; in the soft-RoCE VM, where every indirect branch is a
//! lookup of the emulator, that was a measurable part of rc_verbs' empty poll loop
//! (docs/benchmarks.md).
//!
//! Same rules as the callback queue: a function removed (also from inside a dispatch) never
//! runs again once `remove` returns; one that re-enters `progress` is not called recursively;
//! its argument is released after the last dispatch that could call it has ended.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::host::CbGuard;

struct Entry {
    id: u64,
    cb: CbGuard,
    running: Cell<bool>,
    removed: Cell<bool>,
}

/// A copy-on-write list: a dispatch iterates a snapshot, so adding or removing from inside a
/// progress function changes another copy.
pub(crate) struct TransportProgress {
    list: RefCell<Rc<Vec<Rc<Entry>>>>,
    next_id: Cell<u64>,
}

impl TransportProgress {
    pub fn new() -> TransportProgress {
        TransportProgress {
            list: RefCell::new(Rc::new(Vec::new())),
            next_id: Cell::new(0),
        }
    }

    /// Adds `cb`; returns its id.
    pub fn add(&self, cb: CbGuard) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let entry = Rc::new(Entry {
            id,
            cb,
            running: Cell::new(false),
            removed: Cell::new(false),
        });
        Rc::make_mut(&mut self.list.borrow_mut()).push(entry);
        id
    }

    /// Removes the function `id` (false if unknown).
    pub fn remove(&self, id: u64) -> bool {
        let removed = {
            let mut list = self.list.borrow_mut();
            let Some(pos) = list.iter().position(|e| e.id == id) else {
                return false;
            };
            let e = Rc::make_mut(&mut list).remove(pos);
            e.removed.set(true);
            e
        };
        // released here unless a dispatch still holds it (then when that dispatch ends)
        drop(removed);
        true
    }

    pub fn is_empty(&self) -> bool {
        self.list.borrow().is_empty()
    }

    /// Calls every function once; returns the sum of their results.
    #[inline(always)]
    pub fn dispatch(&self) -> u32 {
        let list = Rc::clone(&self.list.borrow());
        let mut n = 0u32;
        for e in list.iter() {
            if e.removed.get() || e.running.replace(true) {
                continue;
            }
            // The transport's side catches panics (it is an `extern "C"` function), so
            // `running` is always reset.
            n = n.wrapping_add(e.cb.call());
            e.running.set(false);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    //! Callbacks are C functions here, as transports register them: their argument indexes a
    //! thread-local table of behaviours, and the list under test is reached the same way.
    #![allow(unsafe_code)]

    use super::*;
    use std::ffi::c_void;
    use uct_transport::abi::RawCallback;

    #[derive(Default)]
    struct Slot {
        calls: Cell<u32>,
        released: Cell<bool>,
        /// Removes these ids when called.
        remove: RefCell<Vec<u64>>,
        /// Calls `dispatch` again from inside.
        reenter: Cell<bool>,
        /// Whether it saw itself released while running (must never happen).
        released_while_running: Cell<bool>,
    }

    thread_local! {
        static SLOTS: RefCell<Vec<Rc<Slot>>> = const { RefCell::new(Vec::new()) };
        static LIST: RefCell<Option<Rc<TransportProgress>>> = const { RefCell::new(None) };
    }

    fn slot(i: usize) -> Rc<Slot> {
        SLOTS.with(|s| s.borrow()[i].clone())
    }

    /// A transport's progress function: counts the call and does what its slot says.
    ///
    /// # Safety
    /// `arg` is an index into this thread's `SLOTS` (set up by `setup`).
    unsafe extern "C" fn call(arg: *mut c_void) -> u32 {
        let s = slot(arg as usize);
        s.calls.set(s.calls.get() + 1);
        if s.released.get() {
            s.released_while_running.set(true);
        }
        let list = LIST.with(|l| l.borrow().clone()).unwrap();
        for id in s.remove.borrow().iter() {
            list.remove(*id);
        }
        if s.reenter.get() {
            list.dispatch();
        }
        if s.released.get() {
            s.released_while_running.set(true);
        }
        1
    }

    /// A transport's release function: records that its argument was released.
    ///
    /// # Safety
    /// As for `call`.
    unsafe extern "C" fn release(arg: *mut c_void) {
        slot(arg as usize).released.set(true);
    }

    /// A list of `n` callbacks (ids 0..n, slots 0..n).
    fn setup(n: usize) -> Rc<TransportProgress> {
        SLOTS.with(|s| *s.borrow_mut() = (0..n).map(|_| Rc::new(Slot::default())).collect());
        let list = Rc::new(TransportProgress::new());
        LIST.with(|l| *l.borrow_mut() = Some(list.clone()));
        for i in 0..n {
            let id = list.add(CbGuard(RawCallback {
                func: call,
                arg: i as *mut c_void,
                drop_arg: Some(release),
            }));
            assert_eq!(id, i as u64);
        }
        list
    }

    #[test]
    fn calls_each_once_and_a_removed_one_never_again() {
        let list = setup(3);
        assert!(!list.is_empty());
        assert_eq!(list.dispatch(), 3);
        assert!(list.remove(1));
        assert!(slot(1).released.get(), "released at once outside a dispatch");
        assert!(!list.remove(1), "unknown id");
        assert_eq!(list.dispatch(), 2);
        assert_eq!(
            (slot(0).calls.get(), slot(1).calls.get(), slot(2).calls.get()),
            (2, 1, 2)
        );
        list.remove(0);
        list.remove(2);
        assert!(list.is_empty());
        assert_eq!(list.dispatch(), 0);
    }

    #[test]
    fn removal_from_inside_a_dispatch_takes_effect_at_once_and_releases_after_it() {
        let list = setup(3);
        // 0 removes itself and 2 (which comes later in the same dispatch)
        *slot(0).remove.borrow_mut() = vec![0, 2];
        assert_eq!(list.dispatch(), 2, "0 and 1 ran, 2 did not");
        assert_eq!(slot(2).calls.get(), 0);
        assert!(
            slot(0).released.get() && slot(2).released.get(),
            "released when the dispatch ended"
        );
        assert!(!slot(0).released_while_running.get());
        assert_eq!(list.dispatch(), 1);
        assert_eq!(slot(1).calls.get(), 2);
    }

    #[test]
    fn a_nested_dispatch_skips_the_running_callback() {
        let list = setup(2);
        slot(0).reenter.set(true);
        // outer: 0 (which runs the inner dispatch: 1 only), then 1 again
        assert_eq!(list.dispatch(), 2);
        assert_eq!((slot(0).calls.get(), slot(1).calls.get()), (1, 2));
        // a callback added from inside runs from the next dispatch on
        let id = list.add(CbGuard(RawCallback {
            func: call,
            arg: std::ptr::without_provenance_mut(1),
            drop_arg: None,
        }));
        assert_eq!(id, 2);
        slot(0).reenter.set(false);
        assert_eq!(list.dispatch(), 3);
    }
}
