//! An endpoint handed out before it has lanes ([`crate::Worker::connect_sockaddr`]): the lanes
//! depend on the server's worker address, which arrives from progress. Until then the handle
//! keeps the operations issued on it, in order, and replays them on the real endpoint once the
//! connection manager made it; a failed connect completes them with its error and calls the
//! error handler.
//!
//! Endpoints made from a worker address are never in this state: their handle holds the
//! endpoint itself, and an operation on it costs one branch more than before.

use std::cell::{OnceCell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::{Rc, Weak};

use ucs::{Error, Result, Status};

use super::{CloseMode, Ep, EpInner, ErrHandler, ErrMode};
use crate::request::request;
use crate::worker::WorkerInner;
use crate::{Features, Issued, Request};

/// What an [`Ep`] handle holds.
#[derive(Clone)]
pub(crate) enum Repr {
    /// The endpoint.
    Ready(Rc<EpInner>),
    /// A sockaddr connect whose endpoint may not exist yet.
    Connecting(Rc<Connecting>),
}

/// An operation issued before the endpoint existed: replayed on it (`Ok`), or failed.
type Deferred = Box<dyn FnOnce(std::result::Result<&Ep, &Error>)>;

pub(crate) struct Connecting {
    /// Set once the connect succeeded and the deferred operations were replayed.
    ep: OnceCell<Rc<EpInner>>,
    worker: Weak<WorkerInner>,
    to: SocketAddr,
    features: Features,
    err_mode: ErrMode,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    ops: VecDeque<Deferred>,
    on_error: Option<ErrHandler>,
    /// The connect failed.
    error: Option<Error>,
    /// Closed before it connected: the endpoint is closed as soon as it exists.
    closed: Option<CloseMode>,
}

impl Ep {
    pub(crate) fn from_inner(inner: Rc<EpInner>) -> Ep {
        Ep {
            repr: Repr::Ready(inner),
        }
    }

    /// The endpoint, once it exists (always, but for a sockaddr connect still under way).
    pub(crate) fn ready(&self) -> Option<&Rc<EpInner>> {
        match &self.repr {
            Repr::Ready(e) => Some(e),
            Repr::Connecting(c) => c.ep.get(),
        }
    }

    /// The checks every operation makes first: the context has `feature` (`Unsupported`),
    /// the endpoint neither failed nor was closed. `Some`: the endpoint to run it on; `None`:
    /// it is still connecting, defer the operation ([`Ep::defer`]).
    #[inline(always)]
    pub(crate) fn live(&self, feature: Features, what: &str) -> Result<Option<&Rc<EpInner>>> {
        let c = match &self.repr {
            Repr::Ready(ep) => return ready_checks(ep, feature, what),
            Repr::Connecting(c) => c,
        };
        if let Some(ep) = c.ep.get() {
            return ready_checks(ep, feature, what);
        }
        c.features.require(feature, what)?;
        let s = c.state.borrow();
        if let Some(e) = &s.error {
            return Err(e.clone());
        }
        if s.closed.is_some() {
            return Err(closed_error());
        }
        Ok(None)
    }

    /// The endpoint for an operation that needs its lanes now (remote keys, RMA): still
    /// connecting is `NotConnected`.
    pub(crate) fn connected_ep(&self, what: &str) -> Result<&Rc<EpInner>> {
        self.live(Features::NONE, what)?.ok_or_else(|| {
            Error::new(
                Status::NotConnected,
                format!(
                    "ucp: {what} on an endpoint still connecting to {} (connect_sockaddr): use it \
                     once Ep::is_connected, or connect with connect_sockaddr_nb and use the \
                     endpoint it completes with",
                    self.connecting_to().map(|a| a.to_string()).unwrap_or_default()
                ),
            )
        })
    }

    /// Runs `op` on the endpoint once it exists; its result completes the request returned
    /// now. Only for a handle [`Ep::live`] found still connecting.
    pub(crate) fn defer<T: 'static>(
        &self,
        op: impl FnOnce(&Ep) -> Result<Issued<T>> + 'static,
    ) -> Result<Issued<T>> {
        let Repr::Connecting(c) = &self.repr else {
            unreachable!("only a connecting handle defers")
        };
        let (req, done) = request::<T>(&c.worker);
        let f: Deferred = Box::new(move |ep| match ep {
            Ok(ep) => match op(ep) {
                Ok(Issued::Done(v)) => done.complete(Ok(v)),
                Ok(Issued::Pending(r)) => r.on_complete(move |res| done.complete(res)),
                Err(e) => done.complete(Err(e)),
            },
            Err(e) => done.complete(Err(e.clone())),
        });
        c.state.borrow_mut().ops.push_back(f);
        Ok(Issued::Pending(req))
    }

    /// The server a sockaddr connect still under way goes to.
    pub(crate) fn connecting_to(&self) -> Option<SocketAddr> {
        match &self.repr {
            Repr::Connecting(c) if c.ep.get().is_none() => Some(c.to),
            _ => None,
        }
    }

    /// `close` before the endpoint exists: `Flush` closes it after the deferred operations
    /// (the request completes when that close does), `Force` fails them now and closes the
    /// endpoint the moment it exists. Either way later operations fail with `NotConnected`.
    pub(crate) fn close_connecting(&self, mode: CloseMode) -> Issued<()> {
        let Repr::Connecting(c) = &self.repr else {
            unreachable!("only a connecting handle")
        };
        {
            let s = c.state.borrow();
            if s.error.is_some() || s.closed.is_some() {
                return Issued::Done(());
            }
        }
        if mode == CloseMode::Flush {
            let r = self.defer(move |e| Ok(e.close(CloseMode::Flush)));
            c.state.borrow_mut().closed = Some(mode);
            return r.unwrap_or(Issued::Done(()));
        }
        let ops = {
            let mut s = c.state.borrow_mut();
            s.closed = Some(mode);
            std::mem::take(&mut s.ops)
        };
        let e = Error::new(
            Status::Canceled,
            "ucp: the endpoint was closed (CloseMode::Force)",
        );
        for op in ops {
            op(Err(&e));
        }
        Issued::Done(())
    }

    /// The error handler of a handle that may be connecting.
    pub(crate) fn set_handler(&self, f: ErrHandler) {
        match &self.repr {
            Repr::Ready(ep) => *ep.err_handler.borrow_mut() = Some(f),
            Repr::Connecting(c) => match c.ep.get() {
                Some(ep) => *ep.err_handler.borrow_mut() = Some(f),
                None => c.state.borrow_mut().on_error = Some(f),
            },
        }
    }

    /// The error mode, the connect's failure, whether it connected: for a connecting handle.
    pub(crate) fn connecting_state(&self) -> Option<(ErrMode, Option<Error>)> {
        match &self.repr {
            Repr::Connecting(c) if c.ep.get().is_none() => Some((c.err_mode, c.state.borrow().error.clone())),
            _ => None,
        }
    }
}

