//! OpenTelemetry traces (docs/src/observability.md) seen by a real collector on a socket (`crate::support::otlp`,
//! OTLP/HTTP protobuf): which spans a call makes, how they nest, what they say, which context
//! the backend gets, how sampling decides, and that a collector that fails or is gone changes
//! nothing for clients.

use std::time::{Duration, Instant};

use crate::support::otlp::{Collector, Span, CLIENT, SERVER, STATUS_ERROR};
use crate::support::{confirm, metric, start_call, BackendSpec, Fleet};
use serde_json::json;

/// The trace a client started: its trace id and the id of its span the router's are children of.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(trace: &str, span: &str, sampled: bool) -> String {
    format!("00-{trace}-{span}-{}", if sampled { "01" } else { "00" })
}

fn tracing_config(collector: &Collector, extra: &str) -> String {
    format!("[tracing]\notlp_endpoint = \"{}\"\n{extra}", collector.endpoint())
}

/// The spans of `kind` (SERVER, CLIENT), in the order they arrived.
fn of_kind(spans: &[Span], kind: i32) -> Vec<Span> {
    spans.iter().filter(|s| s.kind == kind).cloned().collect()
}

fn child_of<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.parent_span_id == parent.span_id).collect()
}

#[tokio::test]
async fn a_two_round_call_is_one_trace_its_rounds_siblings_under_the_clients_span() {
    let collector = Collector::start().await;
    let fleet = Fleet::start(2, &tracing_config(&collector, "")).await;
    let tp = traceparent(TRACE, CLIENT_SPAN, true);
    let headers = [
        ("traceparent", tp.as_str()),
        ("tracestate", "vendor=opaque"),
        ("mcp-protocol-version", "2025-11-25"),
    ];

    let first = fleet.post(&headers, &start_call("call-t1", 2)).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["result"]["pending"], true, "{:?}", first.json());
    let second = fleet.post(&headers, &confirm("call-t1", 2)).await;
    assert_eq!(second.status, 200);
    let worker = first.worker();
    assert_eq!(second.worker(), worker, "round 2 reached the instance holding the call");

    // Two server spans (one per round) and one client span under each.
    let spans = collector.wait_for_trace(TRACE, 4).await;
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let servers = of_kind(&spans, SERVER);
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let round = |method: &str| {
        servers
            .iter()
            .find(|s| s.attr("mcp.method.name") == Some(method))
            .unwrap()
    };
    let (r1, r2) = (round("tools/call"), round("confirm"));
    for (s, source, pin) in [(r1, "ring", "client created"), (r2, "pin", "client used")] {
        assert_eq!(
            s.parent_span_id, CLIENT_SPAN,
            "the rounds are siblings under the client's span: {s:#?}"
        );
        assert_eq!(s.service_name, "mrtr-router");
        assert_eq!(s.attr("mrtr.route.source"), Some(source), "{s:#?}");
        assert_eq!(s.attr("mrtr.backend"), Some(worker.as_str()), "{s:#?}");
        assert_eq!(s.attr("mrtr.pin.kind"), Some(pin), "{s:#?}");
        assert_eq!(s.attr("mcp.protocol.version"), Some("2025-11-25"));
        assert_eq!(s.attr("http.response.status_code"), Some("200"));
        assert_eq!(s.attr("error.type"), None);
        assert_ne!(s.status_code, STATUS_ERROR);
    }
    assert_eq!(r1.name, "tools/call transfer-funds");
    assert_eq!(r1.attr("gen_ai.tool.name"), Some("transfer-funds"));
    assert_eq!(r2.name, "confirm");
    assert_eq!(r2.attr("gen_ai.tool.name"), None);

    // Each round's client span is its server span's child, and is the parent the backend got.
    let seen = fleet.worker(&worker).state.trace_headers.lock().clone();
    let mut sent = Vec::new();
    for server in [r1, r2] {
        let clients = child_of(&spans, server);
        assert_eq!(clients.len(), 1, "{spans:#?}");
        let client = clients[0];
        assert_eq!(client.kind, CLIENT);
        assert_eq!(client.attr("mrtr.backend"), Some(worker.as_str()));
        assert_eq!(client.attr("http.response.status_code"), Some("200"));
        sent.push((traceparent(TRACE, &client.span_id, true), "vendor=opaque".to_string()));
    }
    assert_eq!(
        seen, sent,
        "the backend continues the same trace, under the router's client span"
    );
    // `params._meta` and the body are the client's: the backend answered the rounds as usual.
    assert_eq!(second.json()["result"]["execution"], 1, "{:?}", second.json());
    fleet.shutdown().await;
}

