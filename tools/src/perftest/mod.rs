//! `rucx-perftest`: UCX's `ucx_perftest` for rucx's transport layer, same command line, same
//! measurement method and same output, so the two can be run side by side.
//!
//! Flow (as `ucx_perftest`): parse options → out-of-band setup (loopback, or server/client over
//! TCP where the client sends its parameters) → header → transport setup and capability check
//! agreed by both sides → warm-up (runs of 1, 2, 4, ... iterations until `-w` iterations or
//! 100 ms) → the measured run with a row about every second → final row → teardown.
//!
//! A side whose peer dies (or fails) stops waiting for it and exits with status 255 and a
//! message: every wait loop watches the transport's failures and the out-of-band connection
//! ([`watch`]).

mod cli;
mod clock;
mod measure;
mod params;
mod report;
mod rte;
mod runner;
mod setup;
mod ucp_bench;
mod ucp_rma;
mod watch;

use std::io::Write as _;
use std::os::unix::net::UnixStream;

use ucs::{Result, Status};

use cli::{Options, Parsed, PrintFlags, Role};
use measure::Perf;
use params::{Params, TestType};
use report::Printer;
use rte::{Link, Rte};
use runner::Bench;
use setup::Setup;

/// Exit status of a failed run (`ucx_perftest` returns -1).
const EXIT_FAILURE: i32 = 255;
/// Exit status of a command-line error (`ucx_perftest` returns -127).
const EXIT_USAGE: i32 = 129;

