//! The `requestState` dialect (docs/src/dialects.md) against a server that writes its states the way some JSON
//! encoders do, and that may ask again with the same state: the router pins, seals and restores
//! the state the client actually sees and echoes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::support::*;
use bytes::Bytes;
use http::Method;
use mrtr_router::internals::PinKind;
use serde_json::json;

const KEY_A: &str = "key-a-0123456789abcdef0123456789abcdef";

/// A 2026-07-28 server (docs/src/dialects.md) that writes its `requestState`s the way some JSON encoders
/// do (`\/`, `\u00e9`), echoes the state in its text first, and resumes only states it issued.
struct StateServer {
    name: String,
    issued: Mutex<std::collections::HashSet<String>>,
    /// Follow-ups whose state this instance did not issue (answered 400, as the SDK does).
    refused: AtomicUsize,
    /// Rounds to ask again with the same state before the call is done.
    reasks: usize,
    /// Follow-ups served so far.
    resumed: AtomicUsize,
}

fn tokens(key: &str) -> String {
    format!("[tokens]\nkeys = [\"{key}\"]\n")
}

async fn start_state_server(name: &str, reasks: usize) -> (BackendSpec, Arc<StateServer>) {
    let st = Arc::new(StateServer {
        name: name.to_string(),
        issued: Default::default(),
        refused: Default::default(),
        reasks,
        resumed: Default::default(),
    });
    let server = st.clone();
    let spec = test_backend(name, move |_, body| {
        let st = server.clone();
        async move { st.answer(&body) }
    })
    .await;
    (spec, st)
}

impl StateServer {
    fn answer(&self, body: &[u8]) -> http::Response<http_body_util::Full<Bytes>> {
        let req: serde_json::Value = serde_json::from_slice(body).unwrap();
        let (status, text) = match req["params"]["requestState"].as_str() {
            Some(state) if self.issued.lock().unwrap().contains(state) => {
                match self.resumed.fetch_add(1, Ordering::SeqCst) < self.reasks {
                    true => (200, input_required(&req["id"], &escape(state))),
                    false => (
                        200,
                        json!({"jsonrpc":"2.0","id":req["id"],"result":{"content":[{"type":"text","text":self.name}]}})
                            .to_string(),
                    ),
                }
            }
            Some(_) => {
                self.refused.fetch_add(1, Ordering::SeqCst);
                let error = json!({"code":-32602,"message":"Invalid or expired requestState"});
                (400, json!({"jsonrpc":"2.0","id":req["id"],"error":error}).to_string())
            }
            None => {
                let mut issued = self.issued.lock().unwrap();
                // Odd states are not ASCII (carried base64 in the token), even ones carry a `/`
                // as is, which a client's encoder may escape in the token it echoes.
                let n = issued.len();
                let state = match n % 2 {
                    0 => format!("{}/{n}", self.name),
                    _ => format!("{}/é/{n}", self.name),
                };
                issued.insert(state.clone());
                (200, input_required(&req["id"], &escape(&state)))
            }
        };
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(text)))
            .unwrap()
    }
}

/// The state as some encoders write it: `/` and non-ASCII escaped.
fn escape(state: &str) -> String {
    state.replace('/', "\\/").replace('é', "\\u00e9")
}

/// An `input_required` answer that also shows the state in its text, before the field.
fn input_required(id: &serde_json::Value, escaped: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{escaped}"}}],"resultType":"input_required","inputRequests":{{"confirm":{{}}}},"requestState":"{escaped}"}}}}"#
    )
}

