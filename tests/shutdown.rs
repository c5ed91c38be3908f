//! Graceful shutdown: the router stops accepting, answers `/readyz` with 503, lets in-flight
//! requests and SSE streams finish for up to `server.shutdown_grace`, then returns (the binary
//! exits 0).

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use mrtr_router::example::Worker;
use mrtr_router::{Listeners, Router, Shared};
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A router driven by the test itself: its own listeners and shutdown signal.
struct Served {
    router: SocketAddr,
    admin: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    run: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(extra: &str, workers: &[&Worker]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let specs: Vec<BackendSpec> = workers
            .iter()
            .map(|w| BackendSpec {
                name: w.state.name.clone(),
                url: w.url(),
                weight: 1,
            })
            .collect();
        std::fs::write(&path, render_config(extra, &specs)).unwrap();
        let router = Router::from_file(&path).expect("valid config");
        let shared = router.handle();
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (router_addr, admin_addr) = (proxy.local_addr().unwrap(), admin.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let run = tokio::spawn(router.run(Listeners { proxy, admin }, async move {
            let _ = stopped.await;
        }));
        Served {
            router: router_addr,
            admin: admin_addr,
            shared,
            stop: Some(stop),
            run,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.router)
    }

    /// Begins the shutdown, as SIGTERM does.
    fn shutdown(&mut self) {
        self.stop.take().expect("not stopped yet").send(()).unwrap();
    }
}

/// Polls `cond` every 5 ms until it holds; fails after 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn stream_call(args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "stream", "arguments": args}})
}

/// Opens an SSE answer through the router at `url`.
async fn open_stream(client: &HttpClient, url: &str, args: Value) -> Incoming {
    let req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Full::new(Bytes::from(stream_call(args).to_string())))
        .unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, client.request(req))
        .await
        .expect("stream head in time")
        .expect("stream opens");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    resp.into_body()
}

/// Reads body frames until `needle` has been seen; returns everything read.
async fn read_until(body: &mut Incoming, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let frame = tokio::time::timeout(REQUEST_DEADLINE, body.frame())
            .await
            .expect("next frame in time")
            .expect("stream still open")
            .expect("no stream error");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    seen
}

async fn readyz(client: &HttpClient, admin: SocketAddr) -> u16 {
    send(
        client,
        Method::GET,
        &format!("http://{admin}/readyz"),
        &[],
        Bytes::new(),
    )
    .await
    .status
    .as_u16()
}

/// A new connection to a router that stopped accepting is refused, or closed without an answer.
async fn assert_not_accepting(addr: SocketAddr) {
    match TcpStream::connect(addr).await {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        Ok(mut s) => {
            let req = "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
            let _ = s.write_all(req.as_bytes()).await;
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("the connection is closed, not left hanging");
            assert!(
                matches!(n, Ok(0) | Err(_)),
                "a connection made after shutdown began was served: {:?}",
                n.map(|n| String::from_utf8_lossy(&buf[..n]).to_string())
            );
        }
    }
}

