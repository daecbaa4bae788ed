#![no_main]
use spore_vmm::fuzz_api::working_set;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    working_set(data);
});
