//! New proxy connections: the protocol is told from the first bytes (HTTP/1 or h2c, with a
//! fallback when a first segment is too short to tell), a connection that sends nothing, or
//! only part of a head, is closed after `header_read_timeout`, and those past
//! `server.max_connections` are counted as they wait.

use std::time::{Duration, Instant};

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

fn raw_post(fleet: &Fleet) -> String {
    raw_mcp_post(fleet.router, "", PING)
}

/// A request whose answer the worker holds back for `ms` milliseconds.
fn raw_slow_post(ms: u64) -> String {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":{ms}}}}}}}"#
    );
    raw_mcp_post("x", "", &body)
}

/// The router closed no sooner than `at_least` after `since` (it is a timeout, not an error).
fn assert_waited(since: Instant, at_least: Duration) {
    let waited = since.elapsed();
    assert!(waited >= at_least, "closed after {waited:?}, before {at_least:?}");
}

/// Reads one answer with a JSON-RPC result (the connection stays open).
async fn read_answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"result\"") {
        let n = tokio::time::timeout(REQUEST_DEADLINE, s.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn requests_are_served_whatever_their_first_segment_holds() {
    let fleet = Fleet::start(1, "").await;
    // Whole, then split after "P" (which also begins the HTTP/2 preface, so the router cannot
    // tell from the first segment alone), then after "PO".
    for split in [None, Some(1), Some(2)] {
        let request = raw_post(&fleet);
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.set_nodelay(true).unwrap();
        match split {
            None => s.write_all(request.as_bytes()).await.unwrap(),
            Some(at) => {
                s.write_all(&request.as_bytes()[..at]).await.unwrap();
                // Not a synchronisation: the answer is checked either way; the pause only makes
                // it likely that the router sees the short segment on its own.
                tokio::time::sleep(Duration::from_millis(50)).await;
                s.write_all(&request.as_bytes()[at..]).await.unwrap();
            }
        }
        let text = read_answer(&mut s).await;
        assert!(text.starts_with("HTTP/1.1 200"), "split {split:?}: {text}");
    }
}

#[tokio::test]
async fn a_silent_connection_is_closed_and_a_stalled_head_gets_408_after_the_header_read_timeout() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"400ms\"").await;

    let got = sent_then_closed(&fleet, b"", Duration::from_millis(300), "a silent connection is closed").await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));

    // Part of the HTTP/2 preface (too little to tell the protocol), then nothing.
    let got = sent_then_closed(
        &fleet,
        b"PRI * HTTP/2",
        Duration::from_millis(400),
        "a connection stuck in the preface is closed",
    )
    .await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));

    // Part of a head, then nothing.
    let got = sent_then_closed(
        &fleet,
        b"POST /mcp HTTP/1.1\r\nHost: x\r\n",
        Duration::from_millis(400),
        "a stalled head is closed",
    )
    .await;
    assert_header_timeout(&got);
    assert_eq!(fleet.total_requests(), 0, "neither reached a backend");
    let metrics = fleet.metrics().await;
    assert_eq!(
        metric(&metrics, r#"mrtr_router_errors_total{reason="header_timeout"}"#),
        Some(1.0),
        "only the stalled head counts"
    );
}

/// Opens a connection, sends `first` (maybe nothing) and reads until the router closes it
/// (`what` says the close expected), no sooner than `at_least` after the connect; returns
/// what came back.
async fn sent_then_closed(fleet: &Fleet, first: &[u8], at_least: Duration, what: &str) -> Vec<u8> {
    let started = Instant::now();
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(first).await.unwrap();
    let got = read_to_close(&mut s, Duration::from_secs(10)).await.expect(what);
    assert_waited(started, at_least);
    got
}

/// The answer to a head that came too slowly: 408 `header_timeout` (docs/src/errors.md), then close.
fn assert_header_timeout(got: &[u8]) {
    let text = String::from_utf8_lossy(got);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("a whole answer: {text:?}"));
    assert!(head.starts_with("HTTP/1.1 408 "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nmcp-router-error: header_timeout"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(body).expect("a JSON-RPC error body");
    assert_eq!(v["error"]["code"], -32600);
}

#[tokio::test]
async fn a_head_trickled_a_byte_at_a_time_still_times_out() {
    // The timeout bounds the whole head, not the gap between its bytes.
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"400ms\"").await;
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.set_nodelay(true).unwrap();
    let started = Instant::now();
    let head = b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // One byte every 50 ms (the pace of a slow client, not a synchronisation) until the router
    // closes; the head has bytes enough for 4.5 s.
    for byte in head {
        match s.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        if s.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A write after the router closed may draw a reset, which can drop the 408 unread: the
    // answer is checked when it arrived, and the close always.
    if let Some(rest) = read_to_close(&mut s, Duration::from_millis(100)).await {
        got.extend_from_slice(&rest);
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "closed after {took:?}");
    assert!(took < Duration::from_millis(2500), "still open after {took:?}");
    if !got.is_empty() {
        assert_header_timeout(&got);
    }
    assert_eq!(fleet.total_requests(), 0);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_without_an_answer_and_a_slow_answer_is_not_cut() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"300ms\"").await;
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    // An answer that takes four header read timeouts: the connection waits for it, not for a head.
    s.write_all(raw_slow_post(1200).as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
    // Then idle: closed with no bytes at all.
    let idle_from = Instant::now();
    let rest = read_to_close(&mut s, Duration::from_secs(10))
        .await
        .expect("the idle connection is closed");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert_waited(idle_from, Duration::from_millis(250));
}

#[tokio::test]
async fn a_request_sent_while_another_is_in_flight_is_not_taken_for_the_client_leaving() {
    // The timer peeks at the socket every 50 ms while the first request is in flight: it must
    // find the second request's bytes there (hyper reads them only after the first answer), not
    // an end of stream.
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"200ms\"").await;
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(raw_slow_post(600).as_bytes()).await.unwrap();
    let deadline = Instant::now() + REQUEST_DEADLINE;
    while fleet.total_requests() == 0 {
        assert!(Instant::now() < deadline, "the first request never reached the worker");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
    let mut got = read_answer(&mut s).await;
    while got.matches("\"result\"").count() < 2 {
        got.push_str(&read_answer(&mut s).await);
    }
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got}");
    assert_eq!(fleet.total_requests(), 2);
    assert_eq!(metric(&fleet.metrics().await, "mrtr_client_aborts_total"), Some(0.0));
}

