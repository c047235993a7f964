//! Tests of the callback queue.

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

/// One-shots added from other threads all run once. A one-shot removed from another thread
/// never runs in a dispatch that starts after the removal; one already taken by a dispatch under
/// way when `remove_oneshot_safe` is called may still run once (the documented race, as for
/// `remove_safe`), so the concurrent phase bounds it and the second phase checks it exactly.
#[test]
fn oneshot_safe_from_threads() {
    let q = CallbackQueue::new();
    let hits = Arc::new(AtomicUsize::new(0));
    let stray = Arc::new(AtomicUsize::new(0));
    let spawn_all = |removed_key: u64| -> Vec<thread::JoinHandle<()>> {
        (0..4)
            .map(|t| {
                let (h, hits, stray) = (q.handle(), hits.clone(), stray.clone());
                thread::spawn(move || {
                    for _ in 0..100 {
                        let hits = hits.clone();
                        h.add_oneshot_safe(t, move || {
                            hits.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                    h.add_oneshot_safe(removed_key, move || {
                        stray.fetch_add(1, Ordering::Relaxed);
                    });
                    h.remove_oneshot_safe(removed_key);
                })
            })
            .collect()
    };
    // Concurrent with dispatches.
    let workers = spawn_all(99);
    for _ in 0..50 {
        q.dispatch();
    }
    workers.into_iter().for_each(|t| t.join().unwrap());
    q.dispatch();
    assert_eq!(hits.load(Ordering::Relaxed), 400);
    let raced = stray.load(Ordering::Relaxed);
    assert!(raced <= 4, "a removed one-shot ran {raced} times for 4 removals");
    assert_eq!(q.dispatch(), 0);
    // Removed before any dispatch started: never runs.
    spawn_all(98).into_iter().for_each(|t| t.join().unwrap());
    q.dispatch();
    assert_eq!(hits.load(Ordering::Relaxed), 800);
    assert_eq!(
        stray.load(Ordering::Relaxed),
        raced,
        "a one-shot removed before the dispatch ran"
    );
    assert_eq!(q.dispatch(), 0);
}

/// Dropped when it can be: at once when removed idle, after its own call when it removes
/// itself.
#[test]
fn removed_callback_drop_time() {
    struct Flag(Rc<Cell<bool>>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let q = Rc::new(CallbackQueue::new());
    let dropped = Rc::new(Cell::new(false));
    let flag = Flag(dropped.clone());
    let id = q.add(move || {
        let _ = &flag;
        0
    });
    assert!(q.remove(id));
    assert!(dropped.get(), "an idle removed callback is dropped by remove");

    let dropped = Rc::new(Cell::new(false));
    let (flag, weak, seen) = (Flag(dropped.clone()), Rc::downgrade(&q), Rc::new(Cell::new(None)));
    let (seen2, d2) = (seen.clone(), dropped.clone());
    let id = q.add(move || {
        let _ = &flag;
        weak.upgrade().unwrap().remove(seen2.get().unwrap());
        assert!(!d2.get(), "dropped while running");
        1
    });
    seen.set(Some(id));
    assert_eq!(q.dispatch(), 1);
    assert!(
        dropped.get(),
        "a self-removed callback is dropped when the dispatch ends"
    );
    assert_eq!(q.dispatch(), 0);
}

/// A panicking callback unwinds out of dispatch and stays registered, the queue usable.
#[test]
fn panic_keeps_callback() {
    let q = CallbackQueue::new();
    let n = Rc::new(Cell::new(0));
    let n2 = n.clone();
    q.add(move || {
        n2.set(n2.get() + 1);
        if n2.get() == 1 {
            panic!("first call panics");
        }
        1
    });
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| q.dispatch()));
    assert!(r.is_err());
    assert_eq!(q.dispatch(), 1);
    assert_eq!(n.get(), 2);
}

/// The inline fast path is taken only when nothing is queued, and is left when work arrives.
#[test]
fn idle_flag() {
    let q = CallbackQueue::new();
    assert!(!q.is_active());
    q.add_oneshot(1, || ());
    assert!(q.is_active());
    assert_eq!(q.dispatch(), 1);
    assert!(!q.is_active());
    let id = q.add(|| 2);
    assert!(q.is_active());
    q.add_oneshot(1, || ());
    assert_eq!(q.dispatch(), 3);
    assert!(q.is_active());
    q.remove(id);
    assert!(!q.is_active());
    let h = q.handle();
    h.add_safe(|| 5);
    assert!(
        !q.is_active(),
        "remote additions are seen through the pending flag"
    );
    assert_eq!(q.dispatch(), 5);
    assert!(q.is_active());
}

/// `wake` leaves the fast path once and runs `dispatch_with`'s hook; a dispatch without a
/// wake-up skips it, busy (callbacks registered) or idle.
#[test]
fn wake_runs_hook() {
    let q = CallbackQueue::new();
    let hits = Cell::new(0);
    let hook = || {
        hits.set(hits.get() + 1);
        7
    };
    assert!(q.is_idle());
    q.handle().wake();
    assert!(!q.is_idle());
    assert_eq!(q.dispatch_with(hook), 7);
    assert_eq!(hits.get(), 1);
    assert!(q.is_idle(), "the wake-up is consumed by the dispatch");
    assert_eq!(q.dispatch(), 0);
    q.add(|| 1);
    assert_eq!(q.dispatch_with(hook), 1, "busy, not woken: no hook");
    assert_eq!(hits.get(), 1);
    q.handle().wake();
    assert_eq!(q.dispatch_with(hook), 8);
    assert_eq!(hits.get(), 2);
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
