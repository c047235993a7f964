//! A scripted uct peer process for multi-process and multi-host tests (`scripts/netns-test.sh`):
//! opens an interface, prints `RUCXPEER addr <dev-hex>:<iface-hex>`, and sends and/or receives a
//! stream of stamped, verifiable messages. Run `tcp_peer --help` for the options and exit codes.
//!
//! ```text
//! cargo run --example tcp_peer -- --dev lo --expect-end 1            # receiver
//! cargo run --example tcp_peer -- --dev lo --connect <addr> --send 10000   # sender
//! ```
//! The logic lives in the test kit (`rucx_testkit::tcp::peer`), shared with the tcp tests.

use rucx_testkit::tcp::peer;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = match peer::parse(&args) {
        Ok(a) => a,
        Err(e) => {
            if e.is_empty() {
                println!("{}", peer::USAGE);
                std::process::exit(0);
            }
            eprintln!("tcp_peer: {e}\n{}", peer::USAGE);
            std::process::exit(peer::EXIT_USAGE);
        }
    };
    let code = peer::run(&rucx::context(), &a);
    std::process::exit(code);
}
