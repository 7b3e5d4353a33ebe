#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_testkit::forms_optimum::check_form_bytes(data));