/// Runs the tool with `args` (program name first); returns the exit status.
pub fn main(args: Vec<String>) -> i32 {
    ucs::log::init();
    let program = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map_or_else(
            || "rucx-perftest".to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
    let opts = match cli::parse(&args[1.min(args.len())..]) {
        Ok(Parsed::Run(o)) => *o,
        Ok(Parsed::Help) => {
            print!("{}", cli::usage(&program));
            return 0;
        }
        Err(_) => {
            print!("{}", cli::usage(&program));
            return EXIT_USAGE;
        }
    };
    clock::init();
    match run(opts) {
        Ok(()) => 0,
        Err(_) => EXIT_FAILURE,
    }
}

fn run(opts: Options) -> Result<()> {
    let mut print = opts.print;
    match opts.role.clone() {
        Role::Loopback => {
            print.test = true;
            print.results = true;
            run_test(opts.params, print, Rte::Loopback { posted: Vec::new() })
        }
        Role::Server => {
            let (stream, _) = rte::accept(opts.port, opts.ipv6)?;
            serve(Link::Tcp(stream), PrintFlags { test: true, ..print })
        }
        Role::Client(host) => {
            let stream = rte::connect(&host, opts.port, opts.ipv6)?;
            let mut r = Rte::sock(Link::Tcp(stream), false)?;
            r.post(&opts.params.encode())?;
            print.results = true;
            run_test(opts.params, print, r)
        }
        Role::LoopbackThreads => {
            let (a, b) = UnixStream::pair().map_err(|e| {
                ucs::error!("socketpair() failed: {e}");
                Status::IoError
            })?;
            let server = std::thread::Builder::new()
                .name("perftest-server".into())
                .spawn(move || serve(Link::Unix(a), PrintFlags::default()))
                .map_err(|_| Status::NoMemory)?;
            let mut r = Rte::sock(Link::Unix(b), false)?;
            r.post(&opts.params.encode())?;
            print.test = true;
            print.results = true;
            let client = run_test(opts.params, print, r);
            let server = server.join().unwrap_or(Err(Status::IoError.into()));
            client.and(server)
        }
    }
}

/// The server side: takes the client's parameters, then runs the same test.
fn serve(link: Link, print: PrintFlags) -> Result<()> {
    let mut r = Rte::sock(link, true)?;
    let blob = r.recv(64 * 1024, &mut || {})?;
    let p = Params::decode(&blob)?;
    run_test(p, print, r)
}

/// UCX's `run_test`: header, parameter check, then the run.
fn run_test(mut p: Params, print: PrintFlags, mut rte: Rte) -> Result<()> {
    p.adjust()?;
    let h = report::header(&p, print);
    {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(h.as_bytes());
        let _ = out.flush();
    }
    let r = p.check().and_then(|()| perf_run(&p, print, &mut rte));
    if let Err(e) = &r {
        ucs::error!("Failed to run test: {e}");
    }
    r
}

/// UCX's `ucx_perf_run` for UCP tests.
fn ucp_perf_run(p: &Params, print: PrintFlags, rte: &mut Rte) -> Result<()> {
    let pingpong = p.desc().ty == TestType::PingPong;
    let mut perf = Perf::new(
        p.max_iter,
        p.report_interval,
        pingpong,
        p.percentile_rank,
        Printer { flags: print },
    );
    let mut bench = ucp_bench::UcpBench::new(p, rte)?;
    let result = (|| {
        // Warm-up as for UCT: runs of 1, 2, 4, ... until -w iterations or the time is up.
        let deadline = clock::accurate() + p.warmup_time;
        let (mut chunk, mut total) = (1u64, 0u64);
        while total < p.warmup_iter {
            perf.set_warmup(chunk);
            bench.run(p, &mut perf, rte)?;
            perf.prepare_new_run(p.max_iter, p.report_interval);
            let own = if clock::accurate() > deadline {
                Status::Ok
            } else {
                Status::InProgress
            };
            match rte.exchange_status(own, &mut || bench.progress())? {
                Status::InProgress => {}
                Status::Ok => break,
                e => return Err(rte::status_error(e)),
            }
            total += chunk;
            chunk *= 2;
        }
        bench.run(p, &mut perf, rte)?;
        rte.barrier(&mut || bench.progress())?;
        perf.report_final();
        if p.validate {
            ucp_bench::exchange_validation(&bench, rte)?;
        }
        Ok(())
    })();
    let cleanup = bench.cleanup(rte);
    result.and(cleanup)
}

/// UCX's `ucx_perf_run` for UCT tests.
fn perf_run(p: &Params, print: PrintFlags, rte: &mut Rte) -> Result<()> {
    if p.desc().api == params::Api::Ucp {
        return ucp_perf_run(p, print, rte);
    }
    let ctx = rucx::context();
    let pingpong = p.desc().ty == TestType::PingPong;
    let mut perf = Perf::new(
        p.max_iter,
        p.report_interval,
        pingpong,
        p.percentile_rank,
        Printer { flags: print },
    );
    let setup = Setup::new(&ctx, p, rte)?;
    let result = (|| {
        let mut bench = Bench::new(p, &setup)?;
        let mut progress = || {
            setup.worker.progress();
        };
        warmup(p, &mut perf, &mut bench, rte, &setup.worker)?;
        bench.run(&mut perf, rte)?;
        rte.barrier(&mut progress)?;
        perf.report_final();
        if p.validate {
            let own = bench.validation_status(rte.group_index());
            match rte.exchange_status(own, &mut progress)? {
                Status::Ok => {}
                e => return Err(rte::status_error(e)),
            }
        }
        Ok(())
    })();
    let cleanup = setup.cleanup(rte);
    result.and(cleanup)
}

/// UCX's `ucx_perf_do_warmup`: runs of 1, 2, 4, ... iterations until `-w` in total or the
/// warm-up time is up (both sides agree when to stop).
fn warmup(
    p: &Params,
    perf: &mut Perf,
    bench: &mut Bench<'_>,
    rte: &mut Rte,
    worker: &uct::Worker,
) -> Result<()> {
    let deadline = clock::accurate() + p.warmup_time;
    let (mut chunk, mut total) = (1u64, 0u64);
    while total < p.warmup_iter {
        perf.set_warmup(chunk);
        bench.run(perf, rte)?;
        let progress = &mut || {
            worker.progress();
        };
        rte.barrier(progress)?;
        perf.prepare_new_run(p.max_iter, p.report_interval);
        let own = if clock::accurate() > deadline {
            Status::Ok
        } else {
            Status::InProgress
        };
        match rte.exchange_status(own, progress)? {
            Status::InProgress => {}
            Status::Ok => return Ok(()),
            e => return Err(rte::status_error(e)),
        }
        total += chunk;
        chunk *= 2;
    }
    Ok(())
}
