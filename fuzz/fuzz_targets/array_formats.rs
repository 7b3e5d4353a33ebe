#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_array::fuzz_check_formats(data));
