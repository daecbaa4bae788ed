#![no_main]
use spore_vmm::fuzz_api::api_request;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    api_request(data);
});
