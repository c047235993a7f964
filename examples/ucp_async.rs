//! UCP under tokio (feature `tokio`): a server and a client, each a worker on its own thread
//! with a current-thread runtime, exchange active messages with `await`. Each worker is driven
//! by a `ucp::tokio::AsyncWorker` task, which sleeps in tokio's reactor while the worker has
//! nothing to do; the other tasks await sends (`Issued` is a future) and the replies that the
//! AM handlers hand over.
//!
//! ```text
//! cargo run --features tokio --example ucp_async [ROUNDS]
//! ```
//! Each round sends one echo of every size at once and awaits all the replies. `RUCX_TLS`,
//! `RUCX_NET_DEVICES` and the other `RUCX_*` variables choose what UCP may use.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::IntoFuture;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::{spawn_local, LocalSet};
use ucp::tokio::AsyncWorker;
use ucp::{AmFlags, Context, Ep, Features, Issued, Worker};

const ECHO: u16 = 1;
const REPLY: u16 = 2;
const BYE: u16 = 3;
/// Short, copied, zero-copy (owned from 64 KiB) and fragmented messages.
const SIZES: &[usize] = &[8, 1000, 16 << 10, 100 << 10, 1 << 20];
const DEADLINE: Duration = Duration::from_secs(60);

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let rounds = match std::env::args().nth(1).map(|a| a.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: ucp_async [ROUNDS]");
            return ExitCode::FAILURE;
        }
    };
    match run(rounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucp_async: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(rounds: usize) -> Res<()> {
    let ctx = Context::builder(rucx::context())
        .features(Features::AM | Features::WAKEUP)
        .build()
        .map_err(|e| format!("UCP context: {e}"))?;
    println!("resources: {}", ctx.resource_names().join(", "));
    let (tx, rx) = mpsc::channel();
    let sctx = ctx.clone();
    let server = std::thread::spawn(move || on_runtime(server(sctx, tx)));
    let client = match rx.recv_timeout(DEADLINE) {
        Ok(addr) => on_runtime(client(ctx, addr, rounds)),
        Err(_) => Err("the server never sent its address".into()),
    };
    let server = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    client.and(server)
}

/// Runs `f` on a current-thread runtime (the workers are `!Send`: their tasks are local).
fn on_runtime(f: impl std::future::Future<Output = Res<()>>) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    LocalSet::new().block_on(&rt, async {
        tokio::time::timeout(DEADLINE, f)
            .await
            .map_err(|_| format!("not done within {DEADLINE:?}"))?
    })
}

/// A worker on this thread, with the task that drives its progress.
fn worker(ctx: &Context) -> Res<Worker> {
    let w = Worker::new(ctx).map_err(|e| format!("UCP worker: {e}"))?;
    let aw = AsyncWorker::new(&w).map_err(|e| format!("AsyncWorker: {e}"))?;
    spawn_local(async move {
        if let Err(e) = aw.run().await {
            eprintln!("ucp_async: progress: {e}");
        }
    });
    Ok(w)
}

/// What AM handlers hand to the tasks: handlers run inside progress and must not block, so
/// they queue and notify.
struct Mailbox<T> {
    q: RefCell<VecDeque<T>>,
    notify: Notify,
}

impl<T> Mailbox<T> {
    fn new() -> Rc<Self> {
        Rc::new(Mailbox {
            q: RefCell::new(VecDeque::new()),
            notify: Notify::new(),
        })
    }

    fn put(&self, v: T) {
        self.q.borrow_mut().push_back(v);
        self.notify.notify_one();
    }

    async fn get(&self) -> T {
        loop {
            if let Some(v) = self.q.borrow_mut().pop_front() {
                return v;
            }
            self.notify.notified().await;
        }
    }
}

/// A message's data: at hand, or (rendezvous) fetched into a buffer of our own.
fn data_of(w: &ucp::WeakWorker, m: &mut ucp::AmMsg<'_>) -> Issued<Vec<u8>> {
    match (m.take_data_desc(), w.upgrade()) {
        (Some(desc), Some(w)) => w.am_recv_data(desc, Vec::new()).unwrap_or_else(|e| {
            // Reported here; the empty data then fails the comparison.
            eprintln!("ucp_async: am_recv_data: {e}");
            Issued::Done(Vec::new())
        }),
        _ => Issued::Done(m.data().to_vec()),
    }
}

