#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_io::fuzz_check_tar_index(data));
