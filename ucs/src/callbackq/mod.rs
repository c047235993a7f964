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
//! With nothing added or removed, `dispatch` does no allocation, no lock and no system call. With
//! no callback and no one-shot it is one load and a branch, inlined into the caller (UCX's
//! empty-array loop). Otherwise it takes a reference-counted snapshot of the callback list and
//! calls each callback in place (no move in or out of its slot).
//!
//! # Removal semantics (our choice; UCX allows a removed callback to run once more)
//! * [`CallbackQueue::remove`] (owner thread): once it returns, the callback never runs again, even
//!   when called from inside a dispatch (the current invocation of the callback itself, if it is the
//!   one being removed, completes normally).
//! * [`CallbackQueueHandle::remove_safe`] (any thread): the callback does not run in any dispatch
//!   that starts after `remove_safe` returns; a dispatch already in progress may still run it once.
//!
//! # Interior mutability
//! The list is copy-on-write (`Rc<Vec<Rc<Entry>>>`): `add`/`remove` change a new copy when a
//! dispatch holds the old one, so a running dispatch never sees the list change under it. Each
//! callback sits in its own `RefCell`, borrowed only while it runs: a callback that re-enters
//! `dispatch` is skipped there rather than called recursively, and `remove` takes the callback
//! out of its cell unless it is the one running (that one is dropped when the last snapshot
//! holding it ends). User code is never called or dropped while a queue-level borrow is held.
//! No `unsafe`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Identifies a callback added with `add` / `add_safe`. Ids are never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CallbackId(u64);

const ACTIVE: u8 = 1;
const PENDING: u8 = 2;

type Callback = Box<dyn FnMut() -> u32>;
type Oneshot = Box<dyn FnOnce()>;

/// A progress callback; `cb` is `None` once removed.
struct Entry {
    id: u64,
    cb: RefCell<Option<Callback>>,
}

type List = Rc<Vec<Rc<Entry>>>;

/// An unlinked entry and its callback (if it was not running), dropped after the borrows end.
type Removed = (Rc<Entry>, Option<Callback>);

struct OneshotEntry {
    key: u64,
    /// Order of addition; a dispatch runs only entries older than its start.
    seq: u64,
    cb: Oneshot,
}

#[derive(Default)]
struct Oneshots {
    queue: VecDeque<OneshotEntry>,
    next_seq: u64,
}

/// A change requested from another thread, applied by the owner at its next dispatch.
enum RemoteOp {
    Add(u64, Box<dyn FnMut() -> u32 + Send>),
    Remove(u64),
    AddOneshot(u64, Box<dyn FnOnce() + Send>),
    RemoveOneshot(u64),
}

struct Shared {
    /// `ACTIVE` (the owner has callbacks or one-shots) | `PENDING` (another thread pushed to
    /// `ops` or woke the queue): one byte, the only thing an idle `dispatch` reads.
    state: AtomicU8,
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
            crate::warn!("callback queue is destroyed; dropping a *_safe request (keep the queue alive)");
            return;
        }
        self.ops().push(op);
        self.state.fetch_or(PENDING, Ordering::Release);
    }
}

/// The owner-thread progress list. See the [module documentation](self).
pub struct CallbackQueue {
    /// The callbacks, in order of addition (copy-on-write, see the module documentation).
    list: RefCell<List>,
    oneshots: RefCell<Oneshots>,
    has_oneshots: Cell<bool>,
    shared: Arc<Shared>,
}

