//! Shapes found from outside a second time (docs/src/dialects.md "Batches", docs/src/quotas.md,
//! docs/src/authorization.md, docs/src/tokens.md): a batch riding a pending call's handle, a
//! sealed `requestState` lent to another tool, a subject no header can carry, a protocol
//! version that reads two ways, an empty session id, a byte order mark before the first event.

use crate::support::auth::rows::Env;
use crate::support::auth::*;
use crate::support::quotas::assert_quota_refusal;
use crate::support::*;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

const KEY: &str = "edge-batches-key-0123456789abcdef012345678";

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":params})
}

/// `pend` stays pending; `ask` asks for input with a fresh state; anything else is done.
fn calls(seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let msg: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    let answer = |m: &Value| {
        let params = &m["params"];
        let result = match (m["method"].as_str(), params["name"].as_str()) {
            (Some("tools/call"), Some("pend")) | (Some("confirm"), _) => json!({"pending": true}),
            (Some("tools/call"), Some("ask")) if params["requestState"].is_null() => json!({
                "resultType": "input_required", "inputRequests": {"ok": {}}, "requestState": format!("state-{n}")}),
            _ => json!({}),
        };
        json!({"jsonrpc":"2.0","id":m["id"],"messageId":m["messageId"],"result":result})
    };
    match &msg {
        Value::Array(batch) => json_answer(200, &Value::Array(batch.iter().map(answer).collect())),
        one => json_answer(200, &answer(one)),
    }
}

async fn raw(fleet: &Fleet, headers: &[(&str, &str)], body: &str) -> Answer {
    let url = fleet.url();
    send(
        &fleet.client,
        Method::POST,
        &url,
        headers,
        Bytes::from(body.to_string()),
    )
    .await
}

/// A batch is no round of a call: under a pending call's key field or routing token, each of
/// its elements still counts as a new call against the rate, and a key field may not stand on
/// one element among others.
#[tokio::test]
async fn a_batch_is_never_a_round_of_a_call() {
    let (spec, backend) = Recorder::start_answering("b", calls).await;
    let config = format!("[tokens]\nkeys = [\"{KEY}\"]\n[quotas]\ncaller = \"ip\"\nrate = \"1/m\"\nburst = 3\n");
    let fleet = Fleet::start_backends(Vec::new(), &[spec], &config).await;
    let mut pend = rpc(1, "tools/call", json!({"name": "pend"}));
    pend["messageId"] = json!("m1");
    let pending = fleet.post(&[], &pend).await;
    assert_eq!(pending.json()["result"]["pending"], true, "{pending:?}");
    let token = pending.headers["mcp-routing-id"].to_str().unwrap().to_string();
    let list = rpc(2, "tools/list", json!({}));
    let confirm = json!({"jsonrpc":"2.0","id":3,"messageId":"m1","method":"confirm","params":{}});

    // A key field beside other elements: refused whole.
    for body in [
        json!([confirm, list]),
        json!([list, confirm]),
        json!([confirm, confirm]),
    ] {
        let before = backend.count();
        let a = raw(&fleet, &[], &body.to_string()).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("batch_refused")),
            "{body}: {a:?}"
        );
        assert_eq!(backend.count(), before);
    }
    // Under the call's routing token, each batch counts its elements: two batches of one spend
    // the burst's last two units, then a batch is refused (a follow-up would have passed).
    for _ in 0..2 {
        let a = raw(&fleet, &[("mcp-routing-id", &token)], &json!([list]).to_string()).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    let before = backend.count();
    let five = json!([list, list, list, list, list]);
    let a = raw(&fleet, &[("mcp-routing-id", &token)], &five.to_string()).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (429, Some("rate_limited")),
        "{a:?}"
    );
    assert_eq!(backend.count(), before);
    // The call's own follow-up, alone, still passes with the rate spent.
    let followed = fleet.post(&[("mcp-routing-id", &token)], &confirm).await;
    assert_eq!(followed.json()["result"]["pending"], true, "{followed:?}");
    fleet.shutdown().await;
}

