//! The edge's promises under shapes a client may send that a plain request does not: a new call
//! inside a session, a batch, a `Connection` header naming the identity headers, a path with dot
//! segments, a body whose keys read two ways, a method with a body that is not POST, one
//! connection's unfinished bodies (docs/src/quotas.md, docs/src/authorization.md,
//! docs/src/limits.md, docs/src/dialects.md). Each test fails on a router that reads the shape
//! as the plain one. Clear handles under `[auth]` and `[tokens]` are in tests/it/auth_handles.rs,
//! one stalled byte in tests/it/stalled_bytes.rs.

use crate::support::auth::rows::Env;
use crate::support::auth::*;
use crate::support::quotas::{assert_quota_refusal, UnfinishedBodies};
use crate::support::*;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

/// Answers `initialize` with a session id, a `tools/call` asking for `pending` with a pending
/// result (the call pins), a JSON-RPC response (no `method`) with 202, anything else `{}`.
fn session_backend(seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    let msg: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    match msg["method"].as_str() {
        Some("initialize") => {
            let mut r = json_answer(200, &json!({"jsonrpc":"2.0","id":msg["id"],"result":{}}));
            r.headers_mut().insert("mcp-session-id", "session-1".parse().unwrap());
            r
        }
        Some("tools/call") if msg["params"]["arguments"]["pending"] == true => json_answer(
            200,
            &json!({"jsonrpc":"2.0","id":msg["id"],"messageId":msg["messageId"],"result":{"pending":true}}),
        ),
        None if seen.method == Method::POST => {
            let mut r = http::Response::new(http_body_util::Full::new(Bytes::new()));
            *r.status_mut() = http::StatusCode::ACCEPTED;
            r
        }
        _ => json_answer(200, &json!({"jsonrpc":"2.0","id":msg["id"],"result":{}})),
    }
}

fn call(id: u64, name: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":{}}})
}

/// A session opened with `initialize` through `fleet`: its id.
async fn open_session(fleet: &Fleet) -> String {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}});
    let opened = fleet.post(&[], &init).await;
    assert_eq!(opened.status, 200, "{opened:?}");
    opened.headers["mcp-session-id"].to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_new_call_inside_a_session_is_rate_limited_while_its_answers_to_the_server_pass() {
    let (spec, backend) = Recorder::start_answering("s", session_backend).await;
    // Two new calls a minute: `initialize`, then one call in the session.
    let fleet = Fleet::start_backends(
        Vec::new(),
        &[spec],
        "[quotas]\ncaller = \"ip\"\nrate = \"1/m\"\nburst = 2\n",
    )
    .await;
    let session = open_session(&fleet).await;
    let in_session = [("mcp-session-id", session.as_str())];
    assert_eq!(fleet.post(&in_session, &call(1, "a")).await.status, 200);
    let reached = backend.count();
    let over = fleet.post(&in_session, &call(2, "b")).await;
    assert_eq!(assert_quota_refusal(&over, &json!(2)), "rate_limited", "{over:?}");
    assert_eq!(backend.count(), reached, "the refused call reached no backend");
    // The client's answer to the server's request (an elicitation's) continues a call: never
    // rate-limited, and forwarded.
    let answer = json!({"jsonrpc":"2.0","id":"srv-1","result":{"action":"accept","content":{}}});
    for _ in 0..3 {
        let passed = fleet.post(&in_session, &answer).await;
        assert_eq!(passed.status, 202, "{passed:?}");
    }
    assert_eq!(backend.count(), reached + 3);
    // Ending the session starts nothing: no rate counts it.
    let url = fleet.url();
    let ended = send(&fleet.client, Method::DELETE, &url, &in_session, Bytes::new()).await;
    assert_eq!(ended.status, 200, "{ended:?}");
    fleet.shutdown().await;
}

