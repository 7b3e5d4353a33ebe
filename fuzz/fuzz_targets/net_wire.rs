#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_net::wire::fuzz_check(data));