/// A sealed `requestState` continues only the method and tool it was issued for, while its
/// call is still open: lent to another tool, it is a new call.
#[tokio::test]
async fn a_sealed_state_continues_only_its_own_tool() {
    let (spec, backend) = Recorder::start_answering("b", calls).await;
    let config = format!("[tokens]\nkeys = [\"{KEY}\"]\n[quotas]\ncaller = \"ip\"\nrate = \"1/m\"\nburst = 1\n");
    let fleet = Fleet::start_backends(Vec::new(), &[spec], &config).await;
    let asked = fleet.post(&[], &rpc(1, "tools/call", json!({"name": "ask"}))).await;
    let state = asked.json()["result"]["requestState"].as_str().unwrap().to_string();
    let before = backend.count();
    let lent = rpc(2, "tools/call", json!({"name": "echo", "requestState": state}));
    let a = fleet.post(&[], &lent).await;
    assert_eq!(assert_quota_refusal(&a, &lent["id"]), "rate_limited", "{a:?}");
    assert_eq!(backend.count(), before);
    let retried = fleet
        .post(
            &[],
            &rpc(3, "tools/call", json!({"name": "ask", "requestState": state})),
        )
        .await;
    assert_eq!(
        retried.status, 200,
        "its own tool's retry is the follow-up: {retried:?}"
    );
    fleet.shutdown().await;
}

fn auth_and_tokens(issuer: &Issuer, origin: &str) -> String {
    format!(
        "[auth]\nissuer = \"{ISSUER}\"\njwks_file = \"{}\"\nrequired_scopes = [\"mcp\"]\n\
         [auth.resource_metadata]\nresource = \"{origin}/mcp\"\n[tokens]\nkeys = [\"{KEY}\"]\n",
        issuer.jwks_path.display()
    )
}

/// A subject, client id or issuer with a control character could reach no backend as the
/// header it must be: the access token is refused, never forwarded without its subject. An empty
/// `Mcp-Session-Id` is no session the router sealed. A method never forwarded is refused first.
#[tokio::test]
async fn claims_and_session_ids_no_header_can_carry_are_refused() {
    let env = Env::start(&["mcp"], auth_and_tokens).await;
    // A method never forwarded is 405 whoever asks, a caller without a token too.
    let url = env.fleet.url();
    let a = send(&env.fleet.client, Method::TRACE, &url, &[], Bytes::new()).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (405, Some("method_not_allowed")),
        "{a:?}"
    );
    for sub in ["ev\nil", "a\u{0}b", "a\u{7f}b"] {
        let bearer = env.issuer.ec.bearer(&env.claims("mcp", |c| c["sub"] = json!(sub)));
        let a = env
            .fleet
            .post(
                &[("authorization", &format!("Bearer {bearer}"))],
                &rpc(1, "ping", json!({})),
            )
            .await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (401, Some("unauthorized")),
            "{sub:?}: {a:?}"
        );
    }
    let bearer = env.issuer.ec.bearer(&env.claims("mcp", |c| c["sub"] = json!("josé")));
    let authorization = format!("Bearer {bearer}");
    let a = env
        .fleet
        .post(&[("authorization", &authorization)], &rpc(1, "ping", json!({})))
        .await;
    assert_eq!(a.status, 200, "a subject beyond ASCII is fine: {a:?}");
    let seen = env.recorder.as_ref().unwrap().last().unwrap();
    assert_eq!(seen.headers.get_all("x-mcp-auth-subject").iter().count(), 1);
    let before = env.served();
    let a = env
        .fleet
        .post(
            &[("authorization", &authorization), ("mcp-session-id", "")],
            &rpc(2, "ping", json!({})),
        )
        .await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (403, Some("handle_not_sealed")),
        "{a:?}"
    );
    assert_eq!(env.served(), before);
}

/// `MCP-Protocol-Version` decides whether a batch may be: twice, or in a value that is no one
/// version, it reads two ways, and the batch is refused.
#[tokio::test]
async fn a_batch_under_a_version_that_reads_two_ways_is_refused() {
    let (spec, backend) = Recorder::start_answering("b", calls).await;
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "").await;
    let batch = json!([rpc(1, "ping", json!({})), rpc(2, "ping", json!({}))]).to_string();
    for headers in [
        vec![
            ("mcp-protocol-version", "2025-03-26"),
            ("mcp-protocol-version", "2025-06-18"),
        ],
        vec![("mcp-protocol-version", "2025-03-26, 2025-06-18")],
        vec![("mcp-protocol-version", "2025-03-26x")],
    ] {
        let before = backend.count();
        let a = raw(&fleet, &headers, &batch).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("batch_refused")),
            "{headers:?}: {a:?}"
        );
        assert_eq!(backend.count(), before);
    }
    let a = raw(&fleet, &[("mcp-protocol-version", "2025-03-26")], &batch).await;
    assert_eq!(a.status, 200, "{a:?}");
    fleet.shutdown().await;
}