/// [`Ep::live`]'s checks of an endpoint that exists.
#[inline(always)]
fn ready_checks<'a>(ep: &'a Rc<EpInner>, feature: Features, what: &str) -> Result<Option<&'a Rc<EpInner>>> {
    ep.features.require(feature, what)?;
    ep.check_usable()?;
    Ok(Some(ep))
}

fn closed_error() -> Error {
    Error::new(Status::NotConnected, "ucp: the endpoint was closed (Ep::close)")
}

/// A handle for the sockaddr connect `req` (it completes with the endpoint, connected, or
/// the failure), with `on_error` called on failure.
pub(crate) fn handle(
    w: &Rc<WorkerInner>,
    to: SocketAddr,
    err_mode: ErrMode,
    on_error: Option<ErrHandler>,
    req: Request<Ep>,
) -> Ep {
    let c = Rc::new(Connecting {
        ep: OnceCell::new(),
        worker: Rc::downgrade(w),
        to,
        features: w.ctx.features(),
        err_mode,
        state: RefCell::new(State {
            on_error,
            ..State::default()
        }),
    });
    let handle = Ep {
        repr: Repr::Connecting(c.clone()),
    };
    // The request's callback keeps the state alive until the connect ends (bounded by
    // RUCX_CM_TIMEOUT); the handles keep it after.
    req.on_complete(move |r| resolve(&c, r));
    handle
}

/// From progress: the connect ended.
fn resolve(c: &Rc<Connecting>, r: Result<Ep>) {
    let inner = match r.map(|ep| ep.ready().cloned()) {
        Ok(Some(inner)) => inner,
        Ok(None) => unreachable!("the connection manager completes with a made endpoint"),
        Err(e) => return fail(c, e),
    };
    let ready = Ep::from_inner(inner.clone());
    if let Some(h) = c.state.borrow_mut().on_error.take() {
        *inner.err_handler.borrow_mut() = Some(h);
    }
    // Replay in order; an operation a completion callback issues meanwhile defers behind the
    // others, as the handle has no endpoint until the queue is empty.
    loop {
        let op = c.state.borrow_mut().ops.pop_front();
        match op {
            Some(op) => op(Ok(&ready)),
            None => break,
        }
    }
    let _ = c.ep.set(inner);
    // A flushing close was replayed with the rest.
    if c.state.borrow_mut().closed.take() == Some(CloseMode::Force) {
        let _ = ready.close(CloseMode::Force);
    }
}

fn fail(c: &Rc<Connecting>, e: Error) {
    let (ops, handler) = {
        let mut s = c.state.borrow_mut();
        if s.closed.is_some() {
            // Closed by the application first: nothing to report.
            s.error = Some(closed_error());
        } else {
            s.error = Some(e.clone());
        }
        (std::mem::take(&mut s.ops), s.on_error.take())
    };
    for op in ops {
        op(Err(&e));
    }
    if c.state.borrow().closed.is_some() {
        return;
    }
    let handle = Ep {
        repr: Repr::Connecting(c.clone()),
    };
    match handler {
        Some(mut h) => {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(&handle, &e))).is_err() {
                ucs::error!(
                    "ucp: panic in the error handler of the endpoint to {} (caught)",
                    c.to
                );
            }
        }
        None => ucs::warn!(
            "ucp: connect to {} failed: {e} (set an error handler with EpParams::on_error or \
             Ep::set_error_handler)",
            c.to
        ),
    }
}

