#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_cache::fuzz_check_cluster(data));
