//! UCP peers that find each other by IP address and port (`Worker::listen`,
//! `Worker::connect_sockaddr`): no address goes out of band. Used by tests/ucp_multiprocess.rs.
//!
//! ```text
//! ucp_peer sink ADDR CLIENTS COUNT   server: accepts CLIENTS clients, each sends COUNT numbered
//!                                    messages; checks that none is lost or duplicated
//! ucp_peer send ADDR ID COUNT        client: sends COUNT numbered messages as client ID
//! ucp_peer echo ADDR                 server: checks every message and sends it back; at BYE
//!                                    prints the count and goes on serving (until killed)
//! ucp_peer sizes ADDR [MAX]          client: every size class both ways, up to MAX bytes
//!                                    (default 64 MiB), checked on both sides
//! ucp_peer stall ADDR                server: takes one message, then stops progressing (until
//!                                    killed)
//! ucp_peer flood ADDR [rndv]         client with error mode Peer: sends (rndv: by rendezvous,
//!                                    which waits for the server's fetch) until the server dies,
//!                                    then checks its requests failed and its error handler
//!                                    ran once
//! ```
//! Servers print `listening on IP:PORT` once they listen (ADDR with port 0: the system picks
//! one). `RUCX_TLS`, `RUCX_NET_DEVICES` choose the transports.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucp::{
    AmFlags, AmProto, Context, Ep, EpParams, ErrMode, Issued, Listener, ListenerParams, Request, Worker,
};
use uct::AsyncMode;

const DATA: u16 = 1;
const ECHO: u16 = 2;
const BYE: u16 = 3;
const DEADLINE: Duration = Duration::from_secs(60);

type Res<T> = Result<T, String>;
/// Messages received: (seed from the header, data).
type Inbox = Rc<RefCell<Vec<(u64, Vec<u8>)>>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucp_peer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["sink", addr, n, count] => sink(addr, num(n)?, num(count)?),
        ["send", addr, id, count] => send(addr, num(id)?, num(count)?),
        ["echo", addr] => echo(addr),
        ["sizes", addr] => sizes(addr, 64 << 20),
        ["sizes", addr, max] => sizes(addr, num(max)? as usize),
        ["stall", addr] => stall(addr),
        ["flood", addr] => flood(addr, AmFlags::default()),
        ["flood", addr, "rndv"] => flood(addr, AmFlags::RNDV),
        _ => Err("usage: see the comment at the top of examples/ucp_peer.rs".into()),
    }
}

fn num(s: &str) -> Res<u64> {
    s.parse().map_err(|_| format!("{s:?} is not a number"))
}

fn sockaddr(s: &str) -> Res<SocketAddr> {
    s.parse().map_err(|_| format!("{s:?} is not IP:PORT"))
}

fn worker() -> Res<Worker> {
    let ctx = Context::builder(rucx::context())
        .build()
        .map_err(|e| format!("UCP context: {e}"))?;
    Worker::with_async_mode(&ctx, AsyncMode::Poll).map_err(|e| format!("UCP worker: {e}"))
}

fn wait(w: &Worker, what: &str, mut cond: impl FnMut() -> bool) -> Res<()> {
    let t = Instant::now();
    while !cond() {
        if t.elapsed() > DEADLINE {
            return Err(format!("timed out waiting for {what}"));
        }
        w.progress();
    }
    Ok(())
}

fn finish<T>(w: &Worker, what: &str, r: ucp::Result<Issued<T>>) -> Res<T> {
    match r.map_err(|e| format!("{what}: {e}"))? {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut req) => {
            wait(w, what, || req.is_done())?;
            req.take().expect("done").map_err(|e| format!("{what}: {e}"))
        }
    }
}

/// Byte `i` of message `seed` of `len` bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

/// Messages with id `id` go to `inbox` as (seed from the header, data); the worker fetches a
/// rendezvous message's data before the handler runs.
fn collect(w: &Worker, id: u16, inbox: &Inbox) -> Res<()> {
    let i = inbox.clone();
    w.set_am_handler(id, move |m| {
        let seed = u64::from_le_bytes(m.header().try_into().unwrap_or([0; 8]));
        i.borrow_mut().push((seed, m.data().to_vec()));
    })
    .map_err(|e| format!("the AM handler: {e}"))?;
    Ok(())
}

/// Listens; accepted endpoints go to `eps`.
fn listen(w: &Worker, addr: &str, eps: &Rc<RefCell<Vec<Ep>>>) -> Res<Listener> {
    let e = eps.clone();
    let l = w
        .listen(
            sockaddr(addr)?,
            ListenerParams::new().on_conn_request(move |req| {
                let from = req.client_addr();
                // A client that went away, or exited after its last flush: not this server's error.
                match req.accept(EpParams::new().on_error(|_, _| {})) {
                    Ok(ep) => e.borrow_mut().push(ep),
                    Err(err) => eprintln!("ucp_peer: accepting {from}: {err}"),
                }
            }),
        )
        .map_err(|e| format!("listen on {addr}: {e}"))?;
    println!("listening on {}", l.local_addr());
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    Ok(l)
}

