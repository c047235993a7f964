//! A shared-memory interface address and a cma packed rkey from a peer (body:
//! `uct_sm::fuzz::sm_addr`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_sm::fuzz::sm_addr(data));
