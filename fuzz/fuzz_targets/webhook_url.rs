#![no_main]
//! Fuzz target `webhook_url`: see a2ad::fuzzing::webhook_url for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::webhook_url(data));
