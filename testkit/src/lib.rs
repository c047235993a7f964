//! What the tests of the rucx crates share (UCX gtest's `uct_test` and `entity`), once:
//!
//! | module | what |
//! |---|---|
//! | [`modules`] | contexts: a transport module linked in, or the plugin this build produced |
//! | [`device`] | the device to test a transport on: a named one, or the first the transport reports |
//! | [`entity`] | one side: memory domain, worker, interface with an error recorder |
//! | [`setup`] | a transport on a device, opened the same way for every entity and pair of a test |
//! | [`pair`] | a connected sender and receiver, either connection model, either worker layout |
//! | [`wait`] | progress until something holds, with a deadline; the completion contract |
//! | [`am`] | recording active messages |
//! | [`data`] | test data: sizes, byte patterns, byte comparisons, iov layouts |
//! | [`child`] | this test binary run again as a child process |
//! | [`watchdog`] | ending a hung test process |
//! | [`tcp`] | tcp on `lo` at the wire level: raw peers, `/proc`, stamped message streams |
//!
//! A transport module that is missing or does not load fails the test (saying how to build it);
//! only a missing device (a host without RDMA) skips one, with a printed note.
#![forbid(unsafe_code)]

pub mod am;
pub mod child;
pub mod data;
pub mod device;
pub mod entity;
pub mod modules;
pub mod pair;
pub mod setup;
pub mod tcp;
pub mod wait;
pub mod watchdog;

pub use am::Recorder;
pub use device::{Dev, Resource};
pub use entity::{worker, Entity, ErrorLog};
pub use modules::Modules;
pub use pair::{Connect, Pair, Remote, Workers};
pub use setup::Setup;
pub use wait::{Progress, DEADLINE};
