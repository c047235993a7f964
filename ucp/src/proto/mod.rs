//! Protocols: how a message of a given size goes over an endpoint's lanes.

pub mod thresholds;
