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

use std::cell::RefCell;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

use ucs::Result;

use crate::worker::{Worker, WorkerInner};

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

/// What [`Request::cancel`] withdraws: a posted tag receive (no allocation per receive).
pub(crate) struct Cancel {
    pub worker: std::rc::Weak<crate::worker::WorkerInner>,
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
    fn finish_from(self: Rc<Self>, r: Result<X>) {
        finish(&self, r.and_then(T::from_recv));
    }
}

/// A [`Completer`] whose request's type is erased: it completes with an `X`, which the
/// request turns into its own value ([`FromRecv`]). No allocation beyond the request's.
pub(crate) struct CompleterFrom<X>(Option<Rc<dyn FinishFrom<X>>>);

impl<X> CompleterFrom<X> {
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
pub(crate) fn request_from<X: 'static, T: FromRecv<X> + 'static>(
    owner: std::rc::Weak<WorkerInner>,
) -> (Request<T>, CompleterFrom<X>) {
    let (req, mut c) = request::<T>(owner);
    let s = c.0.take().expect("a new completer holds its request");
    (req, CompleterFrom(Some(s as Rc<dyn FinishFrom<X>>)))
}

fn dropped() -> ucs::Error {
    ucs::Error::new(
        ucs::Status::Canceled,
        "ucp: the operation was dropped before it finished (its endpoint was destroyed)",
    )
}

fn finish<T>(s: &Rc<RefCell<Shared<T>>>, r: Result<T>) {
    let cb = {
        let mut s = s.borrow_mut();
        s.cancel = None;
        s.callback.take()
    };
    match cb {
        Some(cb) => cb(r),
        None => {
            let waker = {
                let mut s = s.borrow_mut();
                s.result = Some(r);
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
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
pub struct Request<T>(Rc<RefCell<Shared<T>>>);

/// A request and the completer its operation keeps; `owner` is the worker whose progress
/// completes it.
pub(crate) fn request<T>(owner: std::rc::Weak<WorkerInner>) -> (Request<T>, Completer<T>) {
    let s = Rc::new(RefCell::new(Shared {
        result: None,
        waker: None,
        callback: None,
        cancel: None,
        owner,
    }));
    (Request(s.clone()), Completer(Some(s)))
}

impl<T> Request<T> {
    /// True once the operation finished (its result waits in the request).
    pub fn is_done(&self) -> bool {
        self.0.borrow().result.is_some()
    }

    /// The result, once: `Some` when the operation finished.
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
                crate::tag::recv::cancel(c);
                true
            }
            None => false,
        }
    }

    /// Sets what [`Request::cancel`] does.
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

impl<T> Future for Request<T> {
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

impl<T> std::fmt::Debug for Request<T> {
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
pub enum Issued<T> {
    /// Finished inside the call.
    Done(T),
    /// Finishes later.
    Pending(Request<T>),
}

impl<T> Issued<T> {
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

    #[test]
    fn result_callback_and_detach() {
        let (mut r, c) = request::<u32>(std::rc::Weak::new());
        assert!(!r.is_done());
        assert!(r.take().is_none());
        c.complete(Ok(7));
        assert!(r.is_done());
        assert_eq!(r.take(), Some(Ok(7)));

        let (r, c) = request::<u32>(std::rc::Weak::new());
        let seen = Rc::new(Cell::new(0));
        let s = seen.clone();
        r.on_complete(move |v| s.set(v.unwrap()));
        c.complete(Ok(9));
        assert_eq!(seen.get(), 9);

        // Detached: completing a dropped request is harmless.
        let (r, c) = request::<Vec<u8>>(std::rc::Weak::new());
        drop(r);
        c.complete(Ok(vec![1, 2, 3]));
    }
}
