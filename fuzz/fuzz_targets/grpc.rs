#![no_main]
//! Fuzz target `grpc`: see a2ad::fuzzing::grpc for what it drives and checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| a2ad::fuzzing::grpc(data));
