//! One token checked against a policy: every algorithm, the shapes accepted, every refusal and
//! its label, the order of the checks.

use serde_json::{json, Value};

use super::*;

#[test]
fn every_algorithm_verifies() {
    let k = keys();
    let pss = k.rsa.sign(
        &json!({"alg": "PS256", "kid": "rsa-1", "typ": "at+jwt"}).to_string(),
        &claims().to_string(),
    );
    let bearers = [
        ("RS256", k.rsa.bearer(&claims())),
        ("PS256", pss),
        ("ES256", k.p256.bearer(&claims())),
        ("EdDSA", k.ed25519.bearer(&claims())),
    ];
    for (alg, bearer) in bearers {
        let v = verify(&bearer).unwrap_or_else(|e| panic!("{alg}: {e}"));
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
        assert!(only_other.verify(&bearer, &k.set, now()).is_ok(), "{alg}");
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
        let bearer = format!("{input}.{}", b64(&k.rsa.signature(pss, input.as_bytes())));
        assert_eq!(verify(&bearer).unwrap_err(), AuthFailure::BadSignature, "{header}");
    }
}

#[test]
fn subject_falls_back_to_the_client() {
    let v = verify(&ec_bearer(json!({}), claims_with(json!({"sub": null})))).unwrap();
    assert_eq!(
        (v.subject.as_str(), v.client_id.as_deref()),
        ("client-7", Some("client-7"))
    );
    let azp = claims_with(json!({"sub": "", "client_id": null, "azp": "client-9"}));
    let v = verify(&ec_bearer(json!({}), azp)).unwrap();
    assert_eq!(
        (v.subject.as_str(), v.client_id.as_deref()),
        ("client-9", Some("client-9"))
    );
    let none = claims_with(json!({"sub": null, "client_id": null}));
    assert_eq!(verify(&ec_bearer(json!({}), none)), Err(AuthFailure::NoSubject));
}

