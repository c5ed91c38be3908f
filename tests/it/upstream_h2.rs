//! HTTP/2 to backends (`[upstream] http2`, `[[backend]] http2`): concurrent requests share one
//! connection (h2c and over TLS, ALPN h2), a new connection opens only when the backend's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` are all taken, a GOAWAY in the middle of a load loses no
//! request, a refused stream is sent once more (pinned or not), and SSE streams event by event
//! with a client that leaves resetting its upstream stream.

use crate::support::tls_backend;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tls_backend::*;
use tokio::net::TcpListener;
use tokio::sync::{Barrier, Notify};

fn opened(m: &str, backend: &str) -> f64 {
    metric(
        m,
        &format!("mrtr_upstream_connections_opened_total{{backend=\"{backend}\"}}"),
    )
    .unwrap_or(0.0)
}

fn resends(m: &str, backend: &str) -> f64 {
    metric(m, &format!("mrtr_upstream_resends_total{{backend=\"{backend}\"}}")).unwrap_or(0.0)
}

/// Opens an SSE `stream` call through the router; the answer's head.
async fn open_stream(fleet: &Fleet, args: Value) -> http::Response<Incoming> {
    let req = Request::post(fleet.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Full::new(Bytes::from(stream_call(None, args).to_string())))
        .unwrap();
    tokio::time::timeout(REQUEST_DEADLINE, fleet.client.request(req))
        .await
        .expect("an answer in time")
        .expect("the router answers")
}

/// `n` SSE streams held open at once (each has sent its first event and waits for a permit),
/// then released and read to their end.
async fn concurrent_streams(fleet: &Fleet, worker: &mrtr_router::example::Worker, n: usize) {
    let mut bodies = Vec::new();
    for _ in 0..n {
        let resp = open_stream(fleet, json!({"events": 2, "gated": true})).await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        read_until(&mut body, "\"progress\":1").await;
        bodies.push(body);
    }
    // All `n` are in flight at once on the backend now.
    assert_eq!(worker.state.streams_closed.load(Ordering::SeqCst), 0);
    for _ in 0..n {
        worker.state.release();
    }
    for mut body in bodies {
        let rest = read_until(&mut body, "\"result\"").await;
        assert!(rest.contains("\"progress\":2"), "{rest}");
    }
}

#[tokio::test]
async fn concurrent_requests_to_an_h2c_backend_share_one_connection() {
    let worker = start_worker("h2c").await;
    let extra = "[health]\ninterval = \"1h\"\npath = \"/status/200\"\n[upstream]\nhttp2 = true\n";
    let fleet = Fleet::start_with(vec![worker], extra).await;
    // The health check's GET opened the connection (and went over it).
    eventually(Duration::from_secs(10), "the health check's request", || {
        fleet.total_requests() == 1
    })
    .await;
    concurrent_streams(&fleet, &fleet.workers[0], 20).await;
    let bodies: Vec<Value> = (0..20).map(|i| start_call(&format!("h2-{i}"), 2)).collect();
    let all: Vec<_> = bodies.iter().map(|b| fleet.post(&[], b)).collect();
    for a in futures_util::future::join_all(all).await {
        assert_eq!(a.json()["result"]["pending"], true, "{a:?}");
    }
    let m = fleet.metrics().await;
    assert_eq!(opened(&m, "h2c"), 1.0, "{m}");
    assert_eq!(fleet.workers[0].state.connections.load(Ordering::SeqCst), 1);
    fleet.shutdown().await;
}

