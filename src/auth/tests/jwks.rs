//! The issuer's key set: what a key serves (its `kid`, its `alg`), what the set skips, its
//! bounds, and what is no key set at all.

use serde_json::{json, Value};

use super::*;

#[test]
fn a_key_without_kid_serves_only_tokens_without_kid() {
    let signer = Signer::ed25519([9; 32], None);
    let set = KeySet::parse(jwks(&[signer.jwk()]).as_bytes()).unwrap().keys;
    let p = policy();
    assert!(p.verify(&signer.bearer(&claims()), &set, now()).is_ok());
    let named = Signer::ed25519([9; 32], Some("ed-9"));
    assert_eq!(
        p.verify(&named.bearer(&claims()), &set, now()),
        Err(AuthFailure::UnknownKey {
            kid: Some("ed-9".into())
        })
    );
}

#[test]
fn the_key_alg_narrows_what_it_verifies() {
    let k = keys();
    let mut jwk = k.rsa.jwk();
    jwk["kid"] = json!("rsa-1");
    jwk["alg"] = json!("PS256");
    let set = KeySet::parse(jwks(&[jwk]).as_bytes()).unwrap().keys;
    assert_eq!(
        set.iter().next().unwrap().algorithms(),
        AlgorithmSet::of(&[Algorithm::Ps256])
    );
    assert_eq!(
        policy().verify(&k.rsa.bearer(&claims()), &set, now()),
        Err(AuthFailure::KeyMismatch)
    );
    let pss = k.rsa.sign(
        &json!({"alg": "PS256", "kid": "rsa-1"}).to_string(),
        &claims().to_string(),
    );
    assert!(policy().verify(&pss, &set, now()).is_ok());
}

#[test]
fn keys_sharing_a_kid_serve_their_own_algorithms() {
    let rsa = Signer::rsa(Some("shared"));
    let ec = Signer::p256(Some("shared"));
    let set = KeySet::parse(jwks(&[ec.jwk(), rsa.jwk()]).as_bytes()).unwrap().keys;
    for bearer in [rsa.bearer(&claims()), ec.bearer(&claims())] {
        assert!(policy().verify(&bearer, &set, now()).is_ok());
    }
    // Two keys of one type under one kid: the first is the one, a second is never tried.
    let ec2 = Signer::p256(Some("shared"));
    let set = KeySet::parse(jwks(&[ec.jwk(), ec2.jwk()]).as_bytes()).unwrap().keys;
    assert!(policy().verify(&ec.bearer(&claims()), &set, now()).is_ok());
    assert_eq!(
        policy().verify(&ec2.bearer(&claims()), &set, now()),
        Err(AuthFailure::BadSignature)
    );
}

