//! Keepalive: every `RUCX_KEEPALIVE_INTERVAL`, each wired endpoint in error mode `Peer` probes
//! its peer on the wireup lane, and the peer answers at once. An endpoint whose peer answered
//! nothing for three intervals fails with `EndpointTimeout` (a silent peer: process stopped,
//! link cut); a dead transport connection fails it sooner, through the transport's own error.
//!
//! The interval timer runs on the worker's async context; progress looks at one flag.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ucs::{Error, Status};

use crate::ep::{ErrMode, Wired};
use crate::worker::WorkerInner;

/// Intervals without an answer before the peer counts as gone.
const MISSED: u32 = 3;

/// The worker's keepalive timer, started with its first `Peer` endpoint.
#[derive(Default)]
pub(crate) struct Keepalive {
    due: Arc<AtomicBool>,
    timer: std::cell::Cell<Option<ucs::async_ctx::HandlerId>>,
}

impl Keepalive {
    /// True when a round is due (the fast path: one load).
    #[inline]
    pub fn is_due(&self) -> bool {
        self.due.load(Ordering::Relaxed)
    }
}

/// Starts the timer of `w` if keepalive is on and it is not running.
pub(crate) fn start(w: &WorkerInner) {
    let Some(interval) = w.ctx.inner.cfg.keepalive_interval else {
        return;
    };
    if w.keepalive.timer.get().is_some() {
        return;
    }
    let due = w.keepalive.due.clone();
    match w
        .uct
        .async_context()
        .add_timer(interval, move || due.store(true, Ordering::Relaxed))
    {
        Ok(id) => w.keepalive.timer.set(Some(id)),
        Err(e) => ucs::warn!("ucp: keepalive timer not started: {e}; silent peers go unnoticed"),
    }
}

/// Stops the timer (the worker is going).
pub(crate) fn stop(w: &WorkerInner) {
    if let Some(id) = w.keepalive.timer.take() {
        let _ = w.uct.async_context().remove_handler(id, false);
    }
}

/// A keepalive round: fails endpoints whose peer went silent, probes the others.
pub(crate) fn round(w: &Rc<WorkerInner>) {
    w.keepalive.due.store(false, Ordering::Relaxed);
    let Some(interval) = w.ctx.inner.cfg.keepalive_interval else {
        return;
    };
    let limit = interval.saturating_mul(MISSED);
    let now = Instant::now();
    let eps: Vec<_> = w
        .eps
        .borrow()
        .live()
        .filter(|e| e.err_mode == ErrMode::Peer)
        .collect();
    for ep in eps {
        // Judged only once both sides are wired (the peer can answer only then).
        if ep.wired.get() != Wired::Ready || ep.remote_ep.get().is_none() {
            ep.last_rx.set(now);
            continue;
        }
        let silent = now.saturating_duration_since(ep.last_rx.get());
        if silent > limit {
            ep.fail(Error::new(
                Status::EndpointTimeout,
                format!(
                    "ucp: worker {:#x} answered no keepalive for {} ms (RUCX_KEEPALIVE_INTERVAL {} ms)",
                    ep.remote.uuid,
                    silent.as_millis(),
                    interval.as_millis()
                ),
            ));
            continue;
        }
        if let Some(bytes) = crate::wireup::keepalive_message(&ep, true) {
            ep.send_wireup(bytes);
        }
    }
}
