//! Failures land on the right party: what a client does wrong is answered as the client's
//! fault and never counts against a backend; a slow backend is not a dead one; and running out
//! of file descriptors is the router's own problem, not its backends'.

use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Checks rarely (the passive accounting is what is under test), and ejects after 3 failures.
const PASSIVE_ONLY: &str = "[health]\ninterval = \"1h\"\nunhealthy_after = 3\n";

/// Sends `head` then `body` on a fresh connection; with `half_close`, shuts the write side
/// after; returns the status line's code, or `None` if the router closed without an answer.
async fn raw_exchange(fleet: &Fleet, head: &str, body: &[u8], half_close: bool) -> Option<u16> {
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    if half_close {
        s.shutdown().await.unwrap();
    }
    let answer = read_to_close(&mut s, REQUEST_DEADLINE)
        .await
        .expect("the router answers or closes in time");
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
}

#[tokio::test]
async fn broken_or_abandoned_client_bodies_never_eject_a_backend_nor_lose_its_pins() {
    let extra = format!("{PASSIVE_ONLY}[server]\nbody_read_timeout = \"300ms\"\n");
    let fleet = Fleet::start(1, &extra).await;
    let start = fleet.post(&[], &start_call("kept-1", 2)).await;
    assert_eq!(start.json()["result"]["pending"], true);
    let epoch = fleet.control.backend("worker-0").unwrap().epoch;
    let host = format!("Host: {}\r\n", fleet.router);
    let bad_chunk = |method: &str| {
        format!("{method} /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    };
    let short = |method: &str| {
        format!("{method} /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n")
    };
    for method in ["PUT", "POST"] {
        for _ in 0..4 {
            // A chunk size that is no hex number.
            let status = raw_exchange(&fleet, &bad_chunk(method), b"zz\r\n{\"a\":1}\r\n0\r\n\r\n", false).await;
            assert!(matches!(status, Some(400) | None), "{method} bad chunk: {status:?}");
            // Part of a body, then the client stops sending: 408 at body_read_timeout.
            let status = raw_exchange(&fleet, &short(method), b"{\"jsonrpc\":", false).await;
            assert_eq!(status, Some(408), "{method} stalled body");
            // Part of a body, then a half-close: the body can never be complete.
            let status = raw_exchange(&fleet, &short(method), b"{\"jsonrpc\":", true).await;
            assert!(
                matches!(status, Some(400) | None),
                "{method} half-closed body: {status:?}"
            );
        }
    }
    let b = fleet.control.backend("worker-0").unwrap();
    assert!(b.healthy, "{b:?}");
    assert_eq!(b.epoch, epoch, "never ejected");
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"worker-0\",kind=\"reset\"}"),
        Some(0.0)
    );
    assert!(metric(&m, "mrtr_router_errors_total{reason=\"body_timeout\"}").unwrap_or(0.0) >= 8.0);
    // The call pinned before goes on where it was.
    let done = fleet.post(&[], &confirm("kept-1", 2)).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{done:?}");
    assert_eq!(fleet.total_unknown_followups(), 0);
}

#[tokio::test]
async fn slow_calls_never_eject_a_backend_that_answers_its_health_checks() {
    let extra = "[server]\nupstream_timeout = \"200ms\"\n[health]\ninterval = \"50ms\"\nunhealthy_after = 2\n";
    let fleet = Fleet::start(1, extra).await;
    let start = fleet.post(&[], &start_call("kept-2", 2)).await;
    assert_eq!(start.json()["result"]["pending"], true);
    let epoch = fleet.control.backend("worker-0").unwrap().epoch;
    let slow = |i: u32| json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":"sleep","arguments":{"ms": 1500}}});
    let bodies: Vec<_> = (0..6).map(slow).collect();
    let answers = futures_join(bodies.iter().map(|b| fleet.post(&[], b))).await;
    for a in &answers {
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (504, Some("upstream_timeout")),
            "{a:?}"
        );
    }
    let b = fleet.control.backend("worker-0").unwrap();
    assert!(b.healthy && b.epoch == epoch, "slow calls ejected it: {b:?}");
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"worker-0\",kind=\"timeout\"}"),
        Some(6.0),
        "counted, all the same"
    );
    let done = fleet.post(&[], &confirm("kept-2", 2)).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{done:?}");
}