#[test]
fn the_key_set_skips_what_it_cannot_use() {
    let k = keys();
    let with = |changes: Value| {
        let mut jwk = k.rsa.jwk();
        for (key, v) in changes.as_object().unwrap() {
            jwk[key] = v.clone();
        }
        jwk
    };
    let n = k.rsa.jwk()["n"].as_str().unwrap().to_owned();
    let leading_zero = {
        let mut bytes = vec![0u8];
        bytes.extend(base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &n).unwrap());
        b64(&bytes)
    };
    let entries = vec![
        (with(json!({"kid": "ok", "use": "sig", "key_ops": ["verify"]})), None),
        (with(json!({"kid": "zero", "n": leading_zero})), None),
        (
            with(json!({"kid": "small", "n": b64(&[0xc5; 128])})),
            Some("RSA modulus under 2048 bits"),
        ),
        (
            with(json!({"kid": "huge", "n": b64(&[0xc5; 1025])})),
            Some("RSA modulus over 8192 bits"),
        ),
        (
            with(json!({"kid": "even", "e": b64(&[1, 0, 0])})),
            Some("RSA exponent not odd, or not of 3 to 32 bits"),
        ),
        (
            with(json!({"kid": "one", "e": b64(&[1])})),
            Some("RSA exponent not odd, or not of 3 to 32 bits"),
        ),
        (with(json!({"kid": "enc", "use": "enc"})), Some("use is not \"sig\"")),
        (
            with(json!({"kid": "ops", "key_ops": ["encrypt"]})),
            Some("key_ops lacks \"verify\""),
        ),
        (with(json!({"kid": "rs384", "alg": "RS384"})), Some("unsupported alg")),
        (
            with(json!({"kid": "es-on-rsa", "alg": "ES256"})),
            Some("alg does not fit the key type"),
        ),
        (
            with(json!({"kid": "padded", "n": format!("{n}==")})),
            Some("a key member is not base64url"),
        ),
        (with(json!({"kid": "no-e", "e": null})), Some("a key member is missing")),
        (
            json!({"kid": "oct", "kty": "oct", "k": "c2VjcmV0"}),
            Some("unsupported key type"),
        ),
        (
            json!({"kid": "p384", "kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"}),
            Some("unsupported curve"),
        ),
        (
            json!({"kid": "x448", "kty": "OKP", "crv": "X25519", "x": b64(&[1; 32])}),
            Some("unsupported curve"),
        ),
        (
            json!({"kid": "short-x", "kty": "EC", "crv": "P-256", "x": b64(&[1; 31]), "y": b64(&[1; 32])}),
            Some("a key member has the wrong length"),
        ),
        (json!({"kid": "no-kty"}), Some("no kty")),
        (json!("a string"), Some("not a JWK object")),
        (json!({"kid": 5, "kty": "RSA"}), Some("not a JWK object")),
    ];
    let keys: Vec<Value> = entries.iter().map(|(jwk, _)| jwk.clone()).collect();
    let parsed = KeySet::parse(jwks(&keys).as_bytes()).unwrap();
    let kept: Vec<_> = parsed.keys.iter().map(|k| k.kid().unwrap()).collect();
    assert_eq!(kept, ["ok", "zero"]);
    let expected: Vec<SkippedKey> = entries
        .iter()
        .filter_map(|(jwk, reason)| {
            Some(SkippedKey {
                kid: jwk["kid"].as_str().map(str::to_owned),
                reason: (*reason)?,
            })
        })
        .collect();
    assert_eq!(parsed.skipped, expected);
    // The key with a leading zero in `n` verifies like the other.
    let bearer = Signer::rsa(Some("zero")).bearer(&claims());
    assert!(policy().verify(&bearer, &parsed.keys, now()).is_ok());
}

#[test]
fn the_key_set_is_bounded() {
    let key = keys().ed25519.jwk();
    let many: Vec<Value> = (0..MAX_KEYS + 3).map(|_| key.clone()).collect();
    let parsed = KeySet::parse(jwks(&many).as_bytes()).unwrap();
    assert_eq!((parsed.keys.len(), parsed.skipped.len()), (MAX_KEYS, 3));
    assert_eq!(parsed.skipped[0].reason, "beyond the limit of keys in a set");
    let big = format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(MAX_JWKS_BYTES));
    assert_eq!(
        KeySet::parse(big.as_bytes()).unwrap_err(),
        JwksError::TooLarge { len: big.len() }
    );
}

#[test]
fn only_a_document_that_is_no_key_set_is_an_error() {
    let not_utf8: &[u8] = b"{\"keys\": [{\"kid\": \"\xff\"}]}";
    let docs: [&[u8]; 8] = [
        b"",
        b"[]",
        b"{}",
        br#"{"keys": 5}"#,
        br#"{"keys": {}}"#,
        b"not json",
        br#"{"keys": []"#,
        not_utf8,
    ];
    for doc in docs {
        assert!(
            matches!(KeySet::parse(doc), Err(JwksError::NotJwks(_))),
            "{}",
            doc.escape_ascii()
        );
    }
    let empty = KeySet::parse(br#"{"keys": [], "other": 1}"#).unwrap();
    assert!(empty.keys.is_empty() && empty.skipped.is_empty());
    let junk = KeySet::parse(br#"{"keys": [1, null, {"kty": "RSA"}]}"#).unwrap();
    assert_eq!((junk.keys.len(), junk.skipped.len()), (0, 3));
    assert_eq!(
        verify_with(&junk.keys),
        Err(AuthFailure::UnknownKey {
            kid: Some("ec-1".into())
        })
    );
}

fn verify_with(set: &KeySet) -> Result<Verified, AuthFailure> {
    policy().verify(&keys().p256.bearer(&claims()), set, now())
}
