//! The config parser: never a panic; a config that parses prints a text that parses back to
//! an equal config (`mrtr_router_fuzz::check_config`). Input: a config file's text.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        mrtr_router_fuzz::check_config(text);
    }
});
