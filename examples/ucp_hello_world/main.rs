//! UCP hello world, after UCX's `ucp_hello_world`: a server and a client exchange worker
//! addresses (the server's over a TCP side channel, the client's with the tag API), the server
//! answers with a message, and the client measures tag round trips of growing sizes, printing
//! the lanes UCP chose and the protocol of each size.
//!
//! ```text
//! ucp_hello_world [-b|-w|-f] [-s SIZE] [-e send|recv|keepalive]             local: both, as two processes
//! ucp_hello_world --server [-p PORT] [-b|-w|-f] [-s SIZE] [-e ...]            server
//! ucp_hello_world -n HOST [-p PORT] [-b|-w|-f] [-e ...]                       client
//! ```
//! `-b` busy polling, `-w` `Worker::wait`, `-f` event fd + poll(2); `-e` emulates a peer failure
//! with error mode `Peer` (exit status 0: the failure was detected). `-h` says more.

mod args;
mod local;
mod oob;
mod peer;
mod wake;

use std::process::ExitCode;

use args::{Command, Role};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match args::parse(&argv) {
        Ok(Command::Run(a)) => a,
        Ok(Command::Help) => {
            print!("{}", args::usage("ucp_hello_world"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ucp_hello_world: {e}\n\n{}", args::usage("ucp_hello_world"));
            return ExitCode::from(2);
        }
    };
    let r = match &a.role {
        Role::Local => local::run(&a),
        Role::Server => peer::server(&a),
        Role::Client(host) => peer::client(&a, host),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucp_hello_world: {e}");
            ExitCode::FAILURE
        }
    }
}
