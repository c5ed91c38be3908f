//! The SSE splitter: any chunking of a stream yields the same events
//! (`mrtr_router_fuzz::check_sse`). Input: a first byte n, then n little-endian u16 cut
//! positions, then the stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len() / 2);
    let (cuts, stream) = rest.split_at(2 * n);
    let cuts: Vec<usize> = cuts
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    mrtr_router_fuzz::check_sse(stream, &cuts);
});