fn call(id: u32, state: Option<&str>) -> Bytes {
    let state = state.map_or(String::new(), |s| format!(r#","requestState":{s}"#));
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x","arguments":{{}}{state}}}}}"#)
        .into()
}

async fn servers(n: usize, reasks: usize) -> (Vec<BackendSpec>, Vec<Arc<StateServer>>) {
    let mut specs = Vec::new();
    let mut servers = Vec::new();
    for i in 0..n {
        let (spec, st) = start_state_server(&format!("state-{i}"), reasks).await;
        specs.push(spec);
        servers.push(st);
    }
    (specs, servers)
}

#[tokio::test]
async fn states_written_with_escapes_are_sealed_and_restored() {
    let (specs, servers) = servers(3, 0).await;
    let fleet = Fleet::start_backends(Vec::new(), &specs, &tokens(KEY_A)).await;
    let mut escaped_slashes = 0;
    for i in 0..24 {
        let first = send(&fleet.client, Method::POST, &fleet.url(), &[], call(1, None)).await;
        assert_eq!(first.status, 200, "{first:?}");
        let v = first.json();
        let wrapped = v["result"]["requestState"].as_str().unwrap().to_string();
        assert!(wrapped.starts_with("mrt2."), "call {i}: the state is sealed: {v}");
        let text = v["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("state-"), "call {i}: the text is left as it was: {v}");
        // The client echoes the token; every other one through an encoder that escapes `/`.
        let echoed = match i % 4 < 2 {
            true => format!("\"{wrapped}\""),
            false => {
                escaped_slashes += wrapped.matches('/').count();
                format!("\"{}\"", wrapped.replace('/', "\\/"))
            }
        };
        let retry = send(&fleet.client, Method::POST, &fleet.url(), &[], call(2, Some(&echoed))).await;
        assert_eq!(retry.status, 200, "call {i}: {retry:?}");
        let holder = text.split('/').next().unwrap();
        assert_eq!(retry.json()["result"]["content"][0]["text"], holder, "call {i}");
    }
    let refused: usize = servers.iter().map(|s| s.refused.load(Ordering::SeqCst)).sum();
    assert_eq!(refused, 0);
    assert!(escaped_slashes > 0, "no echoed token had a `/` to escape");
}

/// A server may ask again with the very state it asked with: the pin that routes the next
/// round is that state's, and it must stay a live pin (not one finished by its own round).
#[tokio::test]
async fn a_state_asked_for_again_stays_pinned() {
    let (specs, servers) = servers(3, 1).await;
    let fleet = Fleet::start_backends(Vec::new(), &specs, "").await;
    let first = send(&fleet.client, Method::POST, &fleet.url(), &[], call(1, None)).await;
    let v = first.json();
    let state = serde_json::to_string(&v["result"]["requestState"]).unwrap();
    let holder = v["result"]["requestState"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let again = send(&fleet.client, Method::POST, &fleet.url(), &[], call(2, Some(&state))).await;
    assert_eq!(again.json()["result"]["resultType"], "input_required", "{again:?}");
    assert_eq!(again.json()["result"]["requestState"], v["result"]["requestState"]);
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_pins_finished_total{kind=\"request_state\"}"),
        Some(0.0)
    );
    assert_eq!(metric(&m, "mrtr_pins{kind=\"request_state\"}"), Some(1.0));
    let done = send(&fleet.client, Method::POST, &fleet.url(), &[], call(3, Some(&state))).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], holder.as_str(), "{done:?}");
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_route_decisions_total{source=\"pin\"}"), Some(2.0));
    assert_eq!(
        metric(&m, "mrtr_pins_finished_total{kind=\"request_state\"}"),
        Some(1.0)
    );
    let refused: usize = servers.iter().map(|s| s.refused.load(Ordering::SeqCst)).sum();
    assert_eq!(refused, 0);
}

/// A server that answers each round over SSE, its messages full of the names and texts the
/// router looks for in places that carry no meaning for it: a request to the client whose
/// params hold `result` and `error` objects, a log notification with an `error`, content text
/// that spells a whole `input_required` result. Each message is read by its structure
/// (docs/src/dialects.md): the state is pinned and sealed by the real `input_required` answer
/// only, nothing finishes the call early, and the final answer ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_read_by_their_structure_not_by_the_names_in_them() {
    let spec = test_backend("noisy-1", |_: Method, body: Bytes| async move {
        let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let id = &req["id"];
        let decoy = r#"{\"resultType\":\"input_required\",\"requestState\":\"decoy\"}"#;
        let mut events = vec![
            json!({"jsonrpc":"2.0","id":90,"method":"elicitation/create",
                "params":{"message":"\"result\"","result":{"pending":true},"error":{"code":1},
                          "requestedSchema":{"properties":{"result":{"type":"string"}}}}})
            .to_string(),
            json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":{"error":"x","result":1}}}).to_string(),
        ];
        let last = match req["params"]["requestState"].as_str() {
            None => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{decoy}"}}],"resultType":"input_required","inputRequests":{{"ask":{{"error":{{"code":2}},"result":"\"error\""}}}},"requestState":"state-noisy"}}}}"#
            ),
            Some("state-noisy") => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{decoy}"}}],"structuredContent":{{"resultType":"input_required","requestState":"x","pending":true}}}}}}"#
            ),
            Some(other) => panic!("the backend got back a state it did not issue: {other}"),
        };
        events.push(last);
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(http_body_util::Full::new(Bytes::from(body)))
            .unwrap()
    })
    .await;
    let fleet = Fleet::start_backends(Vec::new(), &[spec], &tokens(KEY_A)).await;
    let first = send(&fleet.client, Method::POST, &fleet.url(), &[], call(1, None)).await;
    let text = String::from_utf8_lossy(&first.body).to_string();
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "{text}");
    let sealed = events[2]["result"]["requestState"].as_str().unwrap().to_string();
    assert!(sealed.starts_with("mrt2."), "the real state is sealed: {text}");
    assert_eq!(text.matches("mrt2.").count(), 1, "and nothing else is: {text}");
    let pin = fleet
        .control
        .pin(PinKind::RequestState, &sealed)
        .expect("the state is pinned");
    assert!(!pin.finished);
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_pins_finished_total{kind=\"request_state\"}"),
        Some(0.0)
    );
    let retry = send(
        &fleet.client,
        Method::POST,
        &fleet.url(),
        &[],
        call(2, Some(&format!("\"{sealed}\""))),
    )
    .await;
    let text = String::from_utf8_lossy(&retry.body).to_string();
    assert!(!text.contains("mrt2."), "a final answer pins nothing: {text}");
    assert!(
        fleet.control.pin(PinKind::RequestState, &sealed).unwrap().finished,
        "the final answer ends the call"
    );
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_pins_created_total{kind=\"request_state\"}"), Some(1.0));
    assert_eq!(
        metric(&m, "mrtr_pins_finished_total{kind=\"request_state\"}"),
        Some(1.0)
    );
}
