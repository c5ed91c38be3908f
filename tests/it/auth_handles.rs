//! Sealed handles bound to their principal (docs/src/authorization.md, "Handles bound to their
//! principal"): with `[auth]` and `[tokens]`, every handle the router seals (the routing token,
//! a wrapped `requestState`, a task id, a session id) names the principal (issuer and subject)
//! it was issued to. Another principal's valid token with it is refused 403
//! `handle_principal_mismatch` before any backend sees it; the same principal with a new token
//! (other scopes, another `jti`, another client) goes on to the instance that holds the call.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::support::auth::rows::*;
use crate::support::auth::*;
use crate::support::*;
use serde_json::{json, Value};

const KEY: &str = "auth-handles-key-0123456789abcdef012345";

fn auth_and_tokens(issuer: &Issuer, origin: &str) -> String {
    format!(
        "[tokens]\nkeys = [\"{KEY}\"]\n[auth]\nissuer = \"{ISSUER}\"\njwks_file = \"{}\"\nrequired_scopes = [\"mcp\"]\n\
         [auth.resource_metadata]\nresource = \"{origin}/mcp\"\n",
        issuer.jwks_path.display()
    )
}

fn mismatch() -> Want {
    Want::Refused {
        status: 403,
        reason: "handle_principal_mismatch",
        code: -32013,
        challenge: Expect::Absent,
        result: "principal",
    }
}

/// A token of `sub` (ES256) with `scope`, `client_id` `client`.
fn token_of(env: &Env, sub: &str, scope: &str, client: &str) -> String {
    let mut c = claims(&env.resource, sub, scope);
    c["client_id"] = json!(client);
    env.issuer.ec.bearer(&c)
}

/// A handle of a sealed kind sent in the clear by a verified caller.
fn not_sealed() -> Want {
    Want::Refused {
        status: 403,
        reason: "handle_not_sealed",
        code: -32019,
        challenge: Expect::Absent,
        result: "principal",
    }
}

/// The backend's own value inside a wrapped handle: what follows its last dot.
fn clear_part(wrapped: &str) -> String {
    wrapped.rsplit('.').next().unwrap().to_string()
}

fn sealed(v: &str, what: &str) -> String {
    assert!(v.starts_with("mrt2."), "{what} is sealed: {v}");
    v.to_string()
}

