//! Operations that complete later.
//!
//! A non-blocking call returns an [`Issued`]: `Done(value)` when it finished inside the call,
//! or `Pending(request)`. A [`Request`] can be polled ([`Request::take`]), given a callback
//! ([`Request::on_complete`], run from `Worker::progress`), waited for
//! ([`Request::wait`], which progresses the worker) or awaited (it is a `Future`, woken from
//! `Worker::progress`).
//!
//! Ownership: a request owns whatever its operation needs until it completes (an owned send
//! buffer, the receive buffer of an `am_recv_data`), and hands buffers back in its value.
//! Dropping a request detaches it: the operation still runs to completion (a send is still
//! delivered), its result is discarded, and its buffers are freed then. So no safe code can
//! touch a buffer an operation still uses.
//!
//! Allocation: a finished request the application dropped goes back to its worker's
//! [`RequestPool`], and the next request of its type reuses it.

use std::cell::RefCell;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

use ucs::Result;

use crate::worker::{Worker, WorkerInner};

mod pool;
pub(crate) use pool::RequestPool;

type Callback<T> = Box<dyn FnOnce(Result<T>)>;

struct Shared<T> {
    result: Option<Result<T>>,
    waker: Option<Waker>,
    callback: Option<Callback<T>>,
    /// Withdraws the operation (a posted receive), if it can still be withdrawn.
    cancel: Option<Cancel>,
    /// The worker whose progress completes the operation (a weak count: no allocation, and
    /// its address stays unique while the request lives).
    owner: std::rc::Weak<WorkerInner>,
}

/// What [`Request::cancel`] withdraws: a posted tag receive of the request's worker.
pub(crate) struct Cancel {
    pub id: crate::tag::matcher::RecvId,
}

/// The operation's side: completes the request (from progress). Dropped without completing
/// (its endpoint went away with the operation queued), it completes the request with
/// `Canceled`, so no request waits forever.
pub(crate) struct Completer<T>(Option<Rc<RefCell<Shared<T>>>>);

impl<T> Completer<T> {
    /// Finishes the operation: runs the callback if one is set, else keeps the result for the
    /// request (and wakes its task).
    pub fn complete(mut self, r: Result<T>) {
        if let Some(s) = self.0.take() {
            finish(&s, r);
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            finish(&s, Err(dropped()));
        }
    }
}

/// A request's value made from `X`, the value one internal path produces for every buffer
/// type the application may give (a receive into a `Vec` or into lent memory).
pub(crate) trait FromRecv<X>: Sized {
    fn from_recv(x: X) -> Result<Self>;
}

trait FinishFrom<X> {
    fn finish_from(self: Rc<Self>, r: Result<X>);
}

impl<X, T: FromRecv<X>> FinishFrom<X> for RefCell<Shared<T>> {
    #[inline(always)]
    fn finish_from(self: Rc<Self>, r: Result<X>) {
        finish(&self, r.and_then(T::from_recv));
    }
}

/// A [`Completer`] whose request's type is erased: it completes with an `X`, which the
/// request turns into its own value ([`FromRecv`]). No allocation beyond the request's.
pub(crate) struct CompleterFrom<X>(Option<Rc<dyn FinishFrom<X>>>);

impl<X> CompleterFrom<X> {
    #[inline(always)]
    pub fn complete(mut self, r: Result<X>) {
        if let Some(s) = self.0.take() {
            s.finish_from(r);
        }
    }
}

impl<X> Drop for CompleterFrom<X> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.finish_from(Err(dropped()));
        }
    }
}

/// A request of type `T` and the erased completer its operation keeps.
#[inline(always)]
pub(crate) fn request_from<X: 'static, T: FromRecv<X> + 'static>(
    owner: &Rc<WorkerInner>,
) -> (Request<T>, CompleterFrom<X>) {
    let (req, mut c) = request_on::<T>(owner);
    let s = c.0.take().expect("a new completer holds its request");
    (req, CompleterFrom(Some(s as Rc<dyn FinishFrom<X>>)))
}

fn dropped() -> ucs::Error {
    ucs::Error::new(
        ucs::Status::Canceled,
        "ucp: the operation was dropped before it finished (its endpoint was destroyed)",
    )
}

#[inline(always)]
fn finish<T>(s: &Rc<RefCell<Shared<T>>>, r: Result<T>) {
    let mut b = s.borrow_mut();
    b.cancel = None;
    // The callback and the waker run outside the borrow (they may use the request).
    if let Some(cb) = b.callback.take() {
        drop(b);
        return cb(r);
    }
    b.result = Some(r);
    let waker = b.waker.take();
    drop(b);
    if let Some(w) = waker {
        w.wake();
    }
}

