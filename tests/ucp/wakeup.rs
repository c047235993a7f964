//! Wakeup: a worker sleeps in `poll` on its event fd between `arm`s and still gets every
//! message; `WorkerWaker` ends a `wait`; `arm` is `Busy` while work waits; `Unsupported`
//! without `Features::WAKEUP`.

use std::cell::{Cell, RefCell};
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use ucp::{AmFlags, AmProto, Features, Issued, Status, Worker};
use uct::AsyncMode;

use crate::harness::{pattern, Setup, DEADLINE};
use crate::ucp_test;

ucp_test!(
    sleeps_between_messages_and_loses_none,
    sleepers_exchange_a_rendezvous,
    waker_ends_a_wait,
    arm_is_busy_while_work_waits,
    unsupported_without_wakeup,
);

const AM_ID: u16 = 11;
/// Messages the sender sends, in bursts; after each it waits until the receiver sleeps.
const MESSAGES: usize = 200;
const BURST: usize = 10;
/// Progress calls the receiver may make per message: a few rounds of progress and arm per
/// wake-up.
const PROGRESS_PER_MESSAGE: usize = 20;
/// And per segment of the stream: a byte-stream provider (libfabric's tcp under RxM) reads a
/// segment over several progress calls, refusing to arm (`fi_trywait`) while bytes wait.
const PROGRESS_PER_SEGMENT: usize = 4;

fn features() -> Features {
    Features::AM | Features::WAKEUP
}

/// Whether `fd` is readable within `ms` milliseconds.
fn readable(fd: BorrowedFd<'_>, ms: u16) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0)
}

/// How a receiver spent its time.
#[derive(Default, Debug)]
struct Sleeps {
    progress_calls: usize,
    /// `poll`s that found the fd not readable and then returned with it readable: they blocked.
    slept: usize,
    /// progress calls that found work
    busy_progress: usize,
    /// arms answered `Busy`
    arm_busy: usize,
    /// arms after which the fd was already readable
    woke_at_once: usize,
}

/// The application's wakeup loop: progress until idle, then arm and sleep, until `done()`.
/// `asleep` counts the sleeps as they begin.
fn sleep_loop(name: &str, w: &Worker, asleep: &AtomicUsize, mut done: impl FnMut() -> bool) -> Sleeps {
    let mut s = Sleeps::default();
    let start = Instant::now();
    loop {
        loop {
            s.progress_calls += 1;
            if w.progress() == 0 {
                break;
            }
            s.busy_progress += 1;
        }
        if done() {
            return s;
        }
        match w.arm() {
            Ok(()) => {
                let fd = w.event_fd().unwrap();
                if readable(fd, 0) {
                    s.woke_at_once += 1;
                    continue;
                }
                asleep.fetch_add(1, Ordering::Release);
                // Each sleep may last a deadline: the sender pauses between bursts, and a
                // loaded (emulated) machine is slow, but some event must come within it.
                let wait = DEADLINE.as_millis().min(60_000) as u16;
                assert!(
                    readable(fd, wait),
                    "[{name}] no event within the deadline after arm: a lost wakeup ({s:?})"
                );
                s.slept += 1;
            }
            Err(e) if e == Status::Busy => s.arm_busy += 1,
            Err(e) => panic!("[{name}] arm: {e}"),
        }
        assert!(start.elapsed() < 10 * DEADLINE, "[{name}] timed out ({s:?})");
    }
}

/// Message `i` of the stream, `len` (at least 4) bytes: its number, then a pattern.
fn message(len: usize, i: usize) -> Vec<u8> {
    let mut d = pattern(len, i);
    d[..4].copy_from_slice(&(i as u32).to_le_bytes());
    d
}

/// Progresses `w` until the send `r` completes.
fn finish<T>(name: &str, w: &Worker, r: Issued<T>) {
    if let Issued::Pending(mut req) = r {
        let start = Instant::now();
        while !req.is_done() {
            w.progress();
            assert!(start.elapsed() < DEADLINE, "[{name}] a send never finished");
        }
        if let Some(Err(e)) = req.take() {
            panic!("[{name}] send: {e}");
        }
    }
}

