//! rucx umbrella crate.
pub use ucs; pub use uct; pub use ucp;
