//! Every error the router answers itself (docs/src/errors.md): status, JSON-RPC code, `Mcp-Router-Error`,
//! and the request's id echoed when known.

use bytes::Bytes;
use std::time::Duration;

use crate::support::*;
use http::{Method, StatusCode};
use serde_json::json;

fn assert_router_error(a: &Answer, status: u16, code: i64, reason: &str, id: serde_json::Value) {
    assert_eq!(a.status, status, "{a:?}");
    assert_eq!(a.router_error(), Some(reason), "{a:?}");
    assert_eq!(a.headers["content-type"], "application/json");
    let v = a.json();
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["id"], id, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    if status == 503 {
        assert!(a.headers.contains_key("retry-after"), "503 carries Retry-After");
    }
}

#[tokio::test]
async fn body_not_json_is_a_parse_error() {
    let fleet = Fleet::start(2, "").await;
    for body in [&b"{\"jsonrpc\":"[..], b"not json", b"", b"{} {}"] {
        let a = send(&fleet.client, Method::POST, &fleet.url(), &[], Bytes::from_static(body)).await;
        assert_router_error(&a, 400, -32700, "parse_error", json!(null));
    }
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_router_errors_total{reason=\"parse_error\"}"),
        Some(4.0)
    );
    let served = fleet.total_requests();
    assert_eq!(served, 0, "nothing unparseable is forwarded");
}

#[tokio::test]
async fn body_larger_than_max_body_bytes_is_413() {
    let fleet = Fleet::start(2, "[server]\nmax_body_bytes = 1024").await;
    let big = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"pad":"x".repeat(2000)}});
    let a = fleet.post(&[], &big).await;
    assert_router_error(&a, 413, -32600, "body_too_large", json!(null));
    // Just under the limit passes.
    let ok = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"whoami","pad":"x".repeat(900)}});
    assert_eq!(fleet.post(&[], &ok).await.status, 200);
}

#[tokio::test]
async fn no_healthy_backend_is_503() {
    let w = start_worker("only").await;
    let fleet = Fleet::start_with(vec![w], "").await;
    let mut spec = fleet.specs();
    spec[0].weight = 0;
    fleet.reconfigure(&spec);
    let a = fleet
        .post(
            &[],
            &json!({"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"whoami"}}),
        )
        .await;
    assert_router_error(&a, 503, -32002, "no_backend", json!("abc"));
    let r = send(
        &fleet.client,
        Method::GET,
        &format!("http://{}/readyz", fleet.admin),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 503, "not ready without a backend to route to");
}

#[tokio::test]
async fn connect_failure_is_502() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let fleet = Fleet::start(1, "").await;
    fleet.reconfigure(&[BackendSpec {
        name: "dead".into(),
        url: format!("http://127.0.0.1:{port}"),
        weight: 1,
    }]);
    let a = fleet
        .post(
            &[],
            &json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami"}}),
        )
        .await;
    assert_router_error(&a, 502, -32003, "upstream_unavailable", json!(3));
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"dead\",kind=\"connect\"}"),
        Some(1.0)
    );
}

#[tokio::test]
async fn slow_backend_is_504() {
    let fleet = Fleet::start(1, "[server]\nupstream_timeout = \"300ms\"").await;
    let slow = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":3000}}});
    let a = fleet.post(&[], &slow).await;
    assert_router_error(&a, 504, -32004, "upstream_timeout", json!(4));
}

#[tokio::test]
async fn too_many_rounds_is_429() {
    let fleet = Fleet::start(2, "[routing]\nmax_rounds = 2").await;
    assert_eq!(
        fleet.post(&[], &start_call("long", 5)).await.json()["result"]["pending"],
        true
    );
    assert_eq!(
        fleet.post(&[], &confirm("long", 2)).await.json()["result"]["pending"],
        true
    );
    let a = fleet.post(&[], &confirm("long", 3)).await;
    assert_router_error(&a, 429, -32000, "too_many_rounds", json!(4));
    assert_eq!(a.json()["error"]["data"]["key"], "long");
    // A call within the limit is unaffected.
    fleet.post(&[], &start_call("short", 2)).await;
    assert_eq!(
        fleet.post(&[], &confirm("short", 2)).await.json()["result"]["content"][0]["text"],
        "done"
    );
}

