//! An endpoint's end: failure (its peer died, a lane broke, the peer closed it), the error
//! handler that reports it, `flush` and `close`.
//!
//! A failure is recorded where it is detected (a transport's error callback, a send, wireup)
//! and acted on from `Worker::progress`: queued operations complete with the error, then the
//! endpoint's error handler runs, once. Nothing the application called is re-entered.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ucs::{Error, Result, Status};

use super::{Ep, EpInner, Wired};
use crate::proto::op::SendOp;
use crate::request::{request, Completer};
use crate::worker::WorkerInner;
use crate::Issued;

/// How an endpoint treats its peer's failure (UCX's `ucp_err_handling_mode_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrMode {
    /// Any transport may be used; a failure still fails the endpoint and its operations and
    /// calls the error handler, but transports that cannot detect one may leave the endpoint
    /// waiting.
    #[default]
    None,
    /// Only transports that report peer failure are used (lane selection filters the rest),
    /// so a dead peer always fails the endpoint.
    Peer,
}

pub(crate) type ErrHandler = Box<dyn FnMut(&Ep, &Error)>;

/// Parameters of [`crate::Worker::connect_with`].
#[derive(Default)]
pub struct EpParams {
    pub(crate) err_mode: ErrMode,
    pub(crate) on_error: Option<ErrHandler>,
}

impl EpParams {
    /// Default parameters: [`ErrMode::None`], no error handler.
    pub fn new() -> EpParams {
        EpParams::default()
    }

    /// The error-handling mode (both sides use the initiator's).
    pub fn err_mode(mut self, m: ErrMode) -> EpParams {
        self.err_mode = m;
        self
    }

    /// The error handler (see [`Ep::set_error_handler`]).
    pub fn on_error(mut self, f: impl FnMut(&Ep, &Error) + 'static) -> EpParams {
        self.on_error = Some(Box::new(f));
        self
    }
}

impl std::fmt::Debug for EpParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EpParams({:?}, handler: {})",
            self.err_mode,
            self.on_error.is_some()
        )
    }
}

/// How [`Ep::close`] ends an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseMode {
    /// Sends what is queued, tells the peer, and completes once all of it was delivered.
    Flush,
    /// Now: queued operations complete with `Canceled`, the peer is not told.
    Force,
}

impl EpInner {
    /// Fails the endpoint with `e` (the first failure counts; later ones are ignored): every
    /// operation returns it from now on, and progress completes the queued ones with it and
    /// calls the error handler.
    pub(crate) fn fail(&self, e: Error) {
        if matches!(self.wired.get(), Wired::Failed(_) | Wired::Closed) {
            return;
        }
        ucs::debug!("ucp: endpoint to {:#x} failed: {e}", self.remote.uuid);
        self.wired.set(Wired::Failed(e.status()));
        *self.error.borrow_mut() = Some(e);
        if let Some(w) = self.worker.upgrade() {
            w.failed.borrow_mut().push(self.id.get());
            w.has_failed.set(true);
            if self.conn_sn & crate::cm::wire::CONN_SN_BIT != 0 {
                crate::cm::poke(&w);
            }
        }
    }

    /// The error operations return on a failed or closed endpoint.
    pub(crate) fn error(&self) -> Error {
        match (self.wired.get(), &*self.error.borrow()) {
            (Wired::Failed(_), Some(e)) => e.clone(),
            (Wired::Closed, _) => {
                Error::new(Status::NotConnected, "ucp: the endpoint was closed (Ep::close)")
            }
            (s, _) => Error::new(Status::NotConnected, format!("ucp: endpoint in state {s:?}")),
        }
    }

    /// Completes every queued operation with `e`.
    fn cancel_queued(&self, e: &Error) {
        self.wireup_q.borrow_mut().clear();
        let ops: Vec<SendOp> = self.queue.borrow_mut().take_all();
        for op in ops {
            op.finish(Err(e.clone()));
        }
        if let Some(w) = self.worker.upgrade() {
            crate::rndv::fail_ep(&w, self.id.get(), e);
            crate::tag::fail_ep(&w, self.id.get(), self.remote.uuid, e);
            crate::am::fail_peer(&w, self.remote.uuid);
            crate::stream::fail_ep(&w, self, e);
        }
    }

    /// Marks every lane usable and sends what waited.
    pub(crate) fn set_ready(self: &Rc<Self>) {
        if self.wired.get() == Wired::WaitingForPeer {
            self.wired.set(Wired::Ready);
            self.dispatch();
            // A connect_sockaddr endpoint: its watch completes.
            if self.conn_sn & crate::cm::wire::CONN_SN_BIT != 0 {
                if let Some(w) = self.worker.upgrade() {
                    crate::cm::poke(&w);
                }
            }
        }
    }