#[tokio::test]
async fn an_h2c_connection_without_a_stream_for_the_header_read_timeout_is_closed() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"300ms\"").await;
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(fleet.router).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, http_body_util::Full<bytes::Bytes>>(
        hyper_util::rt::TokioExecutor::new(),
        io,
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post(format!("http://{}/mcp", fleet.router))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(PING)))
        .unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, sender.send_request(req))
        .await
        .expect("an answer")
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let idle_from = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the router closes the idle connection")
        .unwrap()
        .expect("with a GOAWAY, not an error");
    assert_waited(idle_from, Duration::from_millis(250));
}

/// An h2c client that sends the preface and then nothing, not even the GOAWAY's PING answer
/// that h2 waits for, is dropped one timeout after its GOAWAY instead of being held forever.
#[tokio::test]
async fn an_h2c_client_that_never_answers_the_goaway_is_dropped() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"300ms\"").await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let got = sent_then_closed(
        &fleet,
        preface,
        Duration::from_millis(250),
        "a silent h2c client is closed",
    )
    .await;
    assert!(!got.is_empty(), "the router's SETTINGS and GOAWAY came first");
}

#[tokio::test]
async fn a_connection_that_closes_before_its_protocol_is_known_is_let_go_at_once() {
    // The header read timeout is long here: these closes must be noticed, not timed out.
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"30s\"").await;
    for first in [&b""[..], b"P", b"PRI * HTTP/2.0\r\n"] {
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.write_all(first).await.unwrap();
        s.shutdown().await.unwrap();
        let got = read_to_close(&mut s, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("after {first:?}, the router keeps a half-closed connection"));
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    }
    // And it still serves.
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
}

/// A keep-alive connection that waits between requests is parked (hyper's state dropped, its
/// socket kept: `mrtr_connections_parked`), and whatever its client sends next is read whole by
/// the hyper connection made for it: a request, a head split across two writes, two pipelined
/// requests. It stays one connection throughout.
#[tokio::test]
async fn a_waiting_connection_is_parked_and_what_its_client_sends_next_is_served() {
    // Looks every second: parked one to two seconds after its last request, closed after four.
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"4s\"").await;
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    let post = raw_post(&fleet);
    s.write_all(post.as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
    let parked = || fleet.wait_metric("mrtr_connections_parked", 1.0, Duration::from_secs(10));

    parked().await;
    s.write_all(post.as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
    assert_eq!(metric(&fleet.metrics().await, "mrtr_connections_parked"), Some(0.0));

    // The first part wakes the connection; the new hyper connection waits for the rest.
    parked().await;
    let (head, rest) = post.split_at(10);
    s.write_all(head.as_bytes()).await.unwrap();
    fleet
        .wait_metric("mrtr_connections_parked", 0.0, Duration::from_secs(10))
        .await;
    s.write_all(rest.as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));

    parked().await;
    s.write_all(format!("{post}{post}").as_bytes()).await.unwrap();
    let mut got = read_answer(&mut s).await;
    while got.matches("\"result\"").count() < 2 {
        got.push_str(&read_answer(&mut s).await);
    }
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got}");

    assert_eq!(fleet.total_requests(), 5);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_connections{protocol=\"http1\"}"), Some(1.0), "{m}");
    assert_eq!(
        metric(&m, "mrtr_router_errors_total{reason=\"header_timeout\"}"),
        Some(0.0)
    );
}

