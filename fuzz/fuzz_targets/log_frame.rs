#![no_main]
//! Fuzz target `log_frame`: see a2ad::fuzzing::log_frame for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::log_frame(data));