#[tokio::test]
async fn open_calls_inside_a_session_count_while_their_follow_ups_pass() {
    let (spec, backend) = Recorder::start_answering("s", session_backend).await;
    // The session is one open call; two pending calls in it are the other two.
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "[quotas]\ncaller = \"ip\"\nmax_open_calls = 3\n").await;
    let session = open_session(&fleet).await;
    let in_session = [("mcp-session-id", session.as_str())];
    let pending = |mid: &str, id: u64| json!({"jsonrpc":"2.0","id":id,"messageId":mid,"method":"tools/call","params":{"name":"pay","arguments":{"pending":true}}});
    for (i, mid) in ["m-1", "m-2"].into_iter().enumerate() {
        let started = fleet.post(&in_session, &pending(mid, i as u64)).await;
        assert_eq!(started.json()["result"]["pending"], true, "{started:?}");
    }
    let reached = backend.count();
    let over = fleet.post(&in_session, &pending("m-3", 7)).await;
    assert_eq!(
        assert_quota_refusal(&over, &json!(7)),
        "too_many_open_calls",
        "{over:?}"
    );
    assert_eq!(backend.count(), reached);
    // A follow-up of an open call passes.
    let confirm = json!({"jsonrpc":"2.0","id":8,"messageId":"m-1","method":"confirm","params":{}});
    assert_eq!(fleet.post(&in_session, &confirm).await.status, 200);
    fleet.shutdown().await;
}

/// `[auth]` with one tool that needs a scope of its own, and a tool quota.
fn scoped_tool(issuer: &Issuer, origin: &str) -> String {
    format!(
        "[auth]\nissuer = \"{ISSUER}\"\njwks_file = \"{}\"\nrequired_scopes = [\"mcp\"]\npublic_paths = [\"/health/*\"]\n\
         [auth.resource_metadata]\nresource = \"{origin}/mcp\"\n\
         [[auth.tool]]\nname = \"transfer-funds\"\nscopes = [\"payments:write\"]\n\
         [quotas]\n[[quotas.tool]]\nname = \"search\"\nrate = \"1/m\"\nburst = 1\n",
        issuer.jwks_path.display()
    )
}

async fn post_raw(env: &Env, headers: &[(&str, &str)], body: &str) -> Answer {
    let url = env.fleet.url();
    send(
        &env.fleet.client,
        Method::POST,
        &url,
        headers,
        Bytes::from(body.to_string()),
    )
    .await
}

#[tokio::test]
async fn a_batch_is_judged_by_every_element() {
    let env = Env::start(&["mcp"], scoped_tool).await;
    let short = format!("Bearer {}", env.bearer("mcp"));
    let scoped = format!("Bearer {}", env.bearer("mcp payments:write"));
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"});
    let pay = call(2, "transfer-funds");
    let batches = [
        json!([list, pay]),
        json!([pay, list]),
        json!([list, list.clone(), pay]),
        json!([pay]),
    ];
    for batch in &batches {
        let before = env.served();
        let a = post_raw(&env, &[("authorization", &short)], &batch.to_string()).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (403, Some("insufficient_scope")),
            "{batch}: {a:?}"
        );
        let c = challenge(&a).expect("a challenge");
        assert_eq!(c.words("scope"), ["mcp", "payments:write"], "{batch}");
        assert_eq!(env.served(), before, "{batch} reached a backend");
        // With the scope, the same batch goes through.
        let a = post_raw(&env, &[("authorization", &scoped)], &batch.to_string()).await;
        assert_eq!(a.status, 200, "{batch}: {a:?}");
    }
    // A tool quota counts every call of its tool in a batch.
    let search = json!([call(3, "search"), call(4, "search")]);
    let a = post_raw(&env, &[("authorization", &scoped)], &search.to_string()).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (429, Some("rate_limited")),
        "{a:?}"
    );
    assert_eq!(a.json()["error"]["data"]["scope"], "tool");
    // Batches where the protocol has none, or whose elements name different calls.
    let refusals = [
        (
            json!([list, list]).to_string(),
            vec![("mcp-protocol-version", "2025-06-18")],
        ),
        (
            json!([
                {"jsonrpc":"2.0","id":1,"messageId":"a","method":"confirm"},
                {"jsonrpc":"2.0","id":2,"messageId":"b","method":"confirm"}
            ])
            .to_string(),
            vec![],
        ),
        (
            json!([list, {"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":"t"}}]).to_string(),
            vec![],
        ),
    ];
    for (body, extra) in refusals {
        let mut headers = vec![("authorization", scoped.as_str())];
        headers.extend(extra);
        let before = env.served();
        let a = post_raw(&env, &headers, &body).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("batch_refused")),
            "{body}: {a:?}"
        );
        assert_eq!(a.json()["error"]["code"], -32600);
        assert_eq!(env.served(), before);
    }
}

