//! Connections that send too little to tell what they are, then stall: a prefix of the HTTP/2
//! preface (`P`, which could as well begin a `POST`), or of a PROXY protocol header (`PROX`)
//! with `server.proxy_protocol` on. Until `header_read_timeout` such a connection costs the
//! router what a silent one costs: it waits for the client's next bytes, and does not look
//! again and again at the ones it has (300 of them once held a whole core, looking every 2 ms).
//! A client that sends the rest after a pause is served, and one that closes instead is let
//! go at once.
//!
//! The CPU measured is this whole process's (the router runs in it), so the tests take turns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::h2_frames::*;
use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Tests take turns: each measures the CPU time of the whole process.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many connections each phase holds open.
const CONNECTIONS: usize = 300;

/// The CPU time is measured over this long, with every connection accepted and its bytes in.
const WINDOW: Duration = Duration::from_secs(2);

/// Long enough that nothing times out while the connections are held.
const SNIFF: &str = "[server]\nheader_read_timeout = \"30s\"\n";
const PROXY: &str =
    "[server]\nheader_read_timeout = \"30s\"\nproxy_protocol = true\nproxy_protocol_from = [\"127.0.0.0/8\"]\n";

const PENDING: &str = r#"mrtr_connections{protocol="pending"}"#;
const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PROXY_V1: &[u8] = b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 80\r\n";

/// User and system CPU time this process has used so far.
fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is a valid value, and getrusage fills in the one it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The CPU time the process uses over [`WINDOW`] while [`CONNECTIONS`] connections that each
/// sent `first` (maybe nothing) wait for the router to tell what they are.
async fn cpu_while_held(fleet: &Fleet, first: &[u8]) -> Duration {
    let mut held = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.write_all(first).await.unwrap();
        held.push(s);
    }
    // All accepted, none told yet; loopback delivers the bytes within the write, and the
    // settle lets the router take its first look at each before the window.
    fleet
        .wait_metric(PENDING, CONNECTIONS as f64, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = cpu_time();
    tokio::time::sleep(WINDOW).await;
    let used = cpu_time() - before;
    // None was told, closed or timed out during the window.
    fleet
        .wait_metric(PENDING, CONNECTIONS as f64, Duration::from_secs(1))
        .await;
    drop(held);
    fleet.wait_metric(PENDING, 0.0, Duration::from_secs(10)).await;
    used
}

/// Stalled connections that sent `first` cost at most a little more than silent ones.
async fn assert_stalls_cost_what_silence_costs(config: &str, first: &[u8]) {
    let _turn = TURNS.lock().await;
    let _ = mrtr_router::raise_open_file_limit();
    let fleet = Fleet::start(1, config).await;
    let silent = cpu_while_held(&fleet, b"").await;
    let stalled = cpu_while_held(&fleet, first).await;
    eprintln!(
        "{CONNECTIONS} connections over {WINDOW:?}: silent {silent:?} of CPU, after {:?} {stalled:?}",
        String::from_utf8_lossy(first)
    );
    assert!(
        stalled <= silent * 3 + Duration::from_millis(200),
        "{CONNECTIONS} connections stalled after {:?} used {stalled:?} of CPU in {WINDOW:?}, silent ones {silent:?}",
        String::from_utf8_lossy(first)
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stalled_in_the_h2_preface_cost_what_silent_ones_cost() {
    if crate::support::ran_alone() {
        return;
    }
    assert_stalls_cost_what_silence_costs(SNIFF, b"P").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stalled_in_a_proxy_header_cost_what_silent_ones_cost() {
    if crate::support::ran_alone() {
        return;
    }
    assert_stalls_cost_what_silence_costs(PROXY, b"PROX").await;
}

/// Reads one HTTP/1.1 answer with a JSON-RPC result.
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

/// Writes `bytes` in two parts, split at `at`, with a pause between them long enough for the
/// router to have looked at the first part alone (the answer is checked either way).
async fn write_with_a_pause(s: &mut TcpStream, bytes: &[u8], at: usize) {
    s.set_nodelay(true).unwrap();
    s.write_all(&bytes[..at]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(&bytes[at..]).await.unwrap();
}

#[tokio::test]
async fn a_client_that_pauses_in_its_first_bytes_is_served() {
    let _turn = TURNS.lock().await;
    let fleet = Fleet::start(1, SNIFF).await;

    // HTTP/1.1: `P`, then the rest of the `POST`.
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    write_with_a_pause(&mut s, raw_mcp_post(fleet.router, "", PING).as_bytes(), 1).await;
    let text = read_answer(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");

    // HTTP/2: `P`, then the rest of the preface, SETTINGS and a POST on stream 1.
    let mut bytes = H2_PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[]));
    let length = PING.len().to_string();
    let head = hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/mcp"),
        (":authority", "x"),
        ("content-type", "application/json"),
        ("content-length", &length),
    ]);
    bytes.extend(frame(HEADERS, END_HEADERS, 1, &head));
    bytes.extend(frame(DATA, END_STREAM, 1, PING.as_bytes()));
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    write_with_a_pause(&mut s, &bytes, 1).await;
    let (read, write) = s.into_split();
    let seen = Arc::new(parking_lot::Mutex::new(Seen::default()));
    let reader = tokio::spawn(read_frames(
        read,
        Arc::new(tokio::sync::Mutex::new(write)),
        seen.clone(),
    ));
    eventually(REQUEST_DEADLINE, "stream 1 answered", || {
        seen.lock().answered.contains(&1)
    })
    .await;
    assert!(seen.lock().reset.is_empty() && seen.lock().goaway.is_none());
    reader.abort();

    assert_eq!(fleet.total_requests(), 2, "both reached the backend");
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_balancer_that_pauses_in_its_proxy_header_is_served() {
    let _turn = TURNS.lock().await;
    let fleet = Fleet::start(1, PROXY).await;
    // From 127.0.0.1, a trusted balancer.
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    let mut bytes = PROXY_V1.to_vec();
    bytes.extend_from_slice(raw_mcp_post(fleet.router, "", PING).as_bytes());
    write_with_a_pause(&mut s, &bytes, 4).await;
    let text = read_answer(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(fleet.total_requests(), 1);
    fleet.shutdown().await;
}

/// Sends `first`, then closes its end, and expects the router to close the connection too,
/// without an answer and long before `header_read_timeout` (30 s).
async fn let_go_at_once(fleet: &Fleet, first: &[u8]) {
    let started = Instant::now();
    let mut s = TcpStream::connect(fleet.router).await.unwrap();
    s.write_all(first).await.unwrap();
    s.shutdown().await.unwrap();
    let what = String::from_utf8_lossy(first);
    let got = read_to_close(&mut s, Duration::from_secs(2))
        .await
        .unwrap_or_else(|| panic!("after {what:?} and a FIN, the connection is still open"));
    assert!(
        got.is_empty(),
        "after {what:?}: answered {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_client_that_closes_in_its_first_bytes_is_let_go_at_once() {
    let _turn = TURNS.lock().await;
    let fleet = Fleet::start(1, SNIFF).await;
    let_go_at_once(&fleet, b"P").await;
    let_go_at_once(&fleet, b"PRI * HTTP/2.0\r\n").await;
    fleet.wait_metric(PENDING, 0.0, Duration::from_secs(1)).await;
    fleet.shutdown().await;

    let fleet = Fleet::start(1, PROXY).await;
    let_go_at_once(&fleet, b"PROX").await;
    let_go_at_once(&fleet, &PROXY_V1[..20]).await;
    fleet.wait_metric(PENDING, 0.0, Duration::from_secs(1)).await;
    fleet.shutdown().await;
}
