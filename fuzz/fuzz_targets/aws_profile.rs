#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_store::fuzz_check_aws_profile(data));
