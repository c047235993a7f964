//! What both sides share: the context (the feature of `-c`, a short keepalive), the message
//! pattern, the error-mode-`Peer` endpoint parameters and the progress loop.

use std::cell::RefCell;
use std::rc::Rc;

use ucp::{Context, EpParams, ErrMode, Features, Issued, Worker};

use crate::args::Api;

/// The tag of the client's messages (UCX's); the server receives with mask 0, any tag.
pub const TAG: u64 = 0xCAFE;
/// The active-message id (UCX's).
pub const AM_ID: u16 = 0;
/// The keepalive interval unless `RUCX_KEEPALIVE_INTERVAL` is set: a silent peer (a cut
/// link) fails the endpoint with `EndpointTimeout` after three intervals.
const KEEPALIVE: &str = "1s";

pub type Res<T> = Result<T, String>;
/// The first failure reported for the endpoint (by its error handler).
pub type Failed = Rc<RefCell<Option<String>>>;

pub fn context(api: Api) -> Res<Context> {
    let features = match api {
        Api::Stream => Features::STREAM,
        Api::Tag => Features::TAG,
        Api::Am => Features::AM,
    };
    let mut b = Context::builder(rucx::context()).features(features);
    if std::env::var_os("RUCX_KEEPALIVE_INTERVAL").is_none() {
        b = b.config("KEEPALIVE_INTERVAL", KEEPALIVE);
    }
    b.build().map_err(|e| format!("UCP context: {e}"))
}

pub fn worker(ctx: &Context) -> Res<Worker> {
    Worker::new(ctx).map_err(|e| format!("UCP worker: {e}"))
}

/// Error mode `Peer`; the handler records the failure in `failed`.
pub fn ep_params(failed: &Failed) -> EpParams {
    let f = failed.clone();
    EpParams::new().err_mode(ErrMode::Peer).on_error(move |_, e| {
        f.borrow_mut().get_or_insert_with(|| e.to_string());
    })
}

/// Message `iter` (from 1): lowercase letters shifted by the iteration, so that a lost,
/// repeated or reordered message shows.
pub fn pattern(size: usize, iter: u64) -> Vec<u8> {
    (0..size).map(|i| b'a' + ((i as u64 + iter) % 26) as u8).collect()
}

/// The start of a message, for printing.
pub fn shown(data: &[u8]) -> String {
    const MAX: usize = 48;
    let s = String::from_utf8_lossy(&data[..data.len().min(MAX)]).into_owned();
    if data.len() > MAX {
        s + "..."
    } else {
        s
    }
}

/// Progresses until `done()` holds or the endpoint failed (then the failure).
pub fn progress_until(w: &Worker, failed: &Failed, mut done: impl FnMut() -> bool) -> Res<()> {
    loop {
        if done() {
            return Ok(());
        }
        if let Some(e) = failed.borrow().as_deref() {
            return Err(e.to_owned());
        }
        w.progress();
    }
}

/// The value of an operation, progressing until it completed or the endpoint failed.
pub fn wait<T>(w: &Worker, failed: &Failed, issued: ucp::Result<Issued<T>>) -> Res<T> {
    match issued.map_err(|e| e.to_string())? {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            // An operation of a failed endpoint completes with the error too: prefer its result.
            let _ = progress_until(w, failed, || r.is_done());
            match r.take() {
                Some(v) => v.map_err(|e| e.to_string()),
                None => Err(failed.borrow().clone().unwrap_or_default()),
            }
        }
    }
}