    /// Leaves the worker's tables: no reply endpoint, no wireup message reaches it any more.
    fn unlink(&self) {
        let Some(w) = self.worker.upgrade() else { return };
        let mut t = w.eps.borrow_mut();
        let key = (self.remote.uuid, self.conn_sn);
        t.take_unmatched(&key);
        t.take_passive(&key);
        if let Some(r) = self.remote_ep.get() {
            t.unlink_remote(self.id.get(), (self.remote.uuid, r));
        }
    }
}

/// From `Worker::progress`: acts on the failures recorded since the last call.
pub(crate) fn run_failures(w: &Rc<WorkerInner>) {
    w.has_failed.set(false);
    let ids: Vec<u64> = std::mem::take(&mut *w.failed.borrow_mut());
    for id in ids {
        let ep = w.eps.borrow().get(id);
        let Some(ep) = ep else { continue };
        let e = ep.error();
        ep.cancel_queued(&e);
        ep.unlink();
        let handler = ep.err_handler.borrow_mut().take();
        match handler {
            Some(mut h) => {
                let handle = Ep::from_inner(ep.clone());
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(&handle, &e))).is_err() {
                    ucs::error!(
                        "ucp: panic in the error handler of the endpoint to {:#x} (caught)",
                        ep.remote.uuid
                    );
                }
            }
            None => ucs::warn_limited!(
                "ucp: endpoint to worker {:#x} failed: {e} (set an error handler with Ep::set_error_handler)",
                ep.remote.uuid
            ),
        }
    }
}

/// A transport reported that the uct endpoint `key` failed.
pub(crate) fn on_transport_error(w: &WorkerInner, key: uct::EpKey, st: Status) {
    // A scan, as UCX's: failures are rare, and a map would cost every endpoint memory.
    let found = w.eps.borrow().live().find_map(|ep| {
        let lane = ep.uct.iter().position(|u| u.key() == key)?;
        Some((ep, lane))
    });
    let Some((ep, lane)) = found else { return };
    let wi = &w.ifaces[ep.route.lanes.lanes[lane].local];
    ep.fail(Error::new(
        st,
        format!(
            "ucp: lane {lane} ({}/{}) to worker {:#x} failed: the peer is gone or unreachable",
            wi.info.tl_name, wi.info.dev_name, ep.remote.uuid
        ),
    ));
}

/// Shared by a flush's per-lane completions.
struct FlushState {
    outstanding: Cell<usize>,
    all_issued: Cell<bool>,
    first_error: Cell<Status>,
    done: RefCell<Option<Completer<()>>>,
}

impl FlushState {
    fn maybe_finish(&self) {
        if self.all_issued.get() && self.outstanding.get() == 0 {
            if let Some(c) = self.done.borrow_mut().take() {
                let st = self.first_error.get();
                c.complete(if st == Status::Ok {
                    Ok(())
                } else {
                    Err(Error::new(st, "ucp: flush"))
                });
            }
        }
    }
}

/// A flush in an endpoint's queue: flushes every lane from `next` on, once the operations
/// before it were handed to the transports.
pub(crate) struct FlushOp {
    next: usize,
    state: Rc<FlushState>,
}

impl FlushOp {
    fn new(c: Completer<()>) -> FlushOp {
        FlushOp {
            next: 0,
            state: Rc::new(FlushState {
                outstanding: Cell::new(0),
                all_issued: Cell::new(false),
                first_error: Cell::new(Status::Ok),
                done: RefCell::new(Some(c)),
            }),
        }
    }

    /// Issues the lanes' flushes: `Ok(true)` when all were issued (the request completes when
    /// they finish), `Ok(false)` when a lane is out of resources (call again).
    pub(crate) fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        while self.next < ep.uct.len() {
            let s = self.state.clone();
            let comp = uct::Completion::new(move |st| {
                if st != Status::Ok && s.first_error.get() == Status::Ok {
                    s.first_error.set(st);
                }
                s.outstanding.set(s.outstanding.get() - 1);
                s.maybe_finish();
            });
            match ep.uct[self.next].flush(uct::FlushFlags::default(), Some(&comp)) {
                Ok(ucs::Outcome::Done) => {}
                Ok(ucs::Outcome::InProgress) => self.state.outstanding.set(self.state.outstanding.get() + 1),
                Err(e) if e == Status::NoResource => return Ok(false),
                Err(e) => return Err(e),
            }
            self.next += 1;
        }
        // Rendezvous sends complete when the peer has fetched their data.
        if let Some(w) = ep.worker.upgrade() {
            let s = self.state.clone();
            let n = crate::rndv::watch_sends(
                &w,
                ep.id.get(),
                Rc::new(move || {
                    s.outstanding.set(s.outstanding.get() - 1);
                    s.maybe_finish();
                }),
            );
            self.state.outstanding.set(self.state.outstanding.get() + n);
        }
        // Emulated atomics between their rounds.
        let s = self.state.clone();
        let n = ep.rma_state.get().map_or(0, |r| {
            r.watch(Rc::new(move || {
                s.outstanding.set(s.outstanding.get() - 1);
                s.maybe_finish();
            }))
        });
        self.state.outstanding.set(self.state.outstanding.get() + n);
        self.state.all_issued.set(true);
        self.state.maybe_finish();
        Ok(true)
    }

    /// Fails the flush (the endpoint failed before it was issued).
    pub(crate) fn fail(self, e: Error) {
        if let Some(c) = self.state.done.borrow_mut().take() {
            c.complete(Err(e));
        }
    }
}

