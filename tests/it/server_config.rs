//! The config as a running router sees it: every duration at its documented maximum, and the
//! `[server]` keys a reload changes for new connections.

use std::time::{Duration, Instant};

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest value every duration key accepts (`config::defaults::MAX_DURATION`).
const MAX: &str = "3650days";

#[tokio::test]
async fn a_router_with_every_duration_at_its_maximum_serves_reloads_and_stops() {
    let worker = start_worker("worker-0").await;
    let port = worker.addr.port();
    let extra = format!(
        "[server]\nheader_read_timeout = \"{MAX}\"\nbody_read_timeout = \"{MAX}\"\nupstream_timeout = \"{MAX}\"\n\
         stream_idle_timeout = \"{MAX}\"\nshutdown_grace = \"{MAX}\"\n\
         [routing]\npin_idle_ttl = \"{MAX}\"\nsession_idle_ttl = \"{MAX}\"\ntask_idle_ttl = \"{MAX}\"\n\
         replay_window = \"{MAX}\"\ndrain_timeout = \"{MAX}\"\n\
         [health]\ninterval = \"{MAX}\"\ntimeout = \"{MAX}\"\n\
         [tokens]\nkeys = [\"{}\"]\ntoken_ttl = \"{MAX}\"\nsession_ttl = \"{MAX}\"\n\
         [discovery]\ndns = \"127.0.0.1:{port}\"\ninterval = \"{MAX}\"\n",
        "k".repeat(32)
    );
    let fleet = Fleet::start_with(vec![worker], &extra).await;
    let snap = fleet.control.view();
    assert_eq!(
        snap.config().routing.drain_timeout,
        mrtr_router::config::defaults::MAX_DURATION
    );
    assert_eq!(
        snap.config().server.shutdown_grace,
        mrtr_router::config::defaults::MAX_DURATION
    );
    drop(snap);

    // A whole two-round call: pins and tokens with the longest lifetimes.
    let a = fleet.post(&[], &start_call("max-1", 2)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let b = fleet.post(&[], &confirm("max-1", 2)).await;
    assert_eq!(b.json()["result"]["content"][0]["text"], "done");

    let discovered = || fleet.control.backends().iter().any(|b| b.name.starts_with("dns:"));
    eventually(Duration::from_secs(10), "the discovered backend", discovered).await;
    // Removing the static backend drains it until now + drain_timeout; the discovered one
    // (the same worker) serves on.
    fleet.reconfigure(&[]);
    let c = fleet.post(&[], &start_call("max-2", 1)).await;
    assert_eq!(c.status, 200, "{:?}", c.body);

    // shutdown_grace at its maximum: idle connections still close at once.
    fleet.shutdown().await;
}

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// A ping POST with `extra` more headers than the three it needs.
fn post_with_headers(extra: usize) -> String {
    let mut head = String::from("POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n");
    for i in 0..extra {
        head.push_str(&format!("X-Extra-{i}: v\r\n"));
    }
    format!("{head}Content-Length: {}\r\n\r\n{PING}", PING.len())
}

/// Sends `request` on `s` and reads the answer's status line (the connection stays open; a
/// ping's answer is small enough to arrive whole with it, and is read to its end).
async fn status_line(s: &mut TcpStream, request: &str) -> String {
    s.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return head.lines().next().unwrap().to_string();
            }
        }
        let n = tokio::time::timeout(REQUEST_DEADLINE, s.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed before a whole answer: {text:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn a_reload_changes_header_limits_and_timeouts_for_new_connections_and_the_shutdown_grace() {
    let mut fleet = Fleet::start(
        1,
        "[server]\nmax_headers = 100\nheader_read_timeout = \"30s\"\nshutdown_grace = \"60s\"",
    )
    .await;
    let forty = post_with_headers(40);
    // A connection accepted (it has an answer) before the reload.
    let mut before = TcpStream::connect(fleet.router).await.unwrap();
    assert_eq!(status_line(&mut before, &forty).await, "HTTP/1.1 200 OK");

    let smaller = "[server]\nmax_headers = 20\nheader_read_timeout = \"300ms\"\nshutdown_grace = \"300ms\"";
    std::fs::write(&fleet.config_path, render_config(smaller, &fleet.specs())).unwrap();
    fleet.control.reload().expect("reload accepted");

    // A new connection gets the new header limit: 43 headers are too many.
    let mut after = TcpStream::connect(fleet.router).await.unwrap();
    assert!(
        status_line(&mut after, &forty).await.starts_with("HTTP/1.1 431"),
        "max_headers = 20 applies to a new connection"
    );
    let mut after = TcpStream::connect(fleet.router).await.unwrap();
    assert_eq!(status_line(&mut after, &post_with_headers(10)).await, "HTTP/1.1 200 OK");
    // The connection accepted before keeps the settings it started with.
    assert_eq!(status_line(&mut before, &forty).await, "HTTP/1.1 200 OK");

    // And the new header read timeout: a silent new connection is closed after 300 ms, not 30 s.
    let started = Instant::now();
    let mut silent = TcpStream::connect(fleet.router).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
        .await
        .expect("the silent connection is closed within 10 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );

    // The new shutdown grace: a request held for 30 s does not hold the shutdown for the 60 s
    // the router started with.
    let requests = fleet.total_requests();
    let mut held = TcpStream::connect(fleet.router).await.unwrap();
    let body = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":30000}}}"#;
    let slow = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    held.write_all(slow.as_bytes()).await.unwrap();
    eventually(REQUEST_DEADLINE, "the held request reaches the worker", || {
        fleet.total_requests() > requests
    })
    .await;
    assert!(fleet.begin_shutdown());
    assert!(
        fleet.wait_stopped(Duration::from_secs(10)).await,
        "shutdown_grace = 300ms applies after the reload"
    );
}
