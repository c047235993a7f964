//! The tcp device, interface and endpoint addresses and the packed rkey a peer hands over out
//! of band (body: `uct_tcp::wire::fuzz::tcp_addr`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_tcp::wire::fuzz::tcp_addr(data));
