//! `[catalog]` over prompts and resources (docs/src/catalog.md, "Routing by tool"): the router
//! learns the prompts and resources each backend declares and lists, over either protocol, and
//! a new `prompts/get` or `resources/read` goes only to the backends listing its prompt or URI.
//! What no backend lists, or what only backends that are out list, goes as any request.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::catalog::{admin_json, learned, serve, ToolServer, ON};
use crate::support::*;

/// Requests sent per spread: enough that the ring alone reaches both backends.
const SPREAD: usize = 30;

fn get_prompt(prompt: &str, mid: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "messageId": mid, "params": {"name": prompt}})
}

fn read_resource(uri: &str, mid: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "messageId": mid, "params": {"uri": uri}})
}

/// Where [`SPREAD`] new requests go, by backend; each made by `request` of its own `messageId`
/// (`label` and a number: no two spreads share a key, so none follows another's pin).
async fn spread(fleet: &Fleet, label: &str, request: impl Fn(&str) -> Value) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for i in 0..SPREAD {
        let a = fleet.post(&[], &request(&format!("{label}-{i}"))).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
        *seen.entry(a.worker()).or_insert(0) += 1;
    }
    seen
}

/// `first` serves the prompt "greet" and the resource "file:///a"; `second` neither. Both
/// serve the tool "t" (so that the catalog's learning them shows as one tool each).
async fn two_backends(first_modern: bool) -> (Arc<ToolServer>, Vec<BackendSpec>) {
    let tool = json!([{"name": "t", "inputSchema": {"type": "object"}}]);
    let first = ToolServer::new(tool.clone(), first_modern);
    *first.prompts.lock() = vec!["greet".into()];
    *first.resources.lock() = vec!["file:///a".into()];
    let second = ToolServer::new(tool, !first_modern);
    let specs = vec![serve("first", &first).await, serve("second", &second).await];
    (first, specs)
}

/// One backend's member of `/catalog`.
async fn catalog_of(fleet: &Fleet, backend: &str) -> Value {
    let (_, doc) = admin_json(fleet, "/catalog").await;
    let backends = doc["backends"].as_array().cloned().unwrap_or_default();
    backends
        .into_iter()
        .find(|b| b["name"] == backend)
        .unwrap_or(Value::Null)
}

