//! `socket-floor`: the bare-socket floor for the TCP benchmarks — what a non-blocking TCP socket
//! on loopback does with no transport around it, measured like `ucx_perftest` measures.
//!
//! ```text
//! socket-floor lat    [-s 8]     [-n 100000] [-w 1000]   # ping-pong, reports RTT/2
//! socket-floor stream [-s 65536] [-n 20000]  [-w 100]    # one-way stream, then a 1-byte ack
//! socket-floor line   [-n 1000000]                       # a cache line between CPUs 0 and 1
//! socket-floor memcpy [-s 8000]  [-n 1000000] [-w 1000]  # copy bandwidth, one buffer to another
//! ```
//! `--cc NAME` (lat, stream) sets the sockets' congestion control (TCP_CONGESTION), e.g. reno,
//! what rucx's tcp uses on loopback (`RUCX_TCP_CONGESTION=auto`); without it the system's
//! default, what UCX uses.
//! A server thread and a client thread talk over 127.0.0.1 with `TCP_NODELAY`, both busy-polling
//! non-blocking sockets (as UCX's tcp transport progresses). Output is `ucx_perftest -f -v`'s
//! CSV (header + one row: iterations, percentile/avg/overall latency in µs, avg/overall
//! bandwidth in MB/s = MiB/s, avg/overall message rate), so the same parser reads all three
//! tools. The percentile column is the median per-iteration time for `lat`, 0 for `stream`.
//!
//! `line` tells where the two CPUs are: two threads pinned to CPUs 0 and 1 hand a cache line
//! back and forth, and the latency columns give the one-way time in µs: a few hundredths when
//! both CPUs share an L3 cache, several times that across dies. The floor ping-pong and tcp's
//! direct reads depend on it. It is also the shared-memory transports' latency floor: a message
//! between two processes of one host costs at least that line's trip.
//!
//! `memcpy` is their bandwidth floor: one thread copies `-s` bytes from one buffer to another
//! (both stay in cache between copies, as a FIFO's elements and a rendezvous buffer reused by
//! the benchmark do), bandwidth in MB/s.
#![forbid(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

struct Args {
    mode: String,
    size: usize,
    iters: u64,
    warmup: u64,
    /// TCP_CONGESTION of both sockets; `None`: the system's default.
    cc: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = std::env::args().skip(1);
    let mode = a.next().ok_or("missing mode: lat, stream, line or memcpy")?;
    if !matches!(mode.as_str(), "lat" | "stream" | "line" | "memcpy") {
        return Err(format!("unknown mode {mode:?}: lat, stream, line or memcpy"));
    }
    let (size, iters, warmup) = match mode.as_str() {
        "stream" => (65536, 20_000, 100),
        "line" => (8, 1_000_000, 10_000),
        "memcpy" => (8000, 1_000_000, 1000),
        _ => (8, 100_000, 1000),
    };
    let mut args = Args {
        mode,
        size,
        iters,
        warmup,
        cc: None,
    };
    while let Some(o) = a.next() {
        let v = a.next().ok_or(format!("{o} needs a value"))?;
        if o == "--cc" {
            args.cc = Some(v);
            continue;
        }
        let n: u64 = v.parse().map_err(|_| format!("{o}: {v:?} is not a number"))?;
        match o.as_str() {
            "-s" => args.size = n.max(1) as usize,
            "-n" => args.iters = n.max(1),
            "-w" => args.warmup = n,
            _ => {
                return Err(format!(
                    "unknown option {o} (-s size, -n iterations, -w warm-up, --cc congestion control)"
                ))
            }
        }
    }
    Ok(args)
}

