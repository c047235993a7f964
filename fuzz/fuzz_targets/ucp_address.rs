//! The packed ucp worker address (body: `ucp::address::fuzz_address`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ucp::address::fuzz_address(data));
