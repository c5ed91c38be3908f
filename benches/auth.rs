//! Bearer access tokens: the cost of accepting one (ES256, RS256, and EdDSA beside them) and of
//! refusing garbage, an expired token, one for another resource and one with a bad signature
//! (the first three are refused before any signature check), of reading a key set, and of a
//! principal's digest.

#[path = "../tests/fixtures/jwt/signer.rs"]
mod signer;

use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use mrtr_router::internals::{AlgorithmSet, AuthFailure, AuthPolicy, KeySet, Principal};
use serde_json::json;
use signer::{jwks, Signer};

const ISSUER: &str = "https://auth.example.com/realms/mcp";
const AUDIENCE: &str = "https://mcp.example.com/mcp";

fn auth(c: &mut Criterion) {
    let rsa = Signer::rsa(Some("rsa-2048"));
    let ec = Signer::p256(Some("p-256"));
    let ed = Signer::ed25519([3; 32], Some("ed25519"));
    let document = jwks(&[rsa.jwk(), ec.jwk(), ed.jwk()]);
    let keys = KeySet::parse(document.as_bytes()).unwrap().keys;
    let policy = AuthPolicy {
        issuer: ISSUER.to_owned(),
        audiences: vec![AUDIENCE.to_owned()],
        algorithms: AlgorithmSet::ALL,
        leeway: Duration::from_secs(60),
    };
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
    // A typical access token's claims (RFC 9068), ~300 bytes of JSON.
    let claims = |exp: u64, aud: &str| {
        json!({
            "iss": ISSUER, "aud": aud, "sub": "6f1c2a9e-3b7d-4e0a-9c55-2d8f1b7a4e63",
            "client_id": "https://client.example.com/metadata.json", "exp": exp, "iat": secs - 60,
            "jti": "0b9f6c3e-8a21-4d7f-b1e4-5c2a9d8e7f10", "scope": "mcp:tools mcp:resources files:read",
        })
    };
    let fresh = claims(secs + 3600, AUDIENCE);
    let es256 = ec.bearer(&fresh);
    let rs256 = rsa.bearer(&fresh);
    let eddsa = ed.bearer(&fresh);
    let expired = rsa.bearer(&claims(secs - 3600, AUDIENCE));
    let foreign = rsa.bearer(&claims(secs + 3600, "https://api.example.com"));
    let bad_signature = {
        let (signed, sig) = rs256.rsplit_once('.').unwrap();
        let flipped = if sig.starts_with('A') { "B" } else { "A" };
        format!("{signed}.{flipped}{}", &sig[1..])
    };
    let garbage = "x".repeat(400);
    for (token, expected) in [
        (&expired, AuthFailure::Expired),
        (&foreign, AuthFailure::Audience),
        (&bad_signature, AuthFailure::BadSignature),
    ] {
        assert_eq!(policy.verify(token, &keys, now), Err(expected));
    }
    assert!(matches!(
        policy.verify(&garbage, &keys, now),
        Err(AuthFailure::Malformed(_))
    ));

    let mut g = c.benchmark_group("auth");
    for (name, token) in [
        ("accept_es256", &es256),
        ("accept_rs256", &rs256),
        ("accept_eddsa", &eddsa),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| policy.verify(black_box(token), &keys, black_box(now)).unwrap())
        });
    }
    for (name, token) in [
        ("refuse_garbage", &garbage),
        ("refuse_expired", &expired),
        ("refuse_audience", &foreign),
        ("refuse_bad_signature_rs256", &bad_signature),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| policy.verify(black_box(token), &keys, black_box(now)).unwrap_err())
        });
    }
    g.bench_function("jwks_parse_3_keys", |b| {
        b.iter(|| KeySet::parse(black_box(document.as_bytes())).unwrap())
    });
    let principal = Principal::new(ISSUER, "6f1c2a9e-3b7d-4e0a-9c55-2d8f1b7a4e63");
    g.bench_function("principal_digest", |b| b.iter(|| black_box(&principal).digest()));
    g.finish();
}

criterion_group!(benches, auth);
criterion_main!(benches);
