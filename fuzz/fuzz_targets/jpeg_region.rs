#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_image::fuzz_check_jpeg_region(data));
