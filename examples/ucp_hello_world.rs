//! UCP hello world: one worker echoes active messages back to another; the client prints the
//! lanes its endpoint chose and, per message size, the protocol and the round-trip time.
//!
//! ```text
//! ucp_hello_world                      both workers in this process (a thread each)
//! ucp_hello_world --server [PORT]      wait for a client; its address goes over TCP PORT (13337)
//! ucp_hello_world --client HOST[:PORT] connect to a server
//! ```
//! `RUCX_TLS`, `RUCX_NET_DEVICES` and the other `RUCX_*` variables choose what UCP may use
//! (`rucx-info -c` lists them).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ucp::{AmFlags, Context, Ep, Issued, Worker};

const ECHO: u16 = 1;
const REPLY: u16 = 2;
const BYE: u16 = 3;
const DEFAULT_PORT: u16 = 13337;
const SIZES: &[usize] = &[8, 1024, 16 << 10, 256 << 10, 4 << 20];
const DEADLINE: Duration = Duration::from_secs(30);

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        None => in_process(),
        Some("--server") => match args.get(1).map(|p| p.parse::<u16>()) {
            None => server(DEFAULT_PORT),
            Some(Ok(p)) => server(p),
            Some(Err(_)) => Err(format!("bad port {:?}", args[1])),
        },
        Some("--client") if args.len() == 2 => client(&args[1]),
        Some(_) => Err("usage: ucp_hello_world [--server [PORT] | --client HOST[:PORT]]".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucp_hello_world: {e}");
            ExitCode::FAILURE
        }
    }
}

fn context() -> Res<Context> {
    Context::builder(rucx::context())
        .build()
        .map_err(|e| format!("UCP context: {e}"))
}

fn worker(ctx: &Context) -> Res<Worker> {
    Worker::new(ctx).map_err(|e| format!("UCP worker: {e}"))
}

/// The server side: echoes every `ECHO` message back to its sender until `BYE`.
fn serve(w: &Worker) -> Res<()> {
    let done = std::rc::Rc::new(std::cell::Cell::new(false));
    let wk = w.downgrade();
    w.set_am_handler(ECHO, move |m| {
        let Some(ep) = m.reply_ep().cloned() else { return };
        // A failed echo shows up at the client as a missing reply.
        let echo = move |data: ucp::Result<Vec<u8>>| {
            if let Err(e) = data.and_then(|d| ep.am_send_owned(REPLY, &[], d, AmFlags::default())) {
                eprintln!("ucp_hello_world: echo failed: {e}");
            }
        };
        receive(&wk, m, echo);
    });
    let d = done.clone();
    w.set_am_handler(BYE, move |_| d.set(true));
    while !done.get() {
        w.progress();
    }
    // Let the last echo leave before the worker goes.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(100) {
        w.progress();
    }
    Ok(())
}

/// The client side: connects, shows lanes and protocols, measures echoes of each size.
fn run_client(w: &Worker, server_address: &[u8]) -> Res<()> {
    let ep = w.connect(server_address).map_err(|e| format!("connect: {e}"))?;
    let got = std::rc::Rc::new(std::cell::RefCell::new(None::<Vec<u8>>));
    let g = got.clone();
    let wk = w.downgrade();
    w.set_am_handler(REPLY, move |m| {
        let g = g.clone();
        receive(&wk, m, move |d| *g.borrow_mut() = Some(d.unwrap_or_default()));
    });
    wait(w, "the endpoint to connect", || ep.is_connected())?;
    println!(
        "endpoint to worker {:#x}, lanes:\n{}",
        ep.remote_id(),
        ep.describe_lanes().trim_end()
    );
    println!("\n{:>9}  {:<28} {:>12}", "bytes", "protocol", "round trip");
    for &len in SIZES {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let owned = len >= 64 << 10;
        let iters = if len >= 1 << 20 { 5 } else { 100 };
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            send(w, &ep, &data, owned)?;
            wait(w, "the echo", || got.borrow().is_some())?;
            times.push(t.elapsed());
            if got.borrow_mut().take().as_deref() != Some(&data[..]) {
                return Err(format!("the echo of {len} bytes came back different"));
            }
        }
        times.sort();
        let proto = ep.am_protocol(0, len, AmFlags::REPLY, owned);
        println!(
            "{len:>9}  {:<28} {:>9.1} us",
            proto.to_string(),
            times[iters / 2].as_secs_f64() * 1e6
        );
    }
    match ep.am_send(BYE, &[], &[], AmFlags::default()) {
        Ok(Issued::Pending(r)) => r.wait(w),
        Ok(Issued::Done(())) => Ok(()),
        Err(e) => Err(e),
    }
    .map_err(|e| format!("goodbye: {e}"))?;
    println!("\nall echoes intact");
    Ok(())
}

