//! Interface activation (UCX's adaptive progress): `progress` polls only the interfaces that an
//! endpoint's lanes use. An interface no endpoint uses (an auxiliary transport once wireup is
//! done, a transport no peer was reached over) sleeps: its progress is disabled, it is armed
//! for receives, and its event fd waits on the worker's async thread. When that fd fires (a new
//! peer's wireup request, a close, a keepalive probe), the next `progress` wakes the interface
//! and progresses it, and it goes back to sleep once idle again.
//!
//! Only interfaces with an event fd for receives sleep, and only in a worker whose async
//! context has a thread (in poll mode nothing would watch the fd without a system call in
//! every `progress`). An idle interface with no event fd at all (libfabric's shm, cma, self)
//! is polled every [`LAZY_EVERY`]th `progress` instead: a new peer's first message waits a
//! little, the endpoints' lanes do not pay for its poll. `RUCX_ADAPTIVE_PROGRESS=n` keeps
//! every interface progressed.
//!
//! Fast path: an idle `progress` pays one atomic load and two `Cell` reads here (and a counter
//! while lazily polled interfaces exist).

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ucs::async_ctx::{Events, HandlerId};
use uct::{ArmEvents, AsyncMode, EventFlags, ProgressFlags};

use crate::worker::WorkerInner;

/// Progress calls between a reason to sleep (an interface lost its last user, or woke) and
/// the attempt; an interface that is still busy then (unacknowledged packets, queued
/// completions) is tried again after as many.
const SETTLE_CALLS: u32 = 256;

/// An idle interface without an event fd is progressed once in this many `progress` calls.
pub(crate) const LAZY_EVERY: u32 = 32;

/// Per-interface activation state.
struct IfaceState {
    /// Endpoints whose lanes (other than a wireup-only lane) use the interface.
    users: Cell<u32>,
    /// Progress enabled.
    active: Cell<bool>,
    /// May sleep: it has an event fd for receives, and adaptive progress is on.
    sleepable: Cell<bool>,
    /// Has no event fd (and adaptive progress is on): polled lazily while idle.
    lazy_ok: bool,
    /// The async fd handler, while asleep.
    handler: Cell<Option<HandlerId>>,
}

/// The worker's activation state.
pub(crate) struct Activation {
    ifaces: Vec<IfaceState>,
    /// Bit `i`: interface `i`'s event fd fired while it slept (set on the async thread).
    woken: Arc<AtomicU64>,
    /// Progress calls left until the next sleep attempt; 0: none wanted.
    countdown: Cell<u32>,
    /// Bit `i`: interface `i` is polled lazily (idle, no event fd).
    lazy: Cell<u64>,
    /// Progress calls until the lazy interfaces' next poll.
    lazy_tick: Cell<u32>,
}

impl Activation {
    /// Every interface starts progressed; those that may sleep get their first attempt after
    /// [`SETTLE_CALLS`] progress calls.
    pub fn new(ifaces: &[crate::worker::WIface], uct: &uct::Worker, enabled: bool) -> Activation {
        let thread = uct.async_context().mode() == AsyncMode::Thread;
        let ifaces: Vec<IfaceState> = ifaces
            .iter()
            .map(|w| IfaceState {
                users: Cell::new(0),
                active: Cell::new(true),
                sleepable: Cell::new(
                    enabled
                        && thread
                        && w.iface
                            .attr()
                            .event_flags
                            .contains(EventFlags::FD | EventFlags::RECV),
                ),
                lazy_ok: enabled && !w.iface.attr().event_flags.contains(EventFlags::FD),
                handler: Cell::new(None),
            })
            .collect();
        let any = ifaces.iter().any(|s| s.sleepable.get() || s.lazy_ok);
        Activation {
            ifaces,
            woken: Arc::new(AtomicU64::new(0)),
            countdown: Cell::new(if any { SETTLE_CALLS } else { 0 }),
            lazy: Cell::new(0),
            lazy_tick: Cell::new(LAZY_EVERY),
        }
    }

    /// True when `progress` has activation work (the fast path: one load, one read).
    #[inline]
    pub fn has_work(&self) -> bool {
        self.woken.load(Ordering::Relaxed) != 0 || self.countdown.get() != 0 || self.lazy.get() != 0
    }

    /// Interface `i` is progressed (for tests and `rucx-info`-style reports).
    pub fn is_active(&self, i: usize) -> bool {
        self.ifaces[i].active.get()
    }

    fn want_sleep_attempt(&self) {
        if self.countdown.get() == 0 {
            self.countdown.set(SETTLE_CALLS);
        }
    }
}

/// The interface indexes of bit set `used`.
fn indexes(mut used: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if used == 0 {
            return None;
        }
        let i = used.trailing_zeros() as usize;
        used &= used - 1;
        Some(i)
    })
}

/// An endpoint's lanes use interfaces `used` (a bit per index): they are progressed from now on.
pub(crate) fn add_users(w: &WorkerInner, used: u64) {
    for i in indexes(used) {
        let s = &w.activation.ifaces[i];
        s.users.set(s.users.get() + 1);
        wake(w, i);
    }
}

/// An endpoint that used interfaces `used` is gone: those left without users may sleep.
pub(crate) fn remove_users(w: &WorkerInner, used: u64) {
    for i in indexes(used) {
        let s = &w.activation.ifaces[i];
        s.users.set(s.users.get().saturating_sub(1));
        if s.users.get() == 0 && (s.sleepable.get() || s.lazy_ok) {
            w.activation.want_sleep_attempt();
        }
    }
}

