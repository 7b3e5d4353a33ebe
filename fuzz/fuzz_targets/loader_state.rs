#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_io::fuzz_check_loader_state(data));
