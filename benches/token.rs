//! Sealed routing tokens: cost of sealing and opening one (ChaCha20-Poly1305; target: under
//! 2 µs each), and of opening a token of the previous format (HMAC) during an upgrade.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion};
use mrtr_router::internals::{LegacySealingKeys, SealingKeys, TokenKind};

fn token(c: &mut Criterion) {
    let raw = vec![vec![7; 32], vec![9; 32]];
    let keys = SealingKeys::new(raw.clone(), Duration::from_secs(3600)).unwrap();
    let now = SystemTime::now();
    // A typical requestState: base64 text with '.', '/', '+' and '=' (carried as is).
    let state: String = "eyJjYWxsIjoiNDIiLCJyb3VuZCI6Mn0./+="
        .chars()
        .cycle()
        .take(200)
        .collect();
    let token = keys.seal(TokenKind::RoutingId, "worker-1", 1, now);
    let wrapped = keys.seal_value(TokenKind::RequestState, &state, "worker-1", 1, now);
    let legacy = LegacySealingKeys::new(raw, Duration::from_secs(3600))
        .unwrap()
        .seal("worker-1", now);

    let mut g = c.benchmark_group("token");
    g.bench_function("seal", |b| {
        b.iter(|| keys.seal(TokenKind::RoutingId, black_box("worker-1"), 1, black_box(now)))
    });
    g.bench_function("unseal", |b| {
        b.iter(|| {
            keys.verify(TokenKind::RoutingId, black_box(&token), black_box(now))
                .unwrap()
        })
    });
    g.bench_function("seal_request_state_200B", |b| {
        b.iter(|| {
            keys.seal_value(
                TokenKind::RequestState,
                black_box(&state),
                black_box("worker-1"),
                1,
                black_box(now),
            )
        })
    });
    g.bench_function("unseal_request_state_200B", |b| {
        b.iter(|| {
            keys.open_value(TokenKind::RequestState, black_box(&wrapped), black_box(now))
                .unwrap()
        })
    });
    g.bench_function("unseal_previous_format", |b| {
        b.iter(|| {
            keys.verify(TokenKind::RoutingId, black_box(&legacy), black_box(now))
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, token);
criterion_main!(benches);
