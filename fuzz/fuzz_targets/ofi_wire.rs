//! A received ofi message's AM header and a peer's packed ofi rkey (body:
//! `uct_ofi::fuzz::ofi_wire`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uct_ofi::fuzz::ofi_wire(data));
