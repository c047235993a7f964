//! UCP packed remote keys (body: `ucp::fuzz::fuzz_rkey`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ucp::fuzz::fuzz_rkey(data));
