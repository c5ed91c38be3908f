//! `[catalog] filter_list_by_scope` (docs/src/catalog.md, "Lists filtered by scope"): a
//! `tools/list` answer for a caller `[auth]` verified lists only the tools its scopes reach,
//! in a JSON answer and in an SSE event alike; the cursor passes untouched, a page with every
//! tool dropped still carries it, and an answer with nothing to drop passes byte for byte.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::support::auth::rows::*;
use crate::support::auth::*;
use crate::support::*;

/// The lister's pages: `sse` answers in an event stream, `secret` lists only the scoped tool.
fn lister(seen: &Seen) -> http::Response<http_body_util::Full<Bytes>> {
    let Ok(msg) = serde_json::from_slice::<Value>(&seen.body) else {
        return json_answer(200, &json!({}));
    };
    let id = msg["id"].clone();
    if msg["method"] != "tools/list" {
        return json_answer(200, &json!({"jsonrpc": "2.0", "id": id, "result": {}}));
    }
    let tool = |name: &str| json!({"name": name, "inputSchema": {"type": "object"}});
    let all = json!([tool("search"), tool("transfer-funds"), tool("whoami")]);
    match msg["params"]["cursor"].as_str() {
        Some("secret") => json_answer(
            200,
            &json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [tool("transfer-funds")], "nextCursor": "c3"}}),
        ),
        Some("sse") => {
            let event = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": all, "nextCursor": "c2"}});
            http::Response::builder()
                .header("content-type", "text/event-stream")
                .body(http_body_util::Full::new(Bytes::from(format!(
                    "event: message\ndata: {event}\n\n"
                ))))
                .unwrap()
        }
        _ => json_answer(
            200,
            &json!({"jsonrpc": "2.0", "id": id, "result": {"tools": all, "nextCursor": "c1"}}),
        ),
    }
}

/// The main `[auth]` table (`transfer-funds` needs `payments:write`, `whoami` `profile:read`),
/// and the catalog filtering lists by it.
fn config(issuer: &Issuer, origin: &str) -> String {
    let auth = crate::auth::table_auth(issuer, origin);
    format!("{auth}[catalog]\nenabled = true\nfilter_list_by_scope = true\n")
}

/// The tool names and the cursor of a `tools/list` answer (JSON, or the one SSE event).
fn listed(a: &Answer) -> (Vec<String>, Value) {
    let text = String::from_utf8_lossy(&a.body).to_string();
    let json = match text.find("data: ") {
        Some(at) => text[at + 6..].lines().next().unwrap().to_string(),
        None => text,
    };
    let v: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let names = v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    (names, v["result"]["nextCursor"].clone())
}

/// A `tools/list` (of the page at `cursor`) with a bearer of `scope`, answered 200.
async fn ask(env: &Env, scope: &str, cursor: Option<&str>) -> Answer {
    let mut params = json!({});
    if let Some(c) = cursor {
        params["cursor"] = json!(c);
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params});
    let bearer = format!("Bearer {}", env.bearer(scope));
    let headers = [
        ("authorization", bearer.as_str()),
        ("accept", "application/json, text/event-stream"),
    ];
    let a = env.fleet.post(&headers, &body).await;
    assert_eq!(a.status, http::StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    a
}

#[tokio::test]
async fn two_tokens_see_two_lists_and_the_cursor_passes() {
    let recorder = Recorder::start_answering("lister", lister).await;
    let env = Env::start_with(Vec::new(), Some(recorder), &["mcp"], config).await;
    let ask = |scope: &'static str, cursor: Option<&'static str>| ask(&env, scope, cursor);
    // Only `mcp`: neither scoped tool; the cursor as the backend wrote it.
    let a = ask("mcp", None).await;
    assert_eq!(listed(&a), (vec!["search".to_string()], json!("c1")));
    let length: usize = a.headers["content-length"].to_str().unwrap().parse().unwrap();
    assert_eq!(length, a.body.len());
    // Payments: one of them.
    let a = ask("mcp payments:write", None).await;
    assert_eq!(listed(&a).0, ["search", "transfer-funds"].map(String::from).to_vec());
    // Every scope: nothing dropped, the answer as the backend sent it.
    let a = ask("mcp payments:write profile:read", None).await;
    assert_eq!(listed(&a).0.len(), 3);
    let tool = |name: &str| json!({"name": name, "inputSchema": {"type": "object"}});
    let all = json!([tool("search"), tool("transfer-funds"), tool("whoami")]);
    let as_sent = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": all, "nextCursor": "c1"}});
    assert_eq!(a.body, Bytes::from(as_sent.to_string()), "passed byte for byte");
    // A page with every tool dropped still carries its cursor.
    let a = ask("mcp", Some("secret")).await;
    assert_eq!(listed(&a), (Vec::<String>::new(), json!("c3")));
    // In an event stream too.
    let a = ask("mcp profile:read", Some("sse")).await;
    assert!(a.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(
        listed(&a),
        (["search", "whoami"].map(String::from).to_vec(), json!("c2"))
    );
    env.fleet.shutdown().await;
}
