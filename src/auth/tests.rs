use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

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

fn verify(token: &str) -> Result<Verified, AuthFailure> {
    policy().verify(token, &keys().set, now())
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

fn ec_token(header: Value, claims: Value) -> String {
    keys().p256.sign(&ec_header(header), &claims.to_string())
}

#[test]
fn every_algorithm_verifies() {
    let k = keys();
    let pss = k.rsa.sign(
        &json!({"alg": "PS256", "kid": "rsa-1", "typ": "at+jwt"}).to_string(),
        &claims().to_string(),
    );
    let tokens = [
        ("RS256", k.rsa.token(&claims())),
        ("PS256", pss),
        ("ES256", k.p256.token(&claims())),
        ("EdDSA", k.ed25519.token(&claims())),
    ];
    for (alg, token) in tokens {
        let v = verify(&token).unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(v.issuer, ISSUER);
        assert_eq!(v.subject, "user-42");
        assert_eq!(v.client_id.as_deref(), Some("client-7"));
        assert_eq!(v.scopes.iter().collect::<Vec<_>>(), ["files:read", "mcp:tools"]);
        assert_eq!(v.expires_at, UNIX_EPOCH + Duration::from_secs(NOW_SECS + 300));
        assert_eq!(v.principal(), Principal::new(ISSUER, "user-42"));
        // One algorithm's signature is no other's, on the same key.
        let only_other = Policy {
            algorithms: AlgorithmSet::of(&[Algorithm::from_name(alg).unwrap()]),
            ..policy()
        };
        assert!(only_other.verify(&token, &k.set, now()).is_ok(), "{alg}");
    }
}

#[test]
fn pkcs1_and_pss_are_not_interchangeable() {
    let k = keys();
    // A PKCS#1 v1.5 signature under a PS256 header (and the reverse) does not verify.
    let ps_header = json!({"alg": "PS256", "kid": "rsa-1"}).to_string();
    let rs_header = json!({"alg": "RS256", "kid": "rsa-1"}).to_string();
    let claims = claims().to_string();
    for (header, pss) in [(&ps_header, false), (&rs_header, true)] {
        let input = format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()));
        let token = format!("{input}.{}", b64(&k.rsa.signature(pss, input.as_bytes())));
        assert_eq!(verify(&token).unwrap_err(), AuthFailure::BadSignature, "{header}");
    }
}

#[test]
fn subject_falls_back_to_the_client() {
    let v = verify(&ec_token(json!({}), claims_with(json!({"sub": null})))).unwrap();
    assert_eq!(
        (v.subject.as_str(), v.client_id.as_deref()),
        ("client-7", Some("client-7"))
    );
    let azp = claims_with(json!({"sub": "", "client_id": null, "azp": "client-9"}));
    let v = verify(&ec_token(json!({}), azp)).unwrap();
    assert_eq!(
        (v.subject.as_str(), v.client_id.as_deref()),
        ("client-9", Some("client-9"))
    );
    let none = claims_with(json!({"sub": null, "client_id": null}));
    assert_eq!(verify(&ec_token(json!({}), none)), Err(AuthFailure::NoSubject));
}

#[test]
fn scopes_come_from_scope_or_else_scp() {
    let scopes = |changes: Value| {
        let v = verify(&ec_token(json!({}), claims_with(changes)))?;
        Ok::<_, AuthFailure>(v.scopes.to_string())
    };
    assert_eq!(scopes(json!({"scope": "b  a b"})), Ok("a b".to_owned()));
    assert_eq!(scopes(json!({"scope": null})), Ok(String::new()));
    assert_eq!(
        scopes(json!({"scope": null, "scp": ["x", "y:z"]})),
        Ok("x y:z".to_owned())
    );
    assert_eq!(scopes(json!({"scope": null, "scp": "p q"})), Ok("p q".to_owned()));
    assert_eq!(
        scopes(json!({"scp": ["ignored"]})),
        Ok("files:read mcp:tools".to_owned())
    );
    for bad in [
        json!({"scope": "a \"b"}),
        json!({"scope": null, "scp": ["a b"]}),
        json!({"scope": 5}),
    ] {
        assert_eq!(scopes(bad.clone()), Err(AuthFailure::Malformed(Part::Claims)), "{bad}");
    }
}