/// An operation that completes later (from [`Worker::progress`]): the `Pending` side of
/// [`Issued`]. Follow it by polling ([`Request::is_done`], [`Request::take`]), with a callback
/// ([`Request::on_complete`]), by progressing its worker until it is done
/// ([`Request::wait`]), or as a future (`.await`, with the worker progressed by another task:
/// `ucp::tokio`). Dropped, it detaches: the operation still completes.
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// use ucp::{Context, Features, Issued, Status, Worker};
///
/// let uct = uct::Context::builder().builtin(uct_self::module()).plugins(false).build();
/// let ctx = Context::builder(uct).features(Features::TAG).build()?;
/// let worker = Worker::new(&ctx)?;
/// let ep = worker.connect(worker.address())?;
///
/// // A receive no message matched yet is pending; it can still be withdrawn.
/// let Issued::Pending(mut req) = worker.tag_recv(1, u64::MAX, vec![0; 8])? else {
///     unreachable!("nothing was sent")
/// };
/// assert!(!req.is_done());
/// assert!(req.cancel());
/// assert_eq!(req.take().unwrap().unwrap_err(), Status::Canceled);
///
/// // A callback, run from progress once the message is in.
/// let got = Rc::new(RefCell::new(None));
/// let g = got.clone();
/// worker.tag_recv(2, u64::MAX, vec![0; 8])?.on_complete(move |r| {
///     *g.borrow_mut() = Some(r.map(|m| m.data));
/// });
/// ep.tag_send(2, b"hi")?.wait(&worker)?;
/// while got.borrow().is_none() {
///     worker.progress();
/// }
/// assert_eq!(got.borrow_mut().take().unwrap()?, b"hi");
/// # Ok::<(), ucp::Error>(())
/// ```
#[must_use = "dropping a request detaches it: the operation completes, its result is lost"]
pub struct Request<T: 'static>(Rc<RefCell<Shared<T>>>);

/// A request and the completer its operation keeps; `owner` is the worker whose progress
/// completes it (and whose pool it is taken from when one of its type is kept).
pub(crate) fn request<T: 'static>(owner: &std::rc::Weak<WorkerInner>) -> (Request<T>, Completer<T>) {
    match owner.upgrade() {
        Some(w) => request_on(&w),
        None => fresh(owner.clone()),
    }
}

/// [`request`] on worker `w`.
#[inline(always)]
pub(crate) fn request_on<T: 'static>(w: &Rc<WorkerInner>) -> (Request<T>, Completer<T>) {
    // A kept one is already the worker's (its owner is `w`).
    match w.requests.take::<RefCell<Shared<T>>>() {
        Some(s) => (Request(s.clone()), Completer(Some(s))),
        None => fresh(Rc::downgrade(w)),
    }
}

fn fresh<T: 'static>(owner: std::rc::Weak<WorkerInner>) -> (Request<T>, Completer<T>) {
    let s = Rc::new(RefCell::new(Shared {
        result: None,
        waker: None,
        callback: None,
        cancel: None,
        owner,
    }));
    (Request(s.clone()), Completer(Some(s)))
}

/// A finished request the application let go of goes back to its worker's pool.
impl<T: 'static> Drop for Request<T> {
    #[inline(always)]
    fn drop(&mut self) {
        // Only the application's side left: the operation finished (its completer is gone).
        if Rc::strong_count(&self.0) != 1 || Rc::weak_count(&self.0) != 0 {
            return;
        }
        let Ok(mut s) = self.0.try_borrow_mut() else {
            return;
        };
        let Some(w) = s.owner.upgrade() else {
            return;
        };
        // Usually all taken already. Dropped outside the borrow: a result's or callback's own
        // drop may run anything.
        if s.result.is_some() || s.waker.is_some() || s.callback.is_some() || s.cancel.is_some() {
            let parts = (
                s.result.take(),
                s.waker.take(),
                s.callback.take(),
                s.cancel.take(),
            );
            drop(s);
            drop(parts);
        } else {
            drop(s);
        }
        w.requests.put(self.0.clone());
    }
}

