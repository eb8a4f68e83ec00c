#![no_main]
//! Fuzz target `sse`: see a2ad::fuzzing::sse for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::sse(data));
