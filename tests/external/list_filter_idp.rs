//! `[catalog] filter_list_by_scope` (docs/src/catalog.md, "Lists filtered by scope") with
//! access tokens of the test authorization server (tests/idp/server.mjs), verified by the router
//! against its published keys: tests/it/list_filter.rs checks the same with tokens signed in
//! Rust. A token without `secret:read` gets every page of a paged `tools/list` without the tool
//! that scope guards, the cursors as the backend wrote them (a page left with no tool included);
//! a token with it gets each page byte for byte. The filter is not the control: a call of the
//! hidden tool with the first token is still refused 403 `insufficient_scope`.
//!
//! The test script installs node's packages first; without them this test fails (it never
//! skips).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::auth::{challenge, json_answer, start_knowing_its_url, wait_metric_at_least, Recorder, Seen};
use crate::support::*;
use crate::tools::idp::{jwt_parts, Alg, Idp, IdpOptions};

/// The client_credentials client both tokens are issued to.
const CLIENT: (&str, &str) = ("lister-svc", "lister-secret");
/// What every request needs (`required_scopes`), and what `secret` needs besides.
const BASE_SCOPE: &str = "mcp:tools";
const SECRET_SCOPE: &str = "secret:read";

/// The backend's whole JSON-RPC answer to `msg`: `tools/list` in three pages, page 1
/// `[public, secret]` then "p2", page 2 (cursor "p2") `[secret]` then "p3", page 3 (cursor
/// "p3") `[public]` and no cursor; anything else an empty result. A pure function of the
/// request, so that a test can say what the backend wrote for a request it saw.
fn backend_answer(msg: &Value) -> Value {
    let id = msg["id"].clone();
    if msg["method"] != "tools/list" {
        return json!({"jsonrpc": "2.0", "id": id, "result": {}});
    }
    let tool = |name: &str| json!({"name": name, "inputSchema": {"type": "object"}});
    let result = match msg["params"]["cursor"].as_str() {
        Some("p2") => json!({"tools": [tool("secret")], "nextCursor": "p3"}),
        Some("p3") => json!({"tools": [tool("public")]}),
        _ => json!({"tools": [tool("public"), tool("secret")], "nextCursor": "p2"}),
    };
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The backend: [`backend_answer`] as JSON (the catalog's own asks get it too).
fn lister(seen: &Seen) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    match serde_json::from_slice::<Value>(&seen.body) {
        Ok(msg) => json_answer(200, &backend_answer(&msg)),
        Err(_) => json_answer(200, &json!({})),
    }
}

/// `[auth]` with this authorization server as the issuer, its keys from its `jwks_uri`, every
/// request needing `mcp:tools` and a call of `secret` `secret:read` too (`public` nothing more);
/// the catalog on, cutting lists to the caller's scopes.
fn router_config(idp: &Idp, resource: &str) -> String {
    format!(
        "[auth]\nissuer = \"{issuer}\"\njwks_uri = \"{jwks}\"\nrequired_scopes = [\"{BASE_SCOPE}\"]\n\
         [auth.resource_metadata]\nresource = \"{resource}\"\n\
         [[auth.tool]]\nname = \"secret\"\nscopes = [\"{SECRET_SCOPE}\"]\n\
         [catalog]\nenabled = true\nfilter_list_by_scope = true\n",
        issuer = idp.issuer(),
        jwks = idp.jwks_uri(),
    )
}

/// One `tools/call` or `tools/list` with `token`, and the request the backend received for it
/// (found by its JSON-RPC id, which no ask of the catalog uses), if any did.
async fn send_as(
    fleet: &Fleet,
    backend: &Recorder,
    token: &str,
    id: &str,
    method: &str,
    params: Value,
) -> (Answer, Option<Seen>) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let bearer = format!("Bearer {token}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("accept", "application/json, text/event-stream"),
    ];
    let answer = fleet.post(&headers, &body).await;
    let forwarded = backend
        .all()
        .into_iter()
        .find(|s| serde_json::from_slice::<Value>(&s.body).is_ok_and(|m| m["id"] == id));
    (answer, forwarded)
}

/// The tool names and the `nextCursor` (null without one) of a `tools/list` answer.
fn listed(message: &Value) -> (Vec<String>, Value) {
    let tools = message["result"]["tools"].as_array();
    let tools = tools.unwrap_or_else(|| panic!("no tools: {message}"));
    let names = tools.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
    (names, message["result"]["nextCursor"].clone())
}

