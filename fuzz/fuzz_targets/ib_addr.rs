//! The ib device address, packed rkey, rc/ud endpoint and interface addresses and the rc AM
//! header byte (body: `uct_ib::fuzz::ib_addr`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_ib::fuzz::ib_addr(data));