#[tokio::test]
async fn fresh_traces_follow_sample_ratio_and_a_sampled_client_context_is_always_followed() {
    let collector = Collector::start().await;
    let fleet = Fleet::start(1, &tracing_config(&collector, "sample_ratio = 0.0\n")).await;
    let worker = &fleet.workers[0];
    let whoami = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}});

    // A trace the router would start: not sampled. The backend is told so (flags 00).
    let a = fleet.post(&[], &whoami).await;
    assert_eq!(a.status, 200);
    let (tp, _) = worker.state.trace_headers.lock()[0].clone();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "00"), "{tp}");
    let unsampled_trace = parts[1].to_string();

    // A client's sampled trace is followed whatever the ratio.
    let other = "0af7651916cd43dd8448eb211c80319c";
    let tp = traceparent(other, "b7ad6b7169203331", true);
    let b = fleet.post(&[("traceparent", &tp)], &whoami).await;
    assert_eq!(b.status, 200);
    let spans = collector.wait_for_trace(other, 2).await;
    assert_eq!(of_kind(&spans, SERVER)[0].parent_span_id, "b7ad6b7169203331");
    // Spans leave in the order they ended: the unsampled request's would have come first.
    let all = collector.spans();
    assert!(
        all.iter().all(|s| s.trace_id == other),
        "only the sampled trace: {all:#?}"
    );
    assert!(collector.trace(&unsampled_trace).is_empty());

    // A client's unsampled context is followed too: no spans, and the backend hears "not sampled".
    let c = fleet
        .post(&[("traceparent", &traceparent(TRACE, CLIENT_SPAN, false))], &whoami)
        .await;
    assert_eq!(c.status, 200);
    let (tp, _) = worker.state.trace_headers.lock().last().cloned().unwrap();
    assert!(tp.starts_with(&format!("00-{TRACE}-")) && tp.ends_with("-00"), "{tp}");
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_refused_connect_shows_two_client_spans_and_router_errors_name_their_reason() {
    let collector = Collector::start().await;
    let worker = crate::support::start_worker("worker-0").await;
    // A backend whose port refuses; active health checks kept out of the way.
    let dead = BackendSpec {
        name: "dead".to_string(),
        url: format!("http://127.0.0.1:{}", crate::support::free_port()),
        weight: 1,
    };
    let specs = vec![crate::support::specs_of(std::slice::from_ref(&worker)).remove(0), dead];
    let extra = tracing_config(&collector, "[health]\ninterval = \"1h\"\n");
    let fleet = Fleet::start_backends(vec![worker], &specs, &extra).await;
    let key = (0..1000)
        .map(|i| format!("key-{i}"))
        .find(|k| fleet.control.view().ring_owner(k).as_deref() == Some("dead"))
        .expect("some key maps to the dead backend");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}});
    let a = fleet.post(&[("mcp-routing-id", &key)], &body).await;
    assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "worker-0"));

    let spans = wait_for_root_trace(&collector, 3).await;
    let server = &of_kind(&spans, SERVER)[0];
    assert_eq!(
        server.parent_span_id, "",
        "a trace the router started has its server span at the root"
    );
    assert_eq!(
        server.attr("mrtr.backend"),
        Some("worker-0"),
        "where it went in the end"
    );
    assert_eq!(server.attr("mrtr.route.source"), Some("ring"));
    let clients = child_of(&spans, server);
    assert_eq!(clients.len(), 2, "one client span per attempt: {spans:#?}");
    let attempt = |backend: &str| {
        *clients
            .iter()
            .find(|c| c.attr("mrtr.backend") == Some(backend))
            .unwrap()
    };
    let (refused, served) = (attempt("dead"), attempt("worker-0"));
    assert_eq!(
        (refused.attr("error.type"), refused.status_code),
        (Some("connect"), STATUS_ERROR)
    );
    assert_eq!(served.attr("http.response.status_code"), Some("200"));
    assert_eq!(served.attr("error.type"), None);

    // A request the router answers itself: `error.type` is its `Mcp-Router-Error` reason.
    let bad = crate::support::send(
        &fleet.client,
        http::Method::POST,
        &fleet.url(),
        &[],
        bytes::Bytes::from_static(b"{not json"),
    )
    .await;
    assert_eq!(bad.router_error(), Some("parse_error"));
    crate::support::eventually(Duration::from_secs(20), "the parse error's span", || {
        collector
            .spans()
            .iter()
            .any(|s| s.attr("error.type") == Some("parse_error"))
    })
    .await;
    let spans = collector.spans();
    let failed = spans
        .iter()
        .find(|s| s.attr("error.type") == Some("parse_error"))
        .unwrap();
    assert_eq!((failed.kind, failed.status_code), (SERVER, STATUS_ERROR));
    assert_eq!(failed.attr("http.response.status_code"), Some("400"));
    assert!(child_of(&spans, failed).is_empty(), "no upstream attempt");
    fleet.shutdown().await;
}