#[tokio::test]
async fn full_pin_table_refuses_new_calls_but_serves_pinned_ones() {
    let fleet = Fleet::start(2, "[routing]\nmax_pins = 3").await;
    for i in 0..3 {
        assert_eq!(fleet.post(&[], &start_call(&format!("c{i}"), 2)).await.status, 200);
    }
    let a = fleet.post(&[], &start_call("c3", 2)).await;
    assert_router_error(&a, 429, -32000, "pin_capacity", json!(1));
    // Follow-ups of pinned calls still go through, and finishing them frees room.
    assert_eq!(
        fleet.post(&[], &confirm("c0", 2)).await.json()["result"]["content"][0]["text"],
        "done"
    );
    // Requests that cannot start a call are never refused.
    let list = fleet
        .post(&[], &json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .await;
    assert_eq!(list.status, 200);
    assert_eq!(fleet.total_unknown_followups(), 0);
}

#[tokio::test]
async fn a_full_pin_table_refuses_a_new_call_that_echoes_a_routing_token() {
    let fleet = Fleet::start(
        2,
        "[tokens]\nkeys = [\"key-a-0123456789abcdef0123456789abcdef\"]\n[routing]\nmax_pins = 1",
    )
    .await;
    let c0 = fleet.post(&[], &start_call("c0", 2)).await;
    assert_eq!(c0.json()["result"]["pending"], true);
    let token = c0.headers["mcp-routing-id"].to_str().unwrap().to_string();
    assert_eq!(fleet.control.pin_count(), 1, "c0 filled the table");
    // A new call that sends c0's token names a backend, but matches no pin here: it is new.
    let c1 = fleet.post(&[("mcp-routing-id", &token)], &start_call("c1", 2)).await;
    assert_router_error(&c1, 429, -32000, "pin_capacity", json!(1));
    assert_eq!(fleet.control.pin_count(), 1, "the refused call made no pin");
    // c0's own follow-up, token and all, still passes.
    let done = fleet.post(&[("mcp-routing-id", &token)], &confirm("c0", 2)).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], "done");
    assert_eq!(fleet.total_unknown_followups(), 0);
}

/// A legacy-session server (docs/src/dialects.md) on a real socket: `initialize` opens the session
/// `session-1` (an `Mcp-Session-Id` answer header); in it, a `tools/call` answers `pending`, a
/// `confirm` answers `pending` until `params.round` reaches `params.of`, then a final result.
/// The example workers issue no sessions.
async fn session_server() -> BackendSpec {
    test_backend("sessions", |_, body| session_answer(body)).await
}

async fn session_answer(body: Bytes) -> http::Response<http_body_util::Full<Bytes>> {
    let msg: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let (round, of) = (msg["params"]["round"].as_u64(), msg["params"]["of"].as_u64());
    let (result, session) = match msg["method"].as_str() {
        Some("initialize") => (json!({"protocolVersion": "2025-06-18"}), Some("session-1")),
        Some("tools/call") => (json!({"pending": true}), None),
        Some("confirm") if round < of => (json!({"pending": true}), None),
        _ => (json!({"content": []}), None),
    };
    let mut answer = json!({"jsonrpc": "2.0", "id": msg["id"], "result": result});
    if let Some(m) = msg.get("messageId") {
        answer["messageId"] = m.clone();
    }
    let mut resp = http::Response::builder().header("content-type", "application/json");
    if let Some(s) = session {
        resp = resp.header("mcp-session-id", s);
    }
    resp.body(http_body_util::Full::new(Bytes::from(answer.to_string())))
        .unwrap()
}

/// A router in front of [`session_server`] with `routing`, and the session it opened.
async fn in_a_session(routing: &str) -> Fleet {
    let fleet = Fleet::start_backends(Vec::new(), &[session_server().await], routing).await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}});
    let a = fleet.post(&[], &init).await;
    assert_eq!(a.headers["mcp-session-id"], "session-1", "{a:?}");
    assert_eq!(fleet.control.pin_count(), 1, "the session is pinned");
    fleet
}

const SESSION: [(&str, &str); 1] = [("mcp-session-id", "session-1")];

fn call_in_session(mid: &str, id: u32) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "messageId": mid, "method": "tools/call", "params": {"name": "transfer-funds"}})
}

fn confirm_in_session(mid: &str, round: u64, of: u64) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 10 + round, "messageId": mid, "method": "confirm", "params": {"round": round, "of": of}})
}

