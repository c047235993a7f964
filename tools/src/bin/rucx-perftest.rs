//! `rucx-perftest`: UCX's `ucx_perftest` (UCT tests) for rucx. See `rucx-perftest -h`.
#![forbid(unsafe_code)]

#[path = "../perftest/mod.rs"]
mod perftest;

fn main() {
    std::process::exit(perftest::main(std::env::args().collect()));
}
