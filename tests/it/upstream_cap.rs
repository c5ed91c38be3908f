//! The cap on connections to one backend (`[upstream] max_connections_per_backend`): however
//! many requests arrive — a thousand streams of one HTTP/2 client included — the backend never
//! sees more connections than the cap; requests beyond it wait for a connection
//! (`queue_timeout`) and are then answered 503 `upstream_busy`, which ejects nothing.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const CAP: usize = 8;

/// A backend that counts its open connections (and their peak) and holds every answer until
/// `gate` is true.
struct HeldBackend {
    spec: BackendSpec,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    /// Requests received and not answered yet.
    held: Arc<AtomicUsize>,
    gate: watch::Sender<bool>,
}

async fn held_backend(name: &str) -> HeldBackend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (open, peak, held) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (gate, gate_rx) = watch::channel(false);
    let (o, p, h) = (open.clone(), peak.clone(), held.clone());
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let now = o.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            let (o, h, gate) = (o.clone(), h.clone(), gate_rx.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (h, mut gate) = (h.clone(), gate.clone());
                    async move {
                        let is_check = req.uri().path() == "/health";
                        let _ = req.into_body().collect().await;
                        if !is_check {
                            h.fetch_add(1, Ordering::SeqCst);
                            let _ = gate.wait_for(|open| *open).await;
                            h.fetch_sub(1, Ordering::SeqCst);
                        }
                        let body = json!({"jsonrpc": "2.0", "id": 1, "result": {}}).to_string();
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    HeldBackend {
        spec: BackendSpec {
            name: name.to_string(),
            url: format!("http://{addr}"),
            weight: 1,
        },
        open,
        peak,
        held,
        gate,
    }
}

fn config(queue_timeout: &str) -> String {
    config_with(queue_timeout, "100ms")
}

/// Where a test bounds the connections the backend sees at once, its health checks run a
/// minute apart: a check while all eight are busy opens a ninth connection, and the backend
/// sees it closed only once it reads the FIN, so checks every 100 ms could overlap in its
/// count (a tenth, seen once on a loaded machine).
fn config_with(queue_timeout: &str, health_interval: &str) -> String {
    format!(
        "[upstream]\nmax_connections_per_backend = {CAP}\nqueue_timeout = \"{queue_timeout}\"\n\
         [health]\ninterval = \"{health_interval}\"\npath = \"/health\"\n"
    )
}

fn call(i: usize) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {}}})
}

/// `n` calls sent at once, each on a client of its own, in the background; returns once the
/// backend holds `CAP` of them.
async fn send_calls(
    fleet: &Fleet,
    backend: &HeldBackend,
    n: usize,
) -> Vec<tokio::task::JoinHandle<crate::support::Answer>> {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let (client, url) = (client(), fleet.url());
            tokio::spawn(async move {
                let body = Bytes::from(call(i).to_string());
                send(&client, http::Method::POST, &url, &[], body).await
            })
        })
        .collect();
    let held = backend.held.clone();
    eventually(Duration::from_secs(10), "the backend holds the cap's requests", || {
        held.load(Ordering::SeqCst) == CAP
    })
    .await;
    calls
}

/// Forty clients at once on a backend capped at eight: eight connections carry requests, the
/// other thirty-two wait (shown by `mrtr_upstream_queued`), and all forty are answered once the
/// backend answers, over at most eight connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_cap_wait_for_a_connection() {
    let backend = held_backend("capped").await;
    let fleet = Fleet::start_backends(
        Vec::new(),
        std::slice::from_ref(&backend.spec),
        &config_with("30s", "60s"),
    )
    .await;
    let calls = send_calls(&fleet, &backend, 40).await;
    let control = fleet.control.clone();
    eventually(Duration::from_secs(10), "the other 32 wait in the router", || {
        control.backend("capped").unwrap().inflight == 40
    })
    .await;
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_upstream_queued{backend=\"capped\"}"),
        Some(32.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "mrtr_upstream_connections{backend=\"capped\"}"),
        Some(CAP as f64)
    );
    backend.gate.send(true).unwrap();
    for c in calls {
        let a = c.await.unwrap();
        assert_eq!((a.status.as_u16(), a.router_error()), (200, None), "{a:?}");
    }
    // Health checks may open one connection beyond the cap while all are busy.
    let peak = backend.peak.load(Ordering::SeqCst);
    assert!(peak <= CAP + 1, "the backend saw {peak} connections at once");
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_upstream_queued{backend=\"capped\"}"), Some(0.0));
    assert!(control.backend("capped").unwrap().healthy);
}

