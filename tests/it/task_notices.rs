//! A task's id in every shape a message carries it (docs/src/tokens.md): with `[tokens]`, the
//! client sees one sealed id for a task's whole life, in task results, `tasks/get` answers in
//! JSON and over SSE, the status notifications before them (which carry the task's inlined
//! `result` or `error`), the `_meta` that relates a message to its task, `tasks/list`, and a
//! GET stream; never the backend's own id. A terminal status in a notification finishes the
//! task's pin as a terminal answer does.

use crate::support::*;
use http::Method;
use mrtr_router::internals::PinKind;
use serde_json::{json, Value};

const KEY: &str = "task-notices-key-0123456789abcdef012345";

fn tokens() -> String {
    format!("[tokens]\nkeys = [\"{KEY}\"]\n")
}

/// Two replicas with the same keys whose rings disagree (different weights).
async fn two_replicas(extra: &str) -> (Fleet, Fleet) {
    let a = Fleet::start(3, extra).await;
    let mut specs = a.specs();
    specs[0].weight = 6;
    let b = Fleet::start_backends(Vec::new(), &specs, extra).await;
    (a, b)
}

/// Every JSON-RPC message of an answer: its JSON body, or the data of each SSE event.
fn messages(a: &Answer) -> Vec<Value> {
    let text = String::from_utf8_lossy(&a.body);
    let sse = a
        .headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    match sse {
        true => text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("event not JSON ({e}): {d}")))
            .collect(),
        false => vec![a.json()],
    }
}

/// Every task id in a message: each `taskId` string and each `taskIds` element, at any depth.
fn task_ids(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("taskId", Value::String(id)) => out.push(id.clone()),
                    ("taskIds", Value::Array(ids)) => {
                        out.extend(ids.iter().filter_map(|i| i.as_str()).map(String::from))
                    }
                    _ => task_ids(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| task_ids(i, out)),
        _ => {}
    }
}

/// Whether `text` holds an id as the example worker issues them (`task-<8 hex>-<n>`) outside
/// a sealed id (a sealed id wraps the backend's: `mrt2.<seal>.<id>`, the seal authenticating
/// both the id and the backend it hides).
fn names_a_raw_id(text: &str) -> bool {
    let mut outside = String::new();
    for (n, part) in text.split("mrt2.").enumerate() {
        // After a seal: skip the seal and the id it wraps, up to the closing quote.
        let rest = if n == 0 {
            part
        } else {
            part.split_once('"').map_or("", |(_, r)| r)
        };
        outside.push_str(rest);
    }
    outside.match_indices("task-").any(|(at, _)| {
        let rest = &outside.as_bytes()[at + 5..];
        rest.len() > 9 && rest[..8].iter().all(u8::is_ascii_hexdigit) && rest[8] == b'-'
    })
}

/// Checks an answer as a client reads it: every task id in it is `sealed`, and no raw id
/// shows anywhere; returns its messages.
fn only_sealed(answer: &Answer, sealed: &str, what: &str) -> Vec<Value> {
    let text = String::from_utf8_lossy(&answer.body);
    assert!(
        !names_a_raw_id(&text),
        "{what}: a raw task id reached the client: {text}"
    );
    let all = messages(answer);
    for m in &all {
        let mut ids = Vec::new();
        task_ids(m, &mut ids);
        assert!(
            ids.iter().all(|id| id == sealed),
            "{what}: {ids:?} is not only {sealed}: {m}"
        );
    }
    all
}

async fn follow(fleet: &Fleet, method: &str, task_id: &str, extra: Value) -> Answer {
    let mut params = json!({"taskId": task_id});
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    fleet
        .post(&[("mcp-name", task_id), ("mcp-method", method)], &body)
        .await
}

