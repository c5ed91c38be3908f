//! Graceful shutdown: the router stops accepting, answers `/readyz` with 503, lets in-flight
//! requests and SSE streams finish for up to `server.shutdown_grace`, then returns (the binary
//! exits 0).

use std::net::SocketAddr;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Opens an SSE answer through the router at `url`.
async fn open_stream(client: &HttpClient, url: &str, args: Value) -> Incoming {
    let req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Full::new(Bytes::from(stream_call(None, args).to_string())))
        .unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, client.request(req))
        .await
        .expect("stream head in time")
        .expect("stream opens");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    resp.into_body()
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

/// A keep-alive `tools/list` request to `addr`, as raw HTTP/1.1.
fn tools_list(addr: SocketAddr) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    raw_mcp_post(addr, "", &body)
}

/// Sends one keep-alive request on a raw connection and reads its whole answer, leaving the
/// connection idle.
async fn idle_keepalive_connection(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(tools_list(addr).as_bytes()).await.unwrap();
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
    let mut fleet = Fleet::start(1, "").await;
    let client = fleet.client.clone();
    assert_eq!(readyz(&client, fleet.admin).await, 200);

    // In flight when the shutdown begins: an SSE stream held by the worker, a slow JSON request,
    // and an idle keep-alive connection.
    let mut stream = open_stream(&client, &fleet.url(), json!({"events": 2, "gated": true})).await;
    read_until(&mut stream, "notifications/progress").await;
    let slow = {
        let (client, url) = (client.clone(), fleet.url());
        let body = json!({"jsonrpc": "2.0", "id": 5, "messageId": "slow-1", "method": "tools/call",
                          "params": {"name": "sleep", "arguments": {"ms": 800}}});
        tokio::spawn(async move { send(&client, Method::POST, &url, &[], Bytes::from(body.to_string())).await })
    };
    let mut idle = idle_keepalive_connection(fleet.router).await;
    let state = fleet.workers[0].state.clone();
    eventually(Duration::from_secs(10), "the slow request reaches the worker", || {
        state.requests.load(SeqCst) >= 3
    })
    .await;

    assert!(fleet.begin_shutdown(), "the router was running");
    let shared = fleet.control.clone();
    eventually(Duration::from_secs(10), "shutdown begins", || shared.shutting_down()).await;
    assert_eq!(
        readyz(&client, fleet.admin).await,
        503,
        "/readyz fails once shutdown begins"
    );
    assert_not_accepting(fleet.router).await;
    // An idle keep-alive connection is closed rather than kept for new requests.
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
        .await
        .expect("the idle connection is closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");

    // The slow request in flight finishes normally.
    let a = slow.await.unwrap();
    assert_eq!((a.status.as_u16(), a.worker()), (200, "worker-0".to_string()), "{a:?}");
    assert!(
        !fleet.wait_stopped(Duration::from_millis(100)).await,
        "the router must wait for the open stream"
    );
    assert_eq!(readyz(&client, fleet.admin).await, 503);

    // The stream finishes with its result; then the router returns, long before the default 30 s grace.
    let released = Instant::now();
    state.release();
    let rest = read_until(&mut stream, "\"result\"").await;
    assert!(rest.contains("\"progress\":2"), "{rest}");
    let end = tokio::time::timeout(REQUEST_DEADLINE, stream.frame())
        .await
        .expect("the stream ends");
    assert!(end.is_none(), "the stream ends cleanly: {end:?}");
    assert!(
        fleet.wait_stopped(Duration::from_secs(5)).await,
        "the router returns once its last stream ended"
    );
    let after_release = released.elapsed();
    assert_not_accepting(fleet.admin).await;
    println!(
        "shutdown: router returned {after_release:?} after the last stream was released; test took {:?}",
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_bounds_how_long_a_stuck_stream_holds_the_router() {
    let began = std::time::Instant::now();
    let mut fleet = Fleet::start(1, "[server]\nshutdown_grace = \"300ms\"").await;
    // Never released: only the grace period ends it.
    let mut stream = open_stream(&fleet.client, &fleet.url(), json!({"events": 2, "gated": true})).await;
    read_until(&mut stream, "notifications/progress").await;
    let stopping = Instant::now();
    assert!(fleet.begin_shutdown(), "the router was running");
    assert!(
        fleet.wait_stopped(Duration::from_secs(5)).await,
        "the router returns within about the grace period"
    );
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
    let state = fleet.workers[0].state.clone();
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
    let mut child = spawn_router(&path);
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let router: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = client();
    wait_readyz(&mut child, &client, admin, 200, "the router to become ready").await;
    let mut stream = open_stream(
        &client,
        &format!("http://{router}/mcp"),
        json!({"events": 2, "gated": true}),
    )
    .await;
    read_until(&mut stream, "notifications/progress").await;

    signal(&child, "TERM");
    wait_readyz(&mut child, &client, admin, 503, "/readyz to fail after SIGTERM").await;
    assert_not_accepting(router).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the router exited with a stream still open"
    );

    worker.state.release();
    read_until(&mut stream, "\"result\"").await;
    let status = wait_for_exit(&mut child, "the router to exit after its last stream ended").await;
    assert!(status.success(), "exit status {status:?}");
    println!("sigterm: exited {status:?}; test took {:?}", began.elapsed());
}

/// A connection that has not said which protocol it speaks yet (or, with TLS, not finished its
/// handshake) does not hold a shutdown for `header_read_timeout`: it is closed at once.
#[tokio::test]
async fn a_connection_still_silent_when_shutdown_begins_is_closed_at_once() {
    let mut fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"30s\"\nshutdown_grace = \"30s\"").await;
    let mut silent = TcpStream::connect(fleet.router).await.unwrap();
    // The router has accepted it (a request on another connection is served after it).
    assert_eq!(fleet.post(&[], &start_call("after-accept", 1)).await.status, 200);
    fleet.assert_stops_promptly("a silent connection").await;
    let closed = read_to_close(&mut silent, Duration::from_secs(5)).await;
    assert_eq!(closed.as_deref(), Some(&b""[..]), "closed without a word");
}

