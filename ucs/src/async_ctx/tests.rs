//! Async context tests. Intervals are short and deadlines generous: nothing asserts on timing.
#![allow(unsafe_code)] // BorrowedFd::borrow_raw on the context's event fd, to poll it

use super::*;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::{pipe, read, write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::OnceLock;

const DEADLINE: Duration = Duration::from_secs(5);

/// Dispatches until `done()` or the deadline; returns whether `done()` became true.
fn dispatch_until(ctx: &AsyncContext, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        ctx.dispatch();
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn readable(fd: BorrowedFd<'_>, timeout_ms: u16) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::from(timeout_ms)).unwrap() == 1
}

/// A pipe whose read end is drained by the returned handler, which counts its calls.
fn counting_pipe(calls: &Arc<AtomicUsize>) -> (RawFd, OwnedFd, impl FnMut(Events) + Send + 'static) {
    let (rd, wr) = pipe().unwrap();
    let raw = rd.as_raw_fd();
    let calls = calls.clone();
    let handler = move |ev: Events| {
        assert!(ev.contains(Events::READ), "got {ev:?}");
        let mut buf = [0u8; 64];
        read(rd.as_raw_fd(), &mut buf).unwrap();
        calls.fetch_add(1, Ordering::SeqCst);
    };
    (raw, wr, handler)
}

#[test]
fn timer_fires_repeatedly_on_dispatching_thread() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let me = std::thread::current().id();
    let calls = Arc::new(AtomicUsize::new(0));
    let wrong_thread = Arc::new(AtomicBool::new(false));
    let (c, w) = (calls.clone(), wrong_thread.clone());
    let id = ctx
        .add_timer(Duration::from_millis(1), move || {
            if std::thread::current().id() != me {
                w.store(true, Ordering::SeqCst);
            }
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    assert!(dispatch_until(&ctx, || calls.load(Ordering::SeqCst) >= 5));
    assert!(!wrong_thread.load(Ordering::SeqCst));
    ctx.remove_handler(id, true).unwrap();
    assert_eq!(ctx.num_handlers(), 0);
}

#[test]
fn fd_handler_gets_read_and_is_rearmed() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (rd, wr, handler) = counting_pipe(&calls);
    let id = ctx.add_fd_handler(rd, Events::READ, handler).unwrap();
    for round in 1..=3 {
        write(&wr, b"x").unwrap();
        assert!(
            dispatch_until(&ctx, || calls.load(Ordering::SeqCst) == round),
            "round {round}"
        );
    }
    ctx.remove_handler(id, true).unwrap();
}

/// A handler that leaves its fd readable is queued once while the owner is slow (not re-reported
/// in a loop), and reported again after it ran (not lost).
#[test]
fn level_triggered_fd_is_coalesced_not_lost() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let (rd, wr) = pipe().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let id = ctx
        .add_fd_handler(rd.as_raw_fd(), Events::READ, move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    write(&wr, b"x").unwrap();
    assert!(wait_until(|| ctx.queued_events() == 1));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(ctx.queued_events(), 1, "a disarmed fd must not be reported again");
    assert_eq!(ctx.dispatch(), 1);
    // Still readable, so re-arming reports it again.
    assert!(dispatch_until(&ctx, || calls.load(Ordering::SeqCst) >= 2));
    ctx.remove_handler(id, true).unwrap();
    drop(rd);
}

#[test]
fn handler_removes_itself() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let my_id = Arc::new(OnceLock::new());
    let (c, idc, ctx2) = (calls.clone(), my_id.clone(), ctx.clone());
    let id = ctx
        .add_timer(Duration::from_millis(1), move || {
            if c.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                // sync = true from inside the handler must not deadlock.
                ctx2.remove_handler(*idc.get().unwrap(), true).unwrap();
            }
        })
        .unwrap();
    my_id.set(id).unwrap();
    assert!(dispatch_until(&ctx, || calls.load(Ordering::SeqCst) >= 3));
    let stop = Instant::now() + Duration::from_millis(30);
    while Instant::now() < stop {
        ctx.dispatch();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(ctx.num_handlers(), 0);
    assert_eq!(ctx.remove_handler(id, false), Err(Status::NoElem.into()));
}

#[test]
fn add_and_remove_from_another_thread_while_owner_dispatches() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (ctx2, c, d) = (ctx.clone(), calls.clone(), done.clone());
    let other = std::thread::spawn(move || {
        for _ in 0..20 {
            let mut ids = Vec::new();
            for _ in 0..4 {
                let c = c.clone();
                ids.push(ctx2.add_timer(Duration::from_micros(100), move || {
                    c.fetch_add(1, Ordering::SeqCst);
                }));
            }
            std::thread::sleep(Duration::from_millis(1));
            // Make sure at least one tick got through before the first removal.
            assert!(wait_until(|| c.load(Ordering::SeqCst) > 0));
            for id in ids {
                ctx2.remove_handler(id.unwrap(), true).unwrap();
            }
        }
        d.store(true, Ordering::SeqCst);
    });
    while !done.load(Ordering::SeqCst) && !other.is_finished() {
        ctx.dispatch();
    }
    other.join().unwrap();
    assert_eq!(ctx.num_handlers(), 0);
    let before = calls.load(Ordering::SeqCst);
    assert!(before > 0, "timers added from another thread never ran");
    for _ in 0..100 {
        ctx.dispatch();
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(calls.load(Ordering::SeqCst), before, "a removed handler ran");
}

/// `remove_handler(sync)` from another thread returns only after the running call finished.
#[test]
fn sync_remove_waits_for_running_handler() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let running = Arc::new(AtomicBool::new(false));
    let r = running.clone();
    let id = ctx
        .add_timer(Duration::from_millis(1), move || {
            r.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            r.store(false, Ordering::SeqCst);
        })
        .unwrap();
    let (ctx2, r) = (ctx.clone(), running.clone());
    let remover = std::thread::spawn(move || {
        assert!(wait_until(|| r.load(Ordering::SeqCst)));
        ctx2.remove_handler(id, true).unwrap();
        assert!(
            !r.load(Ordering::SeqCst),
            "sync remove returned while the handler ran"
        );
    });
    while !remover.is_finished() {
        ctx.dispatch();
    }
    remover.join().unwrap();
}

