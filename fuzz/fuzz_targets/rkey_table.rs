//! Packed rkeys and remote (key, address, length, operation) requests against the bounds-checked
//! region table of the self and tcp transports (body: `uct_transport::rma::fuzz::rkey_table`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_transport::rma::fuzz::rkey_table(data));
