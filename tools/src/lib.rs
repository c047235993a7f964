//! Shared code of the rucx command-line tools.
#![forbid(unsafe_code)]

pub mod info;