/// Echoes every `ECHO` message to its sender until `BYE`.
async fn server(ctx: Context, addr: mpsc::Sender<Vec<u8>>) -> Res<()> {
    let w = worker(&ctx)?;
    // `None`: goodbye.
    let inbox = Mailbox::<Option<(Ep, Issued<Vec<u8>>)>>::new();
    let i = inbox.clone();
    let wk = w.downgrade();
    w.set_am_handler(ECHO, move |m| {
        if let Some(ep) = m.reply_ep().cloned() {
            i.put(Some((ep, data_of(&wk, m))));
        }
    })
    .map_err(|e| format!("the AM handler: {e}"))?;
    let i = inbox.clone();
    w.set_am_handler(BYE, move |_| i.put(None))
        .map_err(|e| format!("the AM handler: {e}"))?;
    addr.send(w.address().to_vec())
        .map_err(|_| "the client is gone".to_string())?;
    let mut echoes = Vec::new();
    while let Some((ep, data)) = inbox.get().await {
        // A rendezvous message's data arrives later: awaited here, so echoes keep the order.
        let data = data.await.map_err(|e| format!("receiving: {e}"))?;
        // Issued here, in arrival order; awaited by a task of its own, so that the next
        // messages need not wait for this send to complete.
        let sent = ep
            .am_send_owned(REPLY, &[], data, AmFlags::default())
            .map_err(|e| format!("echo: {e}"))?;
        echoes.push(spawn_local(sent.into_future()));
    }
    let echoed = echoes.len();
    for e in echoes {
        e.await
            .map_err(|e| format!("echo task: {e}"))?
            .map_err(|e| format!("echo: {e}"))?;
    }
    println!("server: echoed {echoed} messages");
    Ok(())
}

/// Each round sends every size at once and awaits the replies; then says goodbye.
async fn client(ctx: Context, server_addr: Vec<u8>, rounds: usize) -> Res<()> {
    let w = worker(&ctx)?;
    let replies = Mailbox::<Issued<Vec<u8>>>::new();
    let r = replies.clone();
    let wk = w.downgrade();
    w.set_am_handler(REPLY, move |m| r.put(data_of(&wk, m)))
        .map_err(|e| format!("the AM handler: {e}"))?;
    let ep = w.connect(&server_addr).map_err(|e| format!("connect: {e}"))?;
    for round in 0..rounds {
        // Every size at once: issued in order, then awaited together.
        let mut sends = Vec::new();
        for (k, &len) in SIZES.iter().enumerate() {
            let data = message(len, round * SIZES.len() + k);
            let sent = ep
                .am_send_owned(ECHO, &[], data, AmFlags::REPLY)
                .map_err(|e| format!("sending {len} bytes: {e}"))?;
            sends.push((len, sent));
        }
        for (len, sent) in sends {
            sent.await.map_err(|e| format!("sending {len} bytes: {e}"))?;
        }
        // Replies come in order: the server echoes in arrival order on one endpoint.
        for (k, &len) in SIZES.iter().enumerate() {
            let got = replies.get().await.await.map_err(|e| format!("receiving: {e}"))?;
            if got != message(len, round * SIZES.len() + k) {
                return Err(format!(
                    "round {round}: the echo of {len} bytes came back different"
                ));
            }
        }
    }
    ep.am_send(BYE, &[], &[], AmFlags::default())
        .map_err(|e| format!("goodbye: {e}"))?
        .await
        .map_err(|e| format!("goodbye: {e}"))?;
    println!(
        "client: {rounds} rounds of {} sizes ({:?}), every echo intact",
        SIZES.len(),
        SIZES
    );
    Ok(())
}

/// Message `seq` of `len` bytes.
fn message(len: usize, seq: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + seq) as u8).collect()
}
