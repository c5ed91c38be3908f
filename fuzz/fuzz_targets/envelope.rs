//! The envelope scanner against serde_json: the same verdict, the same fields
//! (`mrtr_router_fuzz::check_envelope`). Input: a request body.
#![no_main]

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    mrtr_router_fuzz::check_envelope(body);
});
