//! Tasks on any replica (docs/src/tokens.md): with `[tokens]`, a task id is sealed wherever it reaches
//! the client and unwrapped in `Mcp-Name` and `params.taskId` together, so every replica with
//! the keys routes every follow-up to the instance holding the task; the round count of a call
//! travels in its tokens; and a routing header that disagrees with the body is refused.

use crate::support::*;
use http::Method;
use serde_json::{json, Value};

const KEY: &str = "tasks-key-0123456789abcdef0123456789ab";

fn tokens() -> String {
    format!("[tokens]\nkeys = [\"{KEY}\"]\n")
}

fn task_call(args: Value) -> Value {
    json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"task","arguments": args}})
}

/// A `tasks/*` request for `task_id`, with `Mcp-Name` (as given) and the task's `requestState`.
fn task_request(method: &str, task_id: &str, extra: Value) -> Value {
    let mut params = json!({"taskId": task_id});
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    json!({"jsonrpc":"2.0","id":7,"method": method,"params": params})
}

async fn follow(fleet: &Fleet, method: &str, task_id: &str, header: Option<&str>, extra: Value) -> Answer {
    let name = header.unwrap_or(task_id);
    let headers = [("mcp-name", name), ("mcp-method", method)];
    let headers = if header == Some("") {
        &headers[1..]
    } else {
        &headers[..]
    };
    fleet.post(headers, &task_request(method, task_id, extra)).await
}

