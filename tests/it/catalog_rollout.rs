//! `[catalog]` through a rollout (docs/src/catalog.md, "Routing by tool"): a tool whose
//! `inputSchema` changed is called where its arguments are accepted, and a new instance's tools
//! are routed to it from the first list a client gets from it, before the catalog has asked it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use http::StatusCode;
use serde_json::{json, Value};

use crate::catalog::{admin_json, learned, serve, ToolServer, ON};
use crate::support::*;

/// `lookup` as v1 defines it (an integer id) and as v2 does (an integer or a string).
fn lookup(v2: bool) -> Value {
    let id = if v2 {
        json!({"type": ["integer", "string"]})
    } else {
        json!({"type": "integer"})
    };
    json!({"name": "lookup", "description": "finds", "inputSchema": {
        "type": "object", "properties": {"id": id}, "required": ["id"]}})
}

fn call_lookup(id: Value, mid: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "messageId": mid,
        "params": {"name": "lookup", "arguments": {"id": id}}})
}

/// Where 30 new calls of `lookup` with `id` go, by backend.
async fn spread(fleet: &Fleet, id: Value, tag: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for i in 0..30 {
        let a = fleet.post(&[], &call_lookup(id.clone(), &format!("{tag}-{i}"))).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
        *seen.entry(a.worker()).or_insert(0) += 1;
    }
    seen
}