#[tokio::test]
async fn each_request_on_a_keep_alive_connection_gets_its_whole_upstream_timeout() {
    // The requests of one HTTP/1.1 connection share one timer, re-armed lazily (its first
    // request sets it): a later request must still be given its own timeout, counted from
    // its own start, not what is left of the first one's.
    const TIMEOUT: Duration = Duration::from_millis(400);
    let fleet = Fleet::start(1, "[server]\nupstream_timeout = \"400ms\"\n").await;
    let tcp = TcpStream::connect(fleet.router).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let call = |ms: u64| {
        let body =
            json!({"jsonrpc":"2.0","id":ms,"method":"tools/call","params":{"name":"sleep","arguments":{"ms": ms}}});
        http::Request::post(fleet.url())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
            .unwrap()
    };
    let mut exchange = |ms: u64| {
        let request = sender.send_request(call(ms));
        async move {
            let started = Instant::now();
            let resp = tokio::time::timeout(REQUEST_DEADLINE, request).await.unwrap().unwrap();
            let reason = resp
                .headers()
                .get("mcp-router-error")
                .map(|v| v.to_str().unwrap().to_string());
            let status = resp.status().as_u16();
            http_body_util::BodyExt::collect(resp.into_body()).await.unwrap();
            (status, reason, started.elapsed())
        }
    };
    assert_eq!(
        exchange(50).await.0,
        200,
        "the first request sets the connection's timer"
    );
    // Most of the first request's timeout goes by before the second starts.
    tokio::time::sleep(TIMEOUT * 3 / 4).await;
    let (status, reason, took) = exchange(3_000).await;
    assert_eq!((status, reason.as_deref()), (504, Some("upstream_timeout")));
    assert!(took >= TIMEOUT, "timed out after {took:?}, before its own {TIMEOUT:?}");
    assert!(took < TIMEOUT * 5, "timed out after {took:?}");
    // The connection, and its timer, serve on.
    assert_eq!(exchange(10).await.0, 200);
    let (status, _, took) = exchange(3_000).await;
    assert_eq!((status, took >= TIMEOUT), (504, true), "{took:?}");
    fleet.shutdown().await;
}

/// Runs the futures concurrently and returns their outputs in order.
async fn futures_join<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

/// A router run with a low open-file limit and flooded with idle connections: it stops
/// accepting at its connection cap instead of running out of descriptors, so its health checks
/// still reach the backends (none is ejected) and its admin listener still answers.
#[tokio::test]
async fn a_flood_of_connections_leaves_the_backends_healthy_and_the_admin_listener_answering() {
    let workers = vec![start_worker("w1").await, start_worker("w2").await];
    let dir = tempfile::tempdir().unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let config = dir.path().join("c.toml");
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n\
         [health]\ninterval = \"50ms\"\ntimeout = \"500ms\"\nunhealthy_after = 2\n"
    );
    for w in &workers {
        text.push_str(&format!(
            "[[backend]]\nname = \"{}\"\nurl = \"{}\"\n",
            w.state.name,
            w.url()
        ));
    }
    std::fs::write(&config, text).unwrap();
    // 128 descriptors in all: a cap of (128 - 32) / 2 = 48 client connections.
    let mut child = KillOnDrop(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n 128 && exec {} --config {}", bin(), config.display()))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let child = &mut child.0;
    let client = client();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    wait_readyz(child, &client, admin, 200, "the router starts").await;
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    // Health checks go on for a while under the flood: each check of each backend is a connection.
    let before: u64 = workers
        .iter()
        .map(|w| w.state.connections.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: u64 = workers
            .iter()
            .map(|w| w.state.connections.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        if now >= before + 20 {
            break;
        }
        assert!(Instant::now() < deadline, "health checks stopped reaching the backends");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = format!("http://{admin}/healthz");
    let healthz = send(&client, http::Method::GET, &url, &[], bytes::Bytes::new()).await;
    assert_eq!(healthz.status, 200);
    let backends = send(
        &client,
        http::Method::GET,
        &format!("http://{admin}/backends"),
        &[],
        bytes::Bytes::new(),
    )
    .await;
    let list = backends.json()["backends"].as_array().unwrap().clone();
    assert!(list.iter().all(|b| b["healthy"] == true), "{list:?}");
    let m = send(
        &client,
        http::Method::GET,
        &format!("http://{admin}/metrics"),
        &[],
        bytes::Bytes::new(),
    )
    .await;
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(
        metric(&text, "mrtr_connections_refused_total{reason=\"cap\"}").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    assert_eq!(metric(&text, "mrtr_backend_up{backend=\"w1\"}"), Some(1.0));
    // Once the flood is gone, the router takes connections again and serves them.
    drop(flood);
    let mut first = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let head = raw_mcp_post("x", "Connection: close\r\n", body);
    first.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(REQUEST_DEADLINE, first.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    signal(child, "TERM");
    wait_for_exit(child, "the router to stop").await;
}
