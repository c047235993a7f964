//! Filled by a later issue.
#![deny(unsafe_code)]

pub mod verbs;
