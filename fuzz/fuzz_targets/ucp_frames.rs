//! Sequences of UCP frames into one worker, stateful (body: `ucp::fuzz::fuzz_frames`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ucp::fuzz::fuzz_frames(data));
