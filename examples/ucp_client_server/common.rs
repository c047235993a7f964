//! What both sides share: the context (the feature of `-c`, a short keepalive), the message
//! pattern, the error-mode-`Peer` endpoint parameters and the progress loop.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

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

/// Progresses until `done()` holds or the endpoint failed (then the failure), giving up
/// after `idle` if set (a peer that holds us up sending nothing).
pub fn progress_within(
    w: &Worker,
    failed: &Failed,
    idle: Option<Duration>,
    mut done: impl FnMut() -> bool,
) -> Res<()> {
    let start = Instant::now();
    loop {
        if done() {
            return Ok(());
        }
        if let Some(e) = failed.borrow().as_deref() {
            return Err(e.to_owned());
        }
        if let Some(d) = idle.filter(|d| start.elapsed() > *d) {
            return Err(format!("nothing from the peer for {} s (--idle)", d.as_secs()));
        }
        w.progress();
    }
}

/// The value of an operation, progressing until it completed or the endpoint failed.
pub fn wait<T>(w: &Worker, failed: &Failed, issued: ucp::Result<Issued<T>>) -> Res<T> {
    wait_within(w, failed, None, issued)
}

/// [`wait`], giving up after `idle` (the operation ends with its endpoint's close).
pub fn wait_within<T>(
    w: &Worker,
    failed: &Failed,
    idle: Option<Duration>,
    issued: ucp::Result<Issued<T>>,
) -> Res<T> {
    match issued.map_err(|e| e.to_string())? {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            // An operation of a failed endpoint completes with the error too: prefer its result.
            let waited = progress_within(w, failed, idle, || r.is_done());
            if let Err(e) = &waited {
                // Given up: a posted receive must not take the next client's message.
                if r.cancel() {
                    return Err(e.clone());
                }
            }
            match r.take() {
                Some(v) => v.map_err(|e| e.to_string()),
                None => Err(waited
                    .err()
                    .or_else(|| failed.borrow().clone())
                    .unwrap_or_default()),
            }
        }
    }
}
