#![no_main]
use spore_vmm::fuzz_api::config_file;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    config_file(data);
});
