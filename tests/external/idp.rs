//! The test authorization server (tests/idp/server.mjs, oidc-provider) through its harness
//! (tests/external/tools/idp.rs): JWT access tokens for the requested resource, signed ES256 or RS256
//! by keys of its JWKS, rotated on demand; end-user tokens by the authorization-code flow with
//! PKCE; and the official MCP Python SDK's OAuth clients completing discovery, registration and
//! scope step-up against it with an SDK resource server. The test script installs node's and
//! Python's packages first; without them these tests fail (they never skip).

use crate::tools::idp::sdk::*;
use crate::tools::idp::*;
use serde_json::Value;

const RESOURCE: &str = "http://127.0.0.1:9/mcp";
const OTHER_RESOURCE: &str = "http://127.0.0.1:9/other/mcp";

fn claims_of(token: &str, jwks: &Value) -> Value {
    verify_jwt(token, jwks).unwrap_or_else(|e| panic!("{e}: {:?}", jwt_parts(token)))
}

/// `field` of every key in `jwks`, in order.
fn field_of_keys(jwks: &Value, field: &str) -> Vec<String> {
    let keys = jwks["keys"].as_array().unwrap();
    keys.iter().map(|k| k[field].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_tokens_are_signed_jwts_for_the_requested_resource() {
    let idp = Idp::start(
        IdpOptions::default()
            .resource(RESOURCE)
            .resource(OTHER_RESOURCE)
            .client("svc-es", "es-secret", Alg::Es256)
            .client("svc-rs", "rs-secret", Alg::Rs256),
    )
    .await;
    let md = idp.metadata();
    assert_eq!(md["issuer"], idp.issuer());
    assert!(idp.issuer().starts_with("http://127.0.0.1:"), "{}", idp.issuer());
    assert_eq!(md["code_challenge_methods_supported"], serde_json::json!(["S256"]));
    for grant in ["client_credentials", "authorization_code", "refresh_token"] {
        assert!(
            md["grant_types_supported"].as_array().unwrap().contains(&grant.into()),
            "{md}"
        );
    }
    assert!(md["registration_endpoint"].is_string(), "{md}");
    let oidc = idp
        .exchange(
            http::Method::GET,
            &format!("{}/.well-known/openid-configuration", idp.issuer()),
            &[],
            Default::default(),
        )
        .await;
    assert_eq!(&oidc.json(), md, "one document at both well-known names");

    let jwks = idp.jwks().await;
    assert_eq!(field_of_keys(&jwks, "kty"), ["EC", "RSA"], "{jwks}");
    assert!(jwks["keys"][0].get("d").is_none(), "only public halves are published");

    for (client, alg) in [("svc-es", "ES256"), ("svc-rs", "RS256")] {
        let token = idp
            .client_credentials_token(client, "mcp:tools files:read", RESOURCE)
            .await;
        let (head, _) = jwt_parts(&token);
        assert_eq!(
            (head["alg"].as_str(), head["typ"].as_str()),
            (Some(alg), Some("at+jwt")),
            "{head}"
        );
        let claims = claims_of(&token, &jwks);
        assert_eq!(claims["iss"], idp.issuer(), "{claims}");
        assert_eq!(claims["aud"], RESOURCE, "{claims}");
        assert_eq!(claims["scope"], "mcp:tools files:read", "{claims}");
        assert_eq!(
            (&claims["sub"], &claims["client_id"]),
            (&client.into(), &client.into()),
            "{claims}"
        );
        let lifetime = claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap();
        assert_eq!(lifetime, 300, "{claims}");
    }

    // A scope no resource offers is left out, not refused.
    let token = idp
        .client_credentials_token("svc-es", "mcp:tools admin:everything", RESOURCE)
        .await;
    assert_eq!(claims_of(&token, &jwks)["scope"], "mcp:tools");

    // The same server mints for another resource: same issuer and keys, another audience.
    let other = claims_of(
        &idp.client_credentials_token("svc-es", "mcp:tools", OTHER_RESOURCE)
            .await,
        &jwks,
    );
    assert_eq!(
        (&other["iss"], &other["aud"]),
        (&idp.issuer().into(), &OTHER_RESOURCE.into())
    );

    // One it does not serve is refused, until it is added.
    let late = "http://127.0.0.1:9/late/mcp";
    let refused = idp.client_credentials("svc-es", "mcp:tools", Some(late)).await;
    assert_eq!(
        (refused.status.as_u16(), &refused.json()["error"]),
        (400, &"invalid_target".into())
    );
    idp.add_resource(late).await;
    let added = claims_of(&idp.client_credentials_token("svc-es", "mcp:tools", late).await, &jwks);
    assert_eq!(added["aud"], late);

    // Without a resource the library issues an opaque token (no audience to put in a JWT).
    let bare = idp.client_credentials("svc-es", "mcp:tools", None).await;
    assert_eq!(bare.status, 200, "{bare:?}");
    assert_eq!(
        bare.json()["access_token"].as_str().unwrap().split('.').count(),
        1,
        "{bare:?}"
    );

    let wrong = idp
        .token_request(
            &[("grant_type", "client_credentials"), ("resource", RESOURCE)],
            Some(("svc-es", "not-the-secret")),
        )
        .await;
    assert_eq!(
        (wrong.status.as_u16(), &wrong.json()["error"]),
        (401, &"invalid_client".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_sign_under_new_kids_and_retired_ones_leave_the_jwks() {
    let idp = Idp::start(
        IdpOptions::default()
            .resource(RESOURCE)
            .client("svc-es", "es-secret", Alg::Es256)
            .client("svc-rs", "rs-secret", Alg::Rs256),
    )
    .await;
    let first = idp.client_credentials_token("svc-es", "mcp:tools", RESOURCE).await;
    let first_kid = jwt_parts(&first).0["kid"].as_str().unwrap().to_string();

    let rotation = idp.rotate_keys(false).await;
    let jwks = idp.jwks().await;
    let published = field_of_keys(&jwks, "kid");
    assert_eq!(published, rotation.published, "{jwks}");
    assert_eq!(published.len(), 4, "new keys added, old ones kept: {jwks}");
    assert!(published.contains(&first_kid));
    for (client, kid) in [("svc-es", &rotation.es256), ("svc-rs", &rotation.rs256)] {
        let token = idp.client_credentials_token(client, "mcp:tools", RESOURCE).await;
        assert_eq!(jwt_parts(&token).0["kid"], kid.as_str(), "the new key signs");
        assert_ne!(kid, &first_kid);
        claims_of(&token, &jwks);
    }
    claims_of(&first, &jwks);

    let retired = idp.rotate_keys(true).await;
    let jwks = idp.jwks().await;
    assert_eq!(
        retired.published,
        [retired.es256.clone(), retired.rs256.clone()],
        "{jwks}"
    );
    let err = verify_jwt(&first, &jwks).unwrap_err();
    assert!(err.contains("not in the JWKS"), "{err}");
    let fresh = idp.client_credentials_token("svc-es", "mcp:tools", RESOURCE).await;
    assert_eq!(jwt_parts(&fresh).0["kid"], retired.es256.as_str());
    claims_of(&fresh, &jwks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_users_get_tokens_by_the_authorization_code_flow_with_pkce() {
    let idp = Idp::start(IdpOptions::default().resource(RESOURCE)).await;
    let jwks = idp.jwks().await;
    let alice = idp.user_tokens("alice", "mcp:tools files:read", RESOURCE).await;
    let bob = idp.user_tokens("bob", "mcp:tools", RESOURCE).await;
    for (tokens, user, scope) in [(&alice, "alice", "mcp:tools files:read"), (&bob, "bob", "mcp:tools")] {
        let claims = claims_of(&tokens.access_token, &jwks);
        assert_eq!(jwt_parts(&tokens.access_token).0["alg"], "ES256", "the default alg");
        assert_eq!(
            (&claims["sub"], &claims["aud"]),
            (&user.into(), &RESOURCE.into()),
            "{claims}"
        );
        assert_eq!(
            (&claims["scope"], tokens.scope.as_str()),
            (&scope.into(), scope),
            "{claims}"
        );
        assert_eq!(claims["client_id"], tokens.client_id.as_str(), "{claims}");
        assert!(tokens.refresh_token.is_some(), "{tokens:?}");
    }
    assert_ne!(alice.client_id, bob.client_id, "each flow registered its own client");

    // The refresh token buys a new access token for the same user and resource.
    let refreshed = idp
        .token_request(
            &[
                ("grant_type", "refresh_token"),
                ("refresh_token", alice.refresh_token.as_deref().unwrap()),
                ("client_id", &alice.client_id),
            ],
            None,
        )
        .await;
    assert_eq!(refreshed.status, 200, "{refreshed:?}");
    let claims = claims_of(refreshed.json()["access_token"].as_str().unwrap(), &jwks);
    assert_eq!(
        (&claims["sub"], &claims["aud"]),
        (&"alice".into(), &RESOURCE.into()),
        "{claims}"
    );
}

/// The whole OAuth path of the SDK's clients with this server and an SDK resource server: 401
/// with resource_metadata, protected resource metadata, AS metadata, (registration,) token; then
/// a 403 insufficient_scope that the SDK answers by re-authorizing with the union of scopes and
/// sending the call again, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_oauth_clients_discover_register_authorize_and_step_up() {
    let idp = Idp::start(IdpOptions::default().client("sdk-svc", "sdk-secret", Alg::Rs256)).await;
    let rs = SdkResourceServer::start(&idp, &["write_note=files:write", "purge=admin:everything"]).await;
    let cc = [
        "client-credentials",
        "--client-id",
        "sdk-svc",
        "--client-secret",
        "sdk-secret",
        "--issuer",
        idp.issuer(),
    ];

    let run = oauth_client(&rs.url, &cc).await;
    let whoami = passed(&run, &rs, &idp);
    assert_eq!(
        (&whoami["sub"], &whoami["aud"]),
        (&"sdk-svc".into(), &rs.url.as_str().into()),
        "{whoami}"
    );
    assert_eq!(run.calls[1]["text"], "sdk-svc wrote hello", "{run:#?}");
    discovered_once_and_stepped_up(&run);
    let tokens = run.summary["tokens"].as_array().unwrap();
    assert_eq!(tokens[1]["alg"], "RS256", "{tokens:?}");

    let run = oauth_client(&rs.url, &["authorization-code", "--user", "bob"]).await;
    let whoami = passed(&run, &rs, &idp);
    assert_eq!(
        (&whoami["sub"], &whoami["iss"]),
        (&"bob".into(), &idp.issuer().into()),
        "{whoami}"
    );
    assert_eq!(run.calls[1]["text"], "bob wrote hello", "{run:#?}");
    discovered_once_and_stepped_up(&run);
    assert_eq!(run.http("POST /reg 201"), 1, "registered dynamically, once: {run:#?}");
    assert_eq!(
        run.summary["authorizations"], 2,
        "the browser ran again for the step-up: {run:#?}"
    );
    assert_eq!(run.summary["tokens"][1]["refresh_token"], true, "{run:#?}");

    // A scope the server does not offer: the SDK re-authorizes and re-sends once, gets 403
    // again, and the call fails (no loop).
    let run = oauth_client(&rs.url, &[&cc[..], &["--call", "whoami", "--call", "purge"]].concat()).await;
    assert!(!run.success, "{run:#?}");
    assert_eq!(
        (run.http("POST /mcp 403"), run.http("POST /token 200")),
        (2, 2),
        "{run:#?}"
    );
    assert_eq!(
        (&run.calls[0]["ok"], &run.calls[1]["ok"]),
        (&true.into(), &false.into()),
        "{run:#?}"
    );

    // mcp 2.3.0 steps up only on a 403 to a request it sent with a token it held: a first call
    // that needs more than the 401's scope gets its 403 back unanswered (the 401 flow's one
    // retry is the flow's end). A resource server that names the scope in its 401 spares that.
    let run = oauth_client(&rs.url, &[&cc[..], &["--call", "purge"]].concat()).await;
    assert!(!run.success, "{run:#?}");
    assert_eq!(
        (run.http("POST /mcp 403"), run.http("POST /token 200")),
        (1, 1),
        "{run:#?}"
    );

    // After a rotation the token names a kid the resource server has not seen: it re-fetches
    // the JWKS and serves the call.
    let rotation = idp.rotate_keys(false).await;
    let run = oauth_client(&rs.url, &[&cc[..], &["--call", "whoami"]].concat()).await;
    passed(&run, &rs, &idp);
    assert_eq!(run.summary["tokens"][0]["kid"], rotation.rs256.as_str(), "{run:#?}");
}

/// The run succeeded: what its first call, whoami, says of the token.
fn passed(run: &OAuthClientRun, rs: &SdkResourceServer, idp: &Idp) -> Value {
    assert!(
        run.success,
        "{run:#?}\nresource server:\n{}\nidp:\n{}",
        rs.stderr(),
        idp.stderr()
    );
    assert_eq!(run.calls[0]["call"], "whoami", "{run:#?}");
    serde_json::from_str(run.calls[0]["text"].as_str().unwrap()).unwrap()
}

/// One run's wire: a 401 led to discovery (once), a 403 insufficient_scope to a second token
/// with the challenged scope added to the first one's.
fn discovered_once_and_stepped_up(run: &OAuthClientRun) {
    for key in [
        "POST /mcp 401",
        "GET /.well-known/oauth-protected-resource/mcp 200",
        "GET /.well-known/oauth-authorization-server 200",
        "POST /mcp 403",
    ] {
        assert_eq!(run.http(key), 1, "{key}: {run:#?}");
    }
    assert_eq!(run.http("POST /token 200"), 2, "{run:#?}");
    let tokens = run.summary["tokens"].as_array().unwrap();
    let scopes: Vec<&str> = tokens.iter().map(|t| t["scope"].as_str().unwrap()).collect();
    assert_eq!(scopes, ["mcp:tools", "mcp:tools files:write"], "{run:#?}");
}
