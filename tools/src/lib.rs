//! Shared code of the rucx command-line tools.
#![deny(unsafe_code)]

pub mod info;