/// Waits (up to 5 s) until the router's host has acknowledged every byte written on `s`: they
/// are in the router's socket then, whether or not the router has looked at it.
async fn wait_acked(s: &TcpStream) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    for _ in 0..5000 {
        let mut unacked: libc::c_int = 0;
        // SAFETY: `fd` is `s`'s open socket; SIOCOUTQ (TIOCOUTQ) writes one int.
        assert_eq!(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut unacked) }, 0);
        if unacked == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the router's host did not acknowledge the request within 5 s");
}

/// After the shutdown: `quiet` was closed without a word, `sending` got the answer to the
/// `tools/list` it sent as the shutdown began and was closed after it.
async fn assert_closed_and_answered(quiet: &mut TcpStream, sending: &mut TcpStream) {
    let closed = read_to_close(quiet, Duration::from_secs(5)).await;
    assert_eq!(closed.as_deref(), Some(&b""[..]), "closed without a word");
    let answered = read_to_close(sending, Duration::from_secs(5))
        .await
        .expect("closed after its answer");
    let text = String::from_utf8_lossy(&answered);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"result\""), "{text}");
}

/// An idle keep-alive connection still in hyper's hands (not parked yet: the first check
/// comes 7.5 s after its answer) whose client sent its next request as the shutdown began:
/// that request is served, then the connection closes. (The unit test in `src/server/serve.rs`
/// holds tokio's reactor still to take the case where the router has not seen it yet.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_a_request_just_sent_on_an_idle_connection_is_served() {
    let mut fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"30s\"\nshutdown_grace = \"30s\"").await;
    let mut quiet = idle_keepalive_connection(fleet.router).await;
    let mut sending = idle_keepalive_connection(fleet.router).await;
    sending.write_all(tools_list(fleet.router).as_bytes()).await.unwrap();
    wait_acked(&sending).await;
    let parked = metric(&fleet.metrics().await, "mrtr_connections_parked");
    assert_eq!(parked, Some(0.0), "neither is parked yet");
    fleet.assert_stops_promptly("idle connections").await;
    assert_closed_and_answered(&mut quiet, &mut sending).await;
    assert_eq!(fleet.total_requests(), 3);
}

/// Parked connections (idle keep-alive ones, holding only their socket) at the shutdown: one
/// whose client sends nothing is closed at once, one whose client sent a request as the
/// shutdown began has it served first (whether the router had woken it before the shutdown
/// or finds its bytes waiting then; the unit test in `src/server/park.rs` holds tokio's
/// reactor still to take the second way every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_a_parked_connection_is_closed_at_once_and_a_request_sent_on_one_is_served() {
    let mut fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"4s\"\nshutdown_grace = \"30s\"").await;
    let mut quiet = idle_keepalive_connection(fleet.router).await;
    let mut sending = idle_keepalive_connection(fleet.router).await;
    fleet
        .wait_metric("mrtr_connections_parked", 2.0, Duration::from_secs(10))
        .await;
    sending.write_all(tools_list(fleet.router).as_bytes()).await.unwrap();
    wait_acked(&sending).await;
    fleet.assert_stops_promptly("parked connections").await;
    assert_closed_and_answered(&mut quiet, &mut sending).await;
    assert_eq!(fleet.total_requests(), 3);
}