/// A parked connection whose client closes it is let go at once (its socket's readiness
/// wakes it), and one that stays parked is closed after `header_read_timeout` without a word,
/// as an idle keep-alive connection always was.
#[tokio::test]
async fn a_parked_connection_is_let_go_when_its_client_leaves_or_after_the_header_read_timeout() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"2s\"").await;
    let mut leaving = TcpStream::connect(fleet.router).await.unwrap();
    let mut staying = TcpStream::connect(fleet.router).await.unwrap();
    for s in [&mut leaving, &mut staying] {
        s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
        assert!(read_answer(s).await.starts_with("HTTP/1.1 200"));
    }
    let idle_from = Instant::now();
    fleet
        .wait_metric("mrtr_connections_parked", 2.0, Duration::from_secs(10))
        .await;
    drop(leaving);
    fleet
        .wait_metric("mrtr_connections{protocol=\"http1\"}", 1.0, Duration::from_secs(10))
        .await;
    let rest = read_to_close(&mut staying, Duration::from_secs(10))
        .await
        .expect("the parked connection is closed");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert_waited(idle_from, Duration::from_millis(1900));
    fleet
        .wait_metric("mrtr_connections{protocol=\"http1\"}", 0.0, Duration::from_secs(10))
        .await;
    assert_eq!(metric(&fleet.metrics().await, "mrtr_connections_parked"), Some(0.0));
}

/// A chunked request body with trailer fields is read whole and answered (hyper's chunked
/// decoder, whose trailer buffer and limits the vendored hyper keeps boxed and resolved,
/// vendor/patches/hyper/0007); one with more trailer fields than `server.max_headers` is a body
/// the router cannot read: 400 `parse_error`, and the router serves on.
#[tokio::test]
async fn chunked_bodies_with_trailers_are_read_whole_and_too_many_trailers_are_refused() {
    let fleet = Fleet::start(1, "[server]\nmax_headers = 16").await;
    let chunked = |trailers: usize| {
        let (a, b) = PING.split_at(10);
        let fields: String = (0..trailers).map(|i| format!("x-t-{i}: {i}\r\n")).collect();
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n{fields}\r\n",
            fleet.router,
            a.len(),
            b.len()
        )
    };
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(chunked(3).as_bytes()).await.unwrap();
    let answer = read_answer(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The same connection goes on.
    s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));

    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(chunked(17).as_bytes()).await.unwrap();
    let got = read_to_close(&mut s, REQUEST_DEADLINE)
        .await
        .expect("answered, then closed");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("parse_error"), "{text}");

    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
    assert_eq!(fleet.total_requests(), 3);
}

/// Part of a head sent to a parked connection wakes it, and if the rest never comes the client
/// gets the 408 `header_timeout` (with what it sent unread by any request), no sooner than
/// `header_read_timeout` after its last answer.
#[tokio::test]
async fn part_of_a_head_sent_to_a_parked_connection_gets_the_408() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"2s\"").await;
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
    assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
    let answered = Instant::now();
    fleet
        .wait_metric("mrtr_connections_parked", 1.0, Duration::from_secs(10))
        .await;
    s.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let got = read_to_close(&mut s, Duration::from_secs(10))
        .await
        .expect("answered, then closed");
    assert_header_timeout(&got);
    assert_waited(answered, Duration::from_millis(1900));
    assert_eq!(fleet.total_requests(), 1);
}

/// Connections past `server.max_connections` wait in the kernel's backlog, and each is counted
/// once in `mrtr_connections_refused_total{reason="cap"}`: the first as soon as it waits, the
/// others as they are accepted once connections close. After all are served the counter is
/// their number, and a connection accepted with no cap in the way adds nothing.
#[tokio::test]
async fn each_connection_held_back_at_the_cap_is_counted_once() {
    const CAP: usize = 2;
    const PAST: usize = 3;
    let fleet = Fleet::start(1, &format!("[server]\nmax_connections = {CAP}")).await;
    let held_back = || async {
        metric(
            &fleet.metrics().await,
            r#"mrtr_connections_refused_total{reason="cap"}"#,
        )
    };
    let mut open = Vec::new();
    for _ in 0..CAP {
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.write_all(raw_post(&fleet).as_bytes()).await.unwrap();
        assert!(read_answer(&mut s).await.starts_with("HTTP/1.1 200"));
        open.push(s);
    }
    assert_eq!(held_back().await, Some(0.0));

    // Each sends its request at once; the router closes each once answered.
    let closing = raw_mcp_post(fleet.router, "Connection: close\r\n", PING);
    let mut past = Vec::new();
    for _ in 0..PAST {
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.write_all(closing.as_bytes()).await.unwrap();
        past.push(s);
    }
    let counted = "mrtr_connections_refused_total{reason=\"cap\"}";
    fleet.wait_metric(counted, 1.0, Duration::from_secs(10)).await;
    assert_eq!(fleet.total_requests(), CAP as u64, "served past the cap");

    drop(open);
    for (i, s) in past.iter_mut().enumerate() {
        let got = read_to_close(s, REQUEST_DEADLINE).await.expect("served, then closed");
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "connection {i}: {}",
            String::from_utf8_lossy(&got)
        );
    }
    assert_eq!(held_back().await, Some(PAST as f64));

    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(closing.as_bytes()).await.unwrap();
    let got = read_to_close(&mut s, REQUEST_DEADLINE)
        .await
        .expect("served, then closed");
    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    assert_eq!(
        held_back().await,
        Some(PAST as f64),
        "a connection that did not wait was counted"
    );
}
