//! `ep-cost`: what a connected endpoint costs — memory, file descriptors and connection time —
//! measured the same way as `bench/c/ep-cost-ucx.c` measures UCX.
//!
//! ```text
//! ep-cost [-x tcp] [-d lo] [-n 1000] [-r rounds]
//! ```
//! One process, one worker, two interfaces on the device (a "server" and a "client"). The
//! client creates `n` endpoints to the server (connect-to-iface where the transport has it,
//! else `n` endpoint pairs connected to each other), sends one 8-byte `am_short` on each
//! (retrying on `NoResource` with progress) and progresses until the server's handler has
//! counted all `n`. Printed, per connected endpoint (both ends: the client's endpoint and
//! whatever the server keeps for it): heap bytes in use (glibc's `mallinfo2`), resident
//! memory (`/proc/self/statm`), file descriptors; and the wall time from the first
//! `ep_create` to the last message received. Output: a header line and one CSV row per round.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use uct::{AmCbFlags, AsyncMode, Ep, Iface, IfaceFlags, IfaceParams, Worker};

mod heap {
    //! Heap in use, as glibc counts it: the same number `bench/c/ep-cost-ucx.c` reads for UCX,
    //! and it includes what C libraries (libibverbs) allocate.

    /// Bytes allocated and not freed (0 off glibc).
    pub fn in_use() -> isize {
        ucs::sys::heap_in_use().unwrap_or(0) as isize
    }
}

struct Args {
    tl: String,
    dev: String,
    n: usize,
    rounds: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        tl: "tcp".into(),
        dev: "lo".into(),
        n: 1000,
        rounds: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(o) = it.next() {
        let v = it.next().ok_or(format!("{o} needs a value"))?;
        match o.as_str() {
            "-x" => a.tl = v,
            "-d" => a.dev = v,
            "-n" => a.n = v.parse().map_err(|_| format!("-n: {v:?} is not a number"))?,
            "-r" => a.rounds = v.parse().map_err(|_| format!("-r: {v:?} is not a number"))?,
            _ => {
                return Err(format!(
                    "unknown option {o} (-x transport, -d device, -n endpoints, -r rounds)"
                ))
            }
        }
    }
    if a.n == 0 {
        return Err("-n must be at least 1".into());
    }
    Ok(a)
}

fn rss_bytes() -> i64 {
    ucs::sys::resident_bytes().unwrap_or(0) as i64
}

fn fds() -> i64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64)
}

/// Progresses until `cond` or ~60 s pass.
fn progress_until(w: &Worker, start: Instant, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    while !cond() {
        w.progress();
        if start.elapsed().as_secs() > 60 {
            return Err("timed out after 60 s".into());
        }
    }
    Ok(())
}

/// One round: returns (seconds, heap bytes, rss bytes, fds) for `n` connected endpoints.
fn round(ctx: &uct::Context, a: &Args) -> Result<(f64, isize, i64, i64), String> {
    fn err(what: &'static str) -> impl Fn(uct::Error) -> String {
        move |e| format!("{what}: {e}")
    }
    let worker = Worker::with_async_mode(AsyncMode::Poll).map_err(err("worker"))?;
    let (md, _) = ctx.find_resource(&a.tl, &a.dev).map_err(|e| e.to_string())?;
    let server = Iface::open(&md, &worker, IfaceParams::new(&a.tl, &a.dev)).map_err(err("iface"))?;
    let client = Iface::open(&md, &worker, IfaceParams::new(&a.tl, &a.dev)).map_err(err("iface"))?;
    let got = Rc::new(Cell::new(0usize));
    // On both interfaces, as ep-cost-ucx (UCX's self delivers to the sender's own interface).
    for i in [&server, &client] {
        let g = got.clone();
        i.set_am_handler(1, AmCbFlags::SYNC, move |_| g.set(g.get() + 1))
            .map_err(err("am handler"))?;
    }
    let to_iface = client.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE);
    let dev = server.device_address().map_err(err("device address"))?;
    let addr = server.address().map_err(err("iface address"))?;
    let (heap0, rss0, fd0) = (heap::in_use(), rss_bytes(), fds());
    let start = Instant::now();
    let mut eps: Vec<Ep> = Vec::with_capacity(a.n);
    let mut peers: Vec<Ep> = Vec::new();
    for _ in 0..a.n {
        if to_iface {
            eps.push(
                client
                    .ep_create_connected(&dev, &addr)
                    .map_err(err("ep_create_connected"))?,
            );
        } else {
            let c = client.ep_create().map_err(err("ep_create"))?;
            let s = server.ep_create().map_err(err("ep_create"))?;
            let cdev = client.device_address().map_err(err("device address"))?;
            s.connect_to_ep(&cdev, &c.address().map_err(err("ep address"))?)
                .map_err(err("connect_to_ep"))?;
            c.connect_to_ep(&dev, &s.address().map_err(err("ep address"))?)
                .map_err(err("connect_to_ep"))?;
            eps.push(c);
            peers.push(s);
        }
    }
    for ep in &eps {
        loop {
            match ep.am_short(1, 0, &[]) {
                Ok(()) => break,
                Err(e) if e == uct::Status::NoResource => {
                    worker.progress();
                }
                Err(e) => return Err(format!("am_short: {e}")),
            }
            if start.elapsed().as_secs() > 60 {
                return Err("connecting timed out after 60 s".into());
            }
        }
    }
    progress_until(&worker, start, || got.get() >= a.n)?;
    let secs = start.elapsed().as_secs_f64();
    // Let the handshakes' last replies land before measuring.
    for _ in 0..1000 {
        worker.progress();
    }
    let r = (secs, heap::in_use() - heap0, rss_bytes() - rss0, fds() - fd0);
    drop(eps);
    drop(peers);
    Ok(r)
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ep-cost: {e}");
            std::process::exit(2);
        }
    };
    let ctx = rucx::context();
    println!("tool,transport,eps,connect_ms,heap_per_ep,rss_per_ep,fds_per_ep");
    for _ in 0..a.rounds {
        match round(&ctx, &a) {
            Ok((secs, heap, rss, fd)) => {
                let n = a.n as f64;
                println!(
                    "rucx,{},{},{:.2},{:.0},{:.0},{:.2}",
                    a.tl,
                    a.n,
                    secs * 1e3,
                    heap as f64 / n,
                    rss as f64 / n,
                    fd as f64 / n
                );
            }
            Err(e) => {
                eprintln!("ep-cost: {}/{}: {e}", a.tl, a.dev);
                std::process::exit(1);
            }
        }
    }
}
