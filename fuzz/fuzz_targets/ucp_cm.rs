//! UCP connection-manager messages, whole and streamed (body: `ucp::fuzz::fuzz_cm`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ucp::fuzz::fuzz_cm(data));
