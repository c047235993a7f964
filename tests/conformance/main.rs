//! Transport conformance suite (UCX gtest style): every test runs on every transport listed in
//! `targets.rs`, skipping (with a printed note) what a transport does not advertise,
//! after checking that the API reports it as `Unsupported`. The test kit (`rucx-testkit`) opens
//! the targets and connects their pairs.
//!
//! Run: `cargo test --test conformance` (filter by target or test name, e.g. `-- tcp_lo` or
//! `-- am_short`; add `-- --nocapture` to see skip notes).

#[macro_use]
mod targets;

mod am;
mod api;
mod atomic;
mod burst;
mod errhandle;
mod flush;
mod iface;
mod keep;
mod lifetime;
mod misuse_am;
mod misuse_rma;
mod pending;
mod reentrant;
mod rma;
mod shared_data;
mod stale_keys;