impl CallbackQueue {
    /// Creates an empty queue owned by the calling thread.
    pub fn new() -> Self {
        Self {
            list: RefCell::new(Rc::new(Vec::new())),
            oneshots: RefCell::new(Oneshots::default()),
            has_oneshots: Cell::new(false),
            shared: Arc::new(Shared {
                state: AtomicU8::new(0),
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
        self.push_entry(id, Box::new(cb));
        CallbackId(id)
    }

    fn push_entry(&self, id: u64, cb: Callback) {
        let entry = Rc::new(Entry {
            id,
            cb: RefCell::new(Some(cb)),
        });
        // Copies the list if a dispatch holds it (that dispatch keeps iterating the old one).
        Rc::make_mut(&mut self.list.borrow_mut()).push(entry);
        self.update_active();
    }

    fn update_active(&self) {
        self.set_active(!self.list.borrow().is_empty() || self.has_oneshots.get());
    }

    fn set_active(&self, on: bool) {
        // Only the owner changes `ACTIVE`, so this load is current; it spares redundant RMWs.
        if self.is_active() != on {
            if on {
                self.shared.state.fetch_or(ACTIVE, Ordering::Relaxed);
            } else {
                self.shared.state.fetch_and(!ACTIVE, Ordering::Relaxed);
            }
        }
    }

    fn is_active(&self) -> bool {
        self.shared.state.load(Ordering::Relaxed) & ACTIVE != 0
    }

    #[inline]
    fn pending(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) & PENDING != 0
    }

    /// Removes a callback; it never runs again after this returns. Returns `false` if `id` is not
    /// in the queue (already removed).
    pub fn remove(&self, id: CallbackId) -> bool {
        if let Some(removed) = self.remove_local(id.0) {
            drop(removed); // user Drop code runs with no borrow held
            return true;
        }
        // Maybe added by `add_safe` and not applied yet.
        let removed = self.cancel_remote(|op| matches!(op, RemoteOp::Add(i, _) if *i == id.0));
        let found = !removed.is_empty();
        drop(removed);
        if !found {
            crate::debug!(?id, "callbackq: remove of a callback that is not in the queue");
        }
        found
    }

    /// Unlinks entry `id`; returns (if it was found) the entry and its callback to drop once no
    /// borrow is held. The callback stays in a running entry (its cell is borrowed) and goes
    /// with the last snapshot that holds it.
    fn remove_local(&self, id: u64) -> Option<Removed> {
        let entry = {
            let mut list = self.list.borrow_mut();
            let i = list.iter().position(|e| e.id == id)?;
            Rc::make_mut(&mut list).remove(i)
        };
        self.update_active();
        let cb = entry.cb.try_borrow_mut().ok().and_then(|mut c| c.take());
        Some((entry, cb))
    }

    /// Removes pending remote operations matching `pred`, returning them so the caller drops them
    /// outside the lock.
    fn cancel_remote(&self, pred: impl Fn(&RemoteOp) -> bool) -> Vec<RemoteOp> {
        if !self.pending() {
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
        let mut o = self.oneshots.borrow_mut();
        let seq = o.next_seq;
        o.next_seq += 1;
        o.queue.push_back(OneshotEntry { key, seq, cb });
        self.has_oneshots.set(true);
        self.set_active(true);
    }

    /// Removes every pending one-shot with `key` (also those added by `add_oneshot_safe` and not
    /// applied yet); returns how many were removed.
    pub fn remove_oneshot(&self, key: u64) -> usize {
        let removed: VecDeque<OneshotEntry> = {
            let mut o = self.oneshots.borrow_mut();
            let all = std::mem::take(&mut o.queue);
            let (removed, kept) = all.into_iter().partition(|e| e.key == key);
            o.queue = kept;
            self.has_oneshots.set(!o.queue.is_empty());
            removed
        };
        self.update_active();
        let remote = self.cancel_remote(|op| matches!(op, RemoteOp::AddOneshot(k, _) if *k == key));
        removed.len() + remote.len()
    }

    /// Number of regular callbacks in the queue (not counting changes pending from other threads).
    pub fn len(&self) -> usize {
        self.list.borrow().len()
    }

    /// Whether [`len`](Self::len) is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of one-shots waiting for the next dispatch.
    pub fn oneshot_len(&self) -> usize {
        self.oneshots.borrow().queue.len()
    }

    /// Runs pending one-shots, then every callback once. Returns the sum of the callbacks' results
    /// plus one per one-shot run.
    #[inline(always)]
    pub fn dispatch(&self) -> u32 {
        if self.is_idle() {
            0
        } else {
            self.dispatch_with(|| 0)
        }
    }

    /// True when a dispatch would do nothing: no callback, no one-shot, no change or wake-up
    /// from another thread (see [`CallbackQueueHandle::wake`]). One load of one byte.
    #[inline(always)]
    pub fn is_idle(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) == 0
    }

    /// A dispatch that, when it finds a wake-up or change from another thread, runs `on_wake`
    /// after taking them and before the one-shots and callbacks. A worker dispatches its async
    /// events there: the async thread wakes the queue after queueing one, and an event queued
    /// after the wake-up was taken wakes it again, so none is left behind; with no wake-up the
    /// busy path skips the look.
    pub fn dispatch_with(&self, on_wake: impl FnOnce() -> u32) -> u32 {
        let mut count = 0;
        if self.pending() {
            self.apply_remote();
            count = on_wake();
        }
        if self.has_oneshots.get() {
            count = count.wrapping_add(self.run_oneshots());
        }
        // A snapshot: callbacks added or removed from here on change another copy of the list.
        let list = self.list.borrow().clone();
        for e in list.iter() {
            // Borrowed: this callback is running further up the stack (nested dispatch).
            if let Ok(mut cb) = e.cb.try_borrow_mut() {
                if let Some(f) = cb.as_mut() {
                    count = count.wrapping_add(f());
                }
            }
        }
        count
    }

    fn run_oneshots(&self) -> u32 {
        let limit = self.oneshots.borrow().next_seq;
        let mut count = 0u32;
        loop {
            let next = {
                let mut o = self.oneshots.borrow_mut();
                match o.queue.front() {
                    Some(e) if e.seq < limit => o.queue.pop_front(),
                    _ => None,
                }
            };
            let Some(entry) = next else { break };
            (entry.cb)();
            count = count.wrapping_add(1);
        }
        self.has_oneshots.set(!self.oneshots.borrow().queue.is_empty());
        self.update_active();
        count
    }

    #[cold]
    fn apply_remote(&self) {
        self.shared.state.fetch_and(!PENDING, Ordering::Relaxed);
        // The mutex orders this take after every push whose flag store we may have cleared.
        let ops = std::mem::take(&mut *self.shared.ops());
        for op in ops {
            match op {
                RemoteOp::Add(id, cb) => self.push_entry(id, cb),
                RemoteOp::Remove(id) => drop(self.remove_local(id)),
                RemoteOp::AddOneshot(key, cb) => self.push_oneshot(key, cb),
                RemoteOp::RemoveOneshot(key) => {
                    self.remove_oneshot(key);
                }
            }
        }
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

    /// Makes the owner's next dispatch take its full path (and run `dispatch_with`'s `on_wake`)
    /// although nothing else changed: how a producer of work outside the queue, such as the
    /// async thread queueing events, gets an idle worker to look.
    #[inline]
    pub fn wake(&self) {
        self.shared.state.fetch_or(PENDING, Ordering::Release);
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
    /// `add_oneshot_safe` before this call. As for [`remove_safe`](Self::remove_safe), a dispatch
    /// already under way may still run one it has taken.
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
mod tests;
