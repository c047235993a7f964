//! Callback queue: the worker's progress list (UCX `ucs_callbackq`).
//!
//! A [`CallbackQueue`] holds the progress callbacks of one worker.
//! [`dispatch`](CallbackQueue::dispatch) calls every callback once and returns the sum of their
//! results (the amount of work they did), so a worker's `progress()` is one `dispatch()`.
//!
//! # Threads
//! The queue belongs to one owner thread (it is `!Send`); `add`, `remove`, the one-shot calls and
//! `dispatch` are for that thread, and all of them may be called from inside a running callback.
//! Other threads use a [`CallbackQueueHandle`] (`Send + Sync`, from [`CallbackQueue::handle`]):
//! its `*_safe` calls queue the change under a mutex and raise a flag; the owner applies pending
//! changes at the start of its next `dispatch`, like UCX's spill/proxy path.
//!
//! # Fast path
//! With nothing added or removed, `dispatch` does no allocation, no lock and no system call: one
//! acquire load of the pending flag, then a loop over a `Vec` of boxed callbacks.
//!
//! # Removal semantics (our choice; UCX allows a removed callback to run once more)
//! * [`CallbackQueue::remove`] (owner thread): once it returns, the callback never runs again, even
//!   when called from inside a dispatch (the current invocation of the callback itself, if it is the
//!   one being removed, completes normally).
//! * [`CallbackQueueHandle::remove_safe`] (any thread): the callback does not run in any dispatch
//!   that starts after `remove_safe` returns; a dispatch already in progress may still run it once.
//!
//! # Interior mutability
//! State lives in a `RefCell` that is borrowed only inside short private helpers that never call
//! user code (callbacks are moved out of their slot while they run, and dropped only after the
//! borrow ends), so reentrant calls from callbacks can never hit a borrow panic. No `unsafe`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Identifies a callback added with `add` / `add_safe`. Ids are never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CallbackId(u64);

type Callback = Box<dyn FnMut() -> u32>;
type Oneshot = Box<dyn FnOnce()>;

/// A progress callback. `id == 0` marks a slot removed during a dispatch, compacted afterwards.
struct Slot {
    id: u64,
    cb: Option<Callback>,
}

struct OneshotEntry {
    key: u64,
    /// Order of addition; a dispatch runs only entries older than its start.
    seq: u64,
    cb: Oneshot,
}

#[derive(Default)]
struct Local {
    slots: Vec<Slot>,
    oneshots: VecDeque<OneshotEntry>,
    next_oneshot_seq: u64,
}

/// A change requested from another thread, applied by the owner at its next dispatch.
enum RemoteOp {
    Add(u64, Box<dyn FnMut() -> u32 + Send>),
    Remove(u64),
    AddOneshot(u64, Box<dyn FnOnce() + Send>),
    RemoveOneshot(u64),
}

struct Shared {
    /// Set after pushing to `ops`; the only thing `dispatch` reads when nothing changed.
    pending: AtomicBool,
    /// The owning queue is gone: `*_safe` calls drop their callback.
    closed: AtomicBool,
    next_id: AtomicU64,
    ops: Mutex<Vec<RemoteOp>>,
}

impl Shared {
    fn alloc_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn ops(&self) -> MutexGuard<'_, Vec<RemoteOp>> {
        // The lock is never held across user code, so poisoning cannot leave `ops` inconsistent.
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, op: RemoteOp) {
        if self.closed.load(Ordering::Acquire) {
            tracing::warn!("callback queue is destroyed; dropping a *_safe request (keep the queue alive)");
            return;
        }
        self.ops().push(op);
        self.pending.store(true, Ordering::Release);
    }
}

/// The owner-thread progress list. See the [module documentation](self).
pub struct CallbackQueue {
    local: RefCell<Local>,
    /// Nesting depth of `dispatch`; slots are only compacted at depth 0 so indices stay valid.
    depth: Cell<u32>,
    /// Some slot was tombstoned during a dispatch.
    compact: Cell<bool>,
    has_oneshots: Cell<bool>,
    shared: Arc<Shared>,
}

