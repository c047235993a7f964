//! UCX's `uct_hello_world` in rucx: a client sends one active message to a server over a uct
//! transport, after exchanging addresses over a TCP side channel.
//!
//! ```text
//! cargo run --example uct_hello_world -- -l -b              # server and client in this process
//! cargo run --example uct_hello_world -- -t tcp -d lo       # server
//! cargo run --example uct_hello_world -- -t tcp -d lo -n 127.0.0.1 -z   # client
//! ```
//! Flow (each side): open the interface → exchange device/interface/endpoint addresses (see
//! `oob.rs` for the wire format) → connect → barrier → the client sends (`-i` am_short, `-b`
//! am_bcopy, `-z` am_zcopy from registered memory) and the server checks the message byte for
//! byte → the server acknowledges over the side channel, so both exit codes say whether the
//! message arrived intact. With `-l` both sides run on this thread, progressed alternately: uct
//! objects are single-threaded, and `self` reaches only interfaces on its own thread.
//! Run `-h` for the options and exit codes.
#![forbid(unsafe_code)]

mod args;
mod error;
mod oob;
mod pattern;
mod peer;

use std::process::ExitCode;

use args::{Args, Command};
use error::{Failure, Res};
use oob::Oob;
use peer::{Peer, Role};

/// Progress closure over the given workers (each `progress` call polls them all).
fn progress_all(peers: &[&Peer]) -> impl FnMut() -> u32 {
    let workers: Vec<uct::Worker> = peers.iter().map(|p| p.worker().clone()).collect();
    move || workers.iter().map(uct::Worker::progress).sum()
}

fn ack_failure() -> Failure {
    Failure::new(
        "the server reports the message did not arrive intact",
        "see the server's output",
    )
}

fn run_server(a: &Args) -> Res<()> {
    let ctx = rucx::context();
    let mut p = Peer::open(&ctx, a, Role::Server)?;
    println!("{}", p.describe());
    let listener = oob::listen("0.0.0.0", a.port)?;
    println!("[server] waiting for a client on port {} ...", a.port);
    let mut oob = oob::accept(&listener, a.timeout)?;
    drop(listener);
    let mut progress = progress_all(&[&p]);
    p.send_addresses(&mut oob)?;
    p.connect(&mut oob, &mut progress)?;
    oob.barrier_send()?;
    oob.barrier_wait(&mut progress)?;
    let outcome = p.receive(&mut progress);
    oob.send_ack(outcome.is_ok())?;
    outcome
}

fn run_client(a: &Args, host: &str) -> Res<()> {
    let ctx = rucx::context();
    let mut p = Peer::open(&ctx, a, Role::Client)?;
    println!("{}", p.describe());
    let mut oob = oob::connect(host, a.port, a.timeout)?;
    let mut progress = progress_all(&[&p]);
    p.send_addresses(&mut oob)?;
    p.connect(&mut oob, &mut progress)?;
    oob.barrier_send()?;
    oob.barrier_wait(&mut progress)?;
    p.send_message(&mut progress)?;
    if !oob.recv_ack(&mut progress)? {
        return Err(ack_failure());
    }
    println!("[client] the server confirmed the message arrived intact");
    Ok(())
}

/// Both sides on this thread: the same steps as above, interleaved.
fn run_loopback(a: &Args) -> Res<()> {
    let ctx = rucx::context();
    let mut server = Peer::open(&ctx, a, Role::Server)?;
    let mut client = Peer::open(&ctx, a, Role::Client)?;
    println!("{}\n{}", server.describe(), client.describe());
    let (mut so, mut co) = Oob::pair(a.timeout)?;
    let mut progress = progress_all(&[&server, &client]);
    server.send_addresses(&mut so)?;
    client.send_addresses(&mut co)?;
    server.connect(&mut so, &mut progress)?;
    client.connect(&mut co, &mut progress)?;
    so.barrier_send()?;
    co.barrier_send()?;
    so.barrier_wait(&mut progress)?;
    co.barrier_wait(&mut progress)?;
    client.send_message(&mut progress)?;
    let outcome = server.receive(&mut progress);
    so.send_ack(outcome.is_ok())?;
    if !co.recv_ack(&mut progress)? {
        return Err(outcome.err().unwrap_or_else(ack_failure));
    }
    println!("[client] the server confirmed the message arrived intact");
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let prog = argv.first().map_or("uct_hello_world", String::as_str);
    let a = match args::parse(argv.get(1..).unwrap_or_default()) {
        Ok(Command::Run(a)) => a,
        Ok(Command::Help) => {
            print!("{}", args::usage(prog));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{}", args::usage(prog));
            return ExitCode::from(2);
        }
    };
    let r = match (&a.server, a.loopback) {
        (_, true) => run_loopback(&a),
        (Some(host), false) => run_client(&a, host),
        (None, false) => run_server(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("{f}");
            ExitCode::from(if f.unsupported { 77 } else { 1 })
        }
    }
}