/// Two replicas with the same keys whose rings disagree (different weights).
async fn two_replicas(extra: &str) -> (Fleet, Fleet) {
    let a = Fleet::start(3, extra).await;
    let mut specs = a.specs();
    specs[0].weight = 6;
    let b = Fleet::start_backends(Vec::new(), &specs, extra).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_follows_a_task_through_its_sealed_id() {
    let (a, b) = two_replicas(&tokens()).await;
    for round in 0..6 {
        // Started on one replica, followed up alternately on both.
        let (first, second) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let created = first.post(&[], &task_call(json!({"steps": 2, "input": true}))).await;
        let result = &created.json()["result"];
        assert_eq!(result["resultType"], "task", "{created:?}");
        let sealed = result["taskId"].as_str().unwrap().to_string();
        assert!(sealed.starts_with("mrt2."), "the task id is sealed: {sealed}");
        let holder = created.worker();
        assert!(!sealed.contains(&holder), "the backend's name is not readable in it");
        // The task's own requestState passes untouched, both ways.
        let state = result["requestState"].as_str().unwrap().to_string();
        assert!(state.starts_with("task-state-"), "{state}");
        let extra = json!({"requestState": state});
        let mut statuses = Vec::new();
        for (i, fleet) in [second, first, second].into_iter().enumerate() {
            let got = follow(fleet, "tasks/get", &sealed, None, extra.clone()).await;
            assert_eq!(got.worker(), holder, "poll {i}: {got:?}");
            assert_eq!(
                got.json()["result"]["taskId"],
                sealed.as_str(),
                "one id for the task's whole life"
            );
            statuses.push(got.json()["result"]["status"].as_str().unwrap().to_string());
        }
        assert_eq!(statuses, ["working", "working", "input_required"]);
        let update = json!({"requestState": state, "inputResponses": {"confirm": {"action": "accept"}}});
        let ack = follow(first, "tasks/update", &sealed, None, update).await;
        assert_eq!(
            (ack.worker(), ack.json()["result"]["resultType"].as_str()),
            (holder.clone(), Some("complete"))
        );
        let done = follow(second, "tasks/get", &sealed, None, extra).await;
        assert_eq!(done.json()["result"]["status"], "completed", "{done:?}");
        assert_eq!(
            done.json()["result"]["result"]["content"][0]["text"],
            format!("task done by {holder}")
        );
    }
    assert_eq!(
        a.total_unknown_followups(),
        0,
        "every follow-up reached its task's instance"
    );
    assert_eq!(a.total_executions(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_on_another_replica_and_its_ids_in_lists_and_notifications_are_sealed_alike() {
    let (a, b) = two_replicas(&tokens()).await;
    let created = b.post(&[], &task_call(json!({"steps": 50}))).await;
    let sealed = created.json()["result"]["taskId"].as_str().unwrap().to_string();
    let holder = created.worker();
    let ack = follow(&a, "tasks/cancel", &sealed, None, json!({})).await;
    assert_eq!(ack.worker(), holder);
    let got = follow(&b, "tasks/get", &sealed, None, json!({})).await;
    assert_eq!(got.json()["result"]["status"], "cancelled");
    // tasks/list names the task by the same sealed id the client holds.
    let list = a
        .post(
            &[("mcp-routing-id", &routing_to(&a, &holder))],
            &json!({"jsonrpc":"2.0","id":3,"method":"tasks/list"}),
        )
        .await;
    assert_eq!(list.worker(), holder, "{list:?}");
    let ids: Vec<String> = list.json()["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.iter().all(|id| id.starts_with("mrt2.")), "{ids:?}");
    assert!(ids.contains(&sealed), "{ids:?} lacks {sealed}");
    // Started over SSE: the status notification and the result carry the same sealed id.
    let url = a.url();
    let body = task_call(json!({"steps": 1, "sse": true})).to_string();
    let sse = send(&a.client, Method::POST, &url, &[], body.into()).await;
    let text = String::from_utf8_lossy(&sse.body).to_string();
    let ids: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .map(|v| {
            v["params"]["taskId"]
                .as_str()
                .or(v["result"]["taskId"].as_str())
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{text}");
    assert!(ids[0].starts_with("mrt2.") && ids[0] == ids[1], "{ids:?}");
    // Its polls are answered over SSE too, a notification first: the same id in both.
    let got = follow(&b, "tasks/get", &ids[0], None, json!({})).await;
    let events: Vec<Value> = String::from_utf8_lossy(&got.body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{got:?}");
    assert_eq!(events[0]["params"]["taskId"], ids[0].as_str());
    assert_eq!(events[1]["result"]["taskId"], ids[0].as_str());
    assert_eq!(events[1]["result"]["status"], "working", "{got:?}");
    assert_eq!(a.total_unknown_followups(), 0);
}

/// A routing token for some key that `fleet`'s ring gives to `worker` (to reach one instance).
fn routing_to(fleet: &Fleet, worker: &str) -> String {
    let view = fleet.control.view();
    (0..1000)
        .map(|i| format!("list-{i}"))
        .find(|k| view.ring_owner(k).as_deref() == Some(worker))
        .unwrap()
}

#[tokio::test]
async fn a_tampered_wrapped_task_id_is_refused_on_every_replica() {
    let (a, b) = two_replicas(&tokens()).await;
    let created = a.post(&[], &task_call(json!({"steps": 5}))).await;
    let sealed = created.json()["result"]["taskId"].as_str().unwrap().to_string();
    let mut bytes = sealed.clone().into_bytes();
    let at = bytes.len() / 3;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(bytes).unwrap();
    let served = a.total_requests();
    for fleet in [&a, &b] {
        let got = follow(fleet, "tasks/get", &tampered, None, json!({})).await;
        assert_eq!(
            (got.status.as_u16(), got.router_error()),
            (400, Some("invalid_routing_token")),
            "{got:?}"
        );
    }
    assert_eq!(a.total_requests(), served, "a refused follow-up reaches no backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_alternating_between_replicas_gets_too_many_rounds_after_max_rounds() {
    let extra = format!("{}[routing]\nmax_rounds = 3\n", tokens());
    let (a, b) = two_replicas(&extra).await;
    for (mid, order) in [("alt-a", [&a, &b]), ("alt-b", [&b, &a])] {
        let first = order[0].post(&[], &start_call(mid, 10)).await;
        let mut token = first.headers["mcp-routing-id"].to_str().unwrap().to_string();
        for round in 2..=4u32 {
            let fleet = order[round as usize % 2];
            let r = fleet.post(&[("mcp-routing-id", &token)], &confirm(mid, round)).await;
            if round <= 3 {
                assert_eq!(r.json()["result"]["pending"], true, "{mid} round {round}: {r:?}");
                token = r.headers["mcp-routing-id"].to_str().unwrap().to_string();
            } else {
                assert_eq!(
                    (r.status.as_u16(), r.router_error()),
                    (429, Some("too_many_rounds")),
                    "{mid}: round max_rounds + 1 is refused on whichever replica sees it: {r:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn mcp_name_must_agree_with_params_task_id() {
    let fleet = Fleet::start(3, "").await;
    let created = fleet.post(&[], &task_call(json!({"steps": 100}))).await;
    let id = created.json()["result"]["taskId"].as_str().unwrap().to_string();
    assert!(id.starts_with("task-"), "no tokens: the backend's own id: {id}");
    let holder = created.worker();
    let b64 = |s: &str| {
        use base64::Engine;
        format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(s))
    };
    let served = fleet.total_requests();
    for header in [
        "task-other-1".to_string(),
        b64("task-other-1"),
        "=?base64?%%%?=".to_string(),
    ] {
        let got = follow(&fleet, "tasks/get", &id, Some(&header), json!({})).await;
        assert_eq!(
            (got.status.as_u16(), got.router_error()),
            (400, Some("header_mismatch")),
            "{header}: {got:?}"
        );
        assert_eq!(got.json()["error"]["code"], -32020);
    }
    assert_eq!(
        fleet.total_requests(),
        served,
        "no mismatched request reached a backend"
    );
    // Agreeing, plainly or in base64 (it was pinned on its literal text before), or no header
    // at all: each follow-up reaches the task's instance by its pin.
    for header in [None, Some(b64(&id)), Some(String::new())] {
        let got = follow(&fleet, "tasks/get", &id, header.as_deref(), json!({})).await;
        assert_eq!(got.status, 200, "{header:?}: {got:?}");
        assert_eq!(got.worker(), holder, "{header:?}: {got:?}");
        assert_eq!(got.json()["result"]["status"], "working", "{header:?}");
    }
    assert_eq!(fleet.total_unknown_followups(), 0);
}
