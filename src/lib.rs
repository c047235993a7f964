//! rucx umbrella crate.
pub use ucp;
pub use ucs;
pub use uct;
