#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| { let _ = coffer_fuzz_targets::abi_call(data); });