/// Non-blocking exact read: spins on `WouldBlock`.
fn read_full(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                std::hint::spin_loop()
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Non-blocking exact write: spins on `WouldBlock`.
fn write_full(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match s.write(&buf[off..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                std::hint::spin_loop()
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn pair(cc: Option<&str>) -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    for x in [&c, &s] {
        x.set_nodelay(true)?;
        x.set_nonblocking(true)?;
        if let Some(cc) = cc {
            let name = std::ffi::OsString::from(cc);
            nix::sys::socket::setsockopt(x, nix::sys::socket::sockopt::TcpCongestion, &name)
                .map_err(|e| std::io::Error::other(format!("TCP_CONGESTION {cc:?}: {e}")))?;
        }
    }
    Ok((c, s))
}

/// Echo server for `lat`: `total` messages of `size` bytes back to the sender.
fn echo(mut s: TcpStream, size: usize, total: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; size];
    for _ in 0..total {
        read_full(&mut s, &mut buf)?;
        write_full(&mut s, &buf)?;
    }
    Ok(())
}

/// Sink server for `stream`: reads `total` messages, then acknowledges with one byte.
fn sink(mut s: TcpStream, size: usize, total: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; size];
    for _ in 0..total {
        read_full(&mut s, &mut buf)?;
    }
    write_full(&mut s, &[1])
}

/// Prints the CSV; `bytes_per_sec` and `msgs_per_sec` as UCX counts them.
fn print(iters: u64, pct_us: f64, lat_us: f64, bytes_per_sec: f64, msgs_per_sec: f64) {
    let bw = bytes_per_sec / (1024.0 * 1024.0);
    let mr = msgs_per_sec;
    println!("iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr");
    println!("{iters},{pct_us:.3},{lat_us:.3},{lat_us:.3},{bw:.2},{bw:.2},{mr:.0},{mr:.0}");
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

/// `line`: one-way time of a cache line between CPUs 0 and 1 (the two threads take turns
/// storing the next count into one atomic word).
fn cache_line(a: &Args) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Err(std::io::Error::other("line needs two CPUs"));
    }
    let word = Arc::new(AtomicU64::new(0));
    let total = a.warmup + a.iters;
    let w = word.clone();
    let peer = std::thread::spawn(move || -> std::io::Result<()> {
        pin(1)?;
        for i in 0..total {
            while w.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            w.store(2 * i + 2, Ordering::Release);
        }
        Ok(())
    });
    pin(0)?;
    let mut start = Instant::now();
    for i in 0..total {
        if i == a.warmup {
            start = Instant::now();
        }
        word.store(2 * i + 1, Ordering::Release);
        while word.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    peer.join()
        .map_err(|_| std::io::Error::other("peer thread panicked"))??;
    let one_way_us = secs / a.iters as f64 / 2.0 * 1e6;
    let n = a.iters as f64;
    print(a.iters, one_way_us, one_way_us, 0.0, n / secs * 2.0);
    Ok(())
}

/// `memcpy`: copies `size` bytes between two buffers `iters` times.
fn copy_bw(a: &Args) -> std::io::Result<()> {
    let src = vec![0x5au8; a.size];
    let mut dst = vec![0u8; a.size];
    for _ in 0..a.warmup {
        dst.copy_from_slice(std::hint::black_box(&src));
    }
    let start = Instant::now();
    for _ in 0..a.iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    let secs = start.elapsed().as_secs_f64();
    let n = a.iters as f64;
    print(a.iters, 0.0, secs / n * 1e6, n * a.size as f64 / secs, n / secs);
    Ok(())
}

fn run(a: &Args) -> std::io::Result<()> {
    if a.mode == "line" {
        return cache_line(a);
    }
    if a.mode == "memcpy" {
        return copy_bw(a);
    }
    let (mut c, s) = pair(a.cc.as_deref())?;
    let total = a.warmup + a.iters;
    let (size, lat) = (a.size, a.mode == "lat");
    let server = std::thread::spawn(move || {
        if lat {
            echo(s, size, total)
        } else {
            sink(s, size, total)
        }
    });
    let mut buf = vec![0x5au8; a.size];
    if lat {
        for _ in 0..a.warmup {
            write_full(&mut c, &buf)?;
            read_full(&mut c, &mut buf)?;
        }
        let mut times = Vec::with_capacity(a.iters as usize);
        let start = Instant::now();
        let mut prev = start;
        for _ in 0..a.iters {
            write_full(&mut c, &buf)?;
            read_full(&mut c, &mut buf)?;
            let now = Instant::now();
            times.push((now - prev).as_secs_f64());
            prev = now;
        }
        let secs = start.elapsed().as_secs_f64();
        let mid = times.len() / 2;
        let median = *times.select_nth_unstable_by(mid, |x, y| x.total_cmp(y)).1;
        // Ping-pong: half a round trip; rates doubled (UCX's factor 2).
        let n = a.iters as f64;
        print(
            a.iters,
            median / 2.0 * 1e6,
            secs / n / 2.0 * 1e6,
            n * a.size as f64 / secs * 2.0,
            n / secs * 2.0,
        );
    } else {
        for _ in 0..a.warmup {
            write_full(&mut c, &buf)?;
        }
        let start = Instant::now();
        for _ in 0..a.iters {
            write_full(&mut c, &buf)?;
        }
        let mut ack = [0u8];
        read_full(&mut c, &mut ack)?;
        let secs = start.elapsed().as_secs_f64();
        let n = a.iters as f64;
        print(a.iters, 0.0, secs / n * 1e6, n * a.size as f64 / secs, n / secs);
    }
    server
        .join()
        .map_err(|_| std::io::Error::other("server thread panicked"))?
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("socket-floor: {e}");
            eprintln!("usage: socket-floor lat|stream|line|memcpy [-s size] [-n iterations] [-w warm-up]");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&a) {
        eprintln!("socket-floor: {e}");
        std::process::exit(1);
    }
}