#[test]
fn events_queued_while_owner_sleeps_are_all_delivered() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut pipes = Vec::new();
    for _ in 0..3 {
        let (rd, wr, handler) = counting_pipe(&calls);
        let id = ctx.add_fd_handler(rd, Events::READ, handler).unwrap();
        pipes.push((id, wr));
    }
    for (_, wr) in &pipes {
        write(wr, b"x").unwrap();
    }
    assert!(wait_until(|| ctx.queued_events() == 3));
    assert_eq!(ctx.dispatch(), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    for (id, _) in pipes {
        ctx.remove_handler(id, false).unwrap();
    }
}

#[test]
fn event_fd_readable_while_events_queued() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (rd, wr, handler) = counting_pipe(&calls);
    let id = ctx.add_fd_handler(rd, Events::READ, handler).unwrap();
    assert_eq!(ctx.arm(), Ok(()));
    assert!(!readable(ctx.event_fd(), 0));
    write(&wr, b"x").unwrap();
    assert!(
        readable(ctx.event_fd(), 5000),
        "event fd did not wake the sleeper"
    );
    assert_eq!(ctx.arm(), Err(Status::Busy.into()));
    assert_eq!(ctx.dispatch(), 1);
    assert_eq!(ctx.arm(), Ok(()));
    assert!(!readable(ctx.event_fd(), 0));
    ctx.remove_handler(id, true).unwrap();
}

/// A queue added as waker after events were queued is woken for them (a worker created over a
/// context that already has events must not leave them behind).
#[test]
fn late_waker_is_woken_for_queued_events() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (rd, wr, handler) = counting_pipe(&calls);
    let id = ctx.add_fd_handler(rd, Events::READ, handler).unwrap();
    write(&wr, b"x").unwrap();
    assert!(
        wait_until(|| ctx.queued_events() > 0),
        "the event was never queued"
    );
    let q = crate::callbackq::CallbackQueue::new();
    assert!(q.is_idle());
    ctx.add_waker(q.handle());
    assert!(!q.is_idle(), "queued events must wake a new waker");
    assert_eq!(q.dispatch_with(|| ctx.dispatch_queued() as u32), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    ctx.remove_handler(id, true).unwrap();
}