#[test]
fn accepted_shapes_of_the_header_and_claims() {
    let ok = |header: Value, changes: Value| verify(&ec_token(header.clone(), claims_with(changes.clone())));
    for typ in [
        json!(null),
        json!("at+jwt"),
        json!("AT+JWT"),
        json!("application/at+jwt"),
        json!("jwt"),
    ] {
        assert!(ok(json!({ "typ": typ }), json!({})).is_ok(), "typ {typ}");
    }
    // An array audience holding ours; dates within the leeway; fractional dates.
    let fine = [
        json!({"aud": ["https://elsewhere.example", AUDIENCE]}),
        json!({"exp": NOW_SECS + 1 - LEEWAY}),
        json!({"exp": NOW_SECS as f64 - LEEWAY as f64 + 0.5}),
        json!({"nbf": NOW_SECS + LEEWAY, "iat": NOW_SECS + LEEWAY}),
        json!({"nbf": null, "iat": null}),
        json!({"jti": "abc", "extra": {"nested": [1, 2]}}),
    ];
    for changes in fine {
        assert!(ok(json!({}), changes.clone()).is_ok(), "{changes}");
    }
    // Escapes in the strings read.
    let escaped = format!(
        r#"{{"iss":"{ISSUER}","aud":["https:\/\/mcp.example.com\/mcp"],"sub":"user-\u0041","exp":{}}}"#,
        NOW_SECS + 60
    );
    let v = verify(&keys().p256.sign(&ec_header(json!({})), &escaped)).unwrap();
    assert_eq!(v.subject, "user-A", "{escaped}");
}