impl CallbackQueue {
    /// Creates an empty queue owned by the calling thread.
    pub fn new() -> Self {
        Self {
            local: RefCell::new(Local::default()),
            depth: Cell::new(0),
            compact: Cell::new(false),
            has_oneshots: Cell::new(false),
            shared: Arc::new(Shared {
                pending: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                ops: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A handle for adding and removing callbacks from other threads.
    pub fn handle(&self) -> CallbackQueueHandle {
        CallbackQueueHandle {
            shared: self.shared.clone(),
        }
    }

    /// Adds a progress callback; it returns how much work it did (summed by [`dispatch`]).
    /// Added during a dispatch, it first runs in the next dispatch.
    ///
    /// [`dispatch`]: Self::dispatch
    pub fn add(&self, cb: impl FnMut() -> u32 + 'static) -> CallbackId {
        let id = self.shared.alloc_id();
        self.push_slot(id, Box::new(cb));
        CallbackId(id)
    }

    fn push_slot(&self, id: u64, cb: Callback) {
        self.local.borrow_mut().slots.push(Slot { id, cb: Some(cb) });
    }

    /// Removes a callback; it never runs again after this returns. Returns `false` if `id` is not
    /// in the queue (already removed).
    pub fn remove(&self, id: CallbackId) -> bool {
        let (found, removed) = self.remove_local(id.0);
        drop(removed); // user Drop code runs with no borrow held
        if found {
            return true;
        }
        // Maybe added by `add_safe` and not applied yet.
        let removed = self.cancel_remote(|op| matches!(op, RemoteOp::Add(i, _) if *i == id.0));
        let found = !removed.is_empty();
        drop(removed);
        if !found {
            tracing::debug!(?id, "callbackq: remove of a callback that is not in the queue");
        }
        found
    }

    fn remove_local(&self, id: u64) -> (bool, Option<Callback>) {
        let mut local = self.local.borrow_mut();
        let Some(i) = local.slots.iter().position(|s| s.id == id) else {
            return (false, None);
        };
        if self.depth.get() > 0 {
            // A dispatch is iterating by index: tombstone now, compact when it ends.
            let slot = &mut local.slots[i];
            slot.id = 0;
            self.compact.set(true);
            (true, slot.cb.take())
        } else {
            (true, local.slots.remove(i).cb)
        }
    }

    /// Removes pending remote operations matching `pred`, returning them so the caller drops them
    /// outside the lock.
    fn cancel_remote(&self, pred: impl Fn(&RemoteOp) -> bool) -> Vec<RemoteOp> {
        if !self.shared.pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut ops = self.shared.ops();
        let (cancelled, kept) = std::mem::take(&mut *ops).into_iter().partition(pred);
        *ops = kept;
        cancelled
    }

    /// Adds a callback that runs once, at the next dispatch. One-shots run in the order they were
    /// added; one added while one-shots run waits for the following dispatch.
    pub fn add_oneshot(&self, key: u64, cb: impl FnOnce() + 'static) {
        self.push_oneshot(key, Box::new(cb));
    }

    fn push_oneshot(&self, key: u64, cb: Oneshot) {
        let mut local = self.local.borrow_mut();
        let seq = local.next_oneshot_seq;
        local.next_oneshot_seq += 1;
        local.oneshots.push_back(OneshotEntry { key, seq, cb });
        self.has_oneshots.set(true);
    }

    /// Removes every pending one-shot with `key` (also those added by `add_oneshot_safe` and not
    /// applied yet); returns how many were removed.
    pub fn remove_oneshot(&self, key: u64) -> usize {
        let removed: VecDeque<OneshotEntry> = {
            let mut local = self.local.borrow_mut();
            let all = std::mem::take(&mut local.oneshots);
            let (removed, kept) = all.into_iter().partition(|e| e.key == key);
            local.oneshots = kept;
            self.has_oneshots.set(!local.oneshots.is_empty());
            removed
        };
        let remote = self.cancel_remote(|op| matches!(op, RemoteOp::AddOneshot(k, _) if *k == key));
        removed.len() + remote.len()
    }

    /// Number of regular callbacks in the queue (not counting changes pending from other threads).
    pub fn len(&self) -> usize {
        self.local.borrow().slots.iter().filter(|s| s.id != 0).count()
    }

    /// Whether [`len`](Self::len) is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of one-shots waiting for the next dispatch.
    pub fn oneshot_len(&self) -> usize {
        self.local.borrow().oneshots.len()
    }

    /// Runs pending one-shots, then every callback once. Returns the sum of the callbacks' results
    /// plus one per one-shot run.
    #[inline]
    pub fn dispatch(&self) -> u32 {
        if self.shared.pending.load(Ordering::Acquire) {
            self.apply_remote();
        }
        let _depth = DepthGuard::enter(self);
        let mut count = 0u32;
        if self.has_oneshots.get() {
            count = self.run_oneshots();
        }
        // Callbacks added during this dispatch land beyond `n` and wait for the next one.
        let n = self.local.borrow().slots.len();
        for i in 0..n {
            if let Some((id, mut cb)) = self.take_slot(i) {
                count = count.wrapping_add(cb());
                self.restore_slot(i, id, cb);
            }
        }
        count
    }

    fn take_slot(&self, i: usize) -> Option<(u64, Callback)> {
        let mut local = self.local.borrow_mut();
        // In bounds: slots only shrink at depth 0, and we are inside a dispatch.
        let slot = &mut local.slots[i];
        slot.cb.take().map(|cb| (slot.id, cb))
    }

    fn restore_slot(&self, i: usize, id: u64, cb: Callback) {
        let leftover = {
            let mut local = self.local.borrow_mut();
            let slot = &mut local.slots[i];
            if slot.id == id {
                slot.cb = Some(cb);
                None
            } else {
                Some(cb) // removed while it ran
            }
        };
        drop(leftover);
    }

    fn run_oneshots(&self) -> u32 {
        let limit = self.local.borrow().next_oneshot_seq;
        let mut count = 0u32;
        loop {
            let next = {
                let mut local = self.local.borrow_mut();
                match local.oneshots.front() {
                    Some(e) if e.seq < limit => local.oneshots.pop_front(),
                    _ => None,
                }
            };
            let Some(entry) = next else { break };
            (entry.cb)();
            count = count.wrapping_add(1);
        }
        self.has_oneshots.set(!self.local.borrow().oneshots.is_empty());
        count
    }

    #[cold]
    fn apply_remote(&self) {
        self.shared.pending.store(false, Ordering::Relaxed);
        // The mutex orders this take after every push whose flag store we may have cleared.
        let ops = std::mem::take(&mut *self.shared.ops());
        for op in ops {
            match op {
                RemoteOp::Add(id, cb) => self.push_slot(id, cb),
                RemoteOp::Remove(id) => {
                    let (_, removed) = self.remove_local(id);
                    drop(removed);
                }
                RemoteOp::AddOneshot(key, cb) => self.push_oneshot(key, cb),
                RemoteOp::RemoveOneshot(key) => {
                    self.remove_oneshot(key);
                }
            }
        }
    }

    fn compact_slots(&self) {
        self.compact.set(false);
        // Tombstones hold no callback, so this drops no user code under the borrow.
        self.local.borrow_mut().slots.retain(|s| s.id != 0);
    }
}

impl Default for CallbackQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CallbackQueue {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        let ops = std::mem::take(&mut *self.shared.ops());
        drop(ops);
    }
}

impl fmt::Debug for CallbackQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackQueue")
            .field("len", &self.len())
            .field("oneshots", &self.oneshot_len())
            .finish()
    }
}

/// Tracks dispatch nesting; compacts tombstoned slots when the outermost dispatch ends (also on
/// unwind from a panicking callback, whose box is then lost and its slot stays empty until removed).
struct DepthGuard<'a>(&'a CallbackQueue);

