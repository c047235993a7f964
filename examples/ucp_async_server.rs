//! One server, many clients, under tokio (feature `tokio`): the server accepts connection
//! requests as they come (`Listener::next_request().await`) and answers the requests of all
//! its clients from one stream of active messages (`Worker::am_stream`), each answer going back
//! on the message's reply endpoint. The clients, each a worker of its own, connect without
//! blocking the runtime (`AsyncWorker::connect_sockaddr().await`), send their requests one
//! after the other, await each answer and check it. Every worker is driven by an
//! `AsyncWorker::run` task that sleeps in tokio's reactor while the worker has nothing to do.
//!
//! ```text
//! cargo run --features tokio --example ucp_async_server [CLIENTS] [REQUESTS]
//! ```
//! The server runs on a thread with its own current-thread runtime; the clients share the main
//! thread's (a worker is `!Send`: its tasks are local). Requests cycle through short, copied
//! and rendezvous sizes. Defaults: 100 clients, 10 requests each. `RUCX_TLS`,
//! `RUCX_NET_DEVICES` and the other `RUCX_*` variables choose what UCP may use;
//! `RUCX_CM_TIMEOUT` bounds each connect.

use std::cell::{Cell, RefCell};
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use tokio::task::{spawn_local, JoinHandle, LocalSet};
use ucp::tokio::AsyncWorker;
use ucp::{AmFlags, Context, EpParams, Features, ListenerParams, Worker};

const REQUEST: u16 = 10;
const ANSWER: u16 = 11;
const BYE: u16 = 12;
const SIZES: &[usize] = &[8, 3000, 200_000];
const DEADLINE: Duration = Duration::from_secs(120);

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let arg = |i: usize, default: usize| match std::env::args().nth(i).map(|a| a.parse::<usize>()) {
        None => Some(default),
        Some(Ok(n)) if n > 0 => Some(n),
        _ => None,
    };
    let (Some(clients), Some(requests)) = (arg(1, 100), arg(2, 10)) else {
        eprintln!("usage: ucp_async_server [CLIENTS] [REQUESTS]");
        return ExitCode::FAILURE;
    };
    match run(clients, requests) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucp_async_server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(clients: usize, requests: usize) -> Res<()> {
    let ctx = Context::builder(rucx::context())
        .features(Features::AM | Features::WAKEUP)
        .build()
        .map_err(|e| format!("UCP context: {e}"))?;
    println!("resources: {}", ctx.resource_names().join(", "));
    let (tx, rx) = mpsc::channel();
    let sctx = ctx.clone();
    let server = std::thread::spawn(move || on_runtime(server(sctx, tx, clients, requests)));
    let clients = match rx.recv_timeout(DEADLINE) {
        Ok(addr) => on_runtime(all_clients(ctx, addr, clients, requests)),
        Err(_) => Err("the server never said where it listens".into()),
    };
    let server = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    clients.and(server)
}

