//! cargo-fuzz target: see `floe_tests::fuzzing::registry_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| floe_tests::fuzzing::registry_response(data));
