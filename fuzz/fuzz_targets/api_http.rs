#![no_main]
use spore_vmm::fuzz_api::api_http;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    api_http(data);
});