impl<T: 'static> Request<T> {
    /// True once the operation finished (its result waits in the request).
    pub fn is_done(&self) -> bool {
        self.0.borrow().result.is_some()
    }

    /// The result, once: `Some` when the operation finished.
    #[inline]
    pub fn take(&mut self) -> Option<Result<T>> {
        self.0.borrow_mut().result.take()
    }

    /// Calls `f` with the result when the operation finishes (from `Worker::progress`), or
    /// now if it already has.
    pub fn on_complete(self, f: impl FnOnce(Result<T>) + 'static) {
        let done = self.0.borrow_mut().result.take();
        match done {
            Some(r) => f(r),
            None => self.0.borrow_mut().callback = Some(Box::new(f)),
        }
    }

    /// Withdraws the operation if it has not started (a posted tag receive no message has
    /// matched yet): it completes with `Canceled`, its callback runs now. True when withdrawn;
    /// operations that cannot be withdrawn (sends, matched receives) go on.
    pub fn cancel(&self) -> bool {
        let c = self.0.borrow_mut().cancel.take();
        match c {
            Some(c) => {
                let owner = self.0.borrow().owner.clone();
                crate::tag::recv::cancel(&owner, c);
                true
            }
            None => false,
        }
    }

    /// Sets what [`Request::cancel`] does.
    #[inline]
    pub(crate) fn set_cancel(&self, c: Cancel) {
        self.0.borrow_mut().cancel = Some(c);
    }

    /// True when `worker`'s progress is what completes this request.
    pub fn belongs_to(&self, worker: &Worker) -> bool {
        std::ptr::eq(self.0.borrow().owner.as_ptr(), Rc::as_ptr(&worker.inner))
    }

    /// Progresses `worker` until the operation finishes. `InvalidParam` (the request dropped,
    /// so detached, even if it has finished) when `worker` is not the one the operation was
    /// issued on: its progress would never complete it.
    pub fn wait(mut self, worker: &Worker) -> Result<T> {
        if !self.belongs_to(worker) {
            return Err(ucs::Error::new(
                ucs::Status::InvalidParam,
                format!(
                    "ucp: Request::wait on worker {:#x}, but the operation belongs to another \
                     worker ({}): only that worker's progress completes it",
                    worker.id(),
                    match self.0.borrow().owner.upgrade() {
                        Some(w) => format!("{:#x}", w.uuid),
                        None => "one that was destroyed".to_owned(),
                    }
                ),
            ));
        }
        loop {
            if let Some(r) = self.take() {
                return r;
            }
            worker.progress();
        }
    }
}

impl<T: 'static> Future for Request<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<T>> {
        let mut s = self.0.borrow_mut();
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T: 'static> std::fmt::Debug for Request<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Request({})",
            if self.is_done() { "done" } else { "in progress" }
        )
    }
}

/// What a non-blocking call returns: finished, or a request to follow.
#[must_use = "a pending operation completes later; follow its request"]
#[derive(Debug)]
pub enum Issued<T: 'static> {
    /// Finished inside the call.
    Done(T),
    /// Finishes later.
    Pending(Request<T>),
}

impl<T: 'static> Issued<T> {
    /// True for [`Issued::Done`].
    pub fn is_done(&self) -> bool {
        matches!(self, Issued::Done(_))
    }

    /// The value, progressing `worker` until the operation finished; `InvalidParam` when a
    /// pending operation belongs to another worker (see [`Request::wait`]).
    pub fn wait(self, worker: &Worker) -> Result<T> {
        match self {
            Issued::Done(v) => Ok(v),
            Issued::Pending(r) => r.wait(worker),
        }
    }

    /// Calls `f` with the result: now if done, else from progress.
    pub fn on_complete(self, f: impl FnOnce(Result<T>) + 'static) {
        match self {
            Issued::Done(v) => f(Ok(v)),
            Issued::Pending(r) => r.on_complete(f),
        }
    }
}

