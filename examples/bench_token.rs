//! An access token and its issuer's key set for the benchmarks with `[auth]` on
//! (`BENCH_CG_AUTH` in bench/callgrind.sh, docs/src/benchmarks.md): writes the JWKS to the file
//! given and prints a token of the algorithm given (RS256, ES256 or EdDSA), valid for a day, for
//! the issuer `https://idp.bench.test` and the audience given.
//!
//!     cargo run --release --example bench_token -- RS256 http://127.0.0.1:27180/mcp /tmp/jwks.json

#[path = "../tests/fixtures/jwt/signer.rs"]
mod signer;

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;
use signer::Signer;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [alg, audience, jwks_path] = &args[..] else {
        eprintln!("usage: bench_token RS256|ES256|EdDSA AUDIENCE JWKS_FILE");
        std::process::exit(2);
    };
    let signer = match alg.as_str() {
        "RS256" => Signer::rsa(Some("bench-rs")),
        "ES256" => Signer::p256(Some("bench-es")),
        "EdDSA" => Signer::ed25519([7; 32], Some("bench-ed")),
        other => {
            eprintln!("bench_token: {other:?} is not RS256, ES256 or EdDSA");
            std::process::exit(2);
        }
    };
    std::fs::write(jwks_path, signer::jwks(&[signer.jwk()])).expect("the JWKS file is writable");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let claims = json!({
        "iss": "https://idp.bench.test",
        "sub": "bench-client",
        "client_id": "bench-client",
        "aud": audience,
        "scope": "mcp:tools",
        "iat": now,
        "exp": now + 86_400,
        "jti": "bench",
    });
    println!("{}", signer.bearer(&claims));
}
