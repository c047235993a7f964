//! Decoding of the tcp connection handshake (body: `uct_tcp::wire::fuzz::tcp_handshake`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_tcp::wire::fuzz::tcp_handshake(data));
