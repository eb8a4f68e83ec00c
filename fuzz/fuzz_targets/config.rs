#![no_main]
//! Fuzz target `config`: see a2ad::fuzzing::config for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::config(data));
