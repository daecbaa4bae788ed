#![no_main]
use spore_vmm::fuzz_api::tmem_calls;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tmem_calls(data);
});