#[cfg(test)]
mod tests {
    //! The handle's queue against a connect completed by hand (no connection manager): the
    //! endpoint comes from a worker connecting to itself over the self transport.
    use std::cell::RefCell;

    use super::*;
    use crate::{AmFlags, Context, Worker};

    fn worker() -> Worker {
        let uct = uct::Context::builder()
            .builtin(uct_self::module())
            .plugins(false)
            .build();
        let ctx = Context::builder(uct)
            .features(Features::AM | Features::TAG)
            .build()
            .unwrap();
        Worker::new(&ctx).unwrap()
    }

    fn connecting(w: &Worker, on_error: Option<ErrHandler>) -> (Ep, crate::request::Completer<Ep>) {
        let (req, done) = crate::request::request_on::<Ep>(&w.inner);
        let to = "192.0.2.1:9".parse().unwrap();
        (handle(&w.inner, to, ErrMode::None, on_error, req), done)
    }

    #[test]
    fn replays_in_order_once_connected() {
        let w = worker();
        let got = Rc::new(RefCell::new(Vec::new()));
        let g = got.clone();
        w.set_am_handler(3, move |m| g.borrow_mut().push(m.data().to_vec()))
            .unwrap();
        let (ep, done) = connecting(&w, None);
        let mut reqs = Vec::new();
        for i in 0..5u8 {
            match ep.am_send(3, &[], &[i; 3], AmFlags::default()).unwrap() {
                Issued::Pending(r) => reqs.push(r),
                Issued::Done(()) => panic!("sent before the endpoint existed"),
            }
        }
        assert!(ep.tag_send(1, b"x").is_ok(), "TAG is a feature of the context");
        assert_eq!(
            ep.stream_send(b"x").unwrap_err().status(),
            Status::Unsupported,
            "checked before deferring"
        );
        for _ in 0..10 {
            w.progress();
        }
        assert!(got.borrow().is_empty());
        done.complete(w.connect(w.address()));
        // A send after the connect goes behind the replayed ones.
        let _ = ep.am_send(3, &[], b"after", AmFlags::default()).unwrap();
        while got.borrow().len() < 6 {
            w.progress();
        }
        let want: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 3]).chain([b"after".to_vec()]).collect();
        assert_eq!(*got.borrow(), want);
        for r in reqs {
            r.wait(&w).unwrap();
        }
        assert!(ep.is_connected());
        assert_eq!(ep.remote_id(), w.id());
    }

    #[test]
    fn a_failed_connect_fails_what_waits_and_calls_the_handler_once() {
        let w = worker();
        let calls = Rc::new(RefCell::new(Vec::new()));
        let c = calls.clone();
        let (ep, done) = connecting(
            &w,
            Some(Box::new(move |ep: &Ep, e: &Error| {
                c.borrow_mut().push((ep.connecting_to().is_some(), e.status()))
            })),
        );
        let Issued::Pending(mut r) = ep.am_send(3, &[], b"x", AmFlags::default()).unwrap() else {
            panic!("sent before the endpoint existed")
        };
        let Issued::Pending(mut f) = ep.flush().unwrap() else {
            panic!("flushed before the endpoint existed")
        };
        done.complete(Err(Error::new(Status::Unreachable, "refused")));
        assert_eq!(*calls.borrow(), [(true, Status::Unreachable)]);
        assert_eq!(r.take().unwrap().unwrap_err().status(), Status::Unreachable);
        assert_eq!(f.take().unwrap().unwrap_err().status(), Status::Unreachable);
        assert_eq!(ep.error().unwrap().status(), Status::Unreachable);
        assert_eq!(
            ep.am_send(3, &[], b"x", AmFlags::default()).unwrap_err().status(),
            Status::Unreachable
        );
        // Closing a failed endpoint is done at once, and calls nothing more.
        assert!(ep.close(CloseMode::Flush).is_done());
        assert_eq!(calls.borrow().len(), 1);
    }

    #[test]
    fn force_close_cancels_and_closes_the_endpoint_when_it_comes() {
        let w = worker();
        let (ep, done) = connecting(&w, None);
        let Issued::Pending(mut r) = ep.am_send(3, &[], b"x", AmFlags::default()).unwrap() else {
            panic!("sent before the endpoint existed")
        };
        assert!(ep.close(CloseMode::Force).is_done());
        assert_eq!(r.take().unwrap().unwrap_err().status(), Status::Canceled);
        done.complete(w.connect(w.address()));
        assert_eq!(
            ep.am_send(3, &[], b"x", AmFlags::default()).unwrap_err().status(),
            Status::NotConnected
        );
        assert!(!ep.is_connected());
    }
}