/// Hands a message's data to `then`: at once, or (a rendezvous message, whose data is still
/// at the sender) once fetched.
fn receive(w: &ucp::WeakWorker, m: &mut ucp::AmMsg<'_>, then: impl FnOnce(ucp::Result<Vec<u8>>) + 'static) {
    match (m.take_data_desc(), w.upgrade()) {
        (Some(desc), Some(w)) => match w.am_recv_data(desc, Vec::new()) {
            Ok(issued) => issued.on_complete(then),
            Err(e) => then(Err(e)),
        },
        _ => then(Ok(m.data().to_vec())),
    }
}

/// Sends `data` as an ECHO with a reply endpoint; waits until the buffer is free again.
fn send(w: &Worker, ep: &Ep, data: &[u8], owned: bool) -> Res<()> {
    let err = |e: ucp::Error| format!("am_send of {} bytes: {e}", data.len());
    if owned {
        match ep
            .am_send_owned(ECHO, &[], data.to_vec(), AmFlags::REPLY)
            .map_err(err)?
        {
            Issued::Done(_) => Ok(()),
            Issued::Pending(r) => r.wait(w).map(drop).map_err(err),
        }
    } else {
        match ep.am_send(ECHO, &[], data, AmFlags::REPLY).map_err(err)? {
            Issued::Done(()) => Ok(()),
            Issued::Pending(r) => r.wait(w).map_err(err),
        }
    }
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

fn in_process() -> Res<()> {
    let ctx = context()?;
    println!("resources: {}", ctx.resource_names().join(", "));
    let (tx, rx) = std::sync::mpsc::channel();
    let sctx = ctx.clone();
    let server = std::thread::spawn(move || -> Res<()> {
        let w = worker(&sctx)?;
        tx.send(w.address().to_vec()).map_err(|e| e.to_string())?;
        serve(&w)
    });
    let addr = rx
        .recv()
        .map_err(|_| "the server thread failed before its address".to_string());
    let r = addr.and_then(|a| run_client(&worker(&ctx)?, &a));
    let s = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    r.and(s)
}

fn server(port: u16) -> Res<()> {
    let ctx = context()?;
    let w = worker(&ctx)?;
    let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listen on port {port}: {e}"))?;
    println!("waiting for a client on port {port}");
    let (mut s, peer) = l.accept().map_err(|e| format!("accept: {e}"))?;
    let a = w.address();
    s.write_all(&(a.len() as u32).to_le_bytes())
        .and_then(|_| s.write_all(a))
        .map_err(|e| format!("sending the address to {peer}: {e}"))?;
    serve(&w)?;
    println!("client {peer} done");
    Ok(())
}

fn client(target: &str) -> Res<()> {
    let target = if target.contains(':') {
        target.to_owned()
    } else {
        format!("{target}:{DEFAULT_PORT}")
    };
    let mut s = TcpStream::connect(&target).map_err(|e| format!("connect to {target}: {e}"))?;
    let mut n = [0u8; 4];
    s.read_exact(&mut n)
        .map_err(|e| format!("reading the server's address: {e}"))?;
    let n = u32::from_le_bytes(n) as usize;
    if n > 1 << 20 {
        return Err(format!(
            "the server sent a {n}-byte address length: not a ucp_hello_world server?"
        ));
    }
    let mut a = vec![0u8; n];
    s.read_exact(&mut a)
        .map_err(|e| format!("reading the server's address: {e}"))?;
    let ctx = context()?;
    run_client(&worker(&ctx)?, &a)
}