#[tokio::test]
async fn a_full_pin_table_refuses_a_new_call_inside_a_session_but_not_its_pinned_ones() {
    let fleet = in_a_session("[routing]\nmax_pins = 2").await;
    // The session and one call inside it fill the table.
    let c1 = fleet.post(&SESSION, &call_in_session("c-1", 1)).await;
    assert_eq!(c1.json()["result"]["pending"], true);
    assert_eq!(fleet.control.pin_count(), 2);
    // The session's pin chooses the backend, but a new call inside it would add a pin of its own.
    let c2 = fleet.post(&SESSION, &call_in_session("c-2", 2)).await;
    assert_router_error(&c2, 429, -32000, "pin_capacity", json!(2));
    assert_eq!(fleet.control.pin_count(), 2, "the refused call made no pin");
    // The call pinned inside the session goes on; requests that start nothing pass.
    let next = fleet.post(&SESSION, &confirm_in_session("c-1", 2, 3)).await;
    assert_eq!(next.json()["result"]["pending"], true, "{next:?}");
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    assert_eq!(fleet.post(&SESSION, &list).await.status, 200);
    let done = fleet.post(&SESSION, &confirm_in_session("c-1", 3, 3)).await;
    assert_eq!(done.json()["result"]["content"], json!([]), "{done:?}");
}

#[tokio::test]
async fn a_call_inside_a_session_counts_its_rounds() {
    let fleet = in_a_session("[routing]\nmax_rounds = 3").await;
    assert_eq!(
        fleet.post(&SESSION, &call_in_session("long", 1)).await.json()["result"]["pending"],
        true
    );
    for round in 2..=3 {
        let a = fleet.post(&SESSION, &confirm_in_session("long", round, 9)).await;
        assert_eq!(a.json()["result"]["pending"], true, "round {round}: {a:?}");
    }
    let a = fleet.post(&SESSION, &confirm_in_session("long", 4, 9)).await;
    assert_router_error(&a, 429, -32000, "too_many_rounds", json!(14));
    assert_eq!(a.json()["error"]["data"]["key"], "long");
}

#[tokio::test]
async fn too_many_or_too_large_headers_are_431_before_any_body_is_read() {
    let fleet = Fleet::start(1, "").await;
    let many: Vec<(String, String)> = (0..150).map(|i| (format!("x-h-{i}"), "v".to_string())).collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let body = Bytes::from(json!({"jsonrpc":"2.0","id":1,"method":"ping"}).to_string());
    let a = send(&fleet.client, Method::POST, &fleet.url(), &refs, body.clone()).await;
    assert_eq!(a.status, 431);
    let huge = "x".repeat(80 * 1024);
    let a = send(&fleet.client, Method::POST, &fleet.url(), &[("x-big", &huge)], body).await;
    assert_eq!(a.status, 431);
    let served = fleet.total_requests();
    assert_eq!(served, 0);
}

#[tokio::test]
async fn a_body_that_never_arrives_is_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fleet = Fleet::start(1, "[server]\nbody_read_timeout = \"200ms\"").await;
    let mut sock = tokio::net::TcpStream::connect(fleet.router).await.unwrap();
    // Headers promise 100 bytes; 10 come.
    sock.write_all(
        b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"jsonrpc\"",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(REQUEST_DEADLINE, sock.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("mcp-router-error: body_timeout"), "{text}");
}

#[tokio::test]
async fn a_refused_large_body_still_gets_its_413_not_a_reset() {
    let fleet = Fleet::start(1, "").await;
    let big = Bytes::from(vec![b' '; 3 << 20]);
    for _ in 0..5 {
        // A fresh connection each time: the router refuses early, then reads and drops the rest
        // so the client (still sending) receives the answer.
        let client = client();
        let a = send(&client, Method::POST, &fleet.url(), &[], big.clone()).await;
        assert_eq!((a.status.as_u16(), a.router_error()), (413, Some("body_too_large")));
    }
}

