//! The router as the fleet's OAuth resource server (docs/src/authorization.md), on real
//! sockets: every way a request can be refused, one row each (status, `WWW-Authenticate`,
//! `Mcp-Router-Error`, JSON-RPC error and id, no backend reached, `mrtr_auth_total` moved by
//! exactly one), the tokens that pass and what their backend then sees, the Protected Resource
//! Metadata, the issuer's keys unavailable then back, and auth off. Handles bound to their
//! principal are in tests/it/auth_handles.rs.

use std::time::Duration;

use crate::support::auth::rows::*;
use crate::support::auth::signer::{b64, compact};
use crate::support::auth::*;
use crate::support::*;
use bytes::Bytes;
use http::Method;
use ring::hmac;
use serde_json::{json, Value};

/// `[auth]` of the table: one scope for everything, one more for two tools and two methods,
/// one public prefix.
pub(crate) fn table_auth(issuer: &Issuer, origin: &str) -> String {
    format!(
        r#"[auth]
issuer = "{ISSUER}"
jwks_file = "{jwks}"
required_scopes = ["mcp"]
public_paths = ["/public/*"]
[auth.resource_metadata]
resource = "{origin}/mcp"
[[auth.tool]]
name = "transfer-funds"
scopes = ["payments:write"]
[[auth.tool]]
name = "whoami"
scopes = ["profile:read"]
[[auth.method]]
name = "tasks/get"
scopes = ["tasks"]
[[auth.method]]
name = "resources/read"
scopes = ["files:read"]
"#,
        jwks = issuer.jwks_path.display()
    )
}

/// HS256 over the token's signing input with `secret`: the key-confusion attack that signs
/// with the issuer's public key as an HMAC secret.
fn hs256(header: &Value, claims: &Value, secret: &[u8]) -> String {
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), input.as_bytes());
    format!("{input}.{}", b64(tag.as_ref()))
}

