#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_tier::fuzz_check_tier_index(data));