/// The sizes of the stream, one per AM protocol the endpoint has (short, bcopy, zcopy for
/// owned buffers, fragments), with whether each goes owned.
fn stream_kinds(name: &str, ep: &ucp::Ep) -> Vec<(usize, bool, AmProto)> {
    let proto = |n: usize, owned: bool| ep.am_protocol(0, n, AmFlags::default(), owned);
    let mut kinds = Vec::new();
    for (candidates, owned, want) in [
        (&[8][..], false, AmProto::Short),
        (&[900, 2000, 3000][..], false, AmProto::Bcopy),
        (&[2000, 4000, 8000][..], true, AmProto::Zcopy),
    ] {
        match candidates.iter().find(|&&n| proto(n, owned) == want) {
            Some(&n) => kinds.push((n, owned, want)),
            None => println!("[{name}] no {want:?} size on this endpoint"),
        }
    }
    kinds.push((200_000, false, proto(200_000, false)));
    assert!(
        matches!(kinds.last().unwrap().2, AmProto::Fragments(n) if n > 1),
        "[{name}] {kinds:?}"
    );
    kinds
}

/// A receiver thread sleeps between arms while the sender's messages (short, bcopy, zcopy and
/// fragmented, in turn) come in bursts: every message arrives, in order and intact, and the
/// receiver did sleep instead of spinning. On self (one worker, which only reaches itself) the
/// messages arrive inside the sends, and the worker sleeps between them until another thread
/// wakes it.
fn sleeps_between_messages_and_loses_none(s: &Setup) {
    // Owned sends go zero-copy from 2000 bytes where the lane has AM zcopy (a forced
    // threshold also ends am_short below it: 8 bytes stay short); 200 KB go in fragments, not
    // by rendezvous (`sleepers_exchange_a_rendezvous`).
    let Some(ctx) = s
        .with("ZCOPY_THRESH", "2000")
        .with("RNDV_THRESH", "inf")
        .context(features())
    else {
        return;
    };
    let name = s.t.name;
    if !s.t.two_workers {
        return self_sleeps_between_messages(name, &ctx);
    }
    let (addr_tx, addr_rx) = mpsc::channel::<Vec<u8>>();
    let done = Arc::new(AtomicBool::new(false));
    let asleep = Arc::new(AtomicUsize::new(0));
    let receiver = {
        let (ctx, done, asleep) = (ctx.clone(), done.clone(), asleep.clone());
        std::thread::spawn(move || {
            let w = Worker::new(&ctx).unwrap_or_else(|e| panic!("[{name}] worker: {e}"));
            let got = Rc::new(RefCell::new(Vec::new()));
            let g = got.clone();
            w.set_am_handler(AM_ID, move |m| {
                g.borrow_mut().push((m.header().to_vec(), m.data().to_vec()));
            })
            .unwrap();
            addr_tx.send(w.address().to_vec()).unwrap();
            let sleeps = sleep_loop(name, &w, &asleep, || got.borrow().len() >= MESSAGES);
            done.store(true, Ordering::Release);
            // The sender's last packets may still want acknowledgements: stay a moment.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(50) {
                w.progress();
            }
            let got = got.borrow();
            let mut lens = Vec::new();
            for (i, (h, d)) in got.iter().enumerate() {
                assert!(
                    h.is_empty() && d.len() >= 4,
                    "[{name}] message {i}: {h:?}, {} bytes",
                    d.len()
                );
                let seq = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
                assert_eq!(seq, i, "[{name}] message {i} out of order");
                assert!(*d == message(d.len(), i), "[{name}] message {i} corrupted");
                lens.push(d.len());
            }
            (lens, sleeps)
        })
    };
    let w = Worker::new(&ctx).unwrap_or_else(|e| panic!("[{name}] worker: {e}"));
    let remote = addr_rx.recv_timeout(DEADLINE).expect("the receiver's address");
    let ep = w
        .connect(&remote)
        .unwrap_or_else(|e| panic!("[{name}] connect: {e}"));
    let kinds = stream_kinds(name, &ep);
    let mut start;
    let mut sent = Vec::new();
    // Sleeps counted before the burst's first message: a fast receiver may already sleep
    // again before the sender looks after the burst's last one.
    let mut before = 0;
    for i in 0..MESSAGES {
        if i % BURST == 0 {
            before = asleep.load(Ordering::Acquire);
        }
        let (n, owned, _) = kinds[i % kinds.len()];
        let (h, d) = ([], message(n, i));
        if owned {
            let r = ep.am_send_owned(AM_ID, &h, d, AmFlags::default());
            finish(
                name,
                &w,
                r.unwrap_or_else(|e| panic!("[{name}] am_send_owned {i}: {e}")),
            );
        } else {
            let r = ep.am_send(AM_ID, &h, &d, AmFlags::default());
            finish(
                name,
                &w,
                r.unwrap_or_else(|e| panic!("[{name}] am_send {i}: {e}")),
            );
        }
        sent.push(n);
        if i % BURST == BURST - 1 && i + 1 < MESSAGES {
            // A pause until the receiver sleeps (a receiver that never blocks fails here),
            // progressing: the transport's own traffic (acknowledgements) goes on.
            start = Instant::now();
            while asleep.load(Ordering::Acquire) == before {
                w.progress();
                assert!(
                    start.elapsed() < DEADLINE,
                    "[{name}] the receiver never went to sleep after message {i}"
                );
            }
        }
    }
    start = Instant::now();
    while !done.load(Ordering::Acquire) {
        w.progress();
        std::thread::sleep(Duration::from_micros(200));
        assert!(
            start.elapsed() < DEADLINE,
            "[{name}] the receiver never got everything"
        );
    }
    let (lens, sleeps) = receiver.join().expect("receiver thread");
    assert_eq!(lens, sent, "[{name}] the messages received");
    println!("[{name}] receiver: {sleeps:?} for {MESSAGES} messages of {kinds:?}");
    assert!(sleeps.slept >= MESSAGES / BURST - 1, "[{name}] {sleeps:?}");
    let segments: usize = (0..MESSAGES)
        .map(|i| match kinds[i % kinds.len()].2 {
            AmProto::Fragments(n) => n,
            _ => 1,
        })
        .sum();
    assert!(
        sleeps.progress_calls <= PROGRESS_PER_MESSAGE * MESSAGES + PROGRESS_PER_SEGMENT * segments,
        "[{name}] the receiver progressed like a busy loop: {sleeps:?}"
    );
}

