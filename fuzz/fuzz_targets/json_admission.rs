//! cargo-fuzz target: see `floe_tests::fuzzing::json_admission`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| floe_tests::fuzzing::json_admission(data));