impl<'a> DepthGuard<'a> {
    #[inline]
    fn enter(q: &'a CallbackQueue) -> Self {
        q.depth.set(q.depth.get() + 1);
        Self(q)
    }
}

impl Drop for DepthGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        let depth = self.0.depth.get() - 1;
        self.0.depth.set(depth);
        if depth == 0 && self.0.compact.get() {
            self.0.compact_slots();
        }
    }
}

/// Adds and removes callbacks of a [`CallbackQueue`] from any thread; changes are applied by the
/// owner at its next `dispatch`.
#[derive(Clone)]
pub struct CallbackQueueHandle {
    shared: Arc<Shared>,
}

impl CallbackQueueHandle {
    /// Adds a progress callback (see [`CallbackQueue::add`]); it first runs in a dispatch that
    /// starts after this returns.
    pub fn add_safe(&self, cb: impl FnMut() -> u32 + Send + 'static) -> CallbackId {
        let id = self.shared.alloc_id();
        self.shared.push(RemoteOp::Add(id, Box::new(cb)));
        CallbackId(id)
    }

    /// Removes a callback; it does not run in any dispatch that starts after this returns.
    pub fn remove_safe(&self, id: CallbackId) {
        self.shared.push(RemoteOp::Remove(id.0));
    }

    /// Adds a one-shot callback (see [`CallbackQueue::add_oneshot`]).
    pub fn add_oneshot_safe(&self, key: u64, cb: impl FnOnce() + Send + 'static) {
        self.shared.push(RemoteOp::AddOneshot(key, Box::new(cb)));
    }

