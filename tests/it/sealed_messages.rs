//! A property of the live router (docs/src/tokens.md): for generated task messages of every
//! shape the protocol gives (task results, `tasks/get` answers with an inlined `result` or
//! `error`, `tasks/list`, status notifications, related-task `_meta`, subscription
//! acknowledgements), padded with random fields, nesting and strings that hold `"result"`,
//! `"error"` and `"taskId"`, the message a client receives, in a JSON answer or an SSE event,
//! parses, has a sealed id exactly where the protocol puts a task id, and is otherwise the
//! backend's message byte for byte.

use crate::support::*;
use bytes::Bytes;
use http::{Method, Response};
use http_body_util::Full;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{json, Map, Value};

const KEY: &str = "sealed-messages-key-0123456789abcdef0123";
const RAW_IDS: [&str; 3] = ["raw-a", "raw-b", "task-\u{e9}\"q"];

/// Any JSON value a backend may put where the router must not look, with the names and texts
/// the router does look for inside it.
fn junk() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        prop::sample::select(vec![
            "result",
            "\"result\"",
            "\"error\": {}",
            "\"taskId\": \"raw-a\"",
            "{\"taskId\":\"raw-b\"}",
            "raw-a",
            "task-\u{e9}\"q",
            "mrt",
            "",
        ])
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let keys = prop::sample::select(vec![
            "taskId", "taskIds", "result", "error", "tasks", "task", "_meta", "status", "method", "text",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys, inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// Fields beside the ones the protocol defines, under names no shape gives a meaning to.
fn extras() -> impl Strategy<Value = Map<String, Value>> {
    let key = prop::sample::select(vec!["content", "structuredContent", "note", "x", "inputRequests"]);
    prop::collection::vec((key, junk()), 0..3).prop_map(|kv| kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn raw_id() -> impl Strategy<Value = String> {
    prop::sample::select(RAW_IDS.to_vec()).prop_map(String::from)
}

fn status() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["working", "input_required", "completed", "failed", "cancelled"])
}

/// A generated message and the JSON pointers where the protocol puts a task id in it.
#[derive(Debug, Clone)]
struct Case {
    message: Value,
    ids_at: Vec<String>,
    sse: bool,
    pretty: bool,
}

fn with(mut base: Map<String, Value>, extra: Map<String, Value>) -> Value {
    for (k, v) in extra {
        base.entry(k).or_insert(v);
    }
    Value::Object(base)
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("an object"),
    }
}

fn case() -> impl Strategy<Value = Case> {
    let inlined = || prop::option::of(junk());
    let shapes = prop_oneof![
        // A created task, flat (2026-07-28) or nested (2025-11-25).
        (raw_id(), status(), extras(), any::<bool>()).prop_map(|(id, st, ex, nested)| {
            let (result, at) = match nested {
                false => (
                    json!({"resultType": "task", "taskId": id, "status": st}),
                    "/result/taskId",
                ),
                true => (
                    json!({"resultType": "task", "task": {"taskId": id, "status": st}}),
                    "/result/task/taskId",
                ),
            };
            (
                json!({"jsonrpc": "2.0", "id": 4, "result": with(obj(result), ex)}),
                vec![at.to_string()],
            )
        }),
        // A `tasks/get` answer with its result or error inlined.
        (raw_id(), status(), inlined(), inlined(), extras()).prop_map(|(id, st, r, e, ex)| {
            let mut result = obj(json!({"resultType": "complete", "taskId": id, "status": st}));
            r.map(|r| result.insert("result".into(), r));
            e.map(|e| result.insert("error".into(), e));
            (
                json!({"jsonrpc": "2.0", "id": 5, "result": with(result, ex)}),
                vec!["/result/taskId".to_string()],
            )
        }),
        // `tasks/list`.
        (prop::collection::vec((raw_id(), status()), 0..4), extras()).prop_map(|(tasks, ex)| {
            let at = (0..tasks.len()).map(|i| format!("/result/tasks/{i}/taskId")).collect();
            let tasks: Vec<Value> = tasks
                .into_iter()
                .map(|(id, st)| json!({"taskId": id, "status": st}))
                .collect();
            (
                json!({"jsonrpc": "2.0", "id": 6, "result": with(obj(json!({"tasks": tasks})), ex)}),
                at,
            )
        }),
        // A status notification, with the task's result or error and its related-task `_meta`.
        (
            raw_id(),
            status(),
            inlined(),
            inlined(),
            prop::option::of(raw_id()),
            any::<bool>(),
            extras()
        )
            .prop_map(|(id, st, r, e, related, old_name, ex)| {
                let method = if old_name {
                    "notifications/tasks/status"
                } else {
                    "notifications/tasks"
                };
                let mut params = obj(json!({"taskId": id, "status": st}));
                let mut at = vec!["/params/taskId".to_string()];
                r.map(|r| params.insert("result".into(), r));
                e.map(|e| params.insert("error".into(), e));
                if let Some(related) = related {
                    params.insert(
                        "_meta".into(),
                        json!({"io.modelcontextprotocol/related-task": {"taskId": related}}),
                    );
                    at.push("/params/_meta/io.modelcontextprotocol~1related-task/taskId".to_string());
                }
                (
                    json!({"jsonrpc": "2.0", "method": method, "params": with(params, ex)}),
                    at,
                )
            }),
        // A subscription's acknowledgement.
        (prop::collection::vec(raw_id(), 0..3), extras()).prop_map(|(ids, ex)| {
            let at = (0..ids.len())
                .map(|i| format!("/params/notifications/taskIds/{i}"))
                .collect();
            let params = with(obj(json!({"notifications": {"taskIds": ids}})), ex);
            (
                json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": params}),
                at,
            )
        }),
        // A final result or a server's request that names no task but in its `_meta`, and
        // whose other fields hold the names and texts of the shapes above.
        (prop::option::of(raw_id()), junk(), any::<bool>(), extras()).prop_map(|(related, j, request, ex)| {
            let mut inner = obj(json!({"content": j}));
            let mut at = Vec::new();
            let field = if request { "params" } else { "result" };
            if let Some(related) = related {
                inner.insert(
                    "_meta".into(),
                    json!({"io.modelcontextprotocol/related-task": {"taskId": related}}),
                );
                at.push(format!("/{field}/_meta/io.modelcontextprotocol~1related-task/taskId"));
            }
            let mut message = obj(json!({"jsonrpc": "2.0", "id": 8}));
            if request {
                message.insert("method".into(), json!("elicitation/create"));
            }
            message.insert(field.into(), with(inner, ex));
            (Value::Object(message), at)
        }),
    ];
    (shapes, any::<bool>(), any::<bool>()).prop_map(|((message, ids_at), sse, pretty)| Case {
        message,
        ids_at,
        sse,
        // An SSE event's data is one line here; JSON answers may come pretty-printed.
        pretty: pretty && !sse,
    })
}

/// A backend that answers each request with the message its `params.answer` holds, in JSON or
/// over SSE as `params.sse` says.
async fn echo_backend() -> BackendSpec {
    test_backend("echo-1", |_: Method, body: Bytes| async move {
        let req: Value = serde_json::from_slice(&body).unwrap();
        let answer = req["params"]["answer"].as_str().unwrap().to_string();
        let sse = req["params"]["sse"].as_bool().unwrap();
        let (content_type, body) = match sse {
            true => ("text/event-stream", format!("data: {answer}\n\n")),
            false => ("application/json", answer),
        };
        Response::builder()
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    })
    .await
}

#[test]
fn a_client_sees_task_ids_sealed_where_the_protocol_puts_them_and_every_other_byte_as_sent() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fleet = rt.block_on(async {
        let spec = echo_backend().await;
        Fleet::start_backends(Vec::new(), &[spec], &format!("[tokens]\nkeys = [\"{KEY}\"]\n")).await
    });
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let sealed_seen = std::cell::Cell::new(0);
    let result = runner.run(&case(), |case| {
        let sent = match case.pretty {
            true => serde_json::to_string_pretty(&case.message).unwrap(),
            false => case.message.to_string(),
        };
        let request = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
            "params": {"taskId": "q", "answer": sent, "sse": case.sse}});
        let got = rt.block_on(fleet.post(&[], &request));
        prop_assert_eq!(got.status, 200);
        let text = String::from_utf8(got.body.to_vec()).unwrap();
        let received = match case.sse {
            true => text
                .strip_prefix("data: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .unwrap_or_else(|| panic!("one event: {text:?}"))
                .to_string(),
            false => text,
        };
        let parsed: Value = serde_json::from_str(&received).expect("the rewritten message parses");
        // A sealed id where each id was, one seal per id...
        let mut back = received.clone();
        let mut seals = std::collections::HashMap::new();
        for at in &case.ids_at {
            let raw = case.message.pointer(at).and_then(Value::as_str).unwrap();
            let sealed = parsed
                .pointer(at)
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{at} in {received}"));
            prop_assert!(sealed.starts_with("mrt2."), "{} is not sealed in {}", at, received);
            prop_assert_eq!(
                seals.entry(raw.to_string()).or_insert(sealed.to_string()),
                sealed,
                "one id, one seal"
            );
        }
        // ...and nowhere else: the seals are all there is of them, and with the ids put back
        // the message is the backend's, byte for byte.
        prop_assert_eq!(received.matches("\"mrt2.").count(), case.ids_at.len(), "{}", received);
        for (raw, sealed) in &seals {
            let (raw, sealed) = (serde_json::to_string(raw).unwrap(), format!("\"{sealed}\""));
            back = back.replace(&sealed, &raw);
        }
        prop_assert_eq!(&back, &sent);
        sealed_seen.set(sealed_seen.get() + case.ids_at.len());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let sealed_seen = sealed_seen.get();
    assert!(sealed_seen > 100, "the cases had ids to seal: {sealed_seen}");
}
