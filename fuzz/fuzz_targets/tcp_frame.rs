//! Random bytes in random chunks through the tcp receive parser, checked against a one-shot
//! decode of the same stream (body: `uct_tcp::wire::fuzz::tcp_frame`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_tcp::wire::fuzz::tcp_frame(data));
