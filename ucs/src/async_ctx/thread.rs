//! The process-global async thread used by thread-mode contexts.
//!
//! One thread serves every thread-mode context (as in UCX). It is reference counted: the first
//! [`ThreadRef::acquire`] starts it and dropping the last `ThreadRef` stops and joins it. The thread
//! only waits on the shared [`Reactor`] and delivers events; handlers run on owner threads.

use super::reactor::Reactor;
use crate::{Result, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

struct AsyncThread {
    reactor: Arc<Reactor>,
    stop: AtomicBool,
}

struct Global {
    refs: usize,
    thread: Arc<AsyncThread>,
    join: JoinHandle<()>,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

/// A counted reference to the global async thread.
pub(super) struct ThreadRef {
    reactor: Arc<Reactor>,
}

impl ThreadRef {
    pub fn acquire() -> Result<Self> {
        let mut global = GLOBAL.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(g) = global.as_mut() {
            g.refs += 1;
            return Ok(Self {
                reactor: g.thread.reactor.clone(),
            });
        }
        let thread = Arc::new(AsyncThread {
            reactor: Arc::new(Reactor::new(true)?),
            stop: AtomicBool::new(false),
        });
        let t = thread.clone();
        let join = thread::Builder::new()
            .name("rucx-async".into())
            .spawn(move || run(&t))
            .map_err(|e| {
                crate::error!("async: cannot start the async thread: {e}; check the process/thread limits");
                Status::NoResource
            })?;
        crate::debug!("async: global thread started");
        let reactor = thread.reactor.clone();
        *global = Some(Global {
            refs: 1,
            thread,
            join,
        });
        Ok(Self { reactor })
    }

    pub fn reactor(&self) -> &Arc<Reactor> {
        &self.reactor
    }
}

impl Drop for ThreadRef {
    fn drop(&mut self) {
        let last = {
            let mut global = GLOBAL.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(g) = global.as_mut() else { return };
            g.refs -= 1;
            if g.refs == 0 {
                global.take()
            } else {
                None
            }
        };
        let Some(g) = last else { return };
        g.thread.stop.store(true, Ordering::Release);
        g.thread.reactor.wake();
        if g.join.thread().id() == thread::current().id() {
            // Dropped from the async thread itself: it exits on its own after this iteration.
            crate::debug!("async: global thread stopping (detached)");
            return;
        }
        // Joined outside the lock: a context created meanwhile starts a fresh thread.
        if g.join.join().is_err() {
            crate::error!("async: the async thread panicked");
        }
        crate::debug!("async: global thread stopped");
    }
}

fn run(t: &AsyncThread) {
    while !t.stop.load(Ordering::Acquire) {
        t.reactor.poll(t.reactor.timeout());
    }
}
