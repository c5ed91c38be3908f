//! The verification core's unit tests, with tokens signed by `tests/fixtures/jwt/signer.rs`:
//! the fixtures here (the signers, a policy, claims every check accepts), the tests by what they
//! test: `jwt` one token against a policy, `jwks` the key set, `scopes` what a token grants and
//! whom it names.

mod jwks;
mod jwt;
mod scopes;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::jwks::{JwksError, SkippedKey};
use super::jwt::Part;
use super::signer::{b64, compact, jwks, Signer};
use super::*;

const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "https://mcp.example.com/mcp";
const NOW_SECS: u64 = 1_800_000_000;
const LEEWAY: u64 = 30;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

fn policy() -> Policy {
    Policy {
        issuer: ISSUER.to_owned(),
        audiences: vec!["https://other.example/also-us".to_owned(), AUDIENCE.to_owned()],
        algorithms: AlgorithmSet::ALL,
        leeway: Duration::from_secs(LEEWAY),
    }
}

/// The signers of the tests, one per key type, and the set of their public keys.
struct Keys {
    rsa: Signer,
    p256: Signer,
    ed25519: Signer,
    set: KeySet,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let rsa = Signer::rsa(Some("rsa-1"));
        let p256 = Signer::p256(Some("ec-1"));
        let ed25519 = Signer::ed25519([7; 32], Some("ed-1"));
        let doc = jwks(&[rsa.jwk(), p256.jwk(), ed25519.jwk()]);
        let parsed = KeySet::parse(doc.as_bytes()).unwrap();
        assert!(parsed.skipped.is_empty(), "{:?}", parsed.skipped);
        Keys {
            rsa,
            p256,
            ed25519,
            set: parsed.keys,
        }
    })
}

/// Claims every check accepts.
fn claims() -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "user-42",
        "client_id": "client-7",
        "exp": NOW_SECS + 300,
        "iat": NOW_SECS - 10,
        "nbf": NOW_SECS - 10,
        "scope": "files:read mcp:tools",
    })
}

/// `claims()` with `changes` applied (a `null` removes the member).
fn claims_with(changes: Value) -> Value {
    let mut c = claims();
    for (k, v) in changes.as_object().unwrap() {
        match v {
            Value::Null => drop(c.as_object_mut().unwrap().remove(k)),
            v => c[k] = v.clone(),
        }
    }
    c
}

fn verify(bearer: &str) -> Result<Verified, AuthFailure> {
    policy().verify(bearer, &keys().set, now())
}

/// A header of the EC key with `changes` (a `null` removes the member).
fn ec_header(changes: Value) -> String {
    let mut h = keys().p256.header();
    for (k, v) in changes.as_object().unwrap() {
        match v {
            Value::Null => drop(h.as_object_mut().unwrap().remove(k)),
            v => h[k] = v.clone(),
        }
    }
    h.to_string()
}

fn ec_bearer(header: Value, claims: Value) -> String {
    keys().p256.sign(&ec_header(header), &claims.to_string())
}
