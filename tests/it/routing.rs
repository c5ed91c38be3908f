//! The routing-id dialect end to end: concurrent multi-round calls, header vs body keys,
//! duplicates, and pinned calls surviving backend changes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::support::*;
use serde_json::json;

/// One two-round call: start, then confirm. Returns (worker of round 1, worker of round 2).
async fn two_round_call(
    fleet: &Fleet,
    mid: &str,
    start_hdr: Option<&str>,
    confirm_hdr: Option<&str>,
) -> (String, String) {
    let h1: Vec<(&str, &str)> = start_hdr.map(|h| ("mcp-routing-id", h)).into_iter().collect();
    let a = fleet.post(&h1, &start_call(mid, 2)).await;
    assert_eq!(a.status, 200, "{a:?}");
    let v = a.json();
    assert_eq!(v["result"]["pending"], true, "{v}");
    let h2: Vec<(&str, &str)> = confirm_hdr.map(|h| ("mcp-routing-id", h)).into_iter().collect();
    let b = fleet.post(&h2, &confirm(mid, 2)).await;
    let v2 = b.json();
    assert_eq!(v2["result"]["content"][0]["text"], "done", "call {mid}: {v2}");
    (
        v["result"]["worker"].as_str().unwrap().to_string(),
        v2["result"]["worker"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_two_round_calls_never_misroute() {
    let fleet = Arc::new(Fleet::start(4, "").await);
    let mut tasks = Vec::new();
    for i in 0..500 {
        let fleet = fleet.clone();
        tasks.push(tokio::spawn(async move {
            let mid = format!("call-{i}");
            let rid = format!("route-{i}");
            match i % 3 {
                // Header key on every round (the messageId differs and must not matter).
                0 => two_round_call(&fleet, &mid, Some(&rid), Some(&rid)).await,
                // Body key only.
                1 => two_round_call(&fleet, &mid, None, None).await,
                // Mixed: header on the first round, only the messageId on the follow-up.
                _ => two_round_call(&fleet, &mid, Some(&rid), None).await,
            }
        }));
    }
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let (w1, w2) = t.await.unwrap();
        assert_eq!(w1, w2, "a follow-up reached another worker");
        *per_worker.entry(w1).or_default() += 1;
    }
    assert_eq!(fleet.total_unknown_followups(), 0, "misroutes seen by workers");
    assert_eq!(fleet.total_executions(), 500, "every call executed exactly once");
    assert_eq!(per_worker.len(), 4, "calls spread over every worker: {per_worker:?}");
    let m = fleet.metrics().await;
    // Header-keyed starts pin under both the routing id and the messageId; body-keyed under one.
    let (header_starts, body_starts) = (
        (0..500).filter(|i| i % 3 != 1).count(),
        (0..500).filter(|i| i % 3 == 1).count(),
    );
    let expected = 2 * header_starts + body_starts;
    assert_eq!(
        metric(&m, "mrtr_pins_created_total{kind=\"client\"}"),
        Some(expected as f64)
    );
    assert!(metric(&m, "mrtr_route_decisions_total{source=\"pin\"}").unwrap() >= 500.0);
}

#[tokio::test]
async fn header_key_wins_over_body_key() {
    let fleet = Fleet::start(3, "").await;
    let snap = fleet.control.view();
    // Find a header key and a messageId that the ring places on different workers.
    let (h, m) = (0..1000)
        .map(|i| (format!("h-{i}"), format!("m-{i}")))
        .find(|(h, m)| snap.ring_owner(h).unwrap() != snap.ring_owner(m).unwrap())
        .unwrap();
    let expect = snap.ring_owner(&h).unwrap();
    let a = fleet.post(&[("mcp-routing-id", &h)], &start_call(&m, 2)).await;
    assert_eq!(a.worker(), expect);
    // The follow-up with only the messageId finds the pin recorded under it too.
    let b = fleet.post(&[], &confirm(&m, 2)).await;
    assert_eq!(b.worker(), expect);
    assert_eq!(b.json()["result"]["content"][0]["text"], "done");
}

#[tokio::test]
async fn duplicate_follow_ups_reach_the_same_worker() {
    let fleet = Fleet::start(3, "").await;
    let first = fleet.post(&[], &start_call("dup-1", 2)).await;
    let again = fleet.post(&[], &start_call("dup-1", 2)).await;
    assert_eq!(first.worker(), again.worker());
    assert_eq!(
        first.json()["result"],
        again.json()["result"],
        "a retried start is answered idempotently"
    );
    let done = fleet.post(&[], &confirm("dup-1", 2)).await;
    // The call is finished; duplicates within the replay window still reach its worker.
    for _ in 0..3 {
        let dup = fleet.post(&[], &confirm("dup-1", 2)).await;
        assert_eq!(dup.worker(), done.worker());
        assert_eq!(
            dup.json()["result"],
            done.json()["result"],
            "same answer, no second execution"
        );
    }
    assert_eq!(fleet.total_executions(), 1);
    assert_eq!(fleet.total_unknown_followups(), 0);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_pins_finished_total{kind=\"client\"}"), Some(1.0));
    assert_eq!(metric(&m, "mrtr_rounds_per_call_count"), Some(1.0));
}

#[tokio::test]
async fn three_round_calls_keep_their_worker() {
    let fleet = Fleet::start(3, "").await;
    for i in 0..20 {
        let mid = format!("three-{i}");
        let a = fleet.post(&[], &start_call(&mid, 3)).await;
        let b = fleet.post(&[], &confirm(&mid, 2)).await;
        assert_eq!(b.json()["result"]["pending"], true);
        let c = fleet.post(&[], &confirm(&mid, 3)).await;
        assert_eq!(c.json()["result"]["content"][0]["text"], "done");
        assert_eq!((a.worker(), b.worker()), (c.worker(), c.worker()));
    }
    assert_eq!(fleet.total_unknown_followups(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_calls_survive_backends_added_and_reweighted() {
    let mut workers = Vec::new();
    for i in 0..5 {
        workers.push(start_worker(&format!("worker-{i}")).await);
    }
    let fleet = Fleet::start_with(workers, "").await;
    let all = fleet.specs();
    // Start with three backends.
    fleet.reconfigure(&all[..3]);
    let mut started = HashMap::new();
    for i in 0..200 {
        let mid = format!("p-{i}");
        let a = fleet.post(&[], &start_call(&mid, 2)).await;
        assert_eq!(a.json()["result"]["pending"], true);
        started.insert(mid, a.worker());
    }
    // Add two backends and re-weight the first ones: many keys now hash elsewhere.
    let mut changed = all.clone();
    changed[0].weight = 5;
    changed[1].weight = 2;
    fleet.reconfigure(&changed);
    let snap = fleet.control.view();
    let moved = started
        .keys()
        .filter(|k| snap.ring_owner(k).unwrap().as_str() != started[*k])
        .count();
    assert!(
        moved > 50,
        "the ring change must move many keys for this test to mean anything ({moved})"
    );
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_config_reloads_total{result=\"ok\"}"), Some(2.0));
    assert_eq!(metric(&m, "mrtr_ring_members"), Some(5.0));
    for (mid, w) in &started {
        let b = fleet.post(&[], &confirm(mid, 2)).await;
        assert_eq!(&b.worker(), w, "pinned call {mid} moved");
        assert_eq!(b.json()["result"]["content"][0]["text"], "done");
    }
    assert_eq!(fleet.total_unknown_followups(), 0);
    assert_eq!(fleet.total_executions(), 200);
    // New keys use the new ring, including the added backends.
    let mut seen = HashSet::new();
    for i in 0..60 {
        seen.insert(fleet.post(&[], &json!({"jsonrpc":"2.0","id":1,"messageId":format!("new-{i}"),"method":"tools/call","params":{"name":"whoami"}})).await.worker());
    }
    assert!(seen.contains("worker-3") && seen.contains("worker-4"), "{seen:?}");
}

#[tokio::test]
async fn sequential_ids_spread_over_all_workers() {
    let fleet = Fleet::start(3, "").await;
    let mut seen = HashSet::new();
    for i in 0..10 {
        let body = json!({"jsonrpc":"2.0","id":i,"messageId":format!("session-{i}"),"method":"tools/call","params":{"name":"whoami"}});
        seen.insert(fleet.post(&[], &body).await.worker());
    }
    assert_eq!(seen.len(), 3, "session-0..9 landed on {seen:?}");
    // Keyless requests spread too (least outstanding of two random choices).
    let mut keyless = HashSet::new();
    for i in 0..30 {
        keyless.insert(
            fleet
                .post(
                    &[],
                    &json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":"whoami"}}),
                )
                .await
                .worker(),
        );
    }
    assert_eq!(keyless.len(), 3);
    // Single-round traffic creates no pins.
    assert_eq!(fleet.control.pin_count(), 0);
}

#[tokio::test]
async fn invalid_reload_keeps_the_running_config() {
    let fleet = Fleet::start(2, "").await;
    let before = fleet.post(&[], &start_call("keep-1", 2)).await;
    std::fs::write(&fleet.config_path, "[routing]\nvirtual_nodes = \"many\"\n").unwrap();
    let err = fleet.control.reload().unwrap_err();
    assert_eq!(err.line, Some(2), "{err}");
    let after = fleet.post(&[], &confirm("keep-1", 2)).await;
    assert_eq!(after.worker(), before.worker());
    assert_eq!(after.json()["result"]["content"][0]["text"], "done");
    assert_eq!(fleet.control.view().ring().len(), 2);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_config_reloads_total{result=\"error\"}"), Some(1.0));
}

#[tokio::test]
async fn debug_route_explains_keys_and_bodies_without_touching_pins() {
    use bytes::Bytes;
    use http::Method;
    let fleet = Fleet::start(3, "").await;
    let a = fleet.post(&[], &start_call("explain-1", 2)).await;
    let admin = format!("http://{}/debug/route", fleet.admin);
    let v = send(
        &fleet.client,
        Method::GET,
        &format!("{admin}?key=explain-1"),
        &[],
        Bytes::new(),
    )
    .await
    .json();
    assert_eq!(v["source"], "pin");
    assert_eq!(v["backend"], a.worker());
    assert_eq!(v["pin"]["kind"], "client");
    let fresh = send(
        &fleet.client,
        Method::GET,
        &format!("{admin}?key=never%20seen"),
        &[],
        Bytes::new(),
    )
    .await
    .json();
    assert_eq!(
        (fresh["source"].as_str(), fresh["keys"]["client_key"].as_str()),
        (Some("ring"), Some("never seen"))
    );
    // An empty key is no key, as an empty routing header is.
    let empty = send(&fleet.client, Method::GET, &format!("{admin}?key="), &[], Bytes::new())
        .await
        .json();
    assert_eq!(empty["source"], "keyless", "{empty}");
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","requestState":"unknown"}});
    let v = send(
        &fleet.client,
        Method::POST,
        &admin,
        &[("mcp-session-id", "s-9")],
        Bytes::from(body.to_string()),
    )
    .await
    .json();
    assert_eq!(v["source"], "keyless", "{v}");
    assert_eq!(v["keys"]["session_id"], "s-9");
    assert_eq!(v["keys"]["method"], "tools/call");
    // Explaining never created, refreshed or finished anything.
    assert_eq!(fleet.control.pin_count(), 1);
}

/// The per-request metrics docs/src/observability.md names, as an operator's dashboard reads them: counts by
/// backend, method and status, the latency histogram, in-flight back to zero; and the probes.
#[tokio::test]
async fn requests_show_in_the_metrics_and_the_probes_answer() {
    let fleet = Fleet::start(1, "").await;
    for i in 0..3 {
        assert_eq!(fleet.post(&[], &start_call(&format!("m-{i}"), 1)).await.status, 200);
    }
    let m = fleet.metrics().await;
    let requests = "mrtr_requests_total{backend=\"worker-0\",method=\"tools/call\",status=\"200\"}";
    assert_eq!(metric(&m, requests), Some(3.0), "{m}");
    assert_eq!(
        metric(&m, "mrtr_request_duration_seconds_count{backend=\"worker-0\"}"),
        Some(3.0)
    );
    assert!(metric(&m, "mrtr_request_duration_seconds_sum{backend=\"worker-0\"}").unwrap() > 0.0);
    assert_eq!(metric(&m, "mrtr_backend_inflight{backend=\"worker-0\"}"), Some(0.0));
    for probe in ["healthz", "readyz"] {
        let url = format!("http://{}/{probe}", fleet.admin);
        let a = send(&fleet.client, http::Method::GET, &url, &[], bytes::Bytes::new()).await;
        assert_eq!(a.status, 200, "/{probe}: {a:?}");
    }
}