/// The routing token and the task id, issued by example workers: refused to bob, followed by
/// alice with another token to the instance that holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_tokens_and_task_ids_follow_their_principal_only() {
    let workers = vec![start_worker("worker-0").await, start_worker("worker-1").await];
    let env = Env::start_with(workers, None, &["mcp"], auth_and_tokens).await;
    let alice = token_of(&env, "alice", "mcp", "app-1");
    let bearer = format!("Bearer {alice}");
    let started = env
        .fleet
        .post(&[("authorization", &bearer)], &start_call("h-1", 3))
        .await;
    assert_eq!(started.json()["result"]["pending"], true, "{started:?}");
    let routing = sealed(started.headers["mcp-routing-id"].to_str().unwrap(), "the routing token");
    let holder = started.worker();
    let created = env
        .fleet
        .post(
            &[("authorization", &bearer)],
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"task","arguments":{"steps": 2}}}),
        )
        .await;
    let task = sealed(created.json()["result"]["taskId"].as_str().unwrap_or(""), "the task id");
    let task_holder = created.worker();

    let bob = token_of(&env, "bob", "mcp", "app-1");
    // The confirm of round 2 of alice's call, with her routing token.
    let confirm_round_2 = || Req {
        headers: vec![("mcp-routing-id", routing.clone())],
        body: Some(confirm("h-1", 2)),
        ..ping()
    };
    let get_task = |token: &str| {
        post("tasks/get", json!({"taskId": task}))
            .header("mcp-name", task.clone())
            .header("mcp-method", "tasks/get")
            .bearer(token)
    };
    let clear_task = clear_part(&task);
    let get_clear_task = |token: &str| {
        post("tasks/get", json!({"taskId": clear_task}))
            .header("mcp-name", clear_task.clone())
            .bearer(token)
    };
    let rows = vec![
        (
            "bob with alice's routing token",
            confirm_round_2().bearer(&bob),
            mismatch(),
        ),
        ("bob with alice's task id", get_task(&bob), mismatch()),
        (
            "bob with the clear part of alice's task id",
            get_clear_task(&bob),
            not_sealed(),
        ),
        (
            "alice with the clear part of her task id",
            get_clear_task(&alice),
            not_sealed(),
        ),
        (
            "alice's routing token, no access token",
            confirm_round_2(),
            unauthorized(Expect::Missing, "missing"),
        ),
    ];
    check_all(&env, rows).await;
    assert_eq!(env.fleet.total_unknown_followups(), 0);

    // alice again, with a token for other scopes and another client: her calls are hers.
    let again = format!("Bearer {}", token_of(&env, "alice", "mcp tasks", "app-2"));
    let headers = [("authorization", again.as_str()), ("mcp-routing-id", routing.as_str())];
    let round2 = env.fleet.post(&headers, &confirm("h-1", 2)).await;
    assert_eq!(
        (round2.worker(), &round2.json()["result"]["pending"]),
        (holder, &json!(true)),
        "{round2:?}"
    );
    let headers = [
        ("authorization", again.as_str()),
        ("mcp-name", task.as_str()),
        ("mcp-method", "tasks/get"),
    ];
    let polled = env
        .fleet
        .post(
            &headers,
            &json!({"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId": task}}),
        )
        .await;
    assert_eq!(polled.worker(), task_holder, "{polled:?}");
    assert_eq!(polled.json()["result"]["taskId"], task.as_str(), "{polled:?}");
    assert_eq!(
        env.fleet.total_unknown_followups(),
        0,
        "every follow-up reached its holder"
    );
}

/// Answers `initialize` with a session id, a `tools/call` without `requestState` with
/// `input_required` and a fresh state, one with a state with its result, anything else `{}`.
fn sessions_and_states(seen: &Seen) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    static ISSUED: AtomicU64 = AtomicU64::new(0);
    let msg: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    let n = ISSUED.fetch_add(1, Ordering::Relaxed);
    let result = match (msg["method"].as_str(), msg["params"]["requestState"].as_str()) {
        (Some("initialize"), _) => {
            let mut r = json_answer(
                200,
                &json!({"jsonrpc":"2.0","id":msg["id"],"result":{"protocolVersion":"2025-06-18"}}),
            );
            let session = format!("session-{n}").parse().unwrap();
            r.headers_mut().insert("mcp-session-id", session);
            return r;
        }
        (Some("tools/call"), None) => json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {}},
            "requestState": format!("state-{n}"),
        }),
        (Some("tools/call"), Some(state)) => json!({"content": [{"type": "text", "text": format!("resumed {state}")}]}),
        _ => json!({}),
    };
    json_answer(200, &json!({"jsonrpc":"2.0","id":msg["id"],"result":result}))
}