/// Waits for a trace the router started (any trace id) to have `n` spans.
async fn wait_for_root_trace(collector: &Collector, n: usize) -> Vec<Span> {
    let root_trace = || {
        let spans = collector.spans();
        let root = spans.iter().find(|s| s.kind == SERVER && s.parent_span_id.is_empty())?;
        let trace = collector.trace(&root.trace_id);
        (trace.len() >= n).then_some(trace)
    };
    crate::support::eventually(Duration::from_secs(20), "a trace the router started", || {
        root_trace().is_some()
    })
    .await;
    root_trace().unwrap()
}

#[tokio::test]
async fn a_collector_that_refuses_or_is_gone_changes_nothing_for_clients() {
    let collector = Collector::start().await;
    collector.answer_with(500);
    let fleet = Fleet::start(2, &tracing_config(&collector, "")).await;
    let dropped = |text: &str| metric(text, "mrtr_spans_dropped_total").unwrap_or(0.0);
    assert_eq!(dropped(&fleet.metrics().await), 0.0);
    let whoami = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}});
    let serve_some = |n: usize| {
        let fleet = &fleet;
        let whoami = &whoami;
        async move {
            let started = Instant::now();
            for _ in 0..n {
                let a = fleet.post(&[], whoami).await;
                assert_eq!(a.status, 200, "{:?}", a.body);
            }
            started.elapsed()
        }
    };

    // Refused exports: the spans are counted as dropped; requests are served as ever.
    let took = serve_some(20).await;
    assert!(took < Duration::from_secs(10), "{took:?}");
    let mut refused = 0.0;
    for _ in 0..400 {
        refused = dropped(&fleet.metrics().await);
        if refused >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused >= 1.0, "refused exports count their spans as dropped");
    assert!(collector.requests.load(std::sync::atomic::Ordering::SeqCst) >= 1);

    // No collector at all: the same.
    collector.stop().await;
    let took = serve_some(20).await;
    assert!(took < Duration::from_secs(10), "{took:?}");
    let mut gone = refused;
    for _ in 0..400 {
        gone = dropped(&fleet.metrics().await);
        if gone > refused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gone > refused,
        "spans for a collector that is gone are dropped and counted: {gone}"
    );
    fleet.shutdown().await;
}