/// A receiver sleeping between arms gets 1 MiB from a sender that sleeps too until its send
/// completes: a rendezvous where the lanes fetch (over shared memory cma, which has no event
/// fd, moves the data; the announcement wakes the receiver and the acknowledgement the
/// sender, both on the AM lane), and the plain handler sees all the data.
fn sleepers_exchange_a_rendezvous(s: &Setup) {
    let Some(ctx) = s.context(features()) else {
        return;
    };
    let name = s.t.name;
    if !s.t.two_workers {
        return;
    }
    const LEN: usize = 1 << 20;
    let (addr_tx, addr_rx) = mpsc::channel::<Vec<u8>>();
    let asleep = Arc::new(AtomicUsize::new(0));
    let receiver = {
        let (ctx, asleep) = (ctx.clone(), asleep.clone());
        std::thread::spawn(move || {
            let w = Worker::new(&ctx).unwrap_or_else(|e| panic!("[{name}] worker: {e}"));
            let got = Rc::new(RefCell::new(None));
            let g = got.clone();
            w.set_am_handler(AM_ID, move |m| *g.borrow_mut() = Some(m.data().to_vec()))
                .unwrap();
            addr_tx.send(w.address().to_vec()).unwrap();
            let sleeps = sleep_loop(name, &w, &asleep, || got.borrow().is_some());
            // The sender's acknowledgements may still want progress: stay a moment.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(50) {
                w.progress();
            }
            let data = got.borrow_mut().take().unwrap();
            (data, sleeps)
        })
    };
    let w = Worker::new(&ctx).unwrap_or_else(|e| panic!("[{name}] worker: {e}"));
    let remote = addr_rx.recv_timeout(DEADLINE).expect("the receiver's address");
    let ep = w
        .connect(&remote)
        .unwrap_or_else(|e| panic!("[{name}] connect: {e}"));
    let lanes = ep.describe_lanes();
    let proto = ep.am_protocol(0, LEN, AmFlags::default(), false);
    println!("[{name}] 1 MiB by {proto}; lanes:\n{lanes}");
    if name == "posix" {
        assert_eq!(
            proto,
            AmProto::Rndv,
            "[{name}] 1 MiB over shared memory; lanes:\n{lanes}"
        );
        assert!(
            lanes.lines().any(|l| l.contains("cma/") && l.contains("rma_bw")),
            "[{name}] cma serves the rendezvous data under WAKEUP; lanes:\n{lanes}"
        );
    }
    // Sent once the receiver sleeps: the announcement must wake it.
    let start = Instant::now();
    while asleep.load(Ordering::Acquire) == 0 {
        w.progress();
        assert!(start.elapsed() < DEADLINE, "[{name}] the receiver never slept");
    }
    let data = message(LEN, 0);
    let r = ep
        .am_send(AM_ID, &[], &data, AmFlags::default())
        .unwrap_or_else(|e| panic!("[{name}] am_send: {e}"));
    let sender = match r {
        Issued::Done(()) => None,
        Issued::Pending(mut req) => {
            let s = sleep_loop(name, &w, &AtomicUsize::new(0), || req.is_done());
            if let Some(Err(e)) = req.take() {
                panic!("[{name}] send: {e}");
            }
            Some(s)
        }
    };
    let (got, sleeps) = receiver.join().expect("receiver thread");
    assert!(got == data, "[{name}] the receiver got {} bytes", got.len());
    println!("[{name}] receiver: {sleeps:?}; sender: {sender:?}");
    assert!(sleeps.slept >= 1, "[{name}] the receiver never slept: {sleeps:?}");
}

