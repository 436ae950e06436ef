//! cargo-fuzz target: see `floe_tests::fuzzing::config_load`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| floe_tests::fuzzing::config_load(data));
