#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lobster_testkit::cluster_optimum::check_cluster_bytes(data);
});
