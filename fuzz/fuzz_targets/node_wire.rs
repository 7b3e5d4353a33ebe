#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lobster_node::fuzz_check_wire(data));