    /// Removes all one-shots with `key` pending at the next dispatch, including those added by
    /// `add_oneshot_safe` before this call.
    pub fn remove_oneshot_safe(&self, key: u64) {
        self.shared.push(RemoteOp::RemoveOneshot(key));
    }
}

impl fmt::Debug for CallbackQueueHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackQueueHandle").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::{Rc, Weak};
    use std::sync::atomic::AtomicUsize;
    use std::thread;

    fn counter() -> (Rc<Cell<u32>>, impl FnMut() -> u32 + 'static) {
        let c = Rc::new(Cell::new(0));
        let c2 = c.clone();
        let cb = move || {
            c2.set(c2.get() + 1);
            1
        };
        (c, cb)
    }

    #[test]
    fn single() {
        let q = CallbackQueue::new();
        let (c, cb) = counter();
        let id = q.add(cb);
        assert_eq!(q.len(), 1);
        assert_eq!(q.dispatch(), 1);
        assert_eq!(c.get(), 1);
        assert!(q.remove(id));
        assert!(!q.remove(id), "second remove must report not found");
        assert_eq!(q.dispatch(), 0);
        assert_eq!(c.get(), 1);
        assert!(q.is_empty());
    }

    #[test]
    fn count() {
        let q = CallbackQueue::new();
        q.add(|| 3);
        q.add(|| 4);
        q.add(|| 0);
        assert_eq!(q.dispatch(), 7);
        assert_eq!(q.dispatch(), 7);
    }

    #[test]
    fn multi() {
        let q = CallbackQueue::new();
        let mut ids = Vec::new();
        let mut counters = Vec::new();
        for _ in 0..20 {
            let (c, cb) = counter();
            ids.push(q.add(cb));
            counters.push(c);
        }
        for _ in 0..5 {
            assert_eq!(q.dispatch(), 20);
        }
        for id in ids.iter().step_by(2) {
            assert!(q.remove(*id));
        }
        assert_eq!(q.len(), 10);
        assert_eq!(q.dispatch(), 10);
        for (i, c) in counters.iter().enumerate() {
            assert_eq!(c.get(), if i % 2 == 0 { 5 } else { 6 }, "callback {i}");
        }
    }

    /// A callback that removes itself (owner API) on its 3rd call never runs again.
    #[test]
    fn remove_self() {
        let q = Rc::new(CallbackQueue::new());
        let calls = Rc::new(Cell::new(0u32));
        let my_id = Rc::new(Cell::new(None));
        let (weak, c, idc) = (Rc::downgrade(&q), calls.clone(), my_id.clone());
        let id = q.add(move || {
            c.set(c.get() + 1);
            if c.get() == 3 {
                let q: Rc<CallbackQueue> = weak.upgrade().unwrap();
                assert!(q.remove(idc.get().unwrap()));
            }
            1
        });
        my_id.set(Some(id));
        let (other, other_cb) = counter();
        q.add(other_cb);
        for _ in 0..10 {
            q.dispatch();
        }
        assert_eq!(calls.get(), 3);
        assert_eq!(other.get(), 10, "removal must not disturb the other callback");
        assert_eq!(q.len(), 1);
    }

    /// Same through the handle: the removal applies at the next dispatch.
    #[test]
    fn remove_self_safe() {
        let q = CallbackQueue::new();
        let h = q.handle();
        let calls = Rc::new(Cell::new(0u32));
        let my_id = Rc::new(Cell::new(None));
        let (c, idc) = (calls.clone(), my_id.clone());
        let id = q.add(move || {
            c.set(c.get() + 1);
            if c.get() == 2 {
                h.remove_safe(idc.get().unwrap());
            }
            1
        });
        my_id.set(Some(id));
        for _ in 0..10 {
            q.dispatch();
        }
        assert_eq!(calls.get(), 2);
        assert!(q.is_empty());
    }

    /// A callback removes one that comes later in the list: it must not run in this dispatch.
    #[test]
    fn remove_another_during_dispatch() {
        let q = Rc::new(CallbackQueue::new());
        let victim = Rc::new(Cell::new(None));
        let (weak, v) = (Rc::downgrade(&q), victim.clone());
        q.add(move || {
            if let Some(id) = v.take() {
                weak.upgrade().unwrap().remove(id);
            }
            0
        });
        let (c, cb) = counter();
        victim.set(Some(q.add(cb)));
        q.dispatch();
        q.dispatch();
        assert_eq!(c.get(), 0);
        assert_eq!(q.len(), 1);
    }

    /// A callback adds another on its first call; the new one runs from the next dispatch.
    #[test]
    fn add_another() {
        let q = Rc::new(CallbackQueue::new());
        let (c, cb) = counter();
        let mut cb = Some(cb);
        let weak: Weak<CallbackQueue> = Rc::downgrade(&q);
        q.add(move || {
            if let Some(cb) = cb.take() {
                weak.upgrade().unwrap().add(cb);
            }
            0
        });
        assert_eq!(q.dispatch(), 0);
        assert_eq!(c.get(), 0);
        assert_eq!(q.len(), 2);
        assert_eq!(q.dispatch(), 1);
        assert_eq!(c.get(), 1);
    }

    /// A callback calling dispatch reentrantly: it is skipped in the nested dispatch, the others
    /// run, and nothing panics.
    #[test]
    fn nested_dispatch() {
        let q = Rc::new(CallbackQueue::new());
        let depth = Rc::new(Cell::new(0));
        let (weak, d) = (Rc::downgrade(&q), depth.clone());
        q.add(move || {
            d.set(d.get() + 1);
            let n = weak.upgrade().unwrap().dispatch();
            d.set(d.get() - 1);
            n
        });
        let (c, cb) = counter();
        q.add(cb);
        assert_eq!(q.dispatch(), 2);
        assert_eq!(c.get(), 2);
        assert_eq!(depth.get(), 0);
    }

    /// 4 threads add_safe / remove_safe while the owner dispatches.
    #[test]
    fn threads() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 200;
        let q = CallbackQueue::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let keep_runs = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (h, runs, done, keep_runs) = (q.handle(), runs.clone(), done.clone(), keep_runs.clone());
                thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        let r = runs.clone();
                        let id = h.add_safe(move || {
                            r.fetch_add(1, Ordering::Relaxed);
                            1
                        });
                        thread::yield_now();
                        h.remove_safe(id);
                    }
                    // One callback per thread stays.
                    h.add_safe(move || {
                        keep_runs.fetch_add(1, Ordering::Relaxed);
                        0
                    });
                    done.fetch_add(1, Ordering::Release);
                })
            })
            .collect();
        while done.load(Ordering::Acquire) < THREADS {
            q.dispatch();
        }
        workers.into_iter().for_each(|t| t.join().unwrap());
        q.dispatch(); // apply the last changes
        assert_eq!(q.len(), THREADS);
        let before = runs.load(Ordering::Relaxed);
        let kept_before = keep_runs.load(Ordering::Relaxed);
        assert_eq!(q.dispatch(), 0);
        assert_eq!(runs.load(Ordering::Relaxed), before, "a removed callback ran");
        assert_eq!(keep_runs.load(Ordering::Relaxed), kept_before + THREADS);
    }

    /// Owner `remove` of a callback whose `add_safe` was not applied yet.
    #[test]
    fn remove_pending_safe_add() {
        let q = CallbackQueue::new();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let id = q.handle().add_safe(move || {
            r.store(true, Ordering::Relaxed);
            1
        });
        assert!(q.remove(id));
        assert_eq!(q.dispatch(), 0);
        assert!(!ran.load(Ordering::Relaxed));
    }

    type Log = Rc<RefCell<Vec<u32>>>;

    fn recorder() -> (Log, impl Fn(u32) -> Box<dyn FnOnce()>) {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        (log, move |v| {
            let l = l.clone();
            Box::new(move || l.borrow_mut().push(v))
        })
    }

    #[test]
    fn oneshot_ordering() {
        let q = CallbackQueue::new();
        let (log, rec) = recorder();
        for v in 0..12u32 {
            q.add_oneshot(u64::from(v % 3), rec(v));
        }
        assert_eq!(q.oneshot_len(), 12);
        assert_eq!(q.dispatch(), 12);
        assert_eq!(*log.borrow(), (0..12).collect::<Vec<_>>());
        assert_eq!(q.dispatch(), 0, "one-shots must run only once");
        assert_eq!(q.oneshot_len(), 0);
    }

    /// A one-shot that re-adds itself runs once per dispatch, not in a loop.
    #[test]
    fn oneshot_add_recursive() {
        fn again(q: Weak<CallbackQueue>, n: Rc<Cell<u32>>) {
            n.set(n.get() + 1);
            if n.get() < 10 {
                let q2 = q.clone();
                q.upgrade().unwrap().add_oneshot(7, move || again(q2, n));
            }
        }
        let q = Rc::new(CallbackQueue::new());
        let n = Rc::new(Cell::new(0));
        let (weak, n2) = (Rc::downgrade(&q), n.clone());
        q.add_oneshot(7, move || again(weak, n2));
        for expect in 1..=10 {
            assert_eq!(q.dispatch(), 1);
            assert_eq!(n.get(), expect);
        }
        assert_eq!(q.dispatch(), 0);
        assert_eq!(n.get(), 10);
    }

    /// A one-shot removing its own key cancels the later one-shots of that key only.
    #[test]
    fn oneshot_remove_self() {
        let q = Rc::new(CallbackQueue::new());
        let (log, rec) = recorder();
        let weak = Rc::downgrade(&q);
        q.add_oneshot(1, rec(0));
        let first = rec(1);
        q.add_oneshot(1, move || {
            first();
            assert_eq!(weak.upgrade().unwrap().remove_oneshot(1), 1);
        });
        q.add_oneshot(1, rec(2));
        q.add_oneshot(2, rec(3));
        q.dispatch();
        assert_eq!(*log.borrow(), vec![0, 1, 3]);
    }

    #[test]
    fn oneshot_remove_another() {
        let q = Rc::new(CallbackQueue::new());
        let (log, rec) = recorder();
        let weak = Rc::downgrade(&q);
        let first = rec(0);
        q.add_oneshot(1, move || {
            first();
            weak.upgrade().unwrap().remove_oneshot(2);
        });
        q.add_oneshot(2, rec(1));
        q.add_oneshot(3, rec(2));
        q.add_oneshot(2, rec(3));
        q.dispatch();
        q.dispatch();
        assert_eq!(*log.borrow(), vec![0, 2]);
    }

    #[test]
    fn oneshot_remove_by_key() {
        let q = CallbackQueue::new();
        let (log, rec) = recorder();
        for v in 0..6u32 {
            q.add_oneshot(u64::from(v % 2), rec(v));
        }
        assert_eq!(q.remove_oneshot(0), 3);
        assert_eq!(q.remove_oneshot(0), 0);
        q.dispatch();
        assert_eq!(*log.borrow(), vec![1, 3, 5]);
    }

    #[test]
    fn oneshot_safe_from_threads() {
        let q = CallbackQueue::new();
        let hits = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (h, hits) = (q.handle(), hits.clone());
                thread::spawn(move || {
                    for _ in 0..100 {
                        let hits = hits.clone();
                        h.add_oneshot_safe(t, move || {
                            hits.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                    h.add_oneshot_safe(99, || panic!("removed one-shot ran"));
                    h.remove_oneshot_safe(99);
                })
            })
            .collect();
        for _ in 0..50 {
            q.dispatch();
        }
        workers.into_iter().for_each(|t| t.join().unwrap());
        q.dispatch();
        assert_eq!(hits.load(Ordering::Relaxed), 400);
        assert_eq!(q.dispatch(), 0);
    }

    #[test]
    fn handle_outlives_queue() {
        let q = CallbackQueue::new();
        let h = q.handle();
        drop(q);
        let id = h.add_safe(|| 1);
        h.remove_safe(id);
        h.add_oneshot_safe(1, || ());
    }

    #[test]
    fn handle_is_send_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<CallbackQueueHandle>();
    }
}
