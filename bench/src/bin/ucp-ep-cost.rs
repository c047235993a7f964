//! `ucp-ep-cost`: what a connected UCP endpoint costs — memory, file descriptors and connection
//! time — measured the same way as `bench/c/ucp-ep-cost-ucx.c` measures UCX.
//!
//! ```text
//! RUCX_TLS=tcp RUCX_NET_DEVICES=lo ucp-ep-cost [-n 1000] [-r rounds] [-a thread|poll]
//! ```
//! One process, one context (AM), two workers (a "server" and a "client"). The client connects
//! `n` endpoints to the server's worker address, sends one 8-byte active message on each, and
//! both workers are progressed until the server's handler has counted all `n`. Printed, per
//! connected endpoint (both ends: the client's endpoint and whatever the server keeps for it):
//! heap bytes in use (glibc's `mallinfo2`), resident memory (`/proc/self/statm`), file
//! descriptors; and the wall time from the first `connect` to the last message received. Each
//! round uses fresh workers; its endpoints are closed before the next. Transports come from
//! `RUCX_TLS` / `RUCX_NET_DEVICES`; `-a` picks the workers' async mode (default: thread, as
//! UCX's workers). Output: the same CSV as `ep-cost` (transport column `ucp/$RUCX_TLS`).
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use ucp::{AmFlags, CloseMode, Context, Features, Issued, Request, Worker};
use uct::AsyncMode;

/// Bytes allocated and not freed, as glibc counts them (0 off glibc): the number
/// `bench/c/ucp-ep-cost-ucx.c` reads for UCX.
fn heap_in_use() -> isize {
    ucs::sys::heap_in_use().unwrap_or(0) as isize
}

fn rss_bytes() -> i64 {
    ucs::sys::resident_bytes().unwrap_or(0) as i64
}

fn fds() -> i64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64)
}

struct Args {
    n: usize,
    rounds: usize,
    mode: AsyncMode,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        n: 1000,
        rounds: 1,
        mode: AsyncMode::Thread,
    };
    let mut it = std::env::args().skip(1);
    while let Some(o) = it.next() {
        let v = it.next().ok_or(format!("{o} needs a value"))?;
        match o.as_str() {
            "-n" => a.n = v.parse().map_err(|_| format!("-n: {v:?} is not a number"))?,
            "-r" => a.rounds = v.parse().map_err(|_| format!("-r: {v:?} is not a number"))?,
            "-a" => {
                a.mode = match v.as_str() {
                    "thread" => AsyncMode::Thread,
                    "poll" => AsyncMode::Poll,
                    _ => return Err(format!("-a: {v:?} is neither thread nor poll")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown option {o} (-n endpoints, -r rounds, -a thread|poll; transports \
                     through RUCX_TLS and RUCX_NET_DEVICES)"
                ))
            }
        }
    }
    if a.n == 0 {
        return Err("-n must be at least 1".into());
    }
    Ok(a)
}

/// Progresses both workers until `cond` or ~60 s since `start` pass.
fn progress_until(
    ws: [&Worker; 2],
    start: Instant,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> Result<(), String> {
    while !cond() {
        for w in ws {
            w.progress();
        }
        if start.elapsed().as_secs() > 60 {
            return Err(format!("{what} timed out after 60 s"));
        }
    }
    Ok(())
}

fn wait_all(ws: [&Worker; 2], reqs: &mut Vec<Request<()>>, what: &str) -> Result<(), String> {
    let start = Instant::now();
    for mut r in reqs.drain(..) {
        let mut res = None;
        progress_until(ws, start, what, || {
            res = r.take();
            res.is_some()
        })?;
        if let Some(Err(e)) = res {
            return Err(format!("{what}: {e}"));
        }
    }
    Ok(())
}

/// One round: returns (seconds, heap bytes, rss bytes, fds) for `n` connected endpoints.
fn round(ctx: &Context, a: &Args) -> Result<(f64, isize, i64, i64), String> {
    let err = |what: &'static str| move |e: ucp::Error| format!("{what}: {e}");
    let server = Worker::with_async_mode(ctx, a.mode).map_err(err("server worker"))?;
    let client = Worker::with_async_mode(ctx, a.mode).map_err(err("client worker"))?;
    let ws = [&server, &client];
    let got = Rc::new(Cell::new(0usize));
    let g = got.clone();
    server
        .set_am_handler(1, move |_| g.set(g.get() + 1))
        .map_err(|e| format!("the AM handler: {e}"))?;
    let addr = server.address().to_vec();
    let payload = 0u64.to_le_bytes();
    let mut eps = Vec::with_capacity(a.n);
    let mut pending = Vec::new();
    let (heap0, rss0, fd0) = (heap_in_use(), rss_bytes(), fds());
    let start = Instant::now();
    for _ in 0..a.n {
        eps.push(client.connect(&addr).map_err(err("connect"))?);
    }
    for ep in &eps {
        if let Issued::Pending(r) = ep
            .am_send(1, &[], &payload, AmFlags::default())
            .map_err(err("am_send"))?
        {
            pending.push(r);
        }
    }
    progress_until(ws, start, "delivery", || got.get() >= a.n)?;
    let secs = start.elapsed().as_secs_f64();
    wait_all(ws, &mut pending, "am_send")?;
    // Let the handshakes' last replies land before measuring.
    for _ in 0..1000 {
        server.progress();
        client.progress();
    }
    let r = (secs, heap_in_use() - heap0, rss_bytes() - rss0, fds() - fd0);
    for ep in &eps {
        if let Issued::Pending(r) = ep.close(CloseMode::Flush) {
            pending.push(r);
        }
    }
    wait_all(ws, &mut pending, "close")?;
    drop(eps);
    Ok(r)
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ucp-ep-cost: {e}");
            std::process::exit(2);
        }
    };
    let tls = std::env::var("RUCX_TLS").unwrap_or_else(|_| "all".into());
    let ctx = match Context::builder(rucx::context()).features(Features::AM).build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ucp-ep-cost: context: {e}");
            std::process::exit(1);
        }
    };
    println!("tool,transport,eps,connect_ms,heap_per_ep,rss_per_ep,fds_per_ep");
    for _ in 0..a.rounds {
        match round(&ctx, &a) {
            Ok((secs, heap, rss, fd)) => {
                let n = a.n as f64;
                println!(
                    "rucx,ucp/{tls},{},{:.2},{:.0},{:.0},{:.2}",
                    a.n,
                    secs * 1e3,
                    heap as f64 / n,
                    rss as f64 / n,
                    fd as f64 / n
                );
            }
            Err(e) => {
                eprintln!("ucp-ep-cost: ucp/{tls}: {e}");
                std::process::exit(1);
            }
        }
    }
}