/// A request that waits `queue_timeout` without a connection coming free is answered 503
/// `upstream_busy` (with `Retry-After`); the backend stays healthy and serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_out_queue_timeout_is_answered_busy_and_ejects_nothing() {
    let backend = held_backend("full").await;
    let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&backend.spec), &config("300ms")).await;
    let holders = send_calls(&fleet, &backend, CAP).await;
    for i in 0..5 {
        let sent = Instant::now();
        let a = fleet.post(&[], &call(100 + i)).await;
        let waited = sent.elapsed();
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (503, Some("upstream_busy")),
            "{a:?}"
        );
        assert_eq!(a.json()["error"]["code"], -32006);
        assert_eq!(a.json()["id"], 100 + i);
        assert!(a.headers.contains_key("retry-after"));
        assert!(
            waited >= Duration::from_millis(300),
            "answered busy after only {waited:?}"
        );
    }
    let control = fleet.control.clone();
    assert!(
        control.backend("full").unwrap().healthy,
        "busy is the router's limit, not a backend fault"
    );
    assert!(backend.open.load(Ordering::SeqCst) <= CAP + 1);
    backend.gate.send(true).unwrap();
    for h in holders {
        assert_eq!(h.await.unwrap().status, 200);
    }
    let a = fleet.post(&[], &call(200)).await;
    assert_eq!(a.status, 200);
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_router_errors_total{reason=\"upstream_busy\"}"),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "mrtr_upstream_errors_total", &[]),
        0.0,
        "no upstream error was counted:\n{m}"
    );
}

/// One HTTP/2 client connection opening 1,024 streams: the router takes
/// `h2_max_concurrent_streams` (100) at a time, and opens no more than the cap of connections
/// to the backend; every stream is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_of_one_h2_client_open_at_most_the_cap_upstream() {
    let backend = held_backend("h2-target").await;
    let fleet = Fleet::start_backends(
        Vec::new(),
        std::slice::from_ref(&backend.spec),
        &config_with("30s", "60s"),
    )
    .await;
    let io = TokioIo::new(TcpStream::connect(fleet.router).await.unwrap());
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_concurrent_reset_streams(0)
        .handshake::<_, Full<Bytes>>(io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let streams: Vec<_> = (0..1024)
        .map(|i| {
            let mut sender = sender.clone();
            let url = fleet.url();
            tokio::spawn(async move {
                let req = http::Request::post(url)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(call(i).to_string())))
                    .unwrap();
                let resp = sender.send_request(req).await.expect("an answer");
                let status = resp.status();
                let _ = resp.into_body().collect().await;
                status
            })
        })
        .collect();
    let control = fleet.control.clone();
    eventually(Duration::from_secs(10), "the router holds 100 streams", || {
        control.backend("h2-target").unwrap().inflight == 100
    })
    .await;
    let held = backend.held.clone();
    eventually(Duration::from_secs(10), "the backend holds eight", || {
        held.load(Ordering::SeqCst) == CAP
    })
    .await;
    assert!(backend.peak.load(Ordering::SeqCst) <= CAP + 1);
    backend.gate.send(true).unwrap();
    for s in streams {
        assert_eq!(s.await.unwrap(), 200);
    }
    let peak = backend.peak.load(Ordering::SeqCst);
    assert!(peak <= CAP + 1, "the backend saw {peak} connections at once");
    let m = fleet.metrics().await;
    assert_eq!(
        metric(
            &m,
            "mrtr_requests_total{backend=\"h2-target\",method=\"tools/call\",status=\"200\"}"
        ),
        Some(1024.0),
        "{m}"
    );
}

/// A reload raises the cap: waiting requests take the new room at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_raises_the_cap_lets_waiting_requests_through() {
    let backend = held_backend("grown").await;
    let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&backend.spec), &config("30s")).await;
    let calls = send_calls(&fleet, &backend, CAP * 2).await;
    let raised = config("30s").replace(&format!("= {CAP}"), &format!("= {}", CAP * 2));
    std::fs::write(
        &fleet.config_path,
        render_config(&raised, std::slice::from_ref(&backend.spec)),
    )
    .unwrap();
    fleet.control.reload().expect("the raised cap is valid");
    let held = backend.held.clone();
    eventually(Duration::from_secs(10), "the backend holds sixteen", || {
        held.load(Ordering::SeqCst) == CAP * 2
    })
    .await;
    backend.gate.send(true).unwrap();
    for c in calls {
        assert_eq!(c.await.unwrap().status, 200);
    }
}