/// Something is about to be sent on interface `i` (a wireup message): it must be progressed
/// until the transport is done with it.
pub(crate) fn touch(w: &WorkerInner, i: usize) {
    if !w.activation.ifaces[i].active.get() {
        wake(w, i);
        w.activation.want_sleep_attempt();
    }
}

/// Progresses interface `i` from now on.
fn wake(w: &WorkerInner, i: usize) {
    let s = &w.activation.ifaces[i];
    if s.active.replace(true) {
        return;
    }
    let a = &w.activation;
    a.lazy.set(a.lazy.get() & !(1 << i));
    if let Some(id) = s.handler.take() {
        // Not sync: this runs on the owner thread, which is where the handler would run.
        let _ = w.uct.async_context().remove_handler(id, false);
    }
    w.ifaces[i]
        .iface
        .progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
}

/// The activation work of one `progress`: wakes the interfaces whose fd fired and progresses
/// them once; counts down to, and makes, the next sleep attempt.
pub(crate) fn run(w: &Rc<WorkerInner>) -> u32 {
    let a = &w.activation;
    let mut n = 0;
    // A plain load first: the swap is a locked instruction, and this runs on every call
    // while interfaces are polled lazily.
    if a.woken.load(Ordering::Relaxed) != 0 {
        let woken = a.woken.swap(0, Ordering::Acquire);
        for i in indexes(woken) {
            if !a.ifaces[i].active.get() {
                wake(w, i);
                n += w.ifaces[i].iface.progress();
            }
        }
        a.want_sleep_attempt();
    }
    if a.lazy.get() != 0 {
        n += poll_lazy(w);
    }
    let c = a.countdown.get();
    if c > 1 {
        a.countdown.set(c - 1);
    } else if c == 1 {
        a.countdown.set(0);
        if !try_sleep_idle(w) {
            a.want_sleep_attempt();
        }
    }
    n
}

/// Every [`LAZY_EVERY`]th call: progresses the lazily polled interfaces; one that had work
/// is progressed on every call again until it is idle once more.
fn poll_lazy(w: &WorkerInner) -> u32 {
    let a = &w.activation;
    let t = a.lazy_tick.get();
    if t > 1 {
        a.lazy_tick.set(t - 1);
        return 0;
    }
    a.lazy_tick.set(LAZY_EVERY);
    let mut n = 0;
    for i in indexes(a.lazy.get()) {
        let k = w.ifaces[i].iface.progress();
        if k > 0 {
            wake(w, i);
            a.want_sleep_attempt();
        }
        n += k;
    }
    n
}

/// Puts every idle interface to sleep (or to lazy polling); false when one was busy (try
/// again later).
fn try_sleep_idle(w: &WorkerInner) -> bool {
    let a = &w.activation;
    let mut all = true;
    for (i, s) in a.ifaces.iter().enumerate() {
        if s.users.get() > 0 || !s.active.get() {
            continue;
        }
        if s.sleepable.get() {
            all &= try_sleep(w, i);
        } else if s.lazy_ok {
            let iface = &w.ifaces[i].iface;
            if iface.progress() > 0 {
                all = false;
                continue;
            }
            iface.progress_disable(ProgressFlags::SEND | ProgressFlags::RECV);
            s.active.set(false);
            a.lazy.set(a.lazy.get() | (1 << i));
        }
    }
    all
}

/// Disables interface `i`'s progress and arms it, its event fd watched by the async thread.
/// False (and left progressed) when it still has work.
fn try_sleep(w: &WorkerInner, i: usize) -> bool {
    let s = &w.activation.ifaces[i];
    let wi = &w.ifaces[i];
    let iface = &wi.iface;
    // Queued work first; an arm that finds events consumed them and says Busy.
    for _ in 0..3 {
        while iface.progress() > 0 {}
        match iface.event_arm(ArmEvents::RECV) {
            Ok(()) => {
                let fd = match iface.event_fd() {
                    Ok(fd) => fd,
                    Err(e) => return never_sleep(wi, s, &e),
                };
                let bit = 1u64 << i;
                let woken = w.activation.woken.clone();
                let handler = move |_| {
                    woken.fetch_or(bit, Ordering::Release);
                };
                match w
                    .uct
                    .async_context()
                    .add_fd_handler(fd.as_raw_fd(), Events::READ, handler)
                {
                    Ok(id) => s.handler.set(Some(id)),
                    Err(e) => return never_sleep(wi, s, &e),
                }
                iface.progress_disable(ProgressFlags::SEND | ProgressFlags::RECV);
                s.active.set(false);
                ucs::trace!(
                    "ucp: {}/{} sleeps (no endpoint uses it)",
                    wi.info.tl_name,
                    wi.info.dev_name
                );
                return true;
            }
            Err(e) if e == ucs::Status::Busy => continue,
            Err(e) => return never_sleep(wi, s, &e),
        }
    }
    false
}

/// Interface `i` cannot sleep after all: it stays progressed.
fn never_sleep(wi: &crate::worker::WIface, s: &IfaceState, e: &ucs::Error) -> bool {
    s.sleepable.set(false);
    ucs::debug!(
        "ucp: {}/{} stays progressed: arming it failed: {e}",
        wi.info.tl_name,
        wi.info.dev_name
    );
    true
}

/// Stops watching the sleeping interfaces' fds (the worker is going).
pub(crate) fn stop(w: &WorkerInner) {
    for s in &w.activation.ifaces {
        if let Some(id) = s.handler.take() {
            let _ = w.uct.async_context().remove_handler(id, true);
        }
    }
}