#[tokio::test]
async fn a_body_whose_keys_read_two_ways_is_refused() {
    let env = Env::start(&["mcp"], scoped_tool).await;
    let short = format!("Bearer {}", env.bearer("mcp"));
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"transfer-funds"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","name":"transfer-funds"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","Name":"transfer-funds"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call","params":{"name":"transfer-funds"}}"#,
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"whoami\",\"nam\\u0065\":\"x\"}}",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"requestState":"a","requeststate":"b","name":"w"}}"#,
    ];
    for body in bodies {
        let before = env.served();
        let a = post_raw(&env, &[("authorization", &short)], body).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("ambiguous_body")),
            "{body}: {a:?}"
        );
        assert_eq!(a.json()["error"]["code"], -32600);
        assert_eq!(env.served(), before, "{body} reached a backend");
    }
    // `Mcp-Name` names what the body calls, on every method it stands for.
    let mismatched = [
        (call(1, "whoami"), "transfer-funds"),
        (
            json!({"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"a"}}),
            "b",
        ),
        (
            json!({"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}),
            "file:///b",
        ),
    ];
    for (body, name) in mismatched {
        let a = post_raw(
            &env,
            &[("authorization", &short), ("mcp-name", name)],
            &body.to_string(),
        )
        .await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("header_mismatch")),
            "{body}: {a:?}"
        );
    }
    // Controls: one reading, a matching `Mcp-Name` (plain and base64), a nested repeat.
    let fine = [
        (call(1, "whoami").to_string(), Some("whoami".to_string())),
        (call(1, "whoami").to_string(), Some("=?base64?d2hvYW1p?=".to_string())),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{"name":1,"name":2}}}"#
                .to_string(),
            None,
        ),
    ];
    for (body, name) in fine {
        let mut headers = vec![("authorization", short.as_str())];
        if let Some(n) = &name {
            headers.push(("mcp-name", n));
        }
        let a = post_raw(&env, &headers, &body).await;
        assert_eq!(a.status, 200, "{body} {name:?}: {a:?}");
    }
}

