#![no_main]
//! Fuzz target `file_part`: see a2ad::fuzzing::file_part for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::file_part(data));
