#![no_main]
//! Fuzz target `official`: see a2ad::fuzzing::official for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::official(data));