/// One worker on self: each message arrives inside its send; between them the worker sleeps
/// until a helper thread wakes it.
fn self_sleeps_between_messages(name: &str, ctx: &ucp::Context) {
    let w = Worker::new(ctx).unwrap();
    let ep = w.connect(w.address()).unwrap();
    let got = Rc::new(Cell::new(0usize));
    let g = got.clone();
    w.set_am_handler(AM_ID, move |m| {
        assert_eq!(m.data(), pattern(64 + g.get(), g.get()).as_slice());
        g.set(g.get() + 1);
    })
    .unwrap();
    let waker = w.waker().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let helper = std::thread::spawn(move || {
        while go_rx.recv().is_ok() {
            std::thread::sleep(Duration::from_millis(1));
            waker.wake();
        }
    });
    let mut sleeps = Sleeps::default();
    for i in 0..20 {
        go_tx.send(()).unwrap();
        let woken = Cell::new(false);
        let s = sleep_loop(name, &w, &AtomicUsize::new(0), || woken.replace(true));
        sleeps.progress_calls += s.progress_calls;
        sleeps.slept += s.slept;
        let r = ep
            .am_send(AM_ID, &[], &pattern(64 + i, i), AmFlags::default())
            .unwrap();
        assert!(r.is_done(), "[{name}] a self send completes in the call");
        assert_eq!(got.get(), i + 1, "[{name}] message {i} arrived in its send");
    }
    drop(go_tx);
    helper.join().unwrap();
    assert!(sleeps.slept > 0, "[{name}] the worker never slept: {sleeps:?}");
}

