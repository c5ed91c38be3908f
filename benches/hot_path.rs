//! Micro costs of the request path: pin table insert + lookup, ring lookups at 3/64/512
//! backends, and key extraction from a 300-byte and a 64 KiB body (the figures are in
//! docs/src/benchmarks.md).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mrtr_router::config::{BackendConfig, Config};
use mrtr_router::internals::{self as dialect, Backend, BackendKey, HashRing, PinKey, PinKind, PinTable, PinTtls};

fn ttls() -> PinTtls {
    let d = Duration::from_secs(600);
    PinTtls {
        client: d,
        request_state: d,
        task: d,
        session: d,
        replay_window: Duration::from_secs(60),
    }
}

fn pins(c: &mut Criterion) {
    let t = ttls();
    // A table holding 100k calls, as under load; each iteration pins one of them again (a new
    // round) and looks it up (the follow-up), cycling through the whole key space.
    let table = PinTable::new();
    let keys: Vec<PinKey> = (0..100_000u32)
        .map(|i| PinKey::new(PinKind::Client, &i.to_le_bytes()))
        .collect();
    for k in &keys {
        table.pin(*k, BackendKey(1), 1, 1, &t);
    }
    let mut g = c.benchmark_group("pins");
    g.throughput(Throughput::Elements(2));
    let mut i = 0;
    g.bench_function("insert_then_lookup_100k_live", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            table.pin(keys[i], BackendKey(2), 1, 2, &t);
            black_box(table.lookup(keys[i], &t))
        })
    });
    g.finish();
    let mut g = c.benchmark_group("pins");
    g.bench_function("key_digest_36B", |b| {
        b.iter(|| PinKey::new(PinKind::Client, black_box(b"0f3c9a4e-7d21-4b8a-9c55-2e6f10a7d3b9")))
    });
    g.bench_function("sweep_100k_live", |b| b.iter(|| black_box(table.sweep())));
    g.finish();
}

fn backends(n: usize) -> Vec<Arc<Backend>> {
    let text: String = (0..n)
        .map(|i| {
            format!(
                "[[backend]]\nname = \"worker-{i}\"\nurl = \"http://10.0.{}.{}:8000\"\n",
                i / 250,
                i % 250 + 1
            )
        })
        .collect();
    let config = Config::parse(std::path::Path::new("bench.toml"), &text).unwrap();
    config
        .backends
        .iter()
        .map(|b: &BackendConfig| Arc::new(Backend::new(b, &config.upstream, None)))
        .collect()
}

fn ring(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    for n in [3usize, 64, 512] {
        let ring = HashRing::new(backends(n), 160, 0.0);
        let keys: Vec<String> = (0..1024).map(|i| format!("call-{i:08x}-{}", i * 7919)).collect();
        let mut i = 0;
        g.bench_function(format!("lookup_{n}_backends"), |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                black_box(ring.owner(&keys[i]))
            })
        });
        let bounded = HashRing::new(backends(n), 160, 1.25);
        g.bench_function(format!("bounded_lookup_{n}_backends"), |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                black_box(bounded.pick(&keys[i]))
            })
        });
    }
    g.finish();
}

fn key_extraction(c: &mut Criterion) {
    let small = br#"{"jsonrpc":"2.0","id":7,"messageId":"k-3f9a0c2d5e7b","method":"tools/call","params":{"name":"search-documents","arguments":{"query":"quarterly revenue by region","limit":20,"filters":{"department":"finance","year":2026,"status":["final","approved"]},"fields":["title","author","updated","summary"]}}}"#;
    let pad = "x".repeat(64 * 1024 - 200);
    let large = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"upload","arguments":{{"blob":"{pad}"}}}},"messageId":"k-3f9a0c2d5e7b"}}"#
    );
    let mut g = c.benchmark_group("key_extraction");
    g.throughput(Throughput::Bytes(small.len() as u64));
    g.bench_function("body_300B", |b| {
        b.iter(|| dialect::parse_request(black_box(small), "messageId").unwrap())
    });
    g.throughput(Throughput::Bytes(large.len() as u64));
    g.bench_function("body_64KiB", |b| {
        b.iter(|| dialect::parse_request(black_box(large.as_bytes()), "messageId").unwrap())
    });
    let answer = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{"approve":{"method":"elicitation/create","params":{"message":"Approve?"}}},"requestState":"v1.M0AF2PbQoc_6m1A-vIOZqJnl83iRyE6yJJWsqjhoia4C7CmXa_eC"}}"#;
    g.throughput(Throughput::Bytes(answer.len() as u64));
    g.bench_function("outcome_input_required", |b| {
        b.iter(|| dialect::parse_outcome(black_box(answer)))
    });
    g.finish();
}

criterion_group!(benches, pins, ring, key_extraction);
criterion_main!(benches);
