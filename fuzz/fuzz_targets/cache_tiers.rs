#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_testkit::tiers_optimum::check_tier_bytes(data));