/// Learned by a backend asked as `first_modern` says (the other one the other way), new
/// `prompts/get` and `resources/read` go where the prompt and the URI are listed; the rest
/// goes by the ring, and so does what only a drained backend lists.
async fn routed_by_what_backends_list(first_modern: bool) {
    let (_, specs) = two_backends(first_modern).await;
    let fleet = Fleet::start_backends(Vec::new(), &specs, ON).await;
    learned(&fleet, &[("first", 1), ("second", 1)]).await;
    let first = catalog_of(&fleet, "first").await;
    assert_eq!(first["prompts"], json!(["greet"]), "{first}");
    assert_eq!(first["resources"], json!(["file:///a"]), "{first}");
    let second = catalog_of(&fleet, "second").await;
    assert_eq!((&second["prompts"], &second["resources"]), (&json!([]), &json!([])));

    let greet = spread(&fleet, "greet", |mid| get_prompt("greet", mid)).await;
    assert_eq!(greet, BTreeMap::from([("first".into(), SPREAD)]));
    let read = spread(&fleet, "read", |mid| read_resource("file:///a", mid)).await;
    assert_eq!(read, BTreeMap::from([("first".into(), SPREAD)]));
    // Nobody lists it: the ring alone decides, and reaches both.
    let nobody = spread(&fleet, "nobody", |mid| get_prompt("nobody-lists-this", mid)).await;
    assert_eq!(nobody.len(), 2, "{nobody:?}");
    let unlisted = spread(&fleet, "unlisted", |mid| read_resource("file:///nobody", mid)).await;
    assert_eq!(unlisted.len(), 2, "{unlisted:?}");

    // Every backend listing it is out: the request goes as any request (no 503), and the
    // backend's own error is the answer.
    let drained = send(
        &fleet.client,
        Method::POST,
        &format!("http://{}/backends/first/drain", fleet.admin),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(drained.status, StatusCode::OK);
    let a = fleet.post(&[], &get_prompt("greet", "after-drain")).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.worker(), "second");
    assert_eq!(a.json()["error"]["code"], -32602, "the backend's own error");
    let a = fleet.post(&[], &read_resource("file:///a", "after-drain")).await;
    assert_eq!((a.status, a.worker()), (StatusCode::OK, "second".to_string()));
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_modern_backend_s_prompts_and_resources_route_new_requests() {
    routed_by_what_backends_list(true).await;
}

#[tokio::test]
async fn a_session_backend_s_prompts_and_resources_route_new_requests() {
    routed_by_what_backends_list(false).await;
}

/// The control: with the catalog off, or with `route_by_tool = false`, the ring alone sends
/// some new `prompts/get` of "greet" to the backend that does not list it.
#[tokio::test]
async fn without_routing_by_tool_the_ring_alone_decides() {
    let (_, specs) = two_backends(true).await;
    let off = Fleet::start_backends(Vec::new(), &specs, "").await;
    let greet = spread(&off, "greet", |mid| get_prompt("greet", mid)).await;
    assert!(greet.get("second").is_some_and(|&n| n > 0), "{greet:?}");
    off.shutdown().await;

    let ring_only = format!("{ON}route_by_tool = false\n");
    let fleet = Fleet::start_backends(Vec::new(), &specs, &ring_only).await;
    learned(&fleet, &[("first", 1), ("second", 1)]).await;
    assert_eq!(catalog_of(&fleet, "first").await["prompts"], json!(["greet"]));
    let greet = spread(&fleet, "greet", |mid| get_prompt("greet", mid)).await;
    assert!(greet.get("second").is_some_and(|&n| n > 0), "{greet:?}");
    fleet.shutdown().await;
}

/// A backend that declares prompts and fails to list them: its ask still succeeds, its tools
/// and resources are learned, and its prompts are unknown (none).
#[tokio::test]
async fn a_prompt_list_that_fails_fails_no_ask() {
    let (first, mut specs) = two_backends(true).await;
    let failing = test_backend("first", move |method, body: Bytes| {
        let first = first.clone();
        async move {
            let msg: Value = serde_json::from_slice(&body).unwrap_or_default();
            if msg["method"] != "prompts/list" {
                return first.answer("first", method, body);
            }
            let error = json!({"code": -32603, "message": "broken"});
            let refused = json!({"jsonrpc": "2.0", "id": msg["id"], "error": error});
            http::Response::new(http_body_util::Full::new(Bytes::from(refused.to_string())))
        }
    })
    .await;
    specs[0] = failing;
    let fleet = Fleet::start_backends(Vec::new(), &specs, ON).await;
    learned(&fleet, &[("first", 1), ("second", 1)]).await;
    let first = catalog_of(&fleet, "first").await;
    assert_eq!(first["last_error"], Value::Null, "{first}");
    assert_eq!(first["prompts"], json!([]), "{first}");
    assert_eq!(first["resources"], json!(["file:///a"]), "{first}");
    let read = spread(&fleet, "read", |mid| read_resource("file:///a", mid)).await;
    assert_eq!(read, BTreeMap::from([("first".into(), SPREAD)]));
    let metrics = fleet.metrics().await;
    let refused = "mrtr_catalog_refreshes_total{backend=\"first\",result=\"refused\"}";
    assert_eq!(metric(&metrics, refused), Some(0.0));
    fleet.shutdown().await;
}

/// A backend's prompts or resources change, and the stream a client listens on says so
/// (`notifications/prompts/list_changed`, then `notifications/resources/list_changed`): the
/// catalog asks it again at once, though its interval is an hour.
#[tokio::test]
async fn a_prompts_or_resources_change_heard_in_passing_has_the_backend_asked_again() {
    let (first, specs) = two_backends(true).await;
    let hourly = "[catalog]\nenabled = true\ninterval = \"1h\"\ntimeout = \"2s\"\n";
    // `first` alone: the stream a client opens is its.
    let fleet = Fleet::start_backends(Vec::new(), &specs[..1], hourly).await;
    learned(&fleet, &[("first", 1)]).await;
    assert_eq!(catalog_of(&fleet, "first").await["prompts"], json!(["greet"]));
    for (notice, field, now) in [
        (
            "notifications/prompts/list_changed",
            "prompts",
            json!(["greet", "wave"]),
        ),
        (
            "notifications/resources/list_changed",
            "resources",
            json!(["file:///a", "file:///b"]),
        ),
    ] {
        // Only what the notice names changes: the ask it has made learns it.
        match field {
            "prompts" => *first.prompts.lock() = vec!["greet".into(), "wave".into()],
            _ => *first.resources.lock() = vec!["file:///a".into(), "file:///b".into()],
        }
        *first.notice.lock() = notice;
        let accept = [("accept", "text/event-stream")];
        let stream = send(&fleet.client, Method::GET, &fleet.url(), &accept, Bytes::new()).await;
        assert!(String::from_utf8_lossy(&stream.body).contains(notice));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while catalog_of(&fleet, "first").await[field] != now {
            assert!(
                std::time::Instant::now() < deadline,
                "{notice}: asked again, {field} learned"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    fleet.shutdown().await;
}
