//! Upstream keep-alive: connections are reused, and a backend closing its idle connections
//! costs no request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};

fn opened(metrics: &str, backend: &str) -> f64 {
    metric(
        metrics,
        &format!("mrtr_upstream_connections_opened_total{{backend=\"{backend}\"}}"),
    )
    .unwrap_or(0.0)
}

fn call(i: usize) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {}}})
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection() {
    let fleet = Fleet::start(1, "").await;
    for i in 0..50 {
        let a = fleet.post(&[], &call(i)).await;
        assert_eq!(a.status, 200, "request {i}: {:?}", a.body);
    }
    assert_eq!(opened(&fleet.metrics().await, "worker-0"), 1.0);
    fleet.shutdown().await;
}

/// A body that reports when hyper is done with it: the answer has been written.
struct SignalOnDrop {
    inner: Full<Bytes>,
    done: Option<oneshot::Sender<()>>,
}

impl Body for SignalOnDrop {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

/// A backend that answers one request per connection and, once allowed by a permit from
/// `close`, closes that connection without saying so (no `Connection: close`), as servers with
/// a short keep-alive timeout do. Counts the connections it has closed after answering
/// (health checks' bare connects are not counted).
async fn start_closing_backend(close: Arc<Semaphore>) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = Arc::new(AtomicU64::new(0));
    let counter = closed.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let closed = counter.clone();
            let close = close.clone();
            tokio::spawn(async move {
                let (done_tx, done_rx) = oneshot::channel();
                let done_tx = parking_lot::Mutex::new(Some(done_tx));
                let svc = service_fn(move |_req| {
                    let body = SignalOnDrop {
                        inner: Full::new(Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#)),
                        done: done_tx.lock().take(),
                    };
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                // The block ends the connection (and closes its socket) before it is counted.
                let closed_after_answer = {
                    let mut conn = pin!(http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
                    tokio::select! {
                        _ = conn.as_mut() => false,
                        _ = done_rx => {
                            close.acquire().await.unwrap().forget();
                            // Idle now: this closes the connection at once.
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.as_mut().await;
                            true
                        }
                    }
                };
                if closed_after_answer {
                    closed.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, closed)
}

#[tokio::test]
async fn backend_closing_idle_connections_costs_no_request() {
    let close = Arc::new(Semaphore::new(0));
    let (addr, closed) = start_closing_backend(close.clone()).await;
    let spec = BackendSpec {
        name: "closer".into(),
        url: format!("http://{addr}"),
        weight: 1,
    };
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "").await;
    const N: usize = 20;
    for i in 0..N {
        let a = fleet.post(&[], &call(i)).await;
        assert_eq!(a.status, 200, "request {i}: {:?}", a.body);
        // The router has the connection back in its pool; the backend closes it while idle.
        close.add_permits(1);
        eventually(Duration::from_secs(10), "backend closed the connection", || {
            closed.load(Ordering::SeqCst) == i as u64 + 1
        })
        .await;
        if i >= N / 2 {
            // Not a synchronisation: the second half lets the closed connection sit idle past
            // the router's check-on-take threshold (250 ms), so both ways of noticing the
            // close are exercised: the first request's poll (short idle) and the check when
            // the connection is taken (long idle).
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let m = fleet.metrics().await;
    assert_eq!(opened(&m, "closer"), N as f64, "each request needed a new connection");
    // After a short idle the request itself finds the connection closed, and is sent again on a
    // new one; after a long idle the check on take finds it, and nothing is sent twice. (The
    // once-a-second sweep may find a closed connection first, so a short idle may go without a
    // resend too; a long idle never has one.)
    let resends = metric(&m, "mrtr_upstream_resends_total{backend=\"closer\"}").unwrap_or(0.0);
    assert!(
        (1.0..=(N / 2) as f64).contains(&resends),
        "{resends} resends: at most one for each of requests 1 to N/2 (after a short idle), none after a long idle"
    );
    // The last connection, closed by the backend while idle, leaves the pool at the next sweep
    // rather than waiting for a request or its idle timeout.
    eventually(
        Duration::from_secs(10),
        "closed idle connection swept from the pool",
        || fleet.control.backends()[0].idle_connections == 0,
    )
    .await;
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"closer\",kind=\"reset\"}"),
        Some(0.0)
    );
    fleet.shutdown().await;
}