/// Sends one keep-alive request on a raw connection and reads its whole answer, leaving the
/// connection idle.
async fn idle_keepalive_connection(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(REQUEST_DEADLINE, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the answer");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse().ok())
                .expect("a content-length answer");
            if got.len() >= end + 4 + len {
                assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                return s;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_fails_readiness_and_lets_requests_and_streams_finish() {
    let began = std::time::Instant::now();
    let worker = start_worker("w0").await;
    let mut served = Served::start("", &[&worker]).await;
    let client = client();
    assert_eq!(readyz(&client, served.admin).await, 200);

    // In flight when the shutdown begins: an SSE stream held by the worker, a slow JSON request,
    // and an idle keep-alive connection.
    let mut stream = open_stream(&client, &served.url(), json!({"events": 2, "gated": true})).await;
    read_until(&mut stream, "notifications/progress").await;
    let slow = {
        let (client, url) = (client.clone(), served.url());
        let body = json!({"jsonrpc": "2.0", "id": 5, "messageId": "slow-1", "method": "tools/call",
                          "params": {"name": "sleep", "arguments": {"ms": 800}}});
        tokio::spawn(async move { send(&client, Method::POST, &url, &[], Bytes::from(body.to_string())).await })
    };
    let mut idle = idle_keepalive_connection(served.router).await;
    let state = worker.state.clone();
    eventually("the slow request reaches the worker", || {
        state.requests.load(SeqCst) >= 3
    })
    .await;

    served.shutdown();
    let shared = served.shared.clone();
    eventually("shutdown begins", || shared.shutting_down.load(SeqCst)).await;
    assert_eq!(
        readyz(&client, served.admin).await,
        503,
        "/readyz fails once shutdown begins"
    );
    assert_not_accepting(served.router).await;
    // An idle keep-alive connection is closed rather than kept for new requests.
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
        .await
        .expect("the idle connection is closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");

    // The slow request in flight finishes normally.
    let a = slow.await.unwrap();
    assert_eq!((a.status.as_u16(), a.worker()), (200, "w0".to_string()), "{a:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!served.run.is_finished(), "the router must wait for the open stream");
    assert_eq!(readyz(&client, served.admin).await, 503);

    // The stream finishes with its result; then the router returns, long before the default 30 s grace.
    let released = Instant::now();
    worker.state.release();
    let rest = read_until(&mut stream, "\"result\"").await;
    assert!(rest.contains("\"progress\":2"), "{rest}");
    let end = tokio::time::timeout(REQUEST_DEADLINE, stream.frame())
        .await
        .expect("the stream ends");
    assert!(end.is_none(), "the stream ends cleanly: {end:?}");
    tokio::time::timeout(Duration::from_secs(5), &mut served.run)
        .await
        .expect("the router returns once its last stream ended")
        .unwrap();
    let after_release = released.elapsed();
    assert_not_accepting(served.admin).await;
    println!(
        "shutdown: router returned {after_release:?} after the last stream was released; test took {:?}",
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_bounds_how_long_a_stuck_stream_holds_the_router() {
    let began = std::time::Instant::now();
    let worker = start_worker("w0").await;
    let mut served = Served::start("[server]\nshutdown_grace = \"300ms\"", &[&worker]).await;
    let client = client();
    // Never released: only the grace period ends it.
    let mut stream = open_stream(&client, &served.url(), json!({"events": 2, "gated": true})).await;
    read_until(&mut stream, "notifications/progress").await;
    let stopping = Instant::now();
    served.shutdown();
    tokio::time::timeout(Duration::from_secs(5), &mut served.run)
        .await
        .expect("the router returns within about the grace period")
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "returned before the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // What is left when the grace period is over is closed: the client's stream ends and the
    // backend sees its stream closed (as it would when the process exits).
    let end = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match stream.frame().await {
                Some(Ok(f)) if f.is_data() => continue,
                other => return other.map(|r| r.map(|_| ())),
            }
        }
    })
    .await;
    let state = worker.state.clone();
    let deadline = Instant::now() + Duration::from_secs(2);
    while state.streams_closed.load(SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "shutdown grace 300ms: router returned after {took:?}; client stream afterwards: {end:?}; \
         upstream streams closed: {}; test took {:?}",
        state.streams_closed.load(SeqCst),
        began.elapsed()
    );
    assert!(
        end.is_ok(),
        "the router returned but left the stream's connection open: it still runs after shutdown"
    );
    assert_eq!(
        state.streams_closed.load(SeqCst),
        1,
        "the backend still streams to a router that shut down"
    );
}

const BIN: &str = env!("CARGO_BIN_EXE_mrtr-router");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The binary: SIGTERM with an SSE stream open → `/readyz` 503, no new connections, the stream
/// finishes, exit status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_open_stream_finish_then_exits_zero() {
    let began = std::time::Instant::now();
    let worker = start_worker("w0").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let (port, admin_port) = (free_port(), free_port());
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n\
             [[backend]]\nname = \"w0\"\nurl = \"{}\"\n",
            worker.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let router: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = client();
    let mut up = false;
    for _ in 0..400 {
        let req = Request::get(format!("http://{admin}/readyz"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(1), client.request(req)).await {
            if r.status() == 200 {
                up = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if !up {
        let _ = child.kill();
        panic!("router never became ready");
    }
    let mut stream = open_stream(
        &client,
        &format!("http://{router}/mcp"),
        json!({"events": 2, "gated": true}),
    )
    .await;
    read_until(&mut stream, "notifications/progress").await;

    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let mut not_ready = false;
    for _ in 0..400 {
        let req = Request::get(format!("http://{admin}/readyz"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(1), client.request(req)).await {
            if r.status() == 503 {
                not_ready = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(not_ready, "/readyz never answered 503 after SIGTERM");
    assert_not_accepting(router).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the router exited with a stream still open"
    );

    worker.state.release();
    read_until(&mut stream, "\"result\"").await;
    let mut status = None;
    for _ in 0..200 {
        if let Some(s) = child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the router did not exit after its last stream ended")
    });
    assert!(status.success(), "exit status {status:?}");
    println!("sigterm: exited {status:?}; test took {:?}", began.elapsed());
}
