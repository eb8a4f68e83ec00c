#![no_main]
//! Fuzz target `params`: see a2ad::fuzzing::params for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::params(data));
