//! Sealed routing tokens: cost of sealing and checking one (target: under 2 µs each).

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion};
use mrtr_router::internals::TokenKeys;

fn token(c: &mut Criterion) {
    let keys = TokenKeys::new(vec![vec![7; 32], vec![9; 32]], Duration::from_secs(3600)).unwrap();
    let now = SystemTime::now();
    // A typical requestState: base64 text with '.', '/', '+' and '=' (carried as is).
    let state: String = "eyJjYWxsIjoiNDIiLCJyb3VuZCI6Mn0./+="
        .chars()
        .cycle()
        .take(200)
        .collect();
    let token = keys.seal("worker-1", now);
    let wrapped = keys.seal_value(&state, "worker-1", now);

    let mut g = c.benchmark_group("token");
    g.bench_function("seal", |b| b.iter(|| keys.seal(black_box("worker-1"), black_box(now))));
    g.bench_function("verify", |b| {
        b.iter(|| keys.verify(black_box(&token), black_box(now)).unwrap())
    });
    g.bench_function("wrap_request_state_200B", |b| {
        b.iter(|| keys.seal_value(black_box(&state), black_box("worker-1"), black_box(now)))
    });
    g.bench_function("unwrap_request_state_200B", |b| {
        b.iter(|| keys.open_value(black_box(&wrapped), black_box(now)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, token);
criterion_main!(benches);
