//! Driving a worker from a tokio runtime (feature `tokio`).
//!
//! [`AsyncWorker`] registers the worker's [`event_fd`](Worker::event_fd) with tokio's reactor
//! (`AsyncFd`): its [`progress`](AsyncWorker::progress) progresses the worker and, when there
//! was nothing to do, arms it and awaits the fd, so the task sleeps until the worker has work.
//! Requests ([`crate::Request`], [`crate::Issued`]) are futures woken from the worker's
//! progress: run [`AsyncWorker::run`] as a task beside the ones that await them.
//!
//! Connections and messages are awaited too: [`AsyncWorker::connect_sockaddr`] (a connect that
//! blocks nothing; `RUCX_CM_TIMEOUT` bounds it), [`crate::Listener::next_request`] (accept
//! clients one by one) and [`AsyncWorker::am_stream`] (active messages of one id, owned, with
//! their reply endpoint). `examples/ucp_async_server.rs` serves many clients that way.
//!
//! A worker belongs to its thread (`!Send`): use a current-thread runtime, or a `LocalSet`
//! (`spawn_local`), on the thread that created it. The context needs
//! [`Features::WAKEUP`](crate::Features::WAKEUP).
//!
//! ```
//! # fn main() -> ucp::Result<()> {
//! use std::{cell::Cell, rc::Rc};
//! # let uct_ctx = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
//! let ctx = ucp::Context::builder(uct_ctx) // e.g. rucx::context()
//!     .features(ucp::Features::AM | ucp::Features::TAG | ucp::Features::WAKEUP)
//!     .build()?;
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! let local = tokio::task::LocalSet::new();
//! local.block_on(&rt, async {
//!     let worker = ucp::Worker::new(&ctx)?;
//!     let aw = Rc::new(ucp::tokio::AsyncWorker::new(&worker)?);
//!     let driver = aw.clone();
//!     tokio::task::spawn_local(async move { driver.run().await });
//!
//!     let ep = worker.connect(worker.address())?;
//!     let recv = worker.tag_recv(7, u64::MAX, vec![0; 16])?;
//!     ep.tag_send(7, b"awaited")?.await?;
//!     assert_eq!(recv.await?.data, b"awaited"); // woken from the driver's progress
//!
//!     // Handlers run from the driver too; a task can wait for what they record.
//!     let seen = Rc::new(Cell::new(false));
//!     let s = seen.clone();
//!     worker.set_am_handler(1, move |_| s.set(true))?;
//!     ep.am_send(1, &[], b"ping", ucp::AmFlags::default())?.await?;
//!     aw.progress_until(|| seen.get()).await?;
//!     Ok(())
//! })
//! # }
//! ```

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use ucs::{Error, Result, Status};

use crate::worker::Worker;
use crate::{AmStream, Ep, EpParams};

/// The worker's event fd, duplicated for tokio's reactor (which owns what it registers).
struct EventFd(OwnedFd);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A worker whose progress sleeps in tokio's reactor (see the [module](self) documentation).
pub struct AsyncWorker {
    worker: Worker,
    fd: AsyncFd<EventFd>,
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(Status::IoError, format!("ucp::tokio: {what}: {e}"))
}

impl AsyncWorker {
    /// Registers `worker`'s event fd with the current tokio runtime. `Unsupported` without
    /// `Features::WAKEUP`; an error outside a runtime with I/O enabled (`enable_io`).
    pub fn new(worker: &Worker) -> Result<AsyncWorker> {
        let fd = worker
            .event_fd()?
            .try_clone_to_owned()
            .map_err(|e| io_err("duplicating the event fd", e))?;
        if ::tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::new(
                Status::InvalidParam,
                "ucp::tokio: AsyncWorker::new must be called inside a tokio runtime \
                 (Runtime::block_on or a task)",
            ));
        }
        // `register_with_interest`, the replacement, is `unsafe` (ucp has none): its condition,
        // a valid fd that stays open and the same while registered, holds by construction
        // here, since `EventFd` owns its fd and never changes it.
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(EventFd(fd), Interest::READABLE).map_err(|e| {
            io_err(
                "registering the event fd (does the runtime have I/O enabled: enable_io?)",
                e,
            )
        })?;
        Ok(AsyncWorker {
            worker: worker.clone(),
            fd,
        })
    }

    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Progresses the worker once; when that did nothing, arms it and waits until its event fd
    /// is readable (or yields to the other tasks, when it has work already). Returns the work
    /// done.
    pub async fn progress(&self) -> Result<u32> {
        let n = self.worker.progress();
        if n > 0 {
            return Ok(n);
        }
        match self.worker.arm() {
            Ok(()) => {
                let mut ready = self
                    .fd
                    .readable()
                    .await
                    .map_err(|e| io_err("waiting for the event fd", e))?;
                // `arm` before the next wait finds whatever came meanwhile.
                ready.clear_ready();
            }
            // Busy: progress again, after letting the tasks it woke run.
            Err(e) if e == Status::Busy => ::tokio::task::yield_now().await,
            Err(e) => return Err(e),
        }
        Ok(0)
    }

    /// An endpoint to the listener at `addr`, once connected ([`Worker::connect_sockaddr_nb`]
    /// awaited): nothing blocks the runtime, and the error comes within `RUCX_CM_TIMEOUT`
    /// when the server never accepts (`TimedOut`), rejects (`Rejected`) or is not there
    /// (`Unreachable`). Another task must drive the worker ([`AsyncWorker::run`]).
    ///
    /// ```no_run
    /// # async fn f(aw: &ucp::tokio::AsyncWorker, addr: std::net::SocketAddr) -> ucp::Result<()> {
    /// let ep = aw.connect_sockaddr(addr, ucp::EpParams::new()).await?;
    /// ep.am_send(1, &[], b"hello", ucp::AmFlags::REPLY)?.await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_sockaddr(&self, addr: std::net::SocketAddr, params: EpParams) -> Result<Ep> {
        self.worker.connect_sockaddr_nb(addr, params)?.await
    }

    /// The active messages of `id` as a stream ([`Worker::am_stream`]).
    pub fn am_stream(&self, id: u16) -> Result<AmStream> {
        self.worker.am_stream(id)
    }

    /// Progresses until `done()` holds, sleeping while there is nothing to do.
    pub async fn progress_until(&self, mut done: impl FnMut() -> bool) -> Result<()> {
        while !done() {
            self.turn().await?;
        }
        Ok(())
    }

    /// Progresses the worker for as long as the task runs (spawn it with `spawn_local`); ends
    /// only on an error.
    pub async fn run(&self) -> Result<()> {
        loop {
            self.turn().await?;
        }
    }

    /// One [`AsyncWorker::progress`]; after work, a yield, so that a worker that always has
    /// some does not starve the tasks it wakes.
    async fn turn(&self) -> Result<()> {
        if self.progress().await? > 0 {
            ::tokio::task::yield_now().await;
        }
        Ok(())
    }
}

impl std::fmt::Debug for AsyncWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AsyncWorker({:?})", self.worker)
    }
}
