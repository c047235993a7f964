//! A received ud_verbs packet: header, connection request / reply body and the device address
//! inside a request (body: `uct_ib::fuzz::ud_packet`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_ib::fuzz::ud_packet(data));
