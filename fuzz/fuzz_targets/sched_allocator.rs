#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| { lobster_sched::check_allocator(data); });