fn sink(addr: &str, clients: u64, count: u64) -> Res<()> {
    let w = worker()?;
    let eps = Rc::default();
    let _l = listen(&w, addr, &eps)?;
    // seen[client][seq]
    let seen = Rc::new(RefCell::new(vec![vec![false; count as usize]; clients as usize]));
    let total = Rc::new(Cell::new(0u64));
    let error = Rc::new(RefCell::new(None::<String>));
    let (s, t, er) = (seen.clone(), total.clone(), error.clone());
    w.set_am_handler(DATA, move |m| {
        let h = m.header();
        let bad = |why: String| {
            er.borrow_mut().get_or_insert(why);
        };
        if h.len() != 16 {
            return bad(format!("a header of {} bytes", h.len()));
        }
        let id = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
        let seq = u64::from_le_bytes(h[8..].try_into().unwrap()) as usize;
        let mut s = s.borrow_mut();
        match s.get_mut(id).and_then(|c| c.get_mut(seq)) {
            None => bad(format!("client {id} message {seq} is out of range")),
            Some(true) => bad(format!("client {id} message {seq} arrived twice")),
            Some(slot) => {
                if m.data() != pattern(m.data().len(), (id * 1_000_003 + seq) as u64) {
                    return bad(format!("client {id} message {seq}: wrong data"));
                }
                *slot = true;
                t.set(t.get() + 1);
            }
        }
    })
    .map_err(|e| format!("the AM handler: {e}"))?;
    let want = clients * count;
    wait(&w, "every client's messages", || {
        total.get() == want || error.borrow().is_some()
    })
    .map_err(|e| format!("{e}: {} of {want} arrived", total.get()))?;
    if let Some(e) = error.borrow_mut().take() {
        return Err(e);
    }
    println!("received {clients}x{count}: none lost, none duplicated");
    Ok(())
}

fn send(addr: &str, id: u64, count: u64) -> Res<()> {
    let w = worker()?;
    let ep = w
        .connect_sockaddr(sockaddr(addr)?, EpParams::new())
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let mut pending: Vec<Request<()>> = Vec::new();
    for seq in 0..count {
        let mut h = id.to_le_bytes().to_vec();
        h.extend_from_slice(&seq.to_le_bytes());
        let data = pattern((seq % 64) as usize, id * 1_000_003 + seq);
        match ep.am_send(DATA, &h, &data, AmFlags::default()) {
            Ok(Issued::Done(())) => {}
            Ok(Issued::Pending(r)) => pending.push(r),
            Err(e) => return Err(format!("message {seq}: {e}")),
        }
        // Keeps the queue bounded: finished requests leave.
        if pending.len() >= 256 {
            w.progress();
            pending.retain(|r| !r.is_done());
        }
    }
    for mut r in pending {
        if !r.is_done() {
            wait(&w, "the sends", || r.is_done())?;
        }
        r.take().expect("done").map_err(|e| format!("a send: {e}"))?;
    }
    finish(&w, "flush", ep.flush())?;
    println!("client {id}: sent {count}");
    Ok(())
}

/// The sizes `sizes` sends: fixed ones up to `max`, and, for each single-message protocol the
/// endpoint has (short, bcopy, zero-copy for owned buffers), the largest size that takes it.
fn size_classes(ep: &Ep, max: usize) -> Vec<(usize, bool)> {
    let mut out: Vec<(usize, bool)> = [0, 1, 64, 200, 60_000, 300_000, 1 << 20, 8 << 20, 64 << 20]
        .into_iter()
        .filter(|&n| n <= max)
        .map(|n| (n, false))
        .collect();
    for (want, owned) in [
        (AmProto::Short, false),
        (AmProto::Bcopy, false),
        (AmProto::Zcopy, true),
    ] {
        let largest = (0..=(1usize << 20))
            .rev()
            .step_by(16)
            .find(|&n| ep.am_protocol(8, n, AmFlags::default(), owned) == want);
        match largest {
            Some(n) if n <= max => out.push((n, owned)),
            _ => println!("no {want} on this endpoint"),
        }
    }
    out.sort();
    out.dedup();
    out
}

fn echo(addr: &str) -> Res<()> {
    let w = worker()?;
    let eps: Rc<RefCell<Vec<Ep>>> = Rc::default();
    let _l = listen(&w, addr, &eps)?;
    let inbox: Inbox = Rc::default();
    let bye = Rc::new(Cell::new(false));
    let b = bye.clone();
    collect(&w, DATA, &inbox)?;
    w.set_am_handler(BYE, move |_| b.set(true))
        .map_err(|e| format!("the AM handler: {e}"))?;
    let mut echoed = 0;
    let mut reported = false;
    // Serves until killed: a client's last acknowledgements may still need this side.
    loop {
        w.progress();
        let msgs: Vec<_> = inbox.borrow_mut().drain(..).collect();
        for (seed, data) in msgs {
            if data != pattern(data.len(), seed) {
                return Err(format!("message {seed} of {} bytes: wrong data", data.len()));
            }
            let ep = eps
                .borrow()
                .first()
                .cloned()
                .ok_or("a message before any client")?;
            // Back in a buffer of our own: zero-copy where the lane allows it.
            let back = pattern(data.len(), seed + 1);
            let r = ep.am_send_owned(ECHO, &(seed + 1).to_le_bytes(), back, AmFlags::default());
            finish(&w, "the echo", r)?;
            echoed += 1;
        }
        if bye.get() && !reported {
            println!("echoed {echoed} messages");
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            reported = true;
        }
    }
}