/// A wrapped `requestState` and a session id: refused to bob (POST, GET and DELETE alike),
/// followed by alice with another token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_states_and_sessions_follow_their_principal_only() {
    let recorder = Recorder::start_answering("states", sessions_and_states).await;
    let env = Env::start_with(Vec::new(), Some(recorder), &["mcp"], auth_and_tokens).await;
    let alice = format!("Bearer {}", token_of(&env, "alice", "mcp", "app-1"));
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}});
    let opened = env.fleet.post(&[("authorization", &alice)], &init).await;
    let session = sealed(opened.headers["mcp-session-id"].to_str().unwrap(), "the session id");
    let ask = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ask","arguments":{}}});
    let asked = env
        .fleet
        .post(&[("authorization", &alice), ("mcp-session-id", &session)], &ask)
        .await;
    let state = sealed(
        asked.json()["result"]["requestState"].as_str().unwrap_or(""),
        "the requestState",
    );

    let bob = token_of(&env, "bob", "mcp", "app-1");
    let alice_again = token_of(&env, "alice", "mcp files", "app-2");
    let resume = |token: &str| {
        let params = json!({"name": "ask", "arguments": {}, "requestState": state});
        post("tools/call", params).bearer(token)
    };
    let in_session = |req: Req, token: &str| req.header("mcp-session-id", session.clone()).bearer(token);
    let delete = || Req {
        method: http::Method::DELETE,
        ..get("/mcp")
    };
    let alice_sees = || {
        Want::Ok(vec![
            ("x-mcp-auth-subject", vec!["alice"]),
            ("x-mcp-auth-client-id", vec!["app-2"]),
        ])
    };
    let clear_state = clear_part(&state);
    let resume_clear = |token: &str| {
        let params = json!({"name": "ask", "arguments": {}, "requestState": clear_state});
        post("tools/call", params).bearer(token)
    };
    let clear_session = clear_part(&session);
    let rows = vec![
        ("bob with alice's requestState", resume(&bob), mismatch()),
        (
            "bob with the clear part of alice's requestState",
            resume_clear(&bob),
            not_sealed(),
        ),
        (
            "bob POSTs with the clear part of alice's session id",
            ping().header("mcp-session-id", clear_session.clone()).bearer(&bob),
            not_sealed(),
        ),
        (
            "bob listens with the clear part of alice's session id",
            get("/mcp").header("mcp-session-id", clear_session.clone()).bearer(&bob),
            not_sealed(),
        ),
        ("bob POSTs in alice's session", in_session(ping(), &bob), mismatch()),
        (
            "bob listens on alice's session",
            in_session(get("/mcp"), &bob),
            mismatch(),
        ),
        ("bob deletes alice's session", in_session(delete(), &bob), mismatch()),
        ("alice resumes with another token", resume(&alice_again), alice_sees()),
        (
            "alice in her session with another token",
            in_session(ping(), &alice_again),
            alice_sees(),
        ),
    ];
    check_all(&env, rows).await;
    // What reached the backend were alice's requests, with its own handles back.
    let seen = env.recorder.as_ref().unwrap().all();
    assert_eq!(seen.len(), 4, "initialize, ask and alice's two follow-ups: {seen:?}");
    let resumed: Value = serde_json::from_slice(&seen[2].body).unwrap();
    assert!(
        resumed["params"]["requestState"]
            .as_str()
            .is_some_and(|s| s.starts_with("state-")),
        "{resumed}"
    );
    assert!(
        seen[3].header("mcp-session-id")[0].starts_with("session-"),
        "{:?}",
        seen[3]
    );
}

/// While a fleet switches `[tokens]` on (`accept_clear_handles = true`), handles issued before
/// (clear, bound to no one) still reach their backend; sealed ones stay bound to their principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_handles_pass_only_while_the_fleet_switches_tokens_on() {
    let recorder = Recorder::start_answering("states", sessions_and_states).await;
    let switching = |issuer: &Issuer, origin: &str| {
        auth_and_tokens(issuer, origin).replace("[auth]\n", "accept_clear_handles = true\n[auth]\n")
    };
    let env = Env::start_with(Vec::new(), Some(recorder), &["mcp"], switching).await;
    let alice = format!("Bearer {}", token_of(&env, "alice", "mcp", "app-1"));
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}});
    let opened = env.fleet.post(&[("authorization", &alice)], &init).await;
    let session = sealed(opened.headers["mcp-session-id"].to_str().unwrap(), "the session id");
    let bob = token_of(&env, "bob", "mcp", "app-1");
    let rows = vec![
        (
            "a clear session id issued before [tokens]",
            ping().header("mcp-session-id", "issued-before").bearer(&bob),
            ok(),
        ),
        (
            "bob with alice's sealed session id",
            ping().header("mcp-session-id", session.clone()).bearer(&bob),
            mismatch(),
        ),
    ];
    check_all(&env, rows).await;
}