#[tokio::test]
async fn a_json_answer_whose_body_stalls_is_504() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A backend that sends its head and part of a JSON body, then nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"jsonrpc\"";
                let _ = sock.write_all(head.as_bytes()).await;
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            });
        }
    });
    let spec = BackendSpec {
        name: "stall".into(),
        url: format!("http://{addr}"),
        weight: 1,
    };
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "[server]\nupstream_timeout = \"300ms\"").await;
    let a = fleet
        .post(
            &[],
            &json!({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"x"}}),
        )
        .await;
    assert_router_error(&a, 504, -32004, "upstream_timeout", json!(8));
}

/// A backend named `hang` whose connects hang: its listener's accept queue is full, so the
/// kernel drops new SYNs. The listener and the connections that fill it are to be kept until
/// the test ends.
async fn hanging_backend() -> (BackendSpec, (tokio::net::TcpListener, Vec<tokio::net::TcpStream>)) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(Duration::from_millis(300), tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => queued.push(s),
            Ok(Err(e)) => panic!("connect to the full listener failed instead of hanging: {e}"),
            Err(_) => {
                let spec = BackendSpec {
                    name: "hang".into(),
                    url: format!("http://{addr}"),
                    weight: 1,
                };
                return (spec, (listener, queued));
            }
        }
    }
    panic!("the listener's accept queue never filled");
}

#[tokio::test]
async fn a_connect_that_hangs_is_504_at_upstream_timeout() {
    let (spec, held) = hanging_backend().await;
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "[server]\nupstream_timeout = \"300ms\"").await;
    let started = std::time::Instant::now();
    let a = fleet
        .post(
            &[],
            &json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"x"}}),
        )
        .await;
    // Not the 5 s connect timeout's 502: the request's own deadline bounds the connect.
    assert_router_error(&a, 504, -32004, "upstream_timeout", json!(9));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"hang\",kind=\"timeout\"}"),
        Some(1.0)
    );
    drop(held);
}

#[tokio::test]
async fn a_connect_that_hangs_is_502_after_the_connect_timeout() {
    let (spec, held) = hanging_backend().await;
    // The default upstream_timeout (300 s) is longer than the 5 s connect timeout, which ends
    // the attempt. Time is paused from here and jumps to the next timer whenever every task
    // waits, so the 5 s pass at once; sockets are real.
    tokio::time::pause();
    let fleet = Fleet::start_backends(Vec::new(), &[spec], "").await;
    let started = tokio::time::Instant::now();
    let a = fleet
        .post(
            &[],
            &json!({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"x"}}),
        )
        .await;
    assert_router_error(&a, 502, -32003, "upstream_unavailable", json!(8));
    let took = started.elapsed();
    assert!(
        took >= mrtr_router::config::defaults::CONNECT_TIMEOUT && took < Duration::from_secs(6),
        "took {took:?}"
    );
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_upstream_errors_total{backend=\"hang\",kind=\"connect\"}"),
        Some(1.0)
    );
    drop(held);
}

/// A backend that refuses the connection never saw the request: with `upstream.retry` on, it
/// goes once to the next backend of the ring, within `retry_budget` (a share of the requests
/// over the last 10 s, at least 10); past the budget, or with `retry = "off"`, the client gets
/// the 502. The dead backend stays on the ring (no ejection) so every request can ask.
#[tokio::test]
async fn a_refused_connect_moves_on_once_within_the_retry_budget() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let keep_dead = "[health]\ninterval = \"1h\"\nunhealthy_after = 1000\n";
    for (upstream, budget_bound) in [
        ("retry_budget = 1.0\n", None),
        ("retry_budget = 0.1\n", Some(0.1)),
        ("retry = \"off\"\n", Some(0.0)),
    ] {
        let worker = start_worker("worker-0").await;
        let mut specs = specs_of(std::slice::from_ref(&worker));
        specs.push(BackendSpec {
            name: "dead".into(),
            url: format!("http://127.0.0.1:{port}"),
            weight: 1,
        });
        let extra = format!("{keep_dead}[upstream]\n{upstream}");
        let fleet = Fleet::start_backends(vec![worker], &specs, &extra).await;
        let mut refused = 0u32;
        for i in 0..300 {
            let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "whoami"}});
            let a = fleet.post(&[("mcp-routing-id", &format!("k-{i}"))], &call).await;
            match a.status.as_u16() {
                200 => {}
                502 => refused += 1,
                other => panic!("{upstream}: {other}"),
            }
        }
        let m = fleet.metrics().await;
        let retries = metric(&m, "mrtr_retries_total{reason=\"connect\"}").unwrap_or(0.0);
        let exhausted = metric(&m, "mrtr_retries_budget_exhausted_total").unwrap_or(0.0);
        match budget_bound {
            // Every request the dead backend refused went on and was served.
            None => {
                assert_eq!(refused, 0, "{upstream}");
                assert!(retries >= 50.0, "{upstream}: {retries} retries");
                assert_eq!(exhausted, 0.0);
            }
            // Off: never asked.
            Some(0.0) => {
                assert!(refused >= 50, "{upstream}: {refused} refused");
                assert_eq!((retries, exhausted), (0.0, 0.0), "{upstream}");
            }
            // Each refused request asked, and the budget said no.
            Some(share) => {
                assert!(refused > 0, "{upstream}: nothing refused");
                assert!(retries <= share * 300.0 + 10.0, "{upstream}: {retries} retries");
                assert!(retries >= 10.0, "{upstream}: at least the floor: {retries}");
                assert_eq!(exhausted, f64::from(refused), "{upstream}");
            }
        }
        fleet.shutdown().await;
    }
}

