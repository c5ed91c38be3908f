//! The token codec (`mrtr_router_fuzz::check_token_text`, `check_token_bit_flips`). Input: the
//! text checked as a token and wrapped value of every kind; the same bytes, read as a kind,
//! a backend name, a value, a round count, a format and up to 16 bit positions, seal a token
//! of which each of those bits is changed in turn (every bit of every token is the proptest
//! property's job: here it would cost a thousand openings per input).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use mrtr_router_fuzz::{check_token_bit_flips, check_token_text, KINDS};

#[derive(Arbitrary, Debug)]
struct Sealed {
    kind: u8,
    backend: String,
    value: Option<String>,
    rounds: u32,
    previous: bool,
    bits: Vec<u16>,
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    check_token_text(data);
    if let Ok(s) = Sealed::arbitrary(&mut Unstructured::new(data)) {
        let kind = KINDS[usize::from(s.kind) % KINDS.len()];
        let bits: Vec<usize> = s.bits.iter().take(16).map(|&b| usize::from(b)).collect();
        check_token_bit_flips(kind, &s.backend, s.value.as_deref(), s.rounds, s.previous, Some(&bits));
    }
});