#[tokio::test]
async fn methods_with_a_body_but_post_are_not_forwarded_past_the_scopes() {
    let env = Env::start(&["mcp"], scoped_tool).await;
    let short = format!("Bearer {}", env.bearer("mcp"));
    for method in [Method::PUT, Method::PATCH, Method::from_bytes(b"PROPFIND").unwrap()] {
        let url = env.fleet.url();
        let body = Bytes::from(call(1, "transfer-funds").to_string());
        let before = env.served();
        let a = send(
            &env.fleet.client,
            method.clone(),
            &url,
            &[("authorization", &short)],
            body,
        )
        .await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (405, Some("method_not_allowed")),
            "{method}: {a:?}"
        );
        assert_eq!(a.headers["allow"], "GET, HEAD, POST, DELETE, OPTIONS");
        assert_eq!(env.served(), before);
    }
    // GET and DELETE still reach the backend.
    let url = env.fleet.url();
    let a = send(
        &env.fleet.client,
        Method::GET,
        &url,
        &[("authorization", &short)],
        Bytes::new(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test]
async fn the_identity_headers_arrive_whatever_connection_names() {
    let env = Env::start(&["mcp"], scoped_tool).await;
    let token = format!("Bearer {}", env.bearer("mcp"));
    let named = "x-mcp-auth-subject, x-mcp-auth-scopes, X-Mcp-Auth-Issuer, x-mcp-auth-client-id, keep-alive";
    let a = post_raw(
        &env,
        &[("authorization", &token), ("connection", named)],
        &call(1, "whoami").to_string(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen = env.recorder.as_ref().unwrap().last().unwrap();
    assert_eq!(seen.header("x-mcp-auth-subject"), ["alice"]);
    assert_eq!(seen.header("x-mcp-auth-scopes"), ["mcp"]);
    assert_eq!(seen.header("x-mcp-auth-issuer"), [ISSUER]);
    assert!(seen.header("connection").is_empty());
    // A client's own identity header never passes, named in `Connection` or not.
    let a = post_raw(
        &env,
        &[
            ("authorization", &token),
            ("connection", "x-other"),
            ("x-mcp-auth-subject", "root"),
        ],
        &call(2, "whoami").to_string(),
    )
    .await;
    assert_eq!(a.status, 200);
    let seen = env.recorder.as_ref().unwrap().last().unwrap();
    assert_eq!(seen.header("x-mcp-auth-subject"), ["alice"]);
}

#[tokio::test]
async fn a_path_that_reads_two_ways_is_refused_before_the_public_paths_are_read() {
    let env = Env::start(&["mcp"], scoped_tool).await;
    let body = call(1, "transfer-funds").to_string();
    for path in [
        "/health/../mcp",
        "/health/%2e%2e/mcp",
        "/health/%2E%2E/mcp",
        "/health/..%2fmcp",
        "/health/..%2Fmcp",
        "/health/..%5cmcp",
        "//health/../mcp",
        "/health//../mcp",
        "/health/./../mcp",
        "/health/..;/mcp",
    ] {
        let url = format!("http://{}{path}", env.fleet.router);
        let before = env.served();
        let a = send(&env.fleet.client, Method::POST, &url, &[], Bytes::from(body.clone())).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("invalid_path")),
            "{path}: {a:?}"
        );
        assert_eq!(a.json()["error"]["code"], -32600);
        assert_eq!(env.served(), before, "{path} reached a backend");
    }
    // Controls: a public path without a token, the MCP endpoint with one.
    let url = format!("http://{}/health/live", env.fleet.router);
    assert_eq!(
        send(&env.fleet.client, Method::GET, &url, &[], Bytes::new())
            .await
            .status,
        200
    );
    let token = format!("Bearer {}", env.bearer("mcp"));
    assert_eq!(
        post_raw(&env, &[("authorization", &token)], &call(2, "whoami").to_string())
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn one_connection_cannot_take_the_body_budget_without_quotas() {
    const PART: usize = 256 * 1024;
    // A 16 MiB budget: a connection's share is a sixteenth, 1 MiB, four parts.
    let fleet = Fleet::start(1, &format!("[server]\nmax_body_buffer_bytes = {}\n", 16 << 20)).await;
    let mut greedy = UnfinishedBodies::open(&fleet, &[], 1, 12, PART).await;
    let (held, _) = greedy.settle(&fleet, 0).await;
    assert_eq!(held, 1 << 20, "the connection holds its share, no more");
    assert_eq!(greedy.refused().await, 8);
    // Another client's POST goes through.
    let whoami = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami"}});
    assert_eq!(fleet.post(&[], &whoami).await.status, 200);
    let m = fleet.metrics().await;
    let refused = metric_sum(
        &m,
        "mrtr_quota_refusals_total",
        &["quota=\"body_bytes\"", "scope=\"connection\""],
    );
    assert_eq!(refused, 8.0);
    greedy.close(&fleet, 0).await;
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_header_caller_needs_the_peers_it_is_believed_from() {
    let backend = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n";
    let parse =
        |quotas: &str| mrtr_router::Config::parse(std::path::Path::new("t.toml"), &format!("{quotas}{backend}"));
    let e = parse("[quotas]\ncaller = \"header:X-Api-Key\"\nrate = \"5/s\"\n").unwrap_err();
    assert!(e.message.contains("needs trusted_proxies"), "{e}");
    for trusted in ["[\"10.0.0.0/8\"]", "[\"0.0.0.0/0\", \"::/0\"]"] {
        let text = format!("[quotas]\ncaller = \"header:X-Api-Key\"\ntrusted_proxies = {trusted}\nrate = \"5/s\"\n");
        assert!(parse(&text).is_ok(), "{trusted}");
    }
}

/// Answers a `tools/call` with a task (`task-<n>`), anything else `{}`.
fn task_backend(seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let msg: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    let result = match msg["method"].as_str() {
        Some("tools/call") => {
            let n = ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            json!({"resultType":"task","taskId":format!("task-{n}"),"status":"working"})
        }
        _ => json!({}),
    };
    json_answer(200, &json!({"jsonrpc":"2.0","id":msg["id"],"result":result}))
}

#[tokio::test]
async fn a_listener_s_task_ids_reach_the_backend_as_it_issued_them() {
    let (spec, backend) = Recorder::start_answering("t", task_backend).await;
    let tokens = "[tokens]\nkeys = [\"edge-listen-key-0123456789abcdef0123456\"]\n";
    let fleet = Fleet::start_backends(Vec::new(), &[spec], tokens).await;
    let mut wrapped = Vec::new();
    for id in 0..2 {
        let created = fleet.post(&[], &call(id, "slow")).await;
        let task = created.json()["result"]["taskId"].as_str().unwrap().to_string();
        assert!(task.starts_with("mrt2."), "{created:?}");
        wrapped.push(task);
    }
    let listen = json!({"jsonrpc":"2.0","id":9,"method":"subscriptions/listen",
        "params":{"notifications":{"taskIds":[wrapped[0], wrapped[1]]}}});
    let a = fleet.post(&[], &listen).await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen: Value = serde_json::from_slice(&backend.last().unwrap().body).unwrap();
    let ids = &seen["params"]["notifications"]["taskIds"];
    assert_eq!(ids, &json!(["task-0", "task-1"]), "{seen}");
    // A listener's wrapped id that does not verify is refused like any other.
    let forged = json!({"jsonrpc":"2.0","id":10,"method":"subscriptions/listen",
        "params":{"notifications":{"taskIds":[format!("{}x", wrapped[0])]}}});
    let a = fleet.post(&[], &forged).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (400, Some("invalid_routing_token")),
        "{a:?}"
    );
    fleet.shutdown().await;
}

/// Answers `ask` with `input_required` and a fresh state (its retry with the state: done),
/// `pend` with `pending` (echoing the `messageId`), `task` with a task, `confirm` with
/// `pending` when its params ask for it, anything else `{}`.
fn every_kind_of_call(seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let msg: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    let n = ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let params = &msg["params"];
    let result = match (msg["method"].as_str(), params["name"].as_str()) {
        (Some("tools/call"), Some("ask")) if params["requestState"].is_null() => json!({
            "resultType": "input_required", "inputRequests": {"ok": {}}, "requestState": format!("state-{n}")}),
        (Some("tools/call"), Some("pend")) => json!({"pending": true}),
        (Some("tools/call"), Some("task")) => {
            json!({"resultType": "task", "taskId": format!("task-{n}"), "status": "working"})
        }
        (Some("tasks/get"), _) => json!({"taskId": params["taskId"], "status": "working"}),
        (Some("confirm"), _) if params["pend"] == true => json!({"pending": true}),
        _ => json!({}),
    };
    json_answer(
        200,
        &json!({"jsonrpc":"2.0","id":msg["id"],"messageId":msg["messageId"],"result":result}),
    )
}

const EDGE_KEY: &str = "edge-follow-up-key-0123456789abcdef0123";

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":params})
}

#[tokio::test]
async fn a_handle_counts_only_for_the_call_it_belongs_to() {
    let (spec, backend) = Recorder::start_answering("b", every_kind_of_call).await;
    let config = format!("[tokens]\nkeys = [\"{EDGE_KEY}\"]\n[quotas]\ncaller = \"ip\"\nrate = \"1/m\"\nburst = 3\n");
    let fleet = Fleet::start_backends(Vec::new(), &[spec], &config).await;
    // Three new calls spend the burst; the retry of the first is its follow-up.
    let asked = fleet.post(&[], &rpc(1, "tools/call", json!({"name": "ask"}))).await;
    let state = asked.json()["result"]["requestState"].as_str().unwrap().to_string();
    let retried = fleet
        .post(
            &[],
            &rpc(2, "tools/call", json!({"name": "ask", "requestState": state})),
        )
        .await;
    assert_eq!(retried.status, 200, "the retry is the call's follow-up: {retried:?}");
    let mut pend = rpc(3, "tools/call", json!({"name": "pend"}));
    pend["messageId"] = json!("p-0");
    let pending = fleet.post(&[], &pend).await;
    assert_eq!(pending.json()["result"]["pending"], true, "{pending:?}");
    let token = pending.headers["mcp-routing-id"].to_str().unwrap().to_string();
    let created = fleet.post(&[], &rpc(4, "tools/call", json!({"name": "task"}))).await;
    let task = created.json()["result"]["taskId"].as_str().unwrap().to_string();
    assert!(state.starts_with("mrt2.") && task.starts_with("mrt2.") && token.starts_with("mrt2."));

    // New calls that carry a handle of another call, or of one that has ended: each is a new
    // call, and the rate is spent.
    let with_key = |mut v: Value, key: &str| {
        v["messageId"] = json!(key);
        v
    };
    let disguised = [
        (
            "another tool with the state",
            vec![],
            rpc(5, "tools/call", json!({"name": "search", "requestState": state})),
        ),
        (
            "the ended call's state again",
            vec![],
            rpc(6, "tools/call", json!({"name": "ask", "requestState": state})),
        ),
        (
            "a task id on a tool call",
            vec![],
            rpc(7, "tools/call", json!({"name": "search", "taskId": task})),
        ),
        (
            "the routing token on tools/list",
            vec![("mcp-routing-id", token.as_str())],
            rpc(8, "tools/list", json!({})),
        ),
        (
            "a pending call's key on a new call",
            vec![],
            with_key(rpc(9, "tools/call", json!({"name": "search"})), "p-0"),
        ),
        (
            "the routing token with a new key",
            vec![("mcp-routing-id", token.as_str())],
            with_key(rpc(10, "confirm", json!({"pend": true})), "n-1"),
        ),
    ];
    for (what, headers, body) in disguised {
        let before = backend.count();
        let a = fleet.post(&headers, &body).await;
        assert_eq!(assert_quota_refusal(&a, &body["id"]), "rate_limited", "{what}: {a:?}");
        assert_eq!(backend.count(), before, "{what} reached the backend");
    }
    // The calls' own follow-ups pass.
    let headers = [("mcp-routing-id", token.as_str())];
    let confirmed = fleet
        .post(&headers, &with_key(rpc(11, "confirm", json!({"pend": true})), "p-0"))
        .await;
    assert_eq!(confirmed.json()["result"]["pending"], true, "{confirmed:?}");
    let headers = [("mcp-name", task.as_str())];
    let polled = fleet
        .post(&headers, &rpc(12, "tasks/get", json!({"taskId": task})))
        .await;
    assert_eq!(polled.status, 200, "{polled:?}");
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_routing_token_echoed_again_and_again_bounds_its_call() {
    let (spec, _backend) = Recorder::start_answering("b", every_kind_of_call).await;
    let config = format!(
        "[tokens]\nkeys = [\"{EDGE_KEY}\"]\n[routing]\nmax_rounds = 4\n[quotas]\ncaller = \"ip\"\nmax_open_calls = 2\n"
    );
    let fleet = Fleet::start_backends(Vec::new(), &[spec], &config).await;
    // A call known by its routing id: the client echoes the first token it got, every round.
    let started = fleet
        .post(
            &[("mcp-routing-id", "r-1")],
            &rpc(1, "tools/call", json!({"name": "pend"})),
        )
        .await;
    let first = started.headers["mcp-routing-id"].to_str().unwrap().to_string();
    let mut refused = None;
    for round in 2..10 {
        let a = fleet
            .post(
                &[("mcp-routing-id", &first)],
                &rpc(round, "confirm", json!({"pend": true})),
            )
            .await;
        if a.status != 200 {
            refused = Some((round, a));
            break;
        }
    }
    let (round, a) = refused.expect("the call's rounds are bounded");
    assert_eq!(
        (round, a.status.as_u16(), a.router_error()),
        (5, 429, Some("too_many_rounds")),
        "rounds 1 (the start) to 4 pass: {a:?}"
    );
    // New calls under the first call's token take open-call slots of their own.
    let mut statuses = Vec::new();
    for i in 0..3 {
        let mut body = rpc(20 + i, "confirm", json!({"pend": true}));
        body["messageId"] = json!(format!("other-{i}"));
        let a = fleet.post(&[("mcp-routing-id", &first)], &body).await;
        statuses.push((a.status.as_u16(), a.router_error().map(str::to_owned)));
    }
    assert_eq!(
        statuses,
        [
            (200, None),
            (429, Some("too_many_open_calls".into())),
            (429, Some("too_many_open_calls".into()))
        ]
    );
    fleet.shutdown().await;
}

#[tokio::test]
async fn headers_that_read_two_ways_or_name_what_the_body_does_not_are_refused() {
    let env = Env::start(&["mcp"], scoped_tool).await;
    let token = format!("Bearer {}", env.bearer("mcp"));
    let auth = ("authorization", token.as_str());
    let ping = rpc(1, "ping", json!({})).to_string();
    let call = call(2, "whoami").to_string();
    // Headers, body, and the status and reason they get.
    type Row<'a> = (Vec<(&'a str, &'a str)>, &'a str, u16, &'a str);
    let rows: Vec<Row> = vec![
        (
            vec![auth, ("mcp-session-id", ""), ("mcp-session-id", "s-alice")],
            &ping,
            400,
            "header_mismatch",
        ),
        (
            vec![auth, ("mcp-routing-id", "r-1"), ("mcp-routing-id", "r-2")],
            &ping,
            400,
            "header_mismatch",
        ),
        (vec![auth, ("mcp-method", "tools/call")], &ping, 400, "header_mismatch"),
        (
            vec![auth, ("mcp-name", "transfer-funds")],
            &ping,
            400,
            "header_mismatch",
        ),
        (
            vec![auth, ("mcp-method", "tools/call"), ("mcp-name", "whoami")],
            &call,
            200,
            "",
        ),
        (
            vec![
                auth,
                ("origin", "http://evil.example"),
                ("origin", "http://evil.example"),
            ],
            &ping,
            403,
            "origin_not_allowed",
        ),
    ];
    for (headers, body, status, reason) in rows {
        let before = env.served();
        let a = post_raw(&env, &headers, body).await;
        assert_eq!(a.status.as_u16(), status, "{headers:?}: {a:?}");
        if status != 200 {
            assert_eq!(a.router_error(), Some(reason), "{headers:?}");
            assert_eq!(env.served(), before, "{headers:?} reached a backend");
        }
    }
    // Two `Origin`s, the allowed one first: the other is judged too.
    let allowed = env.origin.clone();
    let a = post_raw(
        &env,
        &[auth, ("origin", &allowed), ("origin", "http://evil.example")],
        &ping,
    )
    .await;
    assert_eq!(a.router_error(), Some("origin_not_allowed"), "{a:?}");
    // Identity headers in other spellings never pass.
    let a = post_raw(
        &env,
        &[auth, ("x_mcp_auth_subject", "root"), ("x.mcp.auth.scopes", "admin")],
        &ping,
    )
    .await;
    assert_eq!(a.status, 200);
    let seen = env.recorder.as_ref().unwrap().last().unwrap();
    assert!(seen.header("x_mcp_auth_subject").is_empty() && seen.header("x.mcp.auth.scopes").is_empty());
    // A token in any spelling of the query parameter, or a path parameter.
    for target in [
        "/mcp?%61ccess_token=x",
        "/mcp?access%5Ftoken=x",
        "/mcp?access_token[]=x",
        "/mcp;access_token=x",
    ] {
        let url = format!("http://{}{target}", env.fleet.router);
        let a = send(
            &env.fleet.client,
            Method::POST,
            &url,
            &[auth],
            Bytes::from(ping.clone()),
        )
        .await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (401, Some("unauthorized")),
            "{target}: {a:?}"
        );
    }
    // A GET, DELETE or OPTIONS with a body is not forwarded past the scopes.
    for method in [Method::GET, Method::DELETE, Method::OPTIONS] {
        let before = env.served();
        let a = send(
            &env.fleet.client,
            method.clone(),
            &env.fleet.url(),
            &[auth],
            Bytes::from(call.clone()),
        )
        .await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("body_not_allowed")),
            "{method}: {a:?}"
        );
        assert_eq!(env.served(), before);
    }
    // Read fields of another shape than the router reads.
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":["transfer-funds"]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["transfer-funds"]}"#,
        r#"[[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"transfer-funds"}}]]"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ask","requestState":["s"]}}"#,
    ] {
        let a = post_raw(&env, &[auth], body).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (400, Some("ambiguous_body")),
            "{body}: {a:?}"
        );
    }
}
