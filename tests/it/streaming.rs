//! What passes through: SSE event by event, headers verbatim, status codes and bodies unchanged,
//! client disconnects propagated, HTTP/2 (h2c) clients.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use mrtr_router::control::PinKind;
use serde_json::{json, Value};

async fn open(fleet: &Fleet, body: &Value) -> http::Response<Incoming> {
    let req = Request::post(fleet.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    tokio::time::timeout(REQUEST_DEADLINE, fleet.client.request(req))
        .await
        .unwrap()
        .unwrap()
}
#[tokio::test]
async fn sse_first_event_arrives_before_the_backend_finishes() {
    let fleet = Fleet::start(1, "").await;
    let resp = open(&fleet, &stream_call(None, json!({"events": 3, "gated": true}))).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The worker holds the rest of its answer until released: if the router buffered,
    // this read would never complete.
    let first = read_until(&mut body, "notifications/progress").await;
    assert!(first.contains("\"progress\":1"), "{first}");
    let ping = read_until(&mut body, ": ping").await;
    assert!(!ping.contains("\"result\""), "the result cannot have come yet");
    fleet.workers[0].state.release();
    let rest = read_until(&mut body, "\"result\"").await;
    assert!(rest.contains("\"progress\":3"));
    assert!(
        tokio::time::timeout(REQUEST_DEADLINE, body.frame())
            .await
            .unwrap()
            .is_none(),
        "stream ends"
    );
}

#[tokio::test]
async fn an_sse_stream_outlives_the_header_read_timeout() {
    // The header read timeout is for a head the client has not sent; an answer still being
    // written keeps its connection however long it takes.
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"200ms\"").await;
    let resp = open(&fleet, &stream_call(None, json!({"events": 2, "gated": true}))).await;
    let mut body = resp.into_body();
    read_until(&mut body, ": ping").await;
    // The subject of the test is time passing: five header read timeouts mid-stream.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    fleet.workers[0].state.release();
    let rest = read_until(&mut body, "\"result\"").await;
    assert!(rest.contains("\"progress\":2"), "{rest}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_silent_for_stream_idle_timeout_is_ended_and_closed_upstream() {
    // Time is paused and jumps to the next timer whenever every task waits, so the 60 s (the
    // smallest `stream_idle_timeout` allowed) pass at once; sockets are real.
    let fleet = Fleet::start(1, "[server]\nstream_idle_timeout = \"60s\"").await;
    let resp = open(&fleet, &stream_call(None, json!({"events": 2, "gated": true}))).await;
    let mut body = resp.into_body();
    read_until(&mut body, ": ping").await;
    let silent_from = tokio::time::Instant::now();
    // The worker now says nothing until released, which never happens.
    let end = tokio::time::timeout(Duration::from_secs(600), async {
        loop {
            match body.frame().await {
                Some(Ok(frame)) => assert!(
                    frame
                        .data_ref()
                        .is_none_or(|d| !String::from_utf8_lossy(d).contains("\"result\"")),
                    "the result cannot come"
                ),
                other => return other.map(|r| r.map(|_| ())),
            }
        }
    })
    .await
    .expect("the router ends a silent stream");
    assert!(
        end.is_some_and(|r| r.is_err()),
        "the client sees the stream fail, not finish"
    );
    let silent_for = silent_from.elapsed();
    assert!(
        silent_for >= Duration::from_secs(60) && silent_for < Duration::from_secs(70),
        "ended after {silent_for:?} of silence"
    );
    let m = fleet.metrics().await;
    assert_eq!(
        metric(
            &m,
            r#"mrtr_upstream_errors_total{backend="worker-0",kind="stream_idle"}"#
        ),
        Some(1.0)
    );
    let worker = &fleet.workers[0].state;
    eventually(REQUEST_DEADLINE, "the worker sees its stream closed", || {
        worker.streams_closed.load(Ordering::Relaxed) == 1
    })
    .await;
}

#[tokio::test]
async fn sse_pending_answer_is_pinned_before_the_client_reads_it() {
    let fleet = Fleet::start(3, "").await;
    for i in 0..20 {
        let mid = format!("sse-{i}");
        let resp = open(&fleet, &stream_call(Some(&mid), json!({"events": 2, "pending": true}))).await;
        let mut body = resp.into_body();
        let text = read_until(&mut body, "\"pending\":true").await;
        // The moment the client holds the pending event, the pin is there.
        assert!(
            fleet.control.pin(PinKind::Client, &mid).is_some(),
            "pin missing after the client read: {text}"
        );
        let worker =
            serde_json::from_str::<Value>(text.lines().rev().find(|l| l.starts_with("data:")).unwrap()[5..].trim())
                .unwrap()["result"]["worker"]
                .clone();
        drop(body);
        let b = fleet
            .post(
                &[],
                &json!({"jsonrpc":"2.0","id":2,"messageId":mid,"method":"tools/call","params":{"name":"whoami"}}),
            )
            .await;
        assert_eq!(json!(b.worker()), worker, "the follow-up reaches the pinned worker");
    }
}

#[tokio::test]
async fn mcp_headers_pass_verbatim_once_and_hop_by_hop_ones_do_not() {
    let fleet = Fleet::start(1, "").await;
    let url = format!("http://{}/echo?x=1", fleet.router);
    let headers = [
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "Transfer Funds"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Param-Amount", "500000"),
        ("Mcp-Param-Tag", "a"),
        ("Mcp-Param-Tag", "b"),
        ("Mcp-Session-Id", "s-1"),
        ("Connection", "x-hop"),
        ("x-hop", "secret"),
        ("Proxy-Authorization", "Basic eA=="),
        ("x-forwarded-for", "10.0.0.9"),
    ];
    let a = send(
        &fleet.client,
        Method::POST,
        &url,
        &headers,
        Bytes::from_static(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"Transfer Funds\"}}",
        ),
    )
    .await;
    let v = a.json();
    let all = |name: &str| echoed(&v, name);
    assert_eq!(all("mcp-method"), ["tools/call"]);
    assert_eq!(all("mcp-name"), ["Transfer Funds"]);
    assert_eq!(all("mcp-protocol-version"), ["2026-07-28"]);
    assert_eq!(all("mcp-param-amount"), ["500000"]);
    assert_eq!(all("mcp-param-tag"), ["a", "b"]);
    assert_eq!(all("mcp-session-id"), ["s-1"]);
    assert!(
        all("x-hop").is_empty() && all("proxy-authorization").is_empty(),
        "{}",
        v["headers"]
    );
    assert_eq!(all("x-forwarded-for"), ["10.0.0.9, 127.0.0.1"]);
    // Without a list from the client, the router starts one.
    let plain = send(
        &fleet.client,
        Method::POST,
        &url,
        &[],
        Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}"),
    )
    .await
    .json();
    assert_eq!(echoed(&plain, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(all("x-forwarded-proto"), ["http"]);
    assert_eq!(all("host"), [fleet.workers[0].addr.to_string().as_str()]);
    assert_eq!(v["path"], "/echo", "path forwarded as received");
}

#[tokio::test]
async fn status_codes_and_bodies_pass_unchanged() {
    let fleet = Fleet::start(1, "").await;
    for code in [400u16, 404, 405, 500] {
        let a = send(
            &fleet.client,
            Method::POST,
            &format!("http://{}/status/{code}", fleet.router),
            &[],
            Bytes::from_static(b"{}"),
        )
        .await;
        assert_eq!(a.status, code);
        assert_eq!(a.router_error(), None);
        assert_eq!(a.json(), json!({"status": code, "from": "worker-0"}));
    }
    let a = send(
        &fleet.client,
        Method::POST,
        &format!("http://{}/status/202", fleet.router),
        &[],
        Bytes::from_static(b"{}"),
    )
    .await;
    assert_eq!(a.status, 202);
    assert!(a.body.is_empty(), "202 has no body");
    let a = send(
        &fleet.client,
        Method::DELETE,
        &format!("http://{}/status/405", fleet.router),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(a.status, 405);
}

#[tokio::test]
async fn client_disconnect_closes_the_upstream_stream() {
    // A client that leaves a silent stream is noticed on the connection timer's checks, every
    // quarter of `header_read_timeout` (nothing is written to it that could fail).
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"400ms\"").await;
    let resp = open(&fleet, &stream_call(None, json!({"events": 2, "gated": true}))).await;
    let mut body = resp.into_body();
    read_until(&mut body, "notifications/progress").await;
    let state = fleet.workers[0].state.clone();
    assert_eq!(state.streams_closed.load(Ordering::SeqCst), 0);
    drop(body);
    // The worker notices its stream closed without ever being released.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while state.streams_closed.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "backend never saw the client leave"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fleet.control.view().ring()[0].inflight != 0 {
        assert!(tokio::time::Instant::now() < deadline, "in-flight count not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let metrics = fleet.metrics().await;
    assert_eq!(metric(&metrics, "mrtr_client_aborts_total"), Some(1.0));
}

/// A client that takes nothing of a streamed answer (its receive window stays shut) does not
/// hold its request, and with it a backend connection, for ever: once it has taken nothing for
/// `stream_idle_timeout`, the router drops the connection and the backend's stream is closed.
#[tokio::test(start_paused = true)]
async fn a_client_that_takes_nothing_of_its_answer_is_dropped_after_the_idle_limit() {
    // Time is paused and jumps to the next timer whenever every task waits (here: once every
    // buffer between the worker and the client is full), so the minute passes at once
    // (docs/src/dialects.md: no idle limit under 60 s on a stream); sockets are real.
    use tokio::io::AsyncWriteExt;
    let fleet = Fleet::start(
        1,
        "[server]\nheader_read_timeout = \"400ms\"\nstream_idle_timeout = \"60s\"",
    )
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut client = socket.connect(fleet.router).await.unwrap();
    // More events than every buffer on the way can hold.
    let body = stream_call(None, json!({"events": 1_000_000})).to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    client.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let started = tokio::time::Instant::now();
    let state = fleet.workers[0].state.clone();
    // Never read. The worker's stream closes once the router gives the request up.
    let deadline = started + Duration::from_secs(90);
    while state.streams_closed.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled answer was never given up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(55),
        "given up after {:?}",
        started.elapsed()
    );
    let metrics = fleet.metrics().await;
    assert_eq!(metric(&metrics, "mrtr_client_aborts_total"), Some(1.0));
    assert_eq!(
        metric(&metrics, "mrtr_backend_inflight{backend=\"worker-0\"}"),
        Some(0.0)
    );
    drop(client);
}

#[tokio::test]
async fn http2_clients_are_served() {
    let fleet = Fleet::start(2, "").await;
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let a = send(
        &h2,
        Method::POST,
        &fleet.url(),
        &[],
        Bytes::from(start_call("h2-call", 2).to_string()),
    )
    .await;
    assert_eq!(a.json()["result"]["pending"], true);
    let b = send(
        &h2,
        Method::POST,
        &fleet.url(),
        &[("x-any-header", "x")],
        Bytes::from(confirm("h2-call", 2).to_string()),
    )
    .await;
    assert_eq!(b.json()["result"]["content"][0]["text"], "done");
    assert_eq!(a.worker(), b.worker());
}

/// A legacy-session server (docs/src/dialects.md): `initialize` opens session `s-1`; the session's GET
/// stream sends a numbered `: ping` every 100 ms (up to 100); any other POST in the session is
/// answered by name.
async fn pinging_session_server() -> BackendSpec {
    type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;
    async fn answer(method: Method, body: Bytes) -> http::Response<Body> {
        let resp = http::Response::builder().header("x-worker", "sessions");
        if method == Method::GET {
            let pings = futures_util::stream::unfold(1u32, |n| async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let frame = http_body::Frame::data(Bytes::from(format!(": ping {n}\n\n")));
                (n <= 100).then_some((Ok(frame), n + 1))
            });
            let body = http_body_util::StreamBody::new(pings).boxed();
            return resp.header("content-type", "text/event-stream").body(body).unwrap();
        }
        let msg: Value = serde_json::from_slice(&body).unwrap_or_default();
        let resp = match msg["method"] == "initialize" {
            true => resp.header("mcp-session-id", "s-1"),
            false => resp,
        };
        let answer = json!({"jsonrpc": "2.0", "id": msg["id"], "result": {}});
        let body = Full::new(Bytes::from(answer.to_string())).boxed();
        resp.header("content-type", "application/json").body(body).unwrap()
    }
    test_backend("sessions", answer).await
}

/// A client may listen on a session's GET stream far longer than `session_idle_ttl` without
/// sending anything: the stream's events keep the session pinned, so its next POST still
/// reaches the instance that holds the session.
#[tokio::test]
async fn a_session_stream_keeps_its_session_pinned() {
    let specs = [pinging_session_server().await];
    let fleet = Fleet::start_backends(Vec::new(), &specs, "[routing]\nsession_idle_ttl = \"300ms\"").await;
    let init = fleet
        .post(
            &[],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
        )
        .await;
    assert_eq!(init.headers["mcp-session-id"], "s-1", "{init:?}");
    let req = Request::get(fleet.url())
        .header("accept", "text/event-stream")
        .header("mcp-session-id", "s-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, fleet.client.request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    // Five times the session's idle TTL, with the stream open all along.
    read_until(&mut stream, ": ping 15\n").await;
    // The per-kind pin gauge is set by the upkeep's round (once a second): one now, so that
    // what is read is what the table holds, however late the machine runs the background one.
    fleet.control.sweep();
    let m = fleet.metrics().await;
    // (A counter child shows once it has counted.)
    assert_eq!(
        metric(&m, "mrtr_pins_expired_total{kind=\"session\"}").unwrap_or(0.0),
        0.0
    );
    assert_eq!(metric(&m, "mrtr_pins{kind=\"session\"}"), Some(1.0));
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let a = fleet.post(&[("mcp-session-id", "s-1")], &call).await;
    assert_eq!(a.status, 200, "{a:?}");
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_route_decisions_total{source=\"pin\"}"),
        Some(2.0),
        "the GET and the POST"
    );
}
