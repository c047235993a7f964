//! Active messages as an asynchronous stream: [`crate::Worker::am_stream`] installs a handler
//! that keeps each message (its header, its data, the reply endpoint) in a queue, and
//! [`AmStream::recv`] awaits them in arrival order, so tasks need no handler-to-channel bridge
//! of their own. A rendezvous message's data is fetched by the handler into a buffer of the
//! stream's; `recv` yields the message once it is in.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use ucs::Result;

use crate::{AmMsg, Ep, Issued, Request, Worker};

/// A message [`AmStream::recv`] yields: owned, valid for as long as it is kept.
#[derive(Debug)]
pub struct AmMessage {
    /// The sender's header.
    pub header: Vec<u8>,
    /// The data (a rendezvous message's too, fetched).
    pub data: Vec<u8>,
    /// An endpoint back to the sender, when it sent with [`crate::AmFlags::REPLY`].
    pub reply_ep: Option<Ep>,
}

enum Data {
    Ready(Vec<u8>),
    Fetching(Request<Vec<u8>>),
    Failed(ucs::Error),
}

struct Queued {
    header: Vec<u8>,
    data: Data,
    reply_ep: Option<Ep>,
}

#[derive(Default)]
struct Shared {
    queue: VecDeque<Queued>,
    waker: Option<Waker>,
}

/// The active messages of one id, awaited one by one ([`crate::Worker::am_stream`]). Dropping
/// it removes the handler of its id.
pub struct AmStream {
    worker: crate::WeakWorker,
    id: u16,
    shared: Rc<RefCell<Shared>>,
}

impl AmStream {
    /// The AM id it receives.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Messages received and not yet taken (a rendezvous one possibly still fetching).
    pub fn len(&self) -> usize {
        self.shared.borrow().queue.len()
    }

    /// True when no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next message, awaited (woken from the worker's `progress`, which a task such as
    /// `ucp::tokio::AsyncWorker::run` must drive). Messages come in arrival order; an
    /// error is a rendezvous message whose data could not be fetched (its sender failed).
    /// Waits for as long as no message comes.
    pub async fn recv(&mut self) -> Result<AmMessage> {
        std::future::poll_fn(|cx| {
            let mut s = self.shared.borrow_mut();
            match poll_front(&mut s, cx) {
                Some(m) => Poll::Ready(m),
                None => {
                    s.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// The next message if one is in (its data fetched), without waiting.
    pub fn try_recv(&mut self) -> Option<Result<AmMessage>> {
        let mut s = self.shared.borrow_mut();
        poll_front(&mut s, &mut std::task::Context::from_waker(Waker::noop()))
    }
}

/// The first message, once its data is in.
fn poll_front(s: &mut Shared, cx: &mut std::task::Context<'_>) -> Option<Result<AmMessage>> {
    let front = s.queue.front_mut()?;
    if let Data::Fetching(r) = &mut front.data {
        match Pin::new(r).poll(cx) {
            Poll::Pending => return None,
            Poll::Ready(Ok(v)) => front.data = Data::Ready(v),
            Poll::Ready(Err(e)) => front.data = Data::Failed(e),
        }
    }
    let q = s.queue.pop_front()?;
    Some(match q.data {
        Data::Ready(data) => Ok(AmMessage {
            header: q.header,
            data,
            reply_ep: q.reply_ep,
        }),
        Data::Failed(e) => Err(e),
        Data::Fetching(_) => return None,
    })
}

impl Drop for AmStream {
    fn drop(&mut self) {
        if let Some(w) = self.worker.upgrade() {
            w.clear_am_handler(self.id);
        }
    }
}

impl std::fmt::Debug for AmStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ucp::AmStream(id {}, {} waiting)", self.id, self.len())
    }
}

/// The stream's handler: keeps the message, wakes the task.
fn keep(worker: &crate::WeakWorker, shared: &RefCell<Shared>, m: &mut AmMsg<'_>) {
    let data = match (m.take_data_desc(), worker.upgrade()) {
        (Some(desc), Some(w)) => match w.am_recv_data(desc, Vec::new()) {
            Ok(Issued::Done(v)) => Data::Ready(v),
            Ok(Issued::Pending(r)) => Data::Fetching(r),
            Err(e) => Data::Failed(e),
        },
        _ => Data::Ready(m.data().to_vec()),
    };
    let waker = {
        let mut s = shared.borrow_mut();
        s.queue.push_back(Queued {
            header: m.header().to_vec(),
            data,
            reply_ep: m.reply_ep().cloned(),
        });
        s.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

impl Worker {
    /// The active messages with id `id` as a stream (replaces the handler of `id`): each
    /// message is kept, owned, with its reply endpoint, until [`AmStream::recv`] takes it.
    ///
    /// ```no_run
    /// # async fn serve(worker: ucp::Worker) -> ucp::Result<()> {
    /// let mut requests = worker.am_stream(1)?;
    /// loop {
    ///     let m = requests.recv().await?;
    ///     if let Some(ep) = &m.reply_ep {
    ///         ep.am_send_owned(2, &[], m.data, ucp::AmFlags::default())?.await?;
    ///     }
    /// }
    /// # }
    /// ```
    pub fn am_stream(&self, id: u16) -> Result<AmStream> {
        let shared = Rc::new(RefCell::new(Shared::default()));
        let (s, w) = (shared.clone(), self.downgrade());
        // A fetch completes from progress: the waker of the task that awaits it is the
        // request's own, set when `recv` polls it.
        self.set_am_handler(id, move |m| keep(&w, &s, m))?;
        Ok(AmStream {
            worker: self.downgrade(),
            id,
            shared,
        })
    }
}
