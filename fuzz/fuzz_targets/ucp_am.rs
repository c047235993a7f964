//! UCP active-message headers: single messages and fragments (body: `ucp::fuzz::fuzz_am`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ucp::fuzz::fuzz_am(data));
