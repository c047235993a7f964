//! A shared-memory receive FIFO a hostile peer wrote into, and a peer's segment header (body:
//! `uct_sm::fuzz::sm_fifo`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_sm::fuzz::sm_fifo(data));
