#![no_main]
//! Fuzz target `store_record`: see a2ad::fuzzing::store_record for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::store_record(data));