fn sizes(addr: &str, max: usize) -> Res<()> {
    let w = worker()?;
    let ep = w
        .connect_sockaddr(sockaddr(addr)?, EpParams::new())
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let got: Inbox = Rc::default();
    collect(&w, ECHO, &got)?;
    // The endpoint's protocols are known once it is wired.
    wait(&w, "the connection", || ep.is_connected())?;
    let sizes = size_classes(&ep, max);
    for (i, (n, owned)) in sizes.iter().copied().enumerate() {
        let seed = 10 * i as u64;
        let data = pattern(n, seed);
        let proto = ep.am_protocol(8, n, AmFlags::default(), owned);
        if owned {
            finish(
                &w,
                "a send",
                ep.am_send_owned(DATA, &seed.to_le_bytes(), data, AmFlags::default()),
            )?;
        } else {
            finish(
                &w,
                "a send",
                ep.am_send(DATA, &seed.to_le_bytes(), &data, AmFlags::default()),
            )?;
        }
        wait(&w, "the echo", || !got.borrow().is_empty())?;
        let (s, back) = got.borrow_mut().remove(0);
        if s != seed + 1 || back != pattern(n, seed + 1) {
            return Err(format!("the echo of {n} bytes came back wrong"));
        }
        println!("{n:>9} bytes both ways: {proto}");
    }
    println!("{} sizes", sizes.len());
    finish(&w, "bye", ep.am_send(BYE, &[], &[], AmFlags::default()))?;
    finish(&w, "flush", ep.flush())?;
    println!("all sizes intact");
    Ok(())
}

fn stall(addr: &str) -> Res<()> {
    let w = worker()?;
    let eps = Rc::default();
    let _l = listen(&w, addr, &eps)?;
    let got = Rc::new(Cell::new(false));
    let g = got.clone();
    w.set_am_handler(DATA, move |_| g.set(true))
        .map_err(|e| format!("the AM handler: {e}"))?;
    wait(&w, "a message", || got.get())?;
    println!("stalled");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // The client's sends back up behind a receiver that no longer reads.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn flood(addr: &str, flags: AmFlags) -> Res<()> {
    let w = worker()?;
    let calls = Rc::new(Cell::new(0u32));
    let c = calls.clone();
    let ep = w
        .connect_sockaddr(
            sockaddr(addr)?,
            EpParams::new().err_mode(ErrMode::Peer).on_error(move |_, e| {
                println!("error handler: {e}");
                c.set(c.get() + 1);
            }),
        )
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    wait(&w, "the connection", || ep.is_connected())?;
    let mut pending: Vec<Request<Vec<u8>>> = Vec::new();
    let (mut ok, mut failed, mut refused) = (0u64, 0u64, 0u64);
    let mut announced = false;
    let start = Instant::now();
    // Sends 1 MiB messages, a few in flight, until the endpoint fails.
    let window = 8;
    while calls.get() == 0 {
        if start.elapsed() > DEADLINE {
            return Err("the peer's death was never reported".into());
        }
        if pending.len() < window {
            match ep.am_send_owned(DATA, &0u64.to_le_bytes(), pattern(1 << 20, 0), flags) {
                Ok(Issued::Done(_)) => ok += 1,
                Ok(Issued::Pending(r)) => pending.push(r),
                Err(_) => refused += 1,
            }
        }
        w.progress();
        pending.retain_mut(|r| match r.take() {
            None => true,
            Some(Ok(_)) => {
                ok += 1;
                false
            }
            Some(Err(_)) => {
                failed += 1;
                false
            }
        });
        // Mid-transfer: messages went, and more wait for the lane.
        if !announced && ok >= 1 && pending.len() >= window {
            println!("transferring");
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            announced = true;
        }
    }
    // Every request outstanding at the failure completes with an error; the handler stays at one.
    for mut r in pending {
        wait(&w, "the failed requests", || r.is_done())?;
        match r.take().expect("done") {
            Ok(_) => ok += 1,
            Err(_) => failed += 1,
        }
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(200) {
        w.progress();
    }
    if ep.am_send(DATA, &[], b"x", AmFlags::default()).is_ok() {
        return Err("a send on the failed endpoint was accepted".into());
    }
    println!(
        "sent {ok}, failed {failed}, refused {refused}, error handler called {} time(s)",
        calls.get()
    );
    if calls.get() != 1 {
        return Err(format!("the error handler ran {} times", calls.get()));
    }
    Ok(())
}