#[tokio::test]
async fn concurrent_requests_to_an_h2_backend_over_tls_share_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let worker = start_worker("h2-tls").await;
    let front = tls_front(worker.addr, &ca.server(&["localhost"]), None).await;
    let spec = BackendSpec {
        name: "h2-tls".into(),
        url: format!("https://localhost:{}", front.addr.port()),
        weight: 1,
    };
    // HTTP/2 for this backend only, by its own key.
    let extra = format!(
        "[health]\ninterval = \"1h\"\npath = \"/status/200\"\n[upstream]\ntls_ca = \"{}\"\n",
        ca_file.display()
    );
    let fleet = Fleet::start_backends(vec![worker], &[spec], &extra).await;
    // The health check's GET, over HTTP/1.1 and TLS.
    eventually(Duration::from_secs(10), "the health check's request", || {
        fleet.total_requests() == 1
    })
    .await;
    let text = std::fs::read_to_string(&fleet.config_path).unwrap();
    std::fs::write(&fleet.config_path, format!("{text}http2 = true\n")).unwrap();
    fleet.control.reload().expect("reload accepted");
    assert!(fleet.control.config().backends[0].http2 == Some(true));
    let before = front.handshakes();
    assert_eq!(front.alpn_h2(), 0, "HTTP/1.1 before the reload");
    concurrent_streams(&fleet, &fleet.workers[0], 20).await;
    // Twenty streams at once on one new TLS connection, HTTP/2 by ALPN.
    assert_eq!(front.handshakes() - before, 1);
    assert_eq!(front.alpn_h2(), 1);
    let m = fleet.metrics().await;
    assert_eq!(
        opened(&m, "h2-tls"),
        2.0,
        "one HTTP/1.1 connection before the reload, one HTTP/2 after:\n{m}"
    );
    fleet.shutdown().await;
}

/// A hyper HTTP/2 (h2c) backend with its own stream limit and per-connection behaviour: counts
/// connections and the requests (by `x-test-id`) it processed; each request waits on
/// `barrier` when given; with `goaway_after`, each connection is shut down gracefully (GOAWAY)
/// once it has served that many requests.
struct H2Backend {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    processed: Arc<Mutex<HashMap<String, u32>>>,
}

async fn h2_backend(max_streams: u32, barrier: Option<Arc<Barrier>>, goaway_after: Option<u64>) -> H2Backend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = H2Backend {
        addr: listener.local_addr().unwrap(),
        connections: Default::default(),
        processed: Default::default(),
    };
    let (connections, processed) = (backend.connections.clone(), backend.processed.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let (processed, barrier) = (processed.clone(), barrier.clone());
            let served = Arc::new(AtomicU64::new(0));
            let enough = Arc::new(Notify::new());
            let (served2, enough2) = (served.clone(), enough.clone());
            let svc = service_fn(move |req: Request<Incoming>| {
                let (processed, barrier, served, enough) =
                    (processed.clone(), barrier.clone(), served2.clone(), enough2.clone());
                async move {
                    let id = req.headers().get("x-test-id").map(|v| v.to_str().unwrap().to_string());
                    if let Some(id) = id {
                        *processed.lock().entry(id).or_insert(0) += 1;
                    }
                    if let Some(b) = barrier {
                        b.wait().await;
                    }
                    if served.fetch_add(1, Ordering::SeqCst) + 1 == goaway_after.unwrap_or(u64::MAX) {
                        enough.notify_one();
                    }
                    let body = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(body.as_bytes())))
                            .unwrap(),
                    )
                }
            });
            tokio::spawn(async move {
                let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                builder.max_concurrent_streams(max_streams);
                let mut conn = pin!(builder.serve_connection(TokioIo::new(tcp), svc));
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = enough.notified() => {
                        // GOAWAY: requests already on the connection finish, no new one starts.
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            });
        }
    });
    backend
}

fn h2_spec(name: &str, addr: SocketAddr) -> BackendSpec {
    BackendSpec {
        name: name.into(),
        url: format!("http://{addr}"),
        weight: 1,
    }
}

async fn post_with_id(fleet: &Fleet, id: String) -> Answer {
    let body = Bytes::from(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string());
    send(&fleet.client, Method::POST, &fleet.url(), &[("x-test-id", &id)], body).await
}

/// No health check on the backend at all past the first: a bare TCP connect.
const H2_QUIET: &str = "[health]\ninterval = \"1h\"\n[upstream]\nhttp2 = true\n";