/// A backend that fails after the request was sent (a reset before any byte of its answer):
/// a first round that may run twice (a `tools/list`) goes once to the next backend; a
/// `tools/call` of a tool nobody says is safe to repeat gets the 502 and ran at most once; with
/// `retry = "off"` nothing goes on.
#[tokio::test]
async fn a_reset_first_round_goes_on_only_when_it_may_run_twice() {
    use std::sync::atomic::Ordering;
    let keep = "[health]\ninterval = \"1h\"\nunhealthy_after = 1000\n";
    for retry in ["idempotent", "off"] {
        let (spec, seen) = resetter().await;
        let worker = start_worker("worker-0").await;
        let mut specs = specs_of(std::slice::from_ref(&worker));
        specs.push(spec);
        let extra = format!("{keep}[upstream]\nretry = \"{retry}\"\nretry_budget = 1.0\n");
        let fleet = Fleet::start_backends(vec![worker], &specs, &extra).await;
        let mut failed = 0;
        for i in 0..60 {
            let list = json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"});
            let a = fleet.post(&[("mcp-routing-id", &format!("l-{i}"))], &list).await;
            match a.status.as_u16() {
                200 => {}
                502 => failed += 1,
                other => panic!("{retry}: {other}"),
            }
        }
        let lists_reset = seen.load(Ordering::SeqCst);
        assert!(
            lists_reset >= 5,
            "{retry}: the ring sent the resetter only {lists_reset}"
        );
        let m = fleet.metrics().await;
        let resent = metric(&m, "mrtr_retries_total{reason=\"reset\"}").unwrap_or(0.0);
        match retry {
            "idempotent" => {
                assert_eq!(failed, 0, "every list the resetter dropped went on");
                assert_eq!(resent, lists_reset as f64);
            }
            _ => {
                assert_eq!(failed, lists_reset, "{retry}");
                assert_eq!(resent, 0.0);
            }
        }
        // Never sent twice: a call of a tool no catalog says is safe, a later round of a call (a
        // state it echoes, known here or not), a batch even of one.
        let later = |i: usize| json!({"jsonrpc": "2.0", "id": i, "method": "tools/list", "params": {"requestState": format!("s-{i}")}});
        let batch = |i: usize| json!([{"jsonrpc": "2.0", "id": i, "method": "tools/list"}]);
        let call = |i: usize| json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "whoami"}});
        let shapes: [(&str, &dyn Fn(usize) -> serde_json::Value); 3] =
            [("call", &call), ("later round", &later), ("batch of one", &batch)];
        for (shape, body) in shapes {
            let before = seen.load(Ordering::SeqCst);
            let mut shape_failed = 0;
            for i in 0..60 {
                let key = format!("{shape}-{i}");
                let headers = [("mcp-routing-id", key.as_str()), ("mcp-protocol-version", "2025-03-26")];
                let a = fleet.post(&headers, &body(i)).await;
                if a.status == StatusCode::BAD_GATEWAY {
                    shape_failed += 1;
                }
            }
            assert!(shape_failed > 0, "{retry}, {shape}");
            assert_eq!(
                seen.load(Ordering::SeqCst) - before,
                shape_failed,
                "{retry}, {shape}: each ran once, and failed"
            );
        }
        fleet.shutdown().await;
    }
}