/// The refusals, each with its exact failure; none of them is a token every check but one
/// would accept by accident: each starts from an accepted one.
#[test]
fn refusals() {
    let k = keys();
    let good = ec_token(json!({}), claims());
    assert!(verify(&good).is_ok());
    let (h, rest) = good.split_once('.').unwrap();
    let (c, s) = rest.split_once('.').unwrap();
    let claims_text = claims().to_string();
    let header_text = ec_header(json!({}));
    let other_p256 = Signer::p256(Some("ec-1"));
    let rsa_pub = k.rsa.jwk();
    let hmac_secret = format!("{}{}", rsa_pub["n"].as_str().unwrap(), rsa_pub["e"].as_str().unwrap());
    let hs256 = {
        let header = json!({"alg": "HS256", "kid": "rsa-1", "typ": "at+jwt"}).to_string();
        let input = format!("{}.{}", b64(header.as_bytes()), b64(claims_text.as_bytes()));
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, hmac_secret.as_bytes());
        format!("{input}.{}", b64(ring::hmac::sign(&key, input.as_bytes()).as_ref()))
    };
    let long_claims = claims_with(json!({"pad": "x".repeat(MAX_TOKEN_BYTES)}));
    let long = ec_token(json!({}), long_claims);
    let mut flipped_sig = s.as_bytes().to_vec();
    flipped_sig[10] = if flipped_sig[10] == b'A' { b'B' } else { b'A' };
    let flipped_sig = format!("{h}.{c}.{}", String::from_utf8(flipped_sig).unwrap());
    let unknown = |kid: Option<&str>| AuthFailure::UnknownKey {
        kid: kid.map(str::to_owned),
    };
    use AuthFailure as F;
    let table: Vec<(&str, String, AuthFailure)> = vec![
        ("too long", long.clone(), F::TooLong { len: long.len() }),
        ("empty", String::new(), F::Malformed(Part::Token)),
        ("two parts", format!("{h}.{c}"), F::Malformed(Part::Token)),
        ("four parts", format!("{h}.{c}.{s}.{s}"), F::Malformed(Part::Token)),
        ("a JWE", format!("{h}.{c}.{s}.{s}.{s}"), F::Malformed(Part::Token)),
        (
            "header not base64url",
            format!("{h}*.{c}.{s}"),
            F::Malformed(Part::Header),
        ),
        ("header padded", format!("{h}=.{c}.{s}"), F::Malformed(Part::Header)),
        (
            "header not JSON",
            compact("{alg", &claims_text, b"x"),
            F::Malformed(Part::Header),
        ),
        (
            "header an array",
            compact("[\"ES256\"]", &claims_text, b"x"),
            F::Malformed(Part::Header),
        ),
        (
            "header repeats alg",
            compact(r#"{"alg":"ES256","alg":"ES256","kid":"ec-1"}"#, &claims_text, b"x"),
            F::Malformed(Part::Header),
        ),
        (
            "claims not base64url",
            format!("{h}.{c}!.{s}"),
            F::Malformed(Part::Claims),
        ),
        (
            "claims not JSON",
            k.p256.sign(&header_text, "{\"iss\""),
            F::Malformed(Part::Claims),
        ),
        (
            "claims a string",
            k.p256.sign(&header_text, "\"iss\""),
            F::Malformed(Part::Claims),
        ),
        (
            "claims repeat iss",
            k.p256.sign(
                &header_text,
                &claims_text.replacen('{', r#"{"iss":"https://evil.example","#, 1),
            ),
            F::Malformed(Part::Claims),
        ),
        (
            "exp a string",
            ec_token(json!({}), claims_with(json!({"exp": "soon"}))),
            F::Malformed(Part::Claims),
        ),
        (
            "aud a number",
            ec_token(json!({}), claims_with(json!({"aud": 5}))),
            F::Malformed(Part::Claims),
        ),
        (
            "aud an array in an array",
            ec_token(json!({}), claims_with(json!({"aud": [[AUDIENCE]]}))),
            F::Malformed(Part::Claims),
        ),
        (
            "signature not base64url",
            format!("{h}.{c}.{s}$"),
            F::Malformed(Part::Signature),
        ),
        ("signature empty", format!("{h}.{c}."), F::Malformed(Part::Signature)),
        (
            "signature too long",
            format!("{h}.{c}.{}", "A".repeat(2000)),
            F::Malformed(Part::Signature),
        ),
        ("signature changed", flipped_sig, F::BadSignature),
        ("signature short", format!("{h}.{c}.{}", &s[..20]), F::BadSignature),
        ("signed by another key", other_p256.token(&claims()), F::BadSignature),
        ("claims of another token", format!("{h}.{}.{s}", b64(b"{}")), F::Issuer),
        (
            "unknown kid",
            ec_token(json!({"kid": "ec-2"}), claims()),
            unknown(Some("ec-2")),
        ),
        (
            "no kid, every key has one",
            ec_token(json!({"kid": null}), claims()),
            unknown(None),
        ),
        (
            "alg none",
            format!("{}.{c}.", b64(br#"{"alg":"none","kid":"ec-1"}"#)),
            F::Algorithm,
        ),
        ("alg missing", ec_token(json!({"alg": null}), claims()), F::Algorithm),
        (
            "alg lower case",
            ec_token(json!({"alg": "es256"}), claims()),
            F::Algorithm,
        ),
        (
            "alg unsupported",
            ec_token(json!({"alg": "ES384"}), claims()),
            F::Algorithm,
        ),
        ("HS256 keyed by the RSA public key", hs256, F::Algorithm),
        (
            "RS256 against an EC key",
            ec_token(json!({"alg": "RS256"}), claims()),
            F::KeyMismatch,
        ),
        (
            "EdDSA against an RSA key",
            ec_token(json!({"alg": "EdDSA", "kid": "rsa-1"}), claims()),
            F::KeyMismatch,
        ),
        (
            "crit",
            ec_token(json!({"crit": ["b64"], "b64": false}), claims()),
            F::UnsupportedHeader,
        ),
        (
            "crit null",
            k.p256.sign(r#"{"alg":"ES256","kid":"ec-1","crit":null}"#, &claims_text),
            F::UnsupportedHeader,
        ),
        (
            "enc",
            ec_token(json!({"enc": "A256GCM"}), claims()),
            F::UnsupportedHeader,
        ),
        ("typ JOSE", ec_token(json!({"typ": "JOSE"}), claims()), F::Type),
        (
            "typ an ID token's",
            ec_token(json!({"typ": "id+jwt"}), claims()),
            F::Type,
        ),
        (
            "wrong issuer",
            ec_token(json!({}), claims_with(json!({"iss": "https://evil.example"}))),
            F::Issuer,
        ),
        (
            "issuer with a slash",
            ec_token(json!({}), claims_with(json!({"iss": format!("{ISSUER}/")}))),
            F::Issuer,
        ),
        (
            "no issuer",
            ec_token(json!({}), claims_with(json!({"iss": null}))),
            F::Issuer,
        ),
        (
            "wrong audience",
            ec_token(json!({}), claims_with(json!({"aud": "https://api.example"}))),
            F::Audience,
        ),
        (
            "audience of another case",
            ec_token(json!({}), claims_with(json!({"aud": AUDIENCE.to_uppercase()}))),
            F::Audience,
        ),
        (
            "empty audience list",
            ec_token(json!({}), claims_with(json!({"aud": []}))),
            F::Audience,
        ),
        (
            "no audience",
            ec_token(json!({}), claims_with(json!({"aud": null}))),
            F::Audience,
        ),
        (
            "no exp",
            ec_token(json!({}), claims_with(json!({"exp": null}))),
            F::MissingExpiry,
        ),
        (
            "expired",
            ec_token(json!({}), claims_with(json!({"exp": NOW_SECS - LEEWAY}))),
            F::Expired,
        ),
        (
            "expired long ago",
            ec_token(json!({}), claims_with(json!({"exp": 0}))),
            F::Expired,
        ),
        (
            "not yet valid",
            ec_token(json!({}), claims_with(json!({"nbf": NOW_SECS + LEEWAY + 1}))),
            F::NotYetValid,
        ),
        (
            "issued in the future",
            ec_token(json!({}), claims_with(json!({"iat": NOW_SECS + LEEWAY + 1}))),
            F::NotYetValid,
        ),
    ];
    for (what, token, failure) in table {
        assert_eq!(verify(&token).err(), Some(failure.clone()), "{what}: {token}");
        assert!(AUTH_RESULTS.contains(&failure.result()), "{what}");
        let d = failure.description();
        assert!(
            !d.is_empty() && d.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\'),
            "{what}: {d:?}"
        );
    }
}

#[test]
fn result_labels() {
    use AuthFailure as F;
    assert_eq!(F::Expired.result(), "expired");
    assert_eq!(F::NotYetValid.result(), "expired");
    assert_eq!(F::Audience.result(), "audience");
    for f in [
        F::Malformed(Part::Header),
        F::Algorithm,
        F::UnknownKey { kid: None },
        F::BadSignature,
        F::Issuer,
        F::Type,
    ] {
        assert_eq!(f.result(), "invalid", "{f:?}");
    }
    assert_eq!(
        F::UnknownKey { kid: Some("k".into()) }.to_string(),
        "the token signing key is unknown (kid \"k\")"
    );
}

/// The claims are checked before the signature: a token that is expired, foreign or for another
/// resource is refused for that, whatever its signature (no RSA operation is spent on it).
#[test]
fn claims_are_checked_before_the_signature() {
    let k = keys();
    let forged = |changes: Value| {
        let header = k.rsa.header().to_string();
        compact(&header, &claims_with(changes).to_string(), &[0x55; 256])
    };
    assert_eq!(verify(&forged(json!({}))), Err(AuthFailure::BadSignature));
    assert_eq!(verify(&forged(json!({"exp": 1}))), Err(AuthFailure::Expired));
    assert_eq!(
        verify(&forged(json!({"aud": "https://api.example"}))),
        Err(AuthFailure::Audience)
    );
    assert_eq!(
        verify(&forged(json!({"iss": "https://evil.example"}))),
        Err(AuthFailure::Issuer)
    );
    // And the header before the claims.
    let bad_alg = compact(r#"{"alg":"HS256"}"#, "not even JSON", b"");
    assert_eq!(verify(&bad_alg), Err(AuthFailure::Algorithm));
    // The claims before the key: a token that can never be valid, whatever its `kid`, never
    // says "unknown key" (on which the router would fetch the issuer's keys again).
    let unknown_kid = |changes: Value| {
        let header = json!({"alg": "ES256", "kid": "never-published"}).to_string();
        compact(&header, &claims_with(changes).to_string(), &[0x55; 64])
    };
    assert_eq!(
        verify(&unknown_kid(json!({}))),
        Err(AuthFailure::UnknownKey {
            kid: Some("never-published".into())
        })
    );
    for (changes, failure) in [
        (json!({"exp": 1}), AuthFailure::Expired),
        (json!({"aud": "https://api.example"}), AuthFailure::Audience),
        (json!({"iss": "https://evil.example"}), AuthFailure::Issuer),
    ] {
        assert_eq!(verify(&unknown_kid(changes)), Err(failure));
    }
}

#[test]
fn the_policy_limits_the_algorithms() {
    let k = keys();
    let rs_only = Policy {
        algorithms: AlgorithmSet::of(&[Algorithm::Rs256]),
        ..policy()
    };
    assert!(rs_only.verify(&k.rsa.token(&claims()), &k.set, now()).is_ok());
    for token in [k.p256.token(&claims()), k.ed25519.token(&claims())] {
        assert_eq!(rs_only.verify(&token, &k.set, now()), Err(AuthFailure::Algorithm));
    }
    assert_eq!(
        AlgorithmSet::from_names(&["RS256", "EdDSA"]),
        Ok(AlgorithmSet::of(&[Algorithm::EdDsa, Algorithm::Rs256]))
    );
    for (bad, why) in [
        ("none", "never"),
        ("HS256", "HMAC"),
        ("hs512", "HMAC"),
        ("RS384", "not an algorithm"),
        ("€", "not"),
    ] {
        let err = AlgorithmSet::from_names(&["ES256", bad]).unwrap_err();
        assert!(err.contains(why), "{bad}: {err}");
    }
    assert_eq!(format!("{:?}", AlgorithmSet::ALL), "{Rs256, Ps256, Es256, EdDsa}");
}

#[test]
fn a_key_without_kid_serves_only_tokens_without_kid() {
    let signer = Signer::ed25519([9; 32], None);
    let set = KeySet::parse(jwks(&[signer.jwk()]).as_bytes()).unwrap().keys;
    let p = policy();
    assert!(p.verify(&signer.token(&claims()), &set, now()).is_ok());
    let named = Signer::ed25519([9; 32], Some("ed-9"));
    assert_eq!(
        p.verify(&named.token(&claims()), &set, now()),
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
        policy().verify(&k.rsa.token(&claims()), &set, now()),
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
    for token in [rsa.token(&claims()), ec.token(&claims())] {
        assert!(policy().verify(&token, &set, now()).is_ok());
    }
    // Two keys of one type under one kid: the first is the one, a second is never tried.
    let ec2 = Signer::p256(Some("shared"));
    let set = KeySet::parse(jwks(&[ec.jwk(), ec2.jwk()]).as_bytes()).unwrap().keys;
    assert!(policy().verify(&ec.token(&claims()), &set, now()).is_ok());
    assert_eq!(
        policy().verify(&ec2.token(&claims()), &set, now()),
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
    let token = Signer::rsa(Some("zero")).token(&claims());
    assert!(policy().verify(&token, &parsed.keys, now()).is_ok());
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
    policy().verify(&keys().p256.token(&claims()), set, now())
}

#[test]
fn scope_hierarchies() {
    let granted = Scopes::parse("files mcp:tools read:a:b").unwrap();
    for (required, ok) in [
        ("files", true),
        ("files:write", true),
        ("files:write:all", true),
        ("filesystem", false),
        ("file", false),
        ("mcp:tools", true),
        ("mcp:tools:call", true),
        ("mcp", false),
        ("mcp:toolsx", false),
        ("mcp:prompts", false),
        ("read:a:b:c", true),
        ("read:a", false),
        ("Files", false),
    ] {
        assert_eq!(granted.satisfies(required), ok, "{required}");
    }
    let required: Vec<String> = ["files:read", "mcp", "mcp:prompts", "mcp", "read:a:b"]
        .map(str::to_owned)
        .to_vec();
    assert_eq!(granted.missing(&required), ["mcp", "mcp:prompts"]);
    assert!(Scopes::default().missing(&[]).is_empty());
}

#[test]
fn scope_tokens() {
    for ok in ["a", "files:read", "!#[]~", "https://x.example/scope"] {
        assert!(is_scope_token(ok), "{ok}");
    }
    for bad in ["", "a b", "a\"b", "a\\b", "é", "a\tb", "\x7f"] {
        assert!(!is_scope_token(bad), "{bad:?}");
    }
    assert_eq!(Scopes::parse("ok bad\\"), Err(InvalidScope("bad\\".into())));
    let s = Scopes::from_tokens(["b", "a", "b"]).unwrap();
    assert_eq!((s.len(), s.to_string()), (2, "a b".to_owned()));
    assert!(Scopes::parse("   ").unwrap().is_empty());
}

#[test]
fn the_principal_digest_is_stable_and_unambiguous() {
    let p = Principal::new("https://issuer.example", "user-42");
    // Pinned: sealed handles in flight carry this value; a change breaks them.
    assert_eq!(
        hex(&p.digest()),
        "b79084290f221f0fcb388745f46bdfeeaf7aa2449d26aaf2671078afac0b89bf"
    );
    assert_ne!(Principal::new("ab", "c").digest(), Principal::new("a", "bc").digest());
    assert_ne!(Principal::new("", "x").digest(), Principal::new("x", "").digest());
    assert_ne!(
        Principal::new("i", "svc").digest(),
        Principal::client("i", "svc").digest(),
        "a client is no user"
    );
    assert_eq!(p.digest(), p.clone().digest());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
