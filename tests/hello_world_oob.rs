//! The unit tests of the `uct_hello_world` example's out-of-band channel (`oob.rs`: the frame
//! parser that reads what the peer sends). They are built here because `cargo test` builds the
//! example itself as a plain binary, which tests/hello_world.rs runs.
#[allow(dead_code)]
#[path = "../examples/uct_hello_world/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../examples/uct_hello_world/oob.rs"]
mod oob;