/// An access token of [`CLIENT`] for `resource` with `scope`, checked to carry exactly that
/// scope (the server leaves out a scope it does not offer rather than refuse it).
async fn token_with(idp: &Idp, scope: &str, resource: &str) -> String {
    let token = idp.client_credentials_token(CLIENT.0, scope, resource).await;
    let claims = jwt_parts(&token).1;
    assert_eq!(claims["scope"], scope, "{claims}");
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_tools_list_is_cut_to_each_idp_tokens_scopes_and_the_call_still_refused() {
    let options = IdpOptions {
        scopes: Some(vec![BASE_SCOPE.to_string(), SECRET_SCOPE.to_string()]),
        ..IdpOptions::default()
    };
    let idp = Idp::start(options.client(CLIENT.0, CLIENT.1, Alg::Es256)).await;
    let (spec, backend) = Recorder::start_answering("lister", lister).await;
    let mut resource = String::new();
    let fleet = start_knowing_its_url(Vec::new(), &[spec], |origin| {
        resource = format!("{origin}/mcp");
        router_config(&idp, &resource)
    })
    .await;
    // The router's URL is known only now: the server mints tokens for it from here on.
    idp.add_resource(&resource).await;
    // Until the router has the issuer's keys it answers 503 auth_unavailable, whatever the token.
    let ok = "result=\"ok\"";
    wait_metric_at_least(&fleet, "mrtr_jwks_refreshes_total", &[ok], 1.0, Duration::from_secs(10)).await;

    let base = token_with(&idp, BASE_SCOPE, &resource).await;
    let with_secret = token_with(&idp, &format!("{BASE_SCOPE} {SECRET_SCOPE}"), &resource).await;

    // Each page with each token: the cursor passed to the backend as sent, and the answer the
    // backend wrote, less `secret` for the base token; as it came, byte for byte, whenever
    // nothing is dropped.
    let pages: [(Option<&str>, &[&str], Value); 3] = [
        (None, &["public"], json!("p2")),
        (Some("p2"), &[], json!("p3")),
        (Some("p3"), &["public"], Value::Null),
    ];
    for (who, token, lacks_secret) in [("base", &base, true), ("with_secret", &with_secret, false)] {
        for (page, (cursor, base_sees, next)) in pages.iter().enumerate() {
            let id = format!("{who}-page-{}", page + 1);
            let params = cursor.map_or(json!({}), |c| json!({"cursor": c}));
            let (a, forwarded) = send_as(&fleet, &backend, token, &id, "tools/list", params.clone()).await;
            let body = String::from_utf8_lossy(&a.body).to_string();
            assert_eq!(a.status, http::StatusCode::OK, "{id}: {body}");
            let forwarded = forwarded.unwrap_or_else(|| panic!("{id} reached no backend: {body}"));
            let received: Value = serde_json::from_slice(&forwarded.body).unwrap();
            assert_eq!(received["params"], params, "{id}: the cursor as the client sent it");
            assert_eq!(forwarded.header("x-mcp-auth-subject"), [CLIENT.0], "{id}");
            let written = backend_answer(&received);
            let got = a.json();
            let length: usize = a.headers["content-length"].to_str().unwrap().parse().unwrap();
            assert_eq!(length, a.body.len(), "{id}");
            let (names, cursor_sent) = listed(&got);
            assert_eq!(cursor_sent, *next, "{id}: the cursor as the backend wrote it: {body}");
            let (written_names, _) = listed(&written);
            let expected: Vec<String> = if lacks_secret {
                base_sees.iter().map(|s| s.to_string()).collect()
            } else {
                written_names.clone()
            };
            assert_eq!(names, expected, "{id}: {body}");
            if names == written_names {
                assert_eq!(body, written.to_string(), "{id}: nothing dropped, passed byte for byte");
            } else {
                let mut cut = written.clone();
                let tools = cut["result"]["tools"].as_array_mut().unwrap();
                tools.retain(|t| t["name"] != "secret");
                assert_eq!(got, cut, "{id}: only the tools array rewritten");
            }
        }
    }

    // Hidden from its list or not, a call of `secret` with the base token is refused for its
    // scope, before any backend sees it (docs/src/authorization.md, "Errors").
    let call = json!({"name": "secret", "arguments": {}});
    let (a, forwarded) = send_as(&fleet, &backend, &base, "call-base", "tools/call", call.clone()).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (403, Some("insufficient_scope")),
        "{a:?}"
    );
    assert_eq!(
        (&a.json()["error"]["code"], &a.json()["id"]),
        (&json!(-32011), &json!("call-base")),
        "{a:?}"
    );
    let refusal = challenge(&a).unwrap_or_else(|| panic!("no WWW-Authenticate: {a:?}"));
    assert_eq!(
        (refusal.scheme.as_str(), refusal.get("error")),
        ("Bearer", Some("insufficient_scope")),
        "{refusal:?}"
    );
    assert_eq!(
        refusal.words("scope"),
        [BASE_SCOPE, SECRET_SCOPE],
        "every scope the call needs"
    );
    assert!(forwarded.is_none(), "the refused call reached the backend");
    // The token with the scope is what the call lacked: the same call with it is forwarded.
    let (a, forwarded) = send_as(&fleet, &backend, &with_secret, "call-secret", "tools/call", call).await;
    assert_eq!(a.status, http::StatusCode::OK, "{a:?}");
    assert!(forwarded.is_some(), "the call with secret:read reached the backend");
    fleet.shutdown().await;
}