/// The message of an answer that is the JSON-RPC response (not a notification).
fn response(all: &[Value]) -> &Value {
    all.iter()
        .find(|m| m.get("method").is_none())
        .expect("a response among the messages")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Complete,
    Fail,
    Cancel,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_id_a_client_sees_is_sealed_and_stable_through_two_replicas() {
    let (a, b) = two_replicas(&tokens()).await;
    let mut flow = 0;
    for sse in [false, true] {
        for notice in ["notifications/tasks", "notifications/tasks/status"] {
            for end in [End::Complete, End::Fail, End::Cancel] {
                for input in [false, true] {
                    flow += 1;
                    let what = format!("flow {flow} (sse {sse}, {notice}, {end:?}, input {input})");
                    let (first, second) = if flow % 2 == 0 { (&a, &b) } else { (&b, &a) };
                    let args =
                        json!({"steps": 1, "input": input, "fail": end == End::Fail, "sse": sse, "notice": notice});
                    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "task", "arguments": args}});
                    let created = first.post(&[], &body).await;
                    let created_messages = messages(&created);
                    let result = &response(&created_messages)["result"];
                    assert_eq!(result["resultType"], "task", "{what}: {created:?}");
                    let sealed = result["taskId"].as_str().unwrap().to_string();
                    assert!(sealed.starts_with("mrt2."), "{what}: sealed: {sealed}");
                    let all = only_sealed(&created, &sealed, &what);
                    assert_eq!(all.len(), if sse { 2 } else { 1 }, "{what}");
                    let holder = created.worker();
                    let state = result["requestState"].as_str().unwrap().to_string();
                    let mut last = None;
                    for poll in 0..10 {
                        let fleet = if poll % 2 == 0 { second } else { first };
                        if end == End::Cancel && poll == 1 {
                            let ack = follow(fleet, "tasks/cancel", &sealed, json!({})).await;
                            assert_eq!(ack.worker(), holder, "{what}");
                            only_sealed(&ack, &sealed, &what);
                        }
                        let got = follow(fleet, "tasks/get", &sealed, json!({"requestState": state})).await;
                        assert_eq!(got.worker(), holder, "{what}, poll {poll}: {got:?}");
                        let all = only_sealed(&got, &sealed, &what);
                        let status = response(&all)["result"]["status"].as_str().unwrap().to_string();
                        if sse {
                            let notice_of = all
                                .iter()
                                .find(|m| m["method"] == notice)
                                .expect("a status notification");
                            assert_eq!(notice_of["params"]["status"], status.as_str(), "{what}");
                        }
                        match status.as_str() {
                            "input_required" => {
                                let update =
                                    json!({"requestState": state, "inputResponses": {"confirm": {"action": "accept"}}});
                                only_sealed(&follow(fleet, "tasks/update", &sealed, update).await, &sealed, &what);
                            }
                            "working" => {}
                            _ => {
                                last = Some((status, fleet));
                                break;
                            }
                        }
                    }
                    let (status, saw_it) = last.unwrap_or_else(|| panic!("{what}: the task never ended"));
                    let want = match end {
                        End::Complete => "completed",
                        End::Fail => "failed",
                        End::Cancel => "cancelled",
                    };
                    assert_eq!(status, want, "{what}");
                    let pin = saw_it.control.pin(PinKind::Task, &sealed).expect("the task's pin");
                    assert!(pin.finished, "{what}: the terminal status finished the pin");
                    // The list names it by the same sealed id (every id there is sealed).
                    let listed = second
                        .post(
                            &[("mcp-routing-id", &routing_to(second, &holder))],
                            &json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/list"}),
                        )
                        .await;
                    let text = String::from_utf8_lossy(&listed.body).to_string();
                    assert!(!names_a_raw_id(&text), "{what}: {text}");
                    let mut ids = Vec::new();
                    task_ids(&listed.json(), &mut ids);
                    assert!(
                        ids.contains(&sealed) && ids.iter().all(|i| i.starts_with("mrt2.")),
                        "{what}: {ids:?}"
                    );
                }
            }
        }
    }
    assert_eq!(
        a.total_unknown_followups(),
        0,
        "every follow-up reached its task's instance"
    );
}

/// A routing key that `fleet`'s ring gives to `worker` (to reach one instance).
fn routing_to(fleet: &Fleet, worker: &str) -> String {
    let view = fleet.control.view();
    (0..1000)
        .map(|i| format!("list-{i}"))
        .find(|k| view.ring_owner(k).as_deref() == Some(worker))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_status_notification_on_a_get_stream_finishes_the_tasks_pin() {
    for sealing in [false, true] {
        for notice in ["notifications/tasks", "notifications/tasks/status"] {
            let extra = if sealing { tokens() } else { String::new() };
            let fleet = Fleet::start(2, &extra).await;
            let args = json!({"background": true, "notice": notice});
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "task", "arguments": args}});
            let created = fleet.post(&[], &body).await;
            let id = created.json()["result"]["taskId"].as_str().unwrap().to_string();
            assert_eq!(id.starts_with("mrt2."), sealing, "{id}");
            let holder = created.worker();
            let pin = fleet.control.pin(PinKind::Task, &id).expect("a pin for the new task");
            assert!(!pin.finished, "a working task's pin is live");
            // The task completed in the background; the GET stream is the only one to tell.
            let key = routing_to(&fleet, &holder);
            let url = fleet.url();
            let stream = send(
                &fleet.client,
                Method::GET,
                &url,
                &[("mcp-routing-id", &key)],
                Default::default(),
            )
            .await;
            assert_eq!(stream.worker(), holder, "{stream:?}");
            let events = messages(&stream);
            let ours = events
                .iter()
                .find(|m| m["params"]["taskId"] == id.as_str())
                .unwrap_or_else(|| panic!("the stream names the task as the client knows it: {events:?}"));
            assert_eq!(ours["method"], notice);
            assert_eq!(ours["params"]["status"], "completed");
            assert_eq!(
                ours["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
                id.as_str()
            );
            assert_eq!(
                ours["params"]["result"]["content"][0]["text"],
                format!("task done by {holder}")
            );
            if sealing {
                only_sealed(&stream, &id, "the GET stream");
            }
            let pin = fleet
                .control
                .pin(PinKind::Task, &id)
                .expect("the pin lingers for the replay window");
            assert!(
                pin.finished,
                "sealing {sealing}, {notice}: the notification finished the pin"
            );
            let finished = metric(&fleet.metrics().await, "mrtr_pins_finished_total{kind=\"task\"}");
            assert_eq!(finished, Some(1.0));
        }
    }
}