#[test]
fn poll_mode_works_without_a_thread() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    assert_eq!(ctx.dispatch(), 0);
    let calls = Arc::new(AtomicUsize::new(0));
    let (rd, wr, handler) = counting_pipe(&calls);
    let fd_id = ctx.add_fd_handler(rd, Events::READ, handler).unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = ticks.clone();
    let timer_id = ctx
        .add_timer(Duration::from_millis(1), move || {
            t.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    write(&wr, b"x").unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(
        ctx.queued_events(),
        0,
        "poll mode must not detect events in the background"
    );
    assert!(dispatch_until(&ctx, || calls.load(Ordering::SeqCst) == 1
        && ticks.load(Ordering::SeqCst) >= 3));
    write(&wr, b"x").unwrap();
    assert!(
        dispatch_until(&ctx, || calls.load(Ordering::SeqCst) == 2),
        "fd not re-armed"
    );
    ctx.remove_handler(fd_id, true).unwrap();
    ctx.remove_handler(timer_id, true).unwrap();
    assert_eq!(ctx.dispatch(), 0);
}

#[test]
fn modify_fd_handler_changes_interest() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (rd, wr, handler) = counting_pipe(&calls);
    let id = ctx.add_fd_handler(rd, Events::NONE, handler).unwrap();
    write(&wr, b"x").unwrap();
    for _ in 0..10 {
        ctx.dispatch();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no interest, no call");
    ctx.modify_fd_handler(id, Events::READ).unwrap();
    assert!(dispatch_until(&ctx, || calls.load(Ordering::SeqCst) == 1));
    ctx.remove_handler(id, true).unwrap();
}

#[test]
fn bad_input_is_rejected() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    assert_eq!(
        ctx.add_fd_handler(-1, Events::READ, |_| {}).err(),
        Some(Status::InvalidParam.into())
    );
    assert_eq!(
        ctx.add_timer(Duration::ZERO, || {}).err(),
        Some(Status::InvalidParam.into())
    );
    assert_eq!(
        ctx.add_timer(Duration::MAX, || {}).err(),
        Some(Status::InvalidParam.into())
    );
    assert_eq!(
        ctx.remove_handler(HandlerId(u64::MAX), true),
        Err(Status::NoElem.into())
    );
    let (rd, _wr) = pipe().unwrap();
    let id = ctx.add_fd_handler(rd.as_raw_fd(), Events::READ, |_| {}).unwrap();
    let dup = ctx.add_fd_handler(rd.as_raw_fd(), Events::READ, |_| {});
    assert_eq!(dup.err(), Some(Status::AlreadyExists.into()));
    assert_eq!(ctx.num_handlers(), 1, "a failed add must not stay registered");
    let timer = ctx.add_timer(Duration::from_secs(60), || {}).unwrap();
    assert_eq!(
        ctx.modify_fd_handler(timer, Events::READ),
        Err(Status::InvalidParam.into())
    );
    ctx.remove_handler(id, true).unwrap();
    ctx.remove_handler(timer, true).unwrap();
}

/// Dropping a context with handlers and queued events releases the handler closures.
#[test]
fn drop_releases_handlers() {
    let token = Arc::new(());
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let t = token.clone();
    ctx.add_timer(Duration::from_millis(1), move || {
        let _ = &t;
    })
    .unwrap();
    let t = token.clone();
    ctx.add_timer(Duration::from_secs(3600), move || {
        let _ = &t;
    })
    .unwrap();
    assert!(wait_until(|| ctx.queued_events() > 0));
    drop(ctx);
    assert_eq!(Arc::strong_count(&token), 1, "a handler closure leaked");
}

#[test]
fn context_is_send_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<AsyncContext>();
}