/// v1 and v2 serve `lookup` with different schemas: a string id, which only v2's accepts, goes
/// to v2 every time; an integer id, which both accept, goes to both; arguments neither accepts
/// go where the ring says, counted as unmatched. The control, with the catalog off, sends
/// string ids to v1 too.
#[tokio::test]
async fn a_call_of_a_drifted_tool_goes_where_its_arguments_are_accepted() {
    let v1 = ToolServer::new(json!([lookup(false)]), true);
    let v2 = ToolServer::new(json!([lookup(true)]), true);
    let specs = vec![serve("v1", &v1).await, serve("v2", &v2).await];

    let off = Fleet::start_backends(Vec::new(), &specs, "").await;
    let control = spread(&off, json!("abc"), "off").await;
    assert!(
        control.contains_key("v1"),
        "control: the ring alone sends string ids to v1: {control:?}"
    );
    off.shutdown().await;

    let fleet = Fleet::start_backends(Vec::new(), &specs, ON).await;
    learned(&fleet, &[("v1", 1), ("v2", 1)]).await;
    let strings = spread(&fleet, json!("abc"), "s").await;
    assert_eq!(strings, BTreeMap::from([("v2".to_string(), 30)]));
    let integers = spread(&fleet, json!(7), "i").await;
    assert_eq!(integers.len(), 2, "both schemas accept an integer: {integers:?}");
    let neither = spread(&fleet, json!([1]), "n").await;
    assert_eq!(neither.values().sum::<usize>(), 30);
    let metrics = fleet.metrics().await;
    let checks = |result: &str| {
        metric(
            &metrics,
            &format!("mrtr_tool_argument_checks_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(checks("matched"), Some(60.0));
    assert_eq!(checks("unmatched"), Some(30.0));
    fleet.shutdown().await;
}

/// A new instance (v2) that the catalog has not learned yet (its asks fail) lists a new tool to
/// a client; the client's call of that tool goes to v2, not to v1, which does not serve it. The
/// control: the same before any client was told, when the tool is unknown and the ring decides.
#[tokio::test]
async fn a_new_instances_tools_are_routed_from_the_first_list_a_client_gets() {
    let (fleet, v2) = learned_v1_and_new_v2(json!({"name": "summarize", "inputSchema": {"type": "object"}})).await;
    let summarize = |i: usize| call_summarize("sum", i);
    let mut control = BTreeMap::new();
    for i in 0..30 {
        *control
            .entry(fleet.post(&[], &summarize(i)).await.worker())
            .or_insert(0) += 1;
    }
    assert!(
        control.contains_key("v1"),
        "control: an unknown tool goes by the ring: {control:?}"
    );

    // A client's list reaches v2 (keyless lists go to either backend: bounded tries).
    a_list_from(&fleet, "v2").await;
    for i in 0..30 {
        assert_eq!(fleet.post(&[], &summarize(i)).await.worker(), "v2", "call {i}");
    }
    // `/catalog` shows what v2 told, not yet learned; nothing drifted.
    let (_, doc) = admin_json(&fleet, "/catalog").await;
    let v2_doc = doc["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "v2")
        .unwrap()
        .clone();
    assert!(v2_doc["learned_unix_ms"].is_null(), "{v2_doc}");
    assert!(
        doc["tools"].as_array().unwrap().iter().all(|t| t["drifted"] == false),
        "{doc}"
    );
    // Its first ask that answers makes it an ordinary learned backend.
    v2.refuses_the_catalog.store(false, Ordering::Relaxed);
    learned(&fleet, &[("v1", 1), ("v2", 2)]).await;
    assert_eq!(fleet.post(&[], &summarize(99)).await.worker(), "v2");
    let changes = metric(&fleet.metrics().await, "mrtr_tool_definition_changes_total");
    assert_eq!(changes, Some(0.0), "a first ask after a told list is no change");
    fleet.shutdown().await;
}

/// A tool server whose listener and open connections can be closed: after [`Stoppable::stop`],
/// connecting to it is refused.
struct Stoppable {
    connections: tokio::task::JoinSet<()>,
}

impl Stoppable {
    async fn serve(
        name: &str,
        server: &std::sync::Arc<ToolServer>,
    ) -> (BackendSpec, std::sync::Arc<tokio::sync::Mutex<Stoppable>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let spec = BackendSpec {
            name: name.to_string(),
            url: format!("http://{}", listener.local_addr().unwrap()),
            weight: 1,
        };
        let handle = std::sync::Arc::new(tokio::sync::Mutex::new(Stoppable {
            connections: tokio::task::JoinSet::new(),
        }));
        let (server, label, held) = (server.clone(), name.to_string(), handle.clone());
        let accepting = async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (server, label) = (server.clone(), label.clone());
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (server, label) = (server.clone(), label.clone());
                    async move {
                        use http_body_util::BodyExt;
                        let method = req.method().clone();
                        let body = req.into_body().collect().await?.to_bytes();
                        Ok::<_, hyper::Error>(server.answer(&label, method, body))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(sock);
                let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
                held.lock().await.connections.spawn(async move {
                    let _ = conn.await;
                });
            }
        };
        // The accepting loop too: aborted, it drops the listener.
        handle.lock().await.connections.spawn(accepting);
        (spec, handle)
    }

    /// Closes the listener and every connection: the next connect is refused.
    fn stop(&mut self) {
        self.connections.abort_all();
    }
}

/// w1 serves `tool1` (and can be stopped), w2 `tool2`, w3 only `other`, behind a router that
/// checks health hourly and never ejects (w1 stays in the ring once stopped) and may retry
/// every request; each catalog learned. Returns the router, w1's stop and w3.
async fn two_serving_one_not(
    tool1: Value,
    tool2: Value,
) -> (
    Fleet,
    std::sync::Arc<tokio::sync::Mutex<Stoppable>>,
    std::sync::Arc<ToolServer>,
) {
    let (w1, w2) = (
        ToolServer::new(json!([tool1]), true),
        ToolServer::new(json!([tool2]), true),
    );
    let w3 = ToolServer::new(json!([{"name": "other", "inputSchema": {"type": "object"}}]), true);
    let (spec1, stop1) = Stoppable::serve("w1", &w1).await;
    let specs = vec![spec1, serve("w2", &w2).await, serve("w3", &w3).await];
    let extra = format!("{ON}[health]\ninterval = \"1h\"\nunhealthy_after = 1000\n[upstream]\nretry_budget = 1.0\n");
    let fleet = Fleet::start_backends(Vec::new(), &specs, &extra).await;
    learned(&fleet, &[("w1", 1), ("w2", 1), ("w3", 1)]).await;
    (fleet, stop1, w3)
}

/// A read-only tool's call whose backend refuses the connection moves to the next backend
/// serving the tool, never to one that does not: w1 and w2 serve `ro`, w3 only `other`. With w1
/// stopped (left in the ring: health checks hourly), every call of `ro` is answered by w2.
#[tokio::test]
async fn a_call_moved_off_a_failed_backend_goes_only_where_its_tool_is_served() {
    let ro = json!({"name": "ro", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}});
    let (fleet, stop1, w3) = two_serving_one_not(ro.clone(), ro).await;
    stop1.lock().await.stop();
    let mut by = BTreeMap::new();
    for i in 0..60 {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "messageId": format!("ro-{i}"),
            "params": {"name": "ro", "arguments": {}}});
        let a = fleet.post(&[("mcp-routing-id", &format!("ro-{i}"))], &body).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
        *by.entry(a.worker()).or_insert(0) += 1;
    }
    assert_eq!(by, BTreeMap::from([("w2".to_string(), 60)]));
    assert_eq!(w3.calls.load(Ordering::Relaxed), 0, "w3 does not serve ro");
    let moved = metric_sum(&fleet.metrics().await, "mrtr_retries_total", &["reason=\"connect\""]);
    assert!(moved >= 5.0, "the ring chose w1 for some calls: {moved}");
    fleet.shutdown().await;
}

