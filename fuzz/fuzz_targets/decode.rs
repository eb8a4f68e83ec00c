#![no_main]
//! Fuzz target `decode`: see a2ad::fuzzing::decode for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::decode(data));
