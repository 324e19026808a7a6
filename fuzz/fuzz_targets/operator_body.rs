#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| { let _ = coffer_fuzz_targets::operator_body(data); });
