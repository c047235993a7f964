//! UCP client and server, after UCX's `ucp_client_server`: the client reaches the server by
//! its IP address and port (`Worker::listen`, `Worker::connect_sockaddr`; no side channel) and
//! sends it messages with the stream, tag or active-message API; the server checks them.
//!
//! ```text
//! ucp_client_server [-l IP] [-p PORT] [-c stream|tag|am] [-i ITERS] [-s SIZE] [--once]   server
//! ucp_client_server -a SERVER [-p PORT] [-c stream|tag|am] [-i ITERS] [-s SIZE]          client
//! ```
//! Both sides use error mode `Peer` and a 1 s keepalive: a failed peer or a cut link ends
//! the client, and a `--once` server, with exit status 1 and the failure on stderr; a server
//! without `--once` drops a client that fails, sends a wrong message or is silent for
//! `--idle` seconds (10), says so on stderr, and serves the next. `-h` says more.

mod args;
mod client;
mod common;
mod server;

use std::process::ExitCode;

use args::{Command, Role};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match args::parse(&argv) {
        Ok(Command::Run(a)) => a,
        Ok(Command::Help) => {
            print!("{}", args::usage("ucp_client_server"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ucp_client_server: {e}\n\n{}", args::usage("ucp_client_server"));
            return ExitCode::from(2);
        }
    };
    let (who, r) = match &a.role {
        Role::Server(ip) => ("server", server::run(&a, *ip)),
        Role::Client(host) => ("client", client::run(&a, host)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucp_client_server: {who}: {e}");
            ExitCode::FAILURE
        }
    }
}
