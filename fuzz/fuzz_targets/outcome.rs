//! The answer-outcome parser: never a panic; an `input_required` state's place holds its
//! literal (`mrtr_router_fuzz::check_outcome`). Input: one JSON-RPC message from a backend.
#![no_main]

libfuzzer_sys::fuzz_target!(|message: &[u8]| {
    mrtr_router_fuzz::check_outcome(message);
});