#[tokio::test]
async fn a_new_connection_opens_only_when_the_open_ones_have_no_stream_left() {
    // 20 requests all held by the backend at once, 5 streams a connection: 4 connections.
    let barrier = Arc::new(Barrier::new(20));
    let backend = h2_backend(5, Some(barrier), None).await;
    let fleet = Fleet::start_backends(Vec::new(), &[h2_spec("limited", backend.addr)], H2_QUIET).await;
    // The health check's bare connect, before the load.
    eventually(Duration::from_secs(10), "the health check", || {
        backend.connections.load(Ordering::SeqCst) == 1
    })
    .await;
    let all: Vec<_> = (0..20).map(|i| post_with_id(&fleet, format!("r{i}"))).collect();
    for a in futures_util::future::join_all(all).await {
        assert_eq!(a.status, 200, "{a:?}");
    }
    assert_eq!(backend.connections.load(Ordering::SeqCst) - 1, 4);
    assert_eq!(opened(&fleet.metrics().await, "limited"), 4.0);
    assert_eq!(backend.processed.lock().len(), 20);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_sending_goaway_in_the_middle_of_1000_requests_loses_none() {
    // Every connection goes away after 50 requests, as servers with a request limit per
    // connection do (Envoy, Go's net/http, nginx).
    let backend = h2_backend(100, None, Some(50)).await;
    let fleet = Fleet::start_backends(Vec::new(), &[h2_spec("goaway", backend.addr)], H2_QUIET).await;
    let fleet = Arc::new(fleet);
    let mut tasks = Vec::new();
    for t in 0..20 {
        let fleet = fleet.clone();
        tasks.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for i in 0..50 {
                let a = post_with_id(&fleet, format!("t{t}-{i}")).await;
                if a.status != 200 {
                    failed.push(a);
                }
            }
            failed
        }));
    }
    for task in tasks {
        let failed = task.await.unwrap();
        assert!(failed.is_empty(), "{failed:?}");
    }
    let m = fleet.metrics().await;
    let processed = backend.processed.lock().clone();
    assert_eq!(processed.len(), 1000, "every request reached the backend");
    let twice: Vec<_> = processed.iter().filter(|(_, n)| **n > 1).collect();
    let resent = resends(&m, "goaway");
    assert!(twice.is_empty(), "none of them twice: {twice:?} ({resent} sent again)");
    // Each connection takes its 50 requests and those on their way when its GOAWAY came.
    let connections = backend.connections.load(Ordering::SeqCst);
    assert!(connections >= 10, "a new connection after each GOAWAY: {connections}");
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"goaway\",kind=\"reset\"}"),
        Some(0.0),
        "{m}"
    );
}

/// An HTTP/2 backend (the `h2` crate's server) that refuses a request's first `refusals`
/// attempts with `REFUSED_STREAM` (requests told apart by `x-test-id`) and answers the next.
/// Answers say which backend answered, and `pending` to a request with `x-step: start`.
async fn refusing_backend(name: &'static str, refusals: u32) -> (BackendSpec, Arc<Mutex<HashMap<String, u32>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<HashMap<String, u32>>> = Default::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let header = |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_string());
                    let (id, step) = (header("x-test-id").unwrap_or_default(), header("x-step"));
                    let attempt = {
                        let mut seen = seen.lock();
                        let n = seen.entry(id).or_insert(0);
                        *n += 1;
                        *n
                    };
                    if attempt <= refusals {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    }
                    let result = match step.as_deref() {
                        Some("start") => json!({"pending": true, "worker": name}),
                        _ => json!({"worker": name}),
                    };
                    let body = json!({"jsonrpc": "2.0", "id": 1, "result": result}).to_string();
                    let resp = Response::builder()
                        .header("content-type", "application/json")
                        .header("x-worker", name)
                        .body(())
                        .unwrap();
                    if let Ok(mut stream) = respond.send_response(resp, false) {
                        let _ = stream.send_data(Bytes::from(body), true);
                    }
                }
            });
        }
    });
    (h2_spec(name, addr), seen)
}