#[test]
fn scopes_come_from_scope_or_else_scp() {
    let scopes = |changes: Value| {
        let v = verify(&ec_bearer(json!({}), claims_with(changes)))?;
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
    let ok = |header: Value, changes: Value| verify(&ec_bearer(header.clone(), claims_with(changes.clone())));
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
    let good = ec_bearer(json!({}), claims());
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
    let long_claims = claims_with(json!({"pad": "x".repeat(MAX_BEARER_BYTES)}));
    let long = ec_bearer(json!({}), long_claims);
    let mut flipped_sig = s.as_bytes().to_vec();
    flipped_sig[10] = if flipped_sig[10] == b'A' { b'B' } else { b'A' };
    let flipped_sig = format!("{h}.{c}.{}", String::from_utf8(flipped_sig).unwrap());
    let unknown = |kid: Option<&str>| AuthFailure::UnknownKey {
        kid: kid.map(str::to_owned),
    };
    use AuthFailure as F;
    let table: Vec<(&str, String, AuthFailure)> = vec![
        ("too long", long.clone(), F::TooLong { len: long.len() }),
        ("empty", String::new(), F::Malformed(Part::Whole)),
        ("two parts", format!("{h}.{c}"), F::Malformed(Part::Whole)),
        ("four parts", format!("{h}.{c}.{s}.{s}"), F::Malformed(Part::Whole)),
        ("a JWE", format!("{h}.{c}.{s}.{s}.{s}"), F::Malformed(Part::Whole)),
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
            ec_bearer(json!({}), claims_with(json!({"exp": "soon"}))),
            F::Malformed(Part::Claims),
        ),
        (
            "aud a number",
            ec_bearer(json!({}), claims_with(json!({"aud": 5}))),
            F::Malformed(Part::Claims),
        ),
        (
            "aud an array in an array",
            ec_bearer(json!({}), claims_with(json!({"aud": [[AUDIENCE]]}))),
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
        ("signed by another key", other_p256.bearer(&claims()), F::BadSignature),
        ("claims of another token", format!("{h}.{}.{s}", b64(b"{}")), F::Issuer),
        (
            "unknown kid",
            ec_bearer(json!({"kid": "ec-2"}), claims()),
            unknown(Some("ec-2")),
        ),
        (
            "no kid, every key has one",
            ec_bearer(json!({"kid": null}), claims()),
            unknown(None),
        ),
        (
            "alg none",
            format!("{}.{c}.", b64(br#"{"alg":"none","kid":"ec-1"}"#)),
            F::Algorithm,
        ),
        ("alg missing", ec_bearer(json!({"alg": null}), claims()), F::Algorithm),
        (
            "alg lower case",
            ec_bearer(json!({"alg": "es256"}), claims()),
            F::Algorithm,
        ),
        (
            "alg unsupported",
            ec_bearer(json!({"alg": "ES384"}), claims()),
            F::Algorithm,
        ),
        ("HS256 keyed by the RSA public key", hs256, F::Algorithm),
        (
            "RS256 against an EC key",
            ec_bearer(json!({"alg": "RS256"}), claims()),
            F::KeyMismatch,
        ),
        (
            "EdDSA against an RSA key",
            ec_bearer(json!({"alg": "EdDSA", "kid": "rsa-1"}), claims()),
            F::KeyMismatch,
        ),
        (
            "crit",
            ec_bearer(json!({"crit": ["b64"], "b64": false}), claims()),
            F::UnsupportedHeader,
        ),
        (
            "crit null",
            k.p256.sign(r#"{"alg":"ES256","kid":"ec-1","crit":null}"#, &claims_text),
            F::UnsupportedHeader,
        ),
        (
            "enc",
            ec_bearer(json!({"enc": "A256GCM"}), claims()),
            F::UnsupportedHeader,
        ),
        ("typ JOSE", ec_bearer(json!({"typ": "JOSE"}), claims()), F::Type),
        (
            "typ an ID token's",
            ec_bearer(json!({"typ": "id+jwt"}), claims()),
            F::Type,
        ),
        (
            "wrong issuer",
            ec_bearer(json!({}), claims_with(json!({"iss": "https://evil.example"}))),
            F::Issuer,
        ),
        (
            "issuer with a slash",
            ec_bearer(json!({}), claims_with(json!({"iss": format!("{ISSUER}/")}))),
            F::Issuer,
        ),
        (
            "no issuer",
            ec_bearer(json!({}), claims_with(json!({"iss": null}))),
            F::Issuer,
        ),
        (
            "wrong audience",
            ec_bearer(json!({}), claims_with(json!({"aud": "https://api.example"}))),
            F::Audience,
        ),
        (
            "audience of another case",
            ec_bearer(json!({}), claims_with(json!({"aud": AUDIENCE.to_uppercase()}))),
            F::Audience,
        ),
        (
            "empty audience list",
            ec_bearer(json!({}), claims_with(json!({"aud": []}))),
            F::Audience,
        ),
        (
            "no audience",
            ec_bearer(json!({}), claims_with(json!({"aud": null}))),
            F::Audience,
        ),
        (
            "no exp",
            ec_bearer(json!({}), claims_with(json!({"exp": null}))),
            F::MissingExpiry,
        ),
        (
            "expired",
            ec_bearer(json!({}), claims_with(json!({"exp": NOW_SECS - LEEWAY}))),
            F::Expired,
        ),
        (
            "expired long ago",
            ec_bearer(json!({}), claims_with(json!({"exp": 0}))),
            F::Expired,
        ),
        (
            "not yet valid",
            ec_bearer(json!({}), claims_with(json!({"nbf": NOW_SECS + LEEWAY + 1}))),
            F::NotYetValid,
        ),
        (
            "issued in the future",
            ec_bearer(json!({}), claims_with(json!({"iat": NOW_SECS + LEEWAY + 1}))),
            F::NotYetValid,
        ),
    ];
    for (what, bearer, failure) in table {
        assert_eq!(verify(&bearer).err(), Some(failure.clone()), "{what}: {bearer}");
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
    assert!(rs_only.verify(&k.rsa.bearer(&claims()), &k.set, now()).is_ok());
    for bearer in [k.p256.bearer(&claims()), k.ed25519.bearer(&claims())] {
        assert_eq!(rs_only.verify(&bearer, &k.set, now()), Err(AuthFailure::Algorithm));
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