impl Ep {
    /// Completes when every operation issued on this endpoint before the call has completed
    /// at the peer's side of every lane.
    pub fn flush(&self) -> Result<Issued<()>> {
        let Some(ep) = self.live(crate::Features::NONE, "Ep::flush")? else {
            return self.defer(|e| e.flush());
        };
        let (mut req, c) = request(&ep.worker);
        ep.queue.borrow_mut().push_back(SendOp::flush(FlushOp::new(c)));
        ep.dispatch();
        Ok(match req.take() {
            Some(r) => Issued::Done(r?),
            None => Issued::Pending(req),
        })
    }

    /// Ends the endpoint. `Flush`: what is queued is sent, the peer is told (its endpoint fails
    /// with `ConnectionReset`, calling its error handler) and the request completes when all of
    /// it was delivered. `Force`: queued operations complete with `Canceled` at once. Either
    /// way every later operation returns `NotConnected`; the transports' endpoints are released
    /// when the last handle is dropped.
    pub fn close(&self, mode: CloseMode) -> Issued<()> {
        let Some(ep) = self.ready() else {
            return self.close_connecting(mode);
        };
        if !matches!(ep.wired.get(), Wired::Ready | Wired::WaitingForPeer) || mode == CloseMode::Force {
            ep.wired.set(Wired::Closed);
            ep.cancel_queued(&Error::new(
                Status::Canceled,
                "ucp: the endpoint was closed (CloseMode::Force)",
            ));
            ep.unlink();
            return Issued::Done(());
        }
        // A flush waits for the data (rendezvous fetches included); then the CLOSE notice,
        // and a second flush confirms its delivery.
        let (req, c) = request::<()>(&ep.worker);
        let (flushed, fc) = request::<()>(&ep.worker);
        ep.queue.borrow_mut().push_back(SendOp::flush(FlushOp::new(fc)));
        let inner = ep.clone();
        flushed.on_complete(move |r| {
            if !matches!(inner.wired.get(), Wired::Ready | Wired::WaitingForPeer) {
                inner.wired.set(Wired::Closed);
                inner.unlink();
                return c.complete(r);
            }
            if let Some(bytes) = crate::wireup::close_message(&inner) {
                inner.queue.borrow_mut().push_back(SendOp::wireup(bytes));
            }
            let (closed, fc) = request::<()>(&inner.worker);
            inner
                .queue
                .borrow_mut()
                .push_back(SendOp::flush(FlushOp::new(fc)));
            let ep = inner.clone();
            closed.on_complete(move |r2| {
                ep.wired.set(Wired::Closed);
                ep.unlink();
                c.complete(r.and(r2));
            });
            inner.dispatch();
        });
        ep.dispatch();
        let mut req = req;
        match req.take() {
            Some(_) => Issued::Done(()),
            None => Issued::Pending(req),
        }
    }

    /// Sets the handler called (once, from `Worker::progress`) when the endpoint fails: its
    /// peer died or became unreachable, a lane broke, or the peer closed it. Replaces the one
    /// given at connect. Endpoints a peer created toward this worker (reply endpoints) have
    /// none until set.
    pub fn set_error_handler(&self, f: impl FnMut(&Ep, &Error) + 'static) {
        self.set_handler(Box::new(f));
    }

    /// The error-handling mode in effect.
    pub fn err_mode(&self) -> ErrMode {
        match (self.ready(), self.connecting_state()) {
            (Some(ep), _) => ep.err_mode,
            (None, Some((m, _))) => m,
            (None, None) => ErrMode::None,
        }
    }

    /// Bytes of data this endpoint's sends hold while they wait for its lanes (bounded by
    /// `RUCX_EP_SEND_QUEUE_LIMIT`); 0 while nothing waits.
    pub fn queued_bytes(&self) -> usize {
        self.ready().map_or(0, |ep| ep.queue.borrow().bytes())
    }

    /// The failure, once the endpoint failed (or its connect did).
    pub fn error(&self) -> Option<Error> {
        match (self.ready(), self.connecting_state()) {
            (Some(ep), _) => match ep.wired.get() {
                Wired::Failed(_) | Wired::Closed => Some(ep.error()),
                _ => None,
            },
            (None, Some((_, e))) => e,
            (None, None) => None,
        }
    }
}