#[tokio::test]
async fn a_refused_stream_is_sent_once_more_and_only_once() {
    let (spec, seen) = refusing_backend("refuses-once", 1).await;
    let fleet = Fleet::start_backends(Vec::new(), &[spec], H2_QUIET).await;
    let all: Vec<_> = (0..30).map(|i| post_with_id(&fleet, format!("once-{i}"))).collect();
    for a in futures_util::future::join_all(all).await {
        assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "refuses-once"), "{a:?}");
    }
    assert!(seen.lock().values().all(|n| *n == 2), "each refused once, then served");
    assert_eq!(resends(&fleet.metrics().await, "refuses-once"), 30.0);
    fleet.shutdown().await;

    // Refused twice: the request is not sent a third time.
    let (spec, seen) = refusing_backend("refuses-always", u32::MAX).await;
    let fleet = Fleet::start_backends(Vec::new(), &[spec], H2_QUIET).await;
    let a = post_with_id(&fleet, "never".into()).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (502, Some("upstream_unavailable")),
        "{a:?}"
    );
    assert_eq!(seen.lock()["never"], 2);
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_pinned_follow_up_refused_once_is_sent_again_to_its_backend() {
    let (a_spec, a_seen) = refusing_backend("a", 1).await;
    let (b_spec, b_seen) = refusing_backend("b", 1).await;
    let fleet = Fleet::start_backends(Vec::new(), &[a_spec, b_spec], H2_QUIET).await;
    let call = |step: &'static str, id: String| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}});
        let client = fleet.client.clone();
        let url = fleet.url();
        async move {
            let headers = [
                ("mcp-routing-id", "pinned-call"),
                ("x-step", step),
                ("x-test-id", id.as_str()),
            ];
            send(&client, Method::POST, &url, &headers, Bytes::from(body.to_string())).await
        }
    };
    let start = call("start", "start".into()).await;
    assert_eq!(start.json()["result"]["pending"], true, "{start:?}");
    let owner = start.worker();
    for round in 0..5 {
        let next = call("next", format!("next-{round}")).await;
        assert_eq!((next.status.as_u16(), next.worker()), (200, owner.clone()), "{next:?}");
    }
    let seen = if owner == "a" { a_seen } else { b_seen };
    assert!(seen.lock().values().all(|n| *n == 2), "{:?}", seen.lock());
    assert_eq!(seen.lock().len(), 6, "every round reached the pinned backend");
    fleet.shutdown().await;
}

#[tokio::test]
async fn sse_over_h2_streams_event_by_event_and_a_client_leaving_resets_the_stream() {
    let extra = "[server]\nheader_read_timeout = \"400ms\"\n[health]\ninterval = \"1h\"\n[upstream]\nhttp2 = true\n";
    let fleet = Fleet::start(1, extra).await;
    let state = fleet.workers[0].state.clone();
    let resp = open_stream(&fleet, json!({"events": 3, "gated": true})).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The worker holds the rest until released: a buffering router would never hand this over.
    let first = read_until(&mut body, "notifications/progress").await;
    assert!(
        first.contains("\"progress\":1") && !first.contains("\"result\""),
        "{first}"
    );
    read_until(&mut body, ": ping").await;
    state.release();
    let rest = read_until(&mut body, "\"result\"").await;
    assert!(rest.contains("\"progress\":3"), "{rest}");
    assert!(
        tokio::time::timeout(REQUEST_DEADLINE, body.frame())
            .await
            .unwrap()
            .is_none(),
        "the stream ends"
    );
    eventually(Duration::from_secs(10), "the finished stream counted", || {
        state.streams_closed.load(Ordering::SeqCst) == 1
    })
    .await;

    // A client that leaves: its upstream stream is reset, and the worker sees it go.
    let resp = open_stream(&fleet, json!({"events": 2, "gated": true})).await;
    let mut body = resp.into_body();
    read_until(&mut body, "notifications/progress").await;
    drop(body);
    eventually(Duration::from_secs(10), "the backend sees the stream reset", || {
        state.streams_closed.load(Ordering::SeqCst) == 2
    })
    .await;
    eventually(Duration::from_secs(10), "in-flight count released", || {
        fleet.control.view().ring()[0].inflight == 0
    })
    .await;
    // Both streams went over one connection.
    assert_eq!(opened(&fleet.metrics().await, "worker-0"), 1.0);
    fleet.shutdown().await;
}