/// `wait` sleeps until another thread's `WorkerWaker::wake`.
fn waker_ends_a_wait(s: &Setup) {
    let Some(ctx) = s.context(features()) else {
        return;
    };
    let name = s.t.name;
    let stop = Arc::new(AtomicBool::new(false));
    let (waker_tx, waker_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let st = stop.clone();
    let t = std::thread::spawn(move || {
        let w = Worker::new(&ctx).unwrap();
        waker_tx.send(w.waker().unwrap()).unwrap();
        let mut waits = 0u32;
        while !st.load(Ordering::Acquire) {
            while w.progress() > 0 {}
            w.wait().unwrap_or_else(|e| panic!("[{name}] wait: {e}"));
            waits += 1;
        }
        done_tx.send(waits).unwrap();
    });
    let waker = waker_rx.recv_timeout(DEADLINE).expect("the worker's waker");
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::Release);
    waker.wake();
    let waits = done_rx
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("[{name}] WorkerWaker::wake did not end the wait"));
    assert!(waits >= 1);
    t.join().unwrap();
}

/// Progresses both sides until `b` arms (`a` is progressed too: its traffic may keep `b` busy).
fn arm_when_idle(name: &str, a: &Worker, b: &Worker) {
    let start = Instant::now();
    loop {
        a.progress();
        while b.progress() > 0 {}
        match b.arm() {
            Ok(()) => return,
            Err(e) if e == Status::Busy => {}
            Err(e) => panic!("[{name}] arm: {e}"),
        }
        assert!(
            start.elapsed() < DEADLINE,
            "[{name}] the worker never became idle"
        );
    }
}

/// `arm` is `Busy` after a wake that came before it, and while a message waits for `progress`.
fn arm_is_busy_while_work_waits(s: &Setup) {
    let Some(p) = s.pair_in(features(), AsyncMode::Thread) else {
        return;
    };
    let name = p.name;
    let inbox = p.inbox(AM_ID);
    p.send(AM_ID, b"h", b"wired", AmFlags::default());
    p.wait_for("the first message", || inbox.borrow().len() == 1);

    arm_when_idle(name, &p.a, &p.b);
    p.b.waker().unwrap().wake();
    let e = p.b.arm().expect_err("arm after a wake");
    assert_eq!(e, Status::Busy, "[{name}] {e}");
    arm_when_idle(name, &p.a, &p.b);
    p.b.signal().unwrap();
    assert!(
        readable(p.b.event_fd().unwrap(), 0),
        "[{name}] signal leaves the fd readable"
    );
    let e = p.b.arm().expect_err("arm after a signal");
    assert_eq!(e, Status::Busy, "[{name}] {e}");
    arm_when_idle(name, &p.a, &p.b);

    if !s.t.two_workers {
        // Self delivers inside the send: no message ever waits.
        return;
    }
    let r = p.ep.am_send(AM_ID, b"h", b"waiting", AmFlags::default()).unwrap();
    let start = Instant::now();
    while !readable(p.b.event_fd().unwrap(), 1) {
        // The sender's progress puts the message on the wire; `b` is not progressed.
        p.a.progress();
        assert!(
            start.elapsed() < DEADLINE,
            "[{name}] the message never woke the receiver"
        );
    }
    assert_eq!(
        inbox.borrow().len(),
        1,
        "[{name}] nothing delivered without progress"
    );
    let e = p.b.arm().expect_err("arm with a message waiting");
    assert_eq!(e, Status::Busy, "[{name}] {e}");
    p.wait_for("the waiting message", || inbox.borrow().len() == 2);
    assert_eq!(inbox.borrow()[1].1, b"waiting");
    if let Issued::Pending(mut req) = r {
        p.wait_for("the send", || req.is_done());
        req.take().unwrap().unwrap();
    }
}

/// Without `Features::WAKEUP` the wakeup calls say so.
fn unsupported_without_wakeup(s: &Setup) {
    let Some(ctx) = s.context(Features::AM) else {
        return;
    };
    let w = Worker::new(&ctx).unwrap();
    let errs = [
        w.event_fd().map(|_| ()).unwrap_err(),
        w.arm().unwrap_err(),
        w.wait().unwrap_err(),
        w.signal().unwrap_err(),
        w.waker().map(|_| ()).unwrap_err(),
    ];
    for e in errs {
        assert_eq!(e, Status::Unsupported, "{e}");
        assert!(e.to_string().contains("Features::WAKEUP"), "{e}");
    }
}