/// Runs `f` on a current-thread runtime, within [`DEADLINE`].
fn on_runtime(f: impl Future<Output = Res<()>>) -> Res<()> {
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

/// A worker on this thread and the task that drives it (abort it when done with the worker).
fn worker(ctx: &Context) -> Res<(Rc<AsyncWorker>, JoinHandle<()>)> {
    let w = Worker::new(ctx).map_err(|e| format!("UCP worker: {e}"))?;
    let aw = Rc::new(AsyncWorker::new(&w).map_err(|e| format!("AsyncWorker: {e}"))?);
    let driver = aw.clone();
    let task = spawn_local(async move {
        if let Err(e) = driver.run().await {
            eprintln!("ucp_async_server: progress: {e}");
        }
    });
    Ok((aw, task))
}

/// Accepts `clients` clients and answers `requests` requests of each; ends when every client
/// said goodbye (so every answer was received).
async fn server(ctx: Context, addr: mpsc::Sender<SocketAddr>, clients: usize, requests: usize) -> Res<()> {
    let (aw, driver) = worker(&ctx)?;
    let w = aw.worker();
    let listener = w
        .listen("127.0.0.1:0".parse().unwrap(), ListenerParams::new())
        .map_err(|e| format!("listen: {e}"))?;
    // Before the clients can send: the streams exist when their first messages come.
    let mut inbox = w
        .am_stream(REQUEST)
        .map_err(|e| format!("the request stream: {e}"))?;
    let mut byes = w.am_stream(BYE).map_err(|e| format!("the goodbye stream: {e}"))?;
    addr.send(listener.local_addr())
        .map_err(|_| "the clients are gone".to_string())?;

    // Accepting runs beside the answering: a client sends as soon as it is connected.
    let accepted = Rc::new(RefCell::new(Vec::new()));
    let acc = accepted.clone();
    let acceptor = spawn_local(async move {
        while acc.borrow().len() < clients {
            let req = listener
                .next_request()
                .await
                .map_err(|e| format!("accept: {e}"))?;
            let mode = req.err_mode();
            // The server keeps its endpoints: answers go on them (as reply endpoints).
            let ep = req
                .accept(EpParams::new().err_mode(mode))
                .map_err(|e| format!("accept: {e}"))?;
            acc.borrow_mut().push(ep);
        }
        Ok::<_, String>(())
    });

    let mut answers = Vec::new();
    for _ in 0..clients * requests {
        let m = inbox.recv().await.map_err(|e| format!("a request: {e}"))?;
        let ep = m.reply_ep.ok_or("a request without a reply endpoint")?;
        let sent = ep
            .am_send_owned(ANSWER, &m.header, answer(m.data), AmFlags::default())
            .map_err(|e| format!("answering: {e}"))?;
        // Awaited apart, so that the next request need not wait for this send.
        answers.push(spawn_local(sent.into_future()));
    }
    for a in answers {
        a.await
            .map_err(|e| format!("answer task: {e}"))?
            .map_err(|e| format!("answering: {e}"))?;
    }
    for _ in 0..clients {
        byes.recv().await.map_err(|e| format!("a goodbye: {e}"))?;
    }
    acceptor.await.map_err(|e| format!("accept task: {e}"))??;
    println!(
        "server: {} clients accepted, {} requests answered",
        accepted.borrow().len(),
        clients * requests
    );
    driver.abort();
    Ok(())
}

/// The clients, all at once on this thread; fails with the first client's error.
async fn all_clients(ctx: Context, addr: SocketAddr, clients: usize, requests: usize) -> Res<()> {
    let answered = Rc::new(Cell::new(0usize));
    let tasks: Vec<_> = (0..clients)
        .map(|c| spawn_local(client(ctx.clone(), addr, c, requests, answered.clone())))
        .collect();
    for (c, t) in tasks.into_iter().enumerate() {
        t.await
            .map_err(|e| format!("client {c}: task: {e}"))?
            .map_err(|e| format!("client {c}: {e}"))?;
    }
    println!(
        "clients: all {clients} clients answered ({} answers, every one intact)",
        answered.get()
    );
    Ok(())
}

/// Connects, sends `requests` requests one after the other and checks each answer.
async fn client(
    ctx: Context,
    addr: SocketAddr,
    c: usize,
    requests: usize,
    answered: Rc<Cell<usize>>,
) -> Res<()> {
    let (aw, driver) = worker(&ctx)?;
    let mut answers = aw
        .am_stream(ANSWER)
        .map_err(|e| format!("the answer stream: {e}"))?;
    let ep = aw
        .connect_sockaddr(addr, EpParams::new())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    for i in 0..requests {
        let data = payload(SIZES[(c + i) % SIZES.len()], c * requests + i);
        let header = format!("{c}/{i}").into_bytes();
        ep.am_send(REQUEST, &header, &data, AmFlags::REPLY)
            .map_err(|e| format!("request {i}: {e}"))?
            .await
            .map_err(|e| format!("request {i}: {e}"))?;
        let m = answers.recv().await.map_err(|e| format!("answer {i}: {e}"))?;
        if m.header != header || m.data != answer(data) {
            return Err(format!("answer {i}: not the answer to request {i}"));
        }
        answered.set(answered.get() + 1);
    }
    ep.am_send(BYE, &[], &[], AmFlags::default())
        .map_err(|e| format!("goodbye: {e}"))?
        .await
        .map_err(|e| format!("goodbye: {e}"))?;
    // Delivered before the worker goes (a closing worker may drop what is still on its way).
    ep.flush()
        .map_err(|e| format!("flush: {e}"))?
        .await
        .map_err(|e| format!("flush: {e}"))?;
    driver.abort();
    Ok(())
}

/// The answer to a request: its bytes, each plus one.
fn answer(mut data: Vec<u8>) -> Vec<u8> {
    for b in &mut data {
        *b = b.wrapping_add(1);
    }
    data
}

/// Request `seq` of `len` bytes.
fn payload(len: usize, seq: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + seq) as u8).collect()
}
