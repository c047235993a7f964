//! A small remote-procedure-call server and client on UCP active messages, in the shape
//! rFaaS-style invocation systems need: the request id and procedure in the AM header, the
//! reply on the request's reply endpoint, arguments and results from the rendezvous threshold
//! up by rendezvous (the receiver fetches them with `Worker::am_recv_data`). The client checks
//! every result and prints invocation latency percentiles per argument size.
//!
//! ```text
//! rpc [--local] [-m hot|warm] [-i ITERS] [-s SIZE,SIZE,...]   server and client: two threads here
//! rpc --server [-p PORT] [-m hot|warm]                          server (one client, until it ends)
//! rpc -n HOST [-p PORT] [-m hot|warm] [-i ITERS] [-s SIZES]     client
//! ```
//! `-m hot`: both sides spin on `progress` (lowest latency, a core each). `-m warm`: the server
//! sleeps in `poll(2)` on its worker's event fd and the client in `Worker::wait` between calls.

mod client;
#[allow(dead_code)] // the hello world's barriers are not used here
#[path = "../ucp_hello_world/oob.rs"]
mod oob;
mod proto;
mod server;
#[allow(dead_code)] // the hello world's `-b/-w/-f` names are not used here
#[path = "../ucp_hello_world/wake.rs"]
mod wake;

use std::process::ExitCode;

use ucp::{Context, Features, Worker};
use wake::Wake;

const DEFAULT_PORT: u16 = 13337;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hot,
    Warm,
}

impl Mode {
    fn server_wake(self) -> Wake {
        match self {
            Mode::Hot => Wake::Busy,
            Mode::Warm => Wake::Fd,
        }
    }

    fn client_wake(self) -> Wake {
        match self {
            Mode::Hot => Wake::Busy,
            Mode::Warm => Wake::Wait,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mode::Hot => "hot: both sides busy-poll",
            Mode::Warm => "warm: the server sleeps on its event fd, the client in Worker::wait",
        }
    }
}

enum Role {
    Local,
    Server,
    Client(String),
}

struct Args {
    role: Role,
    port: u16,
    mode: Mode,
    opts: client::Opts,
}

const USAGE: &str =
    "usage: rpc [--local | --server | -n HOST] [-p PORT] [-m hot|warm] [-i ITERS] [-s SIZE,...] [-h]
  --local        server and client as two threads of this process (the default)
  --server       serve one client on side-channel port PORT (default 13337; 0: any, printed)
  -n HOST        call the server on HOST
  -m hot|warm    hot: busy polling (default); warm: sleep on the event fd / in Worker::wait
  -i ITERS       measured calls per size (default 1000; a tenth from 256 KiB up)
  -s SIZES       argument sizes in bytes (default 64,4096,65536,1048576)
  -h, --help     print this help";

/// The arguments, or `None` for `-h`/`--help`.
fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        role: Role::Local,
        port: DEFAULT_PORT,
        mode: Mode::Hot,
        opts: client::Opts {
            sizes: vec![64, 4096, 64 << 10, 1 << 20],
            iters: 1000,
            wake: Wake::Busy,
        },
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--local" => a.role = Role::Local,
            "--server" => a.role = Role::Server,
            "-n" => a.role = Role::Client(value()?.clone()),
            "-p" => {
                let v = value()?;
                a.port = v.parse().map_err(|_| format!("-p {v}: expected a port number"))?
            }
            "-m" => {
                a.mode = match value()?.as_str() {
                    "hot" => Mode::Hot,
                    "warm" => Mode::Warm,
                    v => return Err(format!("-m {v}: expected hot or warm")),
                }
            }
            "-i" => {
                let v = value()?;
                a.opts.iters = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("-i {v}: expected a positive count"))?
            }
            "-s" => {
                let v = value()?;
                a.opts.sizes = v
                    .split(',')
                    .map(|s| s.parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("-s {v}: expected sizes in bytes, comma-separated"))?
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    a.opts.wake = a.mode.client_wake();
    Ok(Some(a))
}

fn context(mode: Mode) -> Result<Context, String> {
    let f = match mode {
        Mode::Hot => Features::AM,
        Mode::Warm => Features::AM | Features::WAKEUP,
    };
    Context::builder(rucx::context())
        .features(f)
        .build()
        .map_err(|e| format!("UCP context: {e}"))
}

fn worker(ctx: &Context) -> Result<Worker, String> {
    Worker::new(ctx).map_err(|e| format!("UCP worker: {e}"))
}

/// Server and client as two threads, the address handed over in memory.
fn local(a: &Args) -> Result<(), String> {
    let ctx = context(a.mode)?;
    println!("rpc, local: server and client threads ({})", a.mode.describe());
    let (tx, rx) = std::sync::mpsc::channel();
    let (sctx, wake) = (ctx.clone(), a.mode.server_wake());
    let server = std::thread::spawn(move || -> Result<u64, String> {
        let w = worker(&sctx)?;
        tx.send(w.address().to_vec()).map_err(|e| e.to_string())?;
        server::serve(&w, wake)
    });
    let r = rx
        .recv()
        .map_err(|_| "the server thread failed before its address".to_string())
        .and_then(|addr| client::run(&worker(&ctx)?, &addr, &a.opts));
    // On an error the server waits for a SHUTDOWN that will not come: leave it.
    r?;
    let served = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())??;
    println!("the server served {served} calls");
    Ok(())
}

fn serve(a: &Args) -> Result<(), String> {
    let ctx = context(a.mode)?;
    let w = worker(&ctx)?;
    let (l, port) = oob::listen(a.port)?;
    println!("rpc server on port {port} ({})", a.mode.describe());
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let (_ch, peer) = oob::accept(&l, w.address())?;
    println!("client {peer} connected");
    let served = server::serve(&w, a.mode.server_wake())?;
    println!("served {served} calls");
    Ok(())
}

fn call(a: &Args, host: &str) -> Result<(), String> {
    let (_ch, addr) = oob::connect(host, a.port)?;
    let ctx = context(a.mode)?;
    println!("rpc client of {host}:{} ({})", a.port, a.mode.describe());
    client::run(&worker(&ctx)?, &addr, &a.opts)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rpc: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let r = match &a.role {
        Role::Local => local(&a),
        Role::Server => serve(&a),
        Role::Client(host) => call(&a, host),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpc: {e}");
            ExitCode::FAILURE
        }
    }
}
