//! Transport conformance suite (UCX gtest style): every test runs on every available transport
//! listed in `conformance/targets.rs`, skipping (with a printed note) what a transport does not
//! advertise, after checking that the API reports it as `Unsupported`.
//!
//! Run: `cargo test --test conformance` (filter by target or test name, e.g. `-- tcp_lo` or
//! `-- am_short`; add `-- --nocapture` to see skip notes).

#[macro_use]
#[path = "conformance/targets.rs"]
mod targets;

#[path = "conformance/data.rs"]
mod data;
#[path = "conformance/fixture.rs"]
mod fixture;

#[path = "conformance/am.rs"]
mod am;
#[path = "conformance/atomic.rs"]
mod atomic;
#[path = "conformance/burst.rs"]
mod burst;
#[path = "conformance/errhandle.rs"]
mod errhandle;
#[path = "conformance/flush.rs"]
mod flush;
#[path = "conformance/iface.rs"]
mod iface;
#[path = "conformance/keep.rs"]
mod keep;
#[path = "conformance/lifetime.rs"]
mod lifetime;
#[path = "conformance/misuse_am.rs"]
mod misuse_am;
#[path = "conformance/misuse_rma.rs"]
mod misuse_rma;
#[path = "conformance/pending.rs"]
mod pending;
#[path = "conformance/rma.rs"]
mod rma;
