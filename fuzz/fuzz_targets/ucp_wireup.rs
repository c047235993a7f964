//! UCP wireup messages (body: `ucp::fuzz::fuzz_wireup`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ucp::fuzz::fuzz_wireup(data));