/// `t` drifted: w1 takes a string `x`, w2 an integer; w3 serves only `other`. A call with a
/// string `x` goes to w1 while it is up. With w1 refusing connections (left in the ring), the
/// call moves to w2, which serves `t` too (its own answer judges the arguments); with w1
/// draining, it goes to w2 at once: a 503 `tool_unavailable` only when no backend serving `t`
/// is up.
#[tokio::test]
async fn a_drifted_call_whose_accepting_backends_are_out_goes_among_all_serving_its_tool() {
    let t = |ty: &str| {
        json!({"name": "t", "annotations": {"readOnlyHint": true}, "inputSchema": {
            "type": "object", "properties": {"x": {"type": ty}}, "required": ["x"]}})
    };
    let (fleet, stop1, w3) = two_serving_one_not(t("string"), t("integer")).await;
    for i in 0..10 {
        assert_eq!(call_t(&fleet, i).await, "w1", "only w1's schema accepts a string x");
    }
    stop1.lock().await.stop();
    for i in 10..20 {
        assert_eq!(call_t(&fleet, i).await, "w2", "w1 refuses: moved to w2, which serves t");
    }
    let moved = metric_sum(&fleet.metrics().await, "mrtr_retries_total", &["reason=\"connect\""]);
    // Each call moved once, but one: the first may find w1's pooled connection closed and be
    // sent again as any request on a closed pooled connection is (not a retry).
    assert!((9.0..=10.0).contains(&moved), "each call was moved once: {moved}");
    let drain = format!("http://{}/backends/w1/drain", fleet.admin);
    let drained = send(&fleet.client, http::Method::POST, &drain, &[], bytes::Bytes::new()).await;
    assert_eq!(drained.status, StatusCode::OK);
    for i in 20..30 {
        assert_eq!(call_t(&fleet, i).await, "w2", "w1 draining: among all serving t");
    }
    assert_eq!(w3.calls.load(Ordering::Relaxed), 0, "w3 does not serve t");
    fleet.shutdown().await;
}

/// Who answered the `i`th new call of `t` with a string `x`.
async fn call_t(fleet: &Fleet, i: usize) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "messageId": format!("t-{i}"),
        "params": {"name": "t", "arguments": {"x": "s"}}});
    let a = fleet.post(&[("mcp-routing-id", &format!("t-{i}"))], &body).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    a.worker()
}

/// The same as a client's list over 64 KiB (a long description): it is read off the request
/// threads, after the answer is on its way, and `summarize` routes to v2 once it is. The
/// control: before any list reached v2, the ring sends some calls of it to v1.
#[tokio::test]
async fn a_large_list_a_client_gets_routes_the_new_instances_tools_too() {
    let long = "a tool that sums up a document. ".repeat(2500);
    let summarize = json!({"name": "summarize", "description": long, "inputSchema": {"type": "object"}});
    let (fleet, _v2) = learned_v1_and_new_v2(summarize).await;
    let call = |i: usize| call_summarize("big", i);
    let mut control = BTreeMap::new();
    for i in 0..30 {
        control.insert(i, fleet.post(&[], &call(i)).await.worker());
    }
    let by_ring_to_v1 = control.iter().find(|(_, w)| *w == "v1").map(|(i, _)| *i);
    let by_ring_to_v1 = by_ring_to_v1.unwrap_or_else(|| panic!("control: by the ring: {control:?}"));
    let list = a_list_from(&fleet, "v2").await;
    assert!(list.body.len() > 64 * 1024, "a large list: {} bytes", list.body.len());
    // Read on a thread of its own, after the answer left: once it is read and the routes
    // rebuilt, a call the ring sent to v1 goes to v2 (bounded wait).
    let mut tries = 0;
    while fleet.post(&[], &call(by_ring_to_v1)).await.worker() != "v2" {
        tries += 1;
        assert!(tries < 250, "the large list was never read");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for i in 0..30 {
        assert_eq!(fleet.post(&[], &call(i)).await.worker(), "v2", "call {i}");
    }
    fleet.shutdown().await;
}

/// v1 serving `lookup`, learned; v2, new, serving `lookup` and `summarize` (its definition)
/// but refusing the catalog's asks, so that only what it tells clients is known of it.
async fn learned_v1_and_new_v2(summarize: Value) -> (Fleet, std::sync::Arc<ToolServer>) {
    let v1 = ToolServer::new(json!([lookup(false)]), true);
    let v2 = ToolServer::new(json!([lookup(false), summarize]), true);
    v2.refuses_the_catalog.store(true, Ordering::Relaxed);
    let specs = vec![serve("v1", &v1).await, serve("v2", &v2).await];
    let fleet = Fleet::start_backends(Vec::new(), &specs, ON).await;
    learned(&fleet, &[("v1", 1)]).await;
    (fleet, v2)
}

/// The `i`th new call of `summarize`, keyed `{prefix}-{i}`.
fn call_summarize(prefix: &str, i: usize) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "messageId": format!("{prefix}-{i}"),
        "params": {"name": "summarize", "arguments": {}}})
}

/// A client's `tools/list` answered by `backend` (keyless lists go to either backend: bounded
/// tries).
async fn a_list_from(fleet: &Fleet, backend: &str) -> Answer {
    for i in 0..50 {
        let list = fleet
            .post(&[], &json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"}))
            .await;
        if list.worker() == backend {
            return list;
        }
    }
    panic!("no list reached {backend} in 50 tries");
}