impl<T: 'static> IntoFuture for Issued<T> {
    type Output = Result<T>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<T>>>>;

    fn into_future(self) -> Self::IntoFuture {
        match self {
            Issued::Done(v) => Box::pin(std::future::ready(Ok(v))),
            Issued::Pending(r) => Box::pin(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn self_worker() -> (Worker, crate::Ep) {
        let uct = uct::Context::builder()
            .builtin(uct_self::module())
            .plugins(false)
            .build();
        let ctx = crate::Context::builder(uct)
            .features(crate::Features::TAG)
            .build()
            .unwrap();
        let w = Worker::new(&ctx).unwrap();
        let ep = w.connect(w.address()).unwrap();
        (w, ep)
    }

    /// Posts a receive for `tag`, sends it `data`, and returns the request once done.
    fn round(w: &Worker, ep: &crate::Ep, tag: u64, data: &[u8]) -> Request<crate::TagRecvd> {
        let Issued::Pending(req) = w.tag_recv(tag, u64::MAX, vec![0; 8]).unwrap() else {
            panic!("nothing was sent yet")
        };
        ep.tag_send(tag, data).unwrap().wait(w).unwrap();
        while !req.is_done() {
            w.progress();
        }
        req
    }

    #[test]
    fn finished_requests_are_reused_reset() {
        let (w, ep) = self_worker();
        let mut req = round(&w, &ep, 1, b"one");
        assert_eq!(req.take().unwrap().unwrap().data, b"one");
        drop(req);
        assert_eq!(w.inner.requests.len(), 1, "the finished request was kept");
        // Reused (the pool gives it out and takes it back), with nothing left from its last
        // use: a finished request dropped without taking its result, and one with a callback.
        let req = round(&w, &ep, 2, b"two");
        assert_eq!(w.inner.requests.len(), 0, "the kept request was taken");
        drop(req);
        assert_eq!(w.inner.requests.len(), 1);
        let Issued::Pending(mut req) = w.tag_recv(3, u64::MAX, vec![0; 8]).unwrap() else {
            panic!("nothing was sent yet")
        };
        assert!(!req.is_done(), "no result left from the last use");
        assert!(req.take().is_none());
        let seen = Rc::new(RefCell::new(None));
        let s = seen.clone();
        req.on_complete(move |r| *s.borrow_mut() = Some(r.map(|m| m.data)));
        ep.tag_send(3, b"three").unwrap().wait(&w).unwrap();
        while seen.borrow().is_none() {
            w.progress();
        }
        assert_eq!(seen.borrow_mut().take().unwrap().unwrap(), b"three");
        let mut req = round(&w, &ep, 4, b"four");
        assert_eq!(req.take().unwrap().unwrap().data, b"four");
    }

    #[test]
    fn a_request_dropped_in_flight_is_not_reused_early() {
        let (w, ep) = self_worker();
        drop(round(&w, &ep, 1, b"x"));
        assert_eq!(w.inner.requests.len(), 1);
        // Detached while posted: the receive still takes its message, and the next receive
        // (given the kept request, not the detached one) takes the next.
        let Issued::Pending(detached) = w.tag_recv(5, u64::MAX, vec![0; 8]).unwrap() else {
            panic!("nothing was sent yet")
        };
        drop(detached);
        assert_eq!(w.inner.requests.len(), 0);
        let Issued::Pending(mut next) = w.tag_recv(5, u64::MAX, vec![0; 8]).unwrap() else {
            panic!("nothing was sent yet")
        };
        ep.tag_send(5, b"first").unwrap().wait(&w).unwrap();
        ep.tag_send(5, b"second").unwrap().wait(&w).unwrap();
        while !next.is_done() {
            w.progress();
        }
        assert_eq!(next.take().unwrap().unwrap().data, b"second");
        // The detached request completed and was freed, not kept (its owner had let go).
        drop(next);
        assert_eq!(w.inner.requests.len(), 1);
    }

    #[test]
    fn requests_outliving_their_worker_are_freed() {
        let (w, ep) = self_worker();
        let Issued::Pending(req) = w.tag_recv(9, u64::MAX, vec![0; 8]).unwrap() else {
            panic!("nothing was sent yet")
        };
        drop(ep);
        drop(w);
        // The worker is gone: the request is not kept anywhere (nor does dropping it crash).
        drop(req);
    }

    #[test]
    fn result_callback_and_detach() {
        let (mut r, c) = request::<u32>(&std::rc::Weak::new());
        assert!(!r.is_done());
        assert!(r.take().is_none());
        c.complete(Ok(7));
        assert!(r.is_done());
        assert_eq!(r.take(), Some(Ok(7)));

        let (r, c) = request::<u32>(&std::rc::Weak::new());
        let seen = Rc::new(Cell::new(0));
        let s = seen.clone();
        r.on_complete(move |v| s.set(v.unwrap()));
        c.complete(Ok(9));
        assert_eq!(seen.get(), 9);

        // Detached: completing a dropped request is harmless.
        let (r, c) = request::<Vec<u8>>(&std::rc::Weak::new());
        drop(r);
        c.complete(Ok(vec![1, 2, 3]));
    }
}