/// Every row of the main fleet (`table_auth`): refusals of cases 2 to 8 and the requests that
/// pass beside them.
fn table(env: &Env) -> Vec<(&'static str, Req, Want)> {
    let good = env.bearer("mcp");
    let now = now_secs();
    let (ec, rsa) = (&env.issuer.ec, &env.issuer.rsa);
    let base = env.claims("mcp", |_| {});
    let header = |alg: &str, kid: &str| json!({"alg": alg, "typ": "at+jwt", "kid": kid}).to_string();
    // A ping with a token of `signer` over good claims, over claims `edit` changed, or with a
    // header of its own.
    let signed_by = |signer: &Signer| ping().bearer(signer.bearer(&base));
    let edited = |edit: &dyn Fn(&mut Value)| ping().bearer(ec.bearer(&env.claims("mcp", edit)));
    let headed = |signer: &Signer, header: String| ping().bearer(signer.sign(&header, &base.to_string()));
    let scoped = |req: Req, scope: &str| req.bearer(env.bearer(scope));
    let without = |claim: &'static str| move |c: &mut Value| drop(c.as_object_mut().unwrap().remove(claim));
    let (evil, other_port) = ("http://evil.example.com", "http://127.0.0.1:1");
    let in_query = format!("/mcp?access_token={good}");
    let confused = hs256(
        &json!({"alg": "HS256", "typ": "at+jwt", "kid": "rsa-1"}),
        &base,
        rsa.jwk().to_string().as_bytes(),
    );
    let jwe = format!(
        "{}.AAAA.AAAA.AAAA.AAAA",
        b64(br#"{"alg":"RSA-OAEP","enc":"A256GCM","kid":"rsa-1"}"#)
    );
    let tasks_get = || post("tasks/get", json!({"taskId": "t-1"}));
    vec![
        // Origin (DNS rebinding), before anything else.
        (
            "a foreign Origin, with a good token",
            ping().bearer(&good).header("origin", evil),
            origin_refused(),
        ),
        (
            "a foreign Origin, without a token",
            ping().header("origin", evil),
            origin_refused(),
        ),
        (
            "Origin: null",
            ping().bearer(&good).header("origin", "null"),
            origin_refused(),
        ),
        (
            "the resource's host, another port",
            ping().bearer(&good).header("origin", other_port),
            origin_refused(),
        ),
        (
            "the resource's own Origin",
            ping().bearer(&good).header("origin", env.origin.clone()),
            ok(),
        ),
        // Public paths: no check, and still nothing of the client's token or identity goes on.
        ("a public path without a token", get("/public/health"), Want::Unchecked),
        (
            "a public path with a bad token and a forged identity",
            get("/public/health")
                .bearer("garbage")
                .header("x-mcp-auth-subject", "root"),
            Want::Unchecked,
        ),
        // Never from the query string (OAuth 2.1), even a good one.
        (
            "a good token in the query only",
            ping().at(&in_query),
            unauthorized(Expect::Unauthorized, "invalid"),
        ),
        (
            "a token in the query beside a good header",
            ping().at(&in_query).bearer(&good),
            unauthorized(Expect::Unauthorized, "invalid"),
        ),
        (
            "two Authorization headers",
            ping().bearer(&good).bearer(&good),
            unauthorized(Expect::Unauthorized, "invalid"),
        ),
        // No bearer token.
        ("no Authorization", ping(), unauthorized(Expect::Missing, "missing")),
        (
            "no Authorization on the GET stream",
            get("/mcp"),
            unauthorized(Expect::Missing, "missing"),
        ),
        (
            "Authorization: Basic",
            ping().header("authorization", "Basic YWxpY2U6cHc="),
            unauthorized(Expect::Missing, "missing"),
        ),
        // Bad tokens.
        ("not a JWT", ping().bearer("not-a-jwt"), invalid("invalid")),
        (
            "another key under the issuer's kid",
            signed_by(&Signer::p256(Some("ec-1"))),
            invalid("invalid"),
        ),
        (
            "a kid the issuer never published",
            signed_by(&Signer::p256(Some("ec-9"))),
            invalid("invalid"),
        ),
        (
            "an RS256 header on the EC key",
            headed(ec, header("RS256", "ec-1")),
            invalid("invalid"),
        ),
        (
            "expired beyond the leeway",
            edited(&|c| c["exp"] = json!(now - 120)),
            invalid("expired"),
        ),
        (
            "nbf in the future",
            edited(&|c| c["nbf"] = json!(now + 300)),
            invalid("expired"),
        ),
        (
            "another issuer",
            edited(&|c| c["iss"] = json!("https://evil.example.com")),
            invalid("invalid"),
        ),
        (
            "for another resource",
            edited(&|c| c["aud"] = json!("https://other.example.com/mcp")),
            invalid("audience"),
        ),
        ("no audience", edited(&without("aud")), invalid("audience")),
        ("no expiry", edited(&without("exp")), invalid("invalid")),
        (
            "alg none",
            ping().bearer(compact(&header("none", "ec-1"), &base.to_string(), &[])),
            invalid("invalid"),
        ),
        (
            "HS256 with the public key as secret",
            ping().bearer(confused),
            invalid("invalid"),
        ),
        ("a JWE", ping().bearer(jwe), invalid("invalid")),
        (
            "a signed token over 8 KiB",
            edited(&|c| c["pad"] = json!("x".repeat(9000))),
            invalid("invalid"),
        ),
        // Scopes: required ∪ the method's ∪ the tool's, all named in the challenge.
        ("a token without scopes", scoped(ping(), ""), short_of(&["mcp"])),
        (
            "a tool's scope lacking",
            scoped(tool("transfer-funds"), "mcp"),
            short_of(&["mcp", "payments:write"]),
        ),
        (
            "the required scope lacking beside the tool's",
            scoped(tool("transfer-funds"), "payments:write"),
            short_of(&["mcp", "payments:write"]),
        ),
        (
            "a method's scope lacking",
            scoped(tasks_get(), "mcp"),
            short_of(&["mcp", "tasks"]),
        ),
        (
            "a sibling scope is not the needed one",
            scoped(post("resources/read", json!({"uri": "file:///a"})), "mcp files:write"),
            short_of(&["files:read", "mcp"]),
        ),
        (
            "a narrower scope does not grant a broader one",
            scoped(tool("whoami"), "mcp profile:read:own"),
            short_of(&["mcp", "profile:read"]),
        ),
        (
            "a broader scope grants the narrower",
            scoped(tool("transfer-funds"), "mcp payments"),
            ok(),
        ),
        (
            "the tool's scope exactly",
            scoped(tool("whoami"), "profile:read mcp"),
            ok(),
        ),
        ("a tool no [[auth.tool]] names", scoped(tool("sleep"), "mcp"), ok()),
        (
            "scopes as an scp array",
            tasks_get().bearer(ec.bearer(&env.claims("", |c| {
                without("scope")(c);
                c["scp"] = json!(["mcp", "tasks"]);
            }))),
            ok(),
        ),
        // Good tokens: every algorithm, and the edges of the claims.
        ("ES256", ping().bearer(&good), ok()),
        ("RS256", signed_by(rsa), ok()),
        ("PS256", headed(rsa, header("PS256", "rsa-1")), ok()),
        ("EdDSA", signed_by(&env.issuer.ed), ok()),
        (
            "expired within the leeway",
            edited(&|c| c["exp"] = json!(now - 5)),
            ok(),
        ),
        (
            "the resource among audiences",
            edited(&|c| c["aud"] = json!(["https://a.example.com", env.resource])),
            ok(),
        ),
        (
            "the scheme in lower case (RFC 9110)",
            ping().header("authorization", format!("bearer {good}")),
            ok(),
        ),
        // What the backend sees: the identity from the token, never the client's.
        (
            "a forged identity is replaced",
            scoped(ping(), "mcp profile")
                .header("x-mcp-auth-subject", "root")
                .header("x-mcp-auth-role", "admin"),
            Want::Ok(vec![
                ("x-mcp-auth-subject", vec!["alice"]),
                ("x-mcp-auth-client-id", vec!["app-1"]),
                ("x-mcp-auth-issuer", vec![ISSUER]),
                ("x-mcp-auth-scopes", vec!["mcp", "profile"]),
                ("x-mcp-auth-role", vec![]),
            ]),
        ),
        (
            "a token without client_id",
            edited(&without("client_id")),
            Want::Ok(vec![
                ("x-mcp-auth-subject", vec!["alice"]),
                ("x-mcp-auth-client-id", vec![]),
            ]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_is_answered_as_the_contract_says() {
    let env = Env::start(&["mcp"], table_auth).await;
    let rows = table(&env);
    assert!(rows.len() > 40, "the whole table");
    check_all(&env, rows).await;
}

/// The same checks with the other settings: the client's token passed on, no identity headers,
/// no required scope (so a 401 names none), and an explicit Origin list replacing the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_no_identity_headers_and_an_origin_list() {
    let mut env = Env::start(&[], |issuer, origin| {
        format!(
            "[auth]\nissuer = \"{ISSUER}\"\njwks_file = \"{}\"\nforward = \"passthrough\"\nidentity_headers = false\n\
             allowed_origins = [\"https://app.example.com\"]\n[auth.resource_metadata]\nresource = \"{origin}/mcp\"\n",
            issuer.jwks_path.display()
        )
    })
    .await;
    (env.passthrough, env.identity) = (true, false);
    let good = env.bearer("");
    let app = "https://app.example.com";
    let rows = vec![
        (
            "no Authorization, no required scope",
            ping(),
            unauthorized(Expect::Missing, "missing"),
        ),
        (
            "the resource's Origin, not listed",
            ping().bearer(&good).header("origin", env.origin.clone()),
            origin_refused(),
        ),
        ("a listed Origin", ping().bearer(&good).header("origin", app), ok()),
        ("a token without scopes, none needed", ping().bearer(&good), ok()),
        (
            "a forged identity",
            ping().bearer(&good).header("x-mcp-auth-subject", "root"),
            ok(),
        ),
    ];
    check_all(&env, rows).await;
}

#[tokio::test]
async fn the_metadata_is_served_at_both_names_without_a_token() {
    let env = Env::start(&["mcp"], table_auth).await;
    let before = env.fleet.metrics().await;
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let url = format!("http://{}{path}", env.fleet.router);
        let a = send(&env.fleet.client, Method::GET, &url, &[], Bytes::new()).await;
        assert_eq!(a.status, 200, "{path}: {a:?}");
        assert!(
            a.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{path}: {a:?}"
        );
        let v = a.json();
        assert_eq!(v["resource"], env.resource, "{path}: {v}");
        assert_eq!(v["authorization_servers"], json!([ISSUER]), "{path}: {v}");
        assert_eq!(v["bearer_methods_supported"], json!(["header"]), "{path}: {v}");
        let mut scopes: Vec<&str> = v["scopes_supported"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: {v}"))
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        scopes.sort();
        assert_eq!(
            scopes,
            ["files:read", "mcp", "payments:write", "profile:read", "tasks"],
            "{path}"
        );
    }
    assert_eq!(env.served(), 0, "the metadata is the router's own, never forwarded");
    let after = env.fleet.metrics().await;
    assert_eq!(
        auth_moves(&auth_counts(&before), &auth_counts(&after)),
        vec![],
        "no token checked"
    );
}

/// The issuer's keys cannot be fetched: 503 `auth_unavailable`, never a 401 (the token may be
/// good); once the issuer serves them, the same token passes, and a key it publishes later is
/// fetched for the first token that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_not_loadable_are_503_until_the_issuer_serves_them() {
    let port = free_port();
    let jwks_uri = format!("http://127.0.0.1:{port}/jwks");
    let env = Env::start(&[], |_, origin| {
        format!(
            "[auth]\nissuer = \"{ISSUER}\"\njwks_uri = \"{jwks_uri}\"\njwks_timeout = \"1s\"\n\
             jwks_refresh_min = \"1s\"\njwks_refresh_max = \"2s\"\njwks_kid_refetch = \"1s\"\n\
             [auth.resource_metadata]\nresource = \"{origin}/mcp\"\n"
        )
    })
    .await;
    let good = env.bearer("");
    let unavailable = Want::Refused {
        status: 503,
        reason: "auth_unavailable",
        code: -32014,
        challenge: Expect::Absent,
        result: "jwks_unavailable",
    };
    check(
        &env,
        0,
        "the issuer's keys never loaded",
        ping().bearer(&good),
        &unavailable,
    )
    .await;
    let a = env
        .fleet
        .post(
            &[("authorization", &format!("Bearer {good}"))],
            &json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
        )
        .await;
    assert!(a.headers.contains_key("retry-after"), "{a:?}");
    let readyz = format!("http://{}/readyz", env.fleet.admin);
    let ready = || send(&env.fleet.client, Method::GET, &readyz, &[], Bytes::new());
    let not_ready = ready().await;
    assert_eq!(not_ready.status, 503, "not ready without keys: {not_ready:?}");
    let refreshes = "mrtr_jwks_refreshes_total";
    let limit = Duration::from_secs(10);
    wait_metric_at_least(&env.fleet, refreshes, &["result=\"error\""], 1.0, limit).await;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port is still free");
    let jwks = JwksServer::start(listener, env.issuer.jwks());
    let ping_ok = || async {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
        env.fleet
            .post(&[("authorization", &format!("Bearer {good}"))], &body)
            .await
            .status
            == 200
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ping_ok().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the keys were never loaded once served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(jwks.fetches.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(ready().await.status, 200, "ready once the keys are in");
    check(&env, 1, "the keys served", ping().bearer(&good), &ok()).await;
    wait_metric_at_least(&env.fleet, refreshes, &["result=\"ok\""], 1.0, limit).await;

    // A rotation: the issuer publishes a new key; the first token naming it makes the router
    // fetch again (at most once per jwks_kid_refetch, so a try may come too early).
    let rotated = Signer::p256(Some("ec-2"));
    let keys = [env.issuer.ec.jwk(), rotated.jwk()];
    jwks.publish(crate::support::auth::signer::jwks(&keys));
    let new_token = rotated.bearer(&env.claims("", |_| {}));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
        let a = env
            .fleet
            .post(&[("authorization", &format!("Bearer {new_token}"))], &body)
            .await;
        if a.status == 200 {
            break;
        }
        assert_eq!(a.status, 401, "{a:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated key was never fetched"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stranger = Signer::p256(Some("ec-never")).bearer(&env.claims("", |_| {}));
    check(
        &env,
        2,
        "a kid the issuer never publishes",
        ping().bearer(stranger),
        &invalid("invalid"),
    )
    .await;
}

/// Without `[auth]` nothing changes: the client's `Authorization` reaches the backend as sent,
/// and the metadata path is the backend's like any other.
#[tokio::test]
async fn auth_off_passes_authorization_through() {
    let (spec, backend) = Recorder::start("recorder").await;
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "").await;
    let body = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let a = fleet.post(&[("authorization", "Bearer opaque-token")], &body).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(backend.last().unwrap().header("authorization"), ["Bearer opaque-token"]);
    let url = format!("http://{}/.well-known/oauth-protected-resource", fleet.router);
    assert_eq!(
        send(&fleet.client, Method::GET, &url, &[], Bytes::new()).await.status,
        200
    );
    assert_eq!(backend.count(), 2, "the metadata path forwarded as any other");
    let m = fleet.metrics().await;
    assert_eq!(metric_sum(&m, "mrtr_auth_total", &[]), 0.0, "nothing checked");
}

#[test]
fn challenges_parse_as_rfc_9110_writes_them() {
    let c = parse_challenge(r#"Bearer error="invalid_token", error_description="a \"b\"",scope=mcp"#).unwrap();
    assert_eq!(c.scheme, "Bearer");
    assert_eq!(c.get("error"), Some("invalid_token"));
    assert_eq!(c.get("error_description"), Some(r#"a "b""#));
    assert_eq!(c.words("scope"), ["mcp"]);
    assert!(
        parse_challenge(r#"Bearer a="1", a="2""#).is_err(),
        "a repeated parameter"
    );
    assert!(parse_challenge(r#"Bearer a="1"#).is_err(), "an unterminated string");
    assert!(parse_challenge("Bearer").unwrap().params.is_empty());
}

/// A `jwks_file`'s keys are read again at a reload even when the config's own text is
/// unchanged: an operator rotates keys by replacing the file and sending SIGHUP.
#[tokio::test]
async fn a_reload_reads_a_rotated_jwks_file_though_the_config_is_unchanged() {
    let env = Env::start(&["mcp"], table_auth).await;
    let rotated = crate::support::auth::Signer::p256(Some("ec-2"));
    let token = rotated.bearer(&env.claims("mcp", |_| {}));
    let url = format!("http://{}/mcp", env.fleet.router);
    let ping = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).unwrap();
    let call = |token: String| {
        let (env, url, ping) = (&env, url.clone(), ping.clone());
        async move {
            let auth = format!("Bearer {token}");
            let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
            send(&env.fleet.client, Method::POST, &url, &headers, Bytes::from(ping)).await
        }
    };
    let before = call(token.clone()).await;
    assert_eq!(before.status, 401, "a key the file does not hold: {before:?}");
    let dropped = env.issuer.rsa.bearer(&env.claims("mcp", |_| {}));
    let first = call(dropped.clone()).await;
    assert_eq!(
        first.status, 200,
        "verified (and remembered) while its key is in the file: {first:?}"
    );
    let keys = crate::support::auth::signer::jwks(&[env.issuer.ec.jwk(), rotated.jwk()]);
    std::fs::write(&env.issuer.jwks_path, keys).unwrap();
    env.fleet.control.reload().unwrap();
    let after = call(token).await;
    assert_eq!(after.status, 200, "the rotated key, read at the reload: {after:?}");
    let old = call(env.bearer("mcp")).await;
    assert_eq!(old.status, 200, "the key kept in the file still verifies: {old:?}");
    let gone = call(env.issuer.rsa.bearer(&env.claims("mcp", |_| {}))).await;
    assert_eq!(
        gone.status, 401,
        "the key dropped from the file no longer does: {gone:?}"
    );
}
