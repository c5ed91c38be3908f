//! The hostile-input table (docs/src/limits.md): each row sends one bad thing, asserts the documented
//! answer (docs/src/limits.md), then asserts that a good request is still served and
//! that this process's resident memory (router and test client) is back within bounds.
//!
//! | row | the bad thing | the answer |
//! |---|---|---|
//! | [`connections_past_max_connections_wait_then_are_served`] | one connection more than `server.max_connections` | not accepted until one closes, then served; `mrtr_connections_refused_total{reason="cap"}` rises |
//! | [`a_thousand_streams_on_one_h2_connection_are_capped`] | 1,024 concurrent streams on one HTTP/2 connection (raw frames) | streams past `h2_max_concurrent_streams` refused (`RST_STREAM REFUSED_STREAM`); the backend sees no more connections than that |
//! | [`unfinished_h2_bodies_stay_within_the_body_buffer_budget`] | 200 unfinished 1 MiB bodies on one HTTP/2 connection | bytes held never above `server.max_body_buffer_bytes`; the rest 503 `router_overloaded` |
//! | [`an_h2_reader_that_takes_nothing_is_reset_after_the_idle_timeout`] | HTTP/2 streams whose client never opens its window | reset after `stream_idle_timeout`, their upstream requests dropped; a slow client that keeps taking is not |
//! | [`admin_changes_need_the_token`] | `POST /backends/*/drain` without, with a wrong, with the right token; reads with `protect_reads`; no token on a non-loopback listener | 401 + `WWW-Authenticate: Bearer`, 401 `invalid_token`, 200; 403 |
//! | [`admin_slowloris_cannot_blind_the_probes`] | 120 slow or idle admin connections | the oldest closed past `admin.max_connections`, the rest after `admin.header_read_timeout`; `/healthz` answers throughout |
//! | [`connect_and_trace_are_answered_by_the_router`] | `CONNECT` (HTTP/1 and HTTP/2), `TRACE` | 405 `method_not_allowed`, `Allow: GET, HEAD, POST, DELETE, OPTIONS`; nothing forwarded |
//! | [`malformed_or_oversized_heads_get_the_documented_bare_answers`] | a head that does not parse, 101 headers, a 70 KiB head (HTTP/1 and HTTP/2) | hyper's bare 400 / 431, as docs/src/limits.md lists them |
//!
//! Two rows of the issue live beside the token format's other tests, in `tests/it/tokens.rs`: a
//! wrapped `requestState` used as an `Mcp-Session-Id` is refused
//! (`a_wrapped_handle_of_one_kind_is_refused_as_another`), and a token's bytes show no
//! backend name (`a_token_reveals_no_backend_name`).
//!
//! The rows run one at a time (memory is measured per process).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::h2_frames::*;
use crate::support::*;
use bytes::Bytes;
use http::{Method, Request};
use mrtr_router::example::Worker;
use mrtr_router::{Config, Listeners, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Rows take turns: each measures the memory of the whole process.
static ROWS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How much more resident memory than at its start a row may leave behind (allocators keep
/// freed memory for reuse).
const SLACK_KIB: u64 = 64 * 1024;

/// A router in front of example workers, from config text and a tweak of the parsed
/// [`Config`] (for values the config file does not allow, such as a short
/// `stream_idle_timeout`), its admin listener bound at `admin_bind`.
struct Rig {
    router: SocketAddr,
    admin: SocketAddr,
    workers: Vec<Worker>,
    client: HttpClient,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

impl Rig {
    async fn start(workers: usize, server: &str, admin: &str, rest: &str) -> Rig {
        Rig::start_with(workers, server, admin, rest, |_| {}, "127.0.0.1:0").await
    }

    async fn start_with(
        n: usize,
        server: &str,
        admin: &str,
        rest: &str,
        tweak: impl FnOnce(&mut Config),
        admin_bind: &str,
    ) -> Rig {
        let mut workers = Vec::new();
        for i in 0..n {
            workers.push(start_worker(&format!("worker-{i}")).await);
        }
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n[admin]\nlisten = \"127.0.0.1:1\"\n{admin}\n{rest}\n"
        );
        for w in &workers {
            text.push_str(&format!(
                "[[backend]]\nname = \"{}\"\nurl = \"{}\"\n",
                w.state.name,
                w.url()
            ));
        }
        let mut config = Config::parse(Path::new("hostile.toml"), &text).expect("valid test config");
        tweak(&mut config);
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind(admin_bind).await.unwrap();
        let router = proxy.local_addr().unwrap();
        let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin.local_addr().unwrap().port()));
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(Router::new(config).run(Listeners { proxy, admin }, async move {
            let _ = stopped.await;
        }));
        Rig {
            router,
            admin: admin_addr,
            workers,
            client: client(),
            stop: Some(stop),
            served,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.router)
    }

    async fn admin_request(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Answer {
        let url = format!("http://{}{path}", self.admin);
        // A connection of its own each time: the admin listener may close old ones (its cap).
        send(&client(), method, &url, headers, Bytes::new()).await
    }

    async fn metrics(&self) -> String {
        let a = self.admin_request(Method::GET, "/metrics", &[]).await;
        String::from_utf8(a.body.to_vec()).unwrap()
    }

    async fn metric(&self, series: &str) -> f64 {
        metric(&self.metrics().await, series).unwrap_or_else(|| panic!("no {series} on /metrics"))
    }

    fn worker_requests(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.state.requests.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    }

    /// The row's last check: a good request is served, and memory is within `slack_kib` of
    /// what it was at `rss_before`.
    async fn still_serves(&self, rss_before: u64, slack_kib: u64) {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                      "params": {"name": "whoami", "arguments": {}}});
        let a = send(
            &self.client,
            Method::POST,
            &self.url(),
            &[],
            Bytes::from(call.to_string()),
        )
        .await;
        assert_eq!(a.status, 200, "{:?}", String::from_utf8_lossy(&a.body));
        assert!(a.json()["result"].is_object(), "{:?}", a.json());
        let rss = rss_kib();
        assert!(
            rss <= rss_before + slack_kib,
            "resident memory {rss} KiB, {} KiB more than at the start (bound {slack_kib} KiB)",
            rss.saturating_sub(rss_before)
        );
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), &mut self.served).await;
    }
}

/// Polls the async `cond` every 10 ms until it holds; fails naming `what` after `limit`.
async fn until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

fn raw_ping() -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{PING}",
        PING.len()
    )
}

/// Reads one HTTP/1 answer whose body holds a JSON-RPC result (the connection stays open).
async fn read_result(s: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    while !String::from_utf8_lossy(&got).contains("\"result\"") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            Ok(_) => panic!("closed before an answer: {:?}", String::from_utf8_lossy(&got)),
            Err(_) => return None,
        }
    }
    Some(String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test]
async fn connections_past_max_connections_wait_then_are_served() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    let rig = Rig::start(1, "max_connections = 4", "", "").await;
    let rss_before = rss_kib();
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(rig.router).await.unwrap();
        s.write_all(raw_ping().as_bytes()).await.unwrap();
        read_result(&mut s, REQUEST_DEADLINE)
            .await
            .expect("served under the cap");
        held.push(s);
    }
    assert_eq!(rig.metric(r#"mrtr_connections{protocol="http1"}"#).await, 4.0);

    // The fifth is queued by the kernel, not taken: its request waits.
    let mut fifth = TcpStream::connect(rig.router).await.unwrap();
    fifth.write_all(raw_ping().as_bytes()).await.unwrap();
    until(REQUEST_DEADLINE, "the refusal is counted", || async {
        rig.metric(r#"mrtr_connections_refused_total{reason="cap"}"#).await >= 1.0
    })
    .await;
    assert!(
        read_result(&mut fifth, Duration::from_millis(300)).await.is_none(),
        "a connection past max_connections was served"
    );
    // One closes: the fifth is taken and served.
    drop(held.pop());
    let answer = read_result(&mut fifth, REQUEST_DEADLINE)
        .await
        .expect("served once a connection closed");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    drop((held, fifth));
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}

#[tokio::test]
async fn a_thousand_streams_on_one_h2_connection_are_capped() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    // Health checks (TCP connects, counted as connections by the worker) once an hour.
    let rig = Rig::start(1, "h2_max_concurrent_streams = 100", "", "[health]\ninterval = \"1h\"").await;
    let rss_before = rss_kib();
    // The one health check of the row (at start) is in before the count begins.
    let connections = || {
        rig.workers[0]
            .state
            .connections
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    eventually(REQUEST_DEADLINE, "the first health check", || connections() >= 1).await;
    let connections_before = connections();

    // A client that opens 1,024 streams at once, never waiting for the server's limit (h2's
    // and hyper's clients would queue them).
    let mut s = TcpStream::connect(rig.router).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    // The server's SETTINGS and its connection window (1 MiB, so the bodies below fit).
    let (mut settings, mut window) = (false, false);
    while !(settings && window) {
        let mut head = [0u8; 9];
        tokio::time::timeout(REQUEST_DEADLINE, s.read_exact(&mut head))
            .await
            .expect("the server's preface")
            .unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
        s.read_exact(&mut payload).await.unwrap();
        settings |= head[3] == SETTINGS && head[4] & ACK == 0;
        window |= head[3] == WINDOW_UPDATE && head[5..9] == [0, 0, 0, 0];
    }
    let (read, write) = s.into_split();
    let write = Arc::new(tokio::sync::Mutex::new(write));
    let seen = Arc::new(parking_lot::Mutex::new(Seen::default()));
    let reader = tokio::spawn(read_frames(read, write.clone(), seen.clone()));

    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":500}}}"#;
    let length = body.len().to_string();
    let block = hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/mcp"),
        (":authority", "x"),
        ("content-type", "application/json"),
        ("content-length", &length),
    ]);
    // The first 100 carry a call the worker holds for 500 ms; the others are empty POSTs (a
    // client that sent bodies on refused streams would draw a reset for each DATA frame too,
    // and h2 closes a connection past 1,024 such resets: `GOAWAY ENHANCE_YOUR_CALM`).
    let empty = hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/mcp"),
        (":authority", "x"),
        ("content-type", "application/json"),
    ]);
    let mut burst = frame(SETTINGS, ACK, 0, &[]);
    let streams: Vec<u32> = (0..1024).map(|i| 2 * i + 1).collect();
    for (i, &id) in streams.iter().enumerate() {
        if i < 100 {
            burst.extend(frame(HEADERS, END_HEADERS, id, &block));
            burst.extend(frame(DATA, END_STREAM, id, body.as_bytes()));
        } else {
            burst.extend(frame(HEADERS, END_HEADERS | END_STREAM, id, &empty));
        }
    }
    write.lock().await.write_all(&burst).await.unwrap();

    until(Duration::from_secs(30), "every stream answered or refused", || async {
        let seen = seen.lock();
        seen.goaway.is_some()
            || streams
                .iter()
                .all(|id| seen.answered.contains(id) || seen.reset.contains_key(id))
    })
    .await;
    let (answered, refused, other) = {
        let seen = seen.lock();
        assert_eq!(
            seen.goaway,
            None,
            "the connection was closed instead ({} answered, {} reset)",
            seen.answered.len(),
            seen.reset.len()
        );
        let refused = seen.reset.values().filter(|c| **c == REFUSED_STREAM).count();
        (seen.answered.len(), refused, seen.reset.len() - refused)
    };
    assert_eq!(other, 0, "streams reset for another reason");
    assert_eq!(answered + refused, 1024);
    assert!(answered >= 100, "{answered} answered");
    assert!(refused >= 1024 - 2 * 100, "{refused} refused");
    // The 100 calls reached the backend (an empty POST accepted in a freed place is the
    // router's 400), over no more connections than streams may be open at once (each
    // request in flight to an HTTP/1 backend needs one).
    assert_eq!(rig.worker_requests(), 100);
    let opened = connections() - connections_before;
    assert!(opened <= 100, "the backend saw {opened} connections");

    reader.abort();
    drop(write);
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}

#[tokio::test]
async fn unfinished_h2_bodies_stay_within_the_body_buffer_budget() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    const MIB: usize = 1 << 20;
    const BUDGET: usize = 32 * MIB;
    let rig = Rig::start(
        1,
        &format!(
            "max_body_bytes = {}\nmax_body_buffer_bytes = {BUDGET}\nh2_max_concurrent_streams = 256",
            2 * MIB
        ),
        "",
        "",
    )
    .await;
    let rss_before = rss_kib();

    let tcp = TcpStream::connect(rig.router).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    // 200 bodies that each declare one byte more than the mebibyte they send.
    let mebibyte = Bytes::from(vec![b' '; MIB]);
    let mut answers = Vec::new();
    let mut sending = Vec::new();
    for _ in 0..200 {
        let mut ready = client.clone().ready().await.unwrap();
        let req = Request::post(rig.url())
            .header("content-type", "application/json")
            .header("content-length", MIB + 1)
            .body(())
            .unwrap();
        let (answer, mut body) = ready.send_request(req, false).unwrap();
        body.send_data(mebibyte.clone(), false).unwrap();
        sending.push(body);
        answers.push(tokio::spawn(async move {
            let resp = answer.await.ok()?;
            let reason = resp
                .headers()
                .get("mcp-router-error")
                .map(|v| v.to_str().unwrap().to_string());
            let retry = resp.headers().contains_key("retry-after");
            Some((resp.status().as_u16(), reason, retry))
        }));
    }
    drop(mebibyte);

    // Settled: every body is either held whole (its mebibyte read, one byte still to come) or
    // refused; meanwhile the bytes held never pass the budget.
    let mut peak = 0.0f64;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let refused_now = answers.iter().filter(|a| a.is_finished()).count();
        let held = rig.metric("mrtr_body_buffer_bytes").await;
        peak = peak.max(held);
        if (held as usize).is_multiple_of(MIB) && refused_now + held as usize / MIB == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for every body held whole or refused ({held} bytes held, {refused_now} answered)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(peak <= BUDGET as f64, "held {peak} bytes, over the budget");
    let grown = rss_kib().saturating_sub(rss_before);
    assert!(
        grown <= (BUDGET / 1024) as u64 + SLACK_KIB,
        "200 unfinished bodies grew resident memory by {grown} KiB"
    );
    let mut refused = 0;
    for answer in answers.iter_mut().filter(|a| a.is_finished()) {
        let (status, reason, retry) = answer.await.unwrap().expect("an answer, not a reset");
        assert_eq!(
            (status, reason.as_deref(), retry),
            (503, Some("router_overloaded"), true)
        );
        refused += 1;
    }
    assert!(refused >= 200 - BUDGET / MIB, "{refused} refused");
    assert_eq!(rig.worker_requests(), 0, "no unfinished body was forwarded");

    // The client goes: what it held is given back.
    drop((sending, client));
    conn.abort();
    until(REQUEST_DEADLINE, "the budget is given back", || async {
        rig.metric("mrtr_body_buffer_bytes").await == 0.0
    })
    .await;
    rig.still_serves(rss_before, (BUDGET / 1024) as u64 + SLACK_KIB).await;
    rig.stop().await;
}

#[tokio::test]
async fn an_h2_reader_that_takes_nothing_is_reset_after_the_idle_timeout() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    // The config file's minimum (60 s, for streams idle between events) is not the router's:
    // the tweak sets a short limit on the parsed config.
    let idle = Duration::from_millis(600);
    let rig = Rig::start_with(1, "", "", "", |c| c.server.stream_idle_timeout = idle, "127.0.0.1:0").await;
    let rss_before = rss_kib();
    let aborts_before = rig.metric("mrtr_client_aborts_total").await;

    // A client whose streams' windows are shut, and that never opens them.
    let tcp = TcpStream::connect(rig.router).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    const STREAMS: u64 = 20;
    let call = stream_call(None, serde_json::json!({"events": 2, "gated": true})).to_string();
    let started = Instant::now();
    let mut bodies = Vec::new();
    for _ in 0..STREAMS {
        let mut ready = client.clone().ready().await.unwrap();
        let req = Request::post(rig.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(())
            .unwrap();
        let (answer, mut body) = ready.send_request(req, false).unwrap();
        body.send_data(Bytes::from(call.clone()), true).unwrap();
        bodies.push(answer);
    }
    let mut ends = Vec::new();
    for answer in bodies {
        let resp = tokio::time::timeout(REQUEST_DEADLINE, answer)
            .await
            .expect("the answer's head (not flow-controlled)")
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        ends.push(tokio::spawn(async move {
            // Nothing can arrive through a shut window: the stream ends by a reset.
            let end = body.data().await;
            (started.elapsed(), end.map(|r| r.map(|_| ()).map_err(|e| e.reason())))
        }));
    }
    let worker = &rig.workers[0].state;
    until(
        REQUEST_DEADLINE,
        "the held streams' upstream requests are dropped",
        || async { worker.streams_closed.load(std::sync::atomic::Ordering::SeqCst) == STREAMS },
    )
    .await;
    for end in ends {
        let (after, end) = tokio::time::timeout(REQUEST_DEADLINE, end)
            .await
            .expect("the stream ends")
            .unwrap();
        assert_eq!(end, Some(Err(Some(h2::Reason::CANCEL))), "the stream is reset");
        assert!(after >= idle, "reset after {after:?}, before the idle timeout");
    }
    assert!(rig.metric("mrtr_client_aborts_total").await >= aborts_before + STREAMS as f64);
    drop(client);
    conn.abort();

    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;

    // A client that reads slowly but steadily (256 KB/s: what it read is given back to the
    // window after 4 ms per KB, the client's pace, not a synchronisation) gets its whole
    // answer, a 640 KiB SSE stream of 16 KiB events that the backend sends at once, though it
    // takes several idle timeouts: the router hands h2 16 KiB at a time, and each is taken well
    // within the timeout (handed whole, what the router read at once would not be).
    let event = format!(
        "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{}\"}}}}\n\n",
        "x".repeat(16 * 1024)
    );
    let stream = format!(
        "{}event: message\ndata: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{}}}}\n\n",
        event.repeat(40)
    );
    let sse = test_backend("sse", move |_, _| {
        let stream = stream.clone();
        async move {
            http::Response::builder()
                .header("content-type", "text/event-stream")
                .body(http_body_util::Full::new(Bytes::from(stream)))
                .unwrap()
        }
    })
    .await;
    let backend = format!("[[backend]]\nname = \"{}\"\nurl = \"{}\"\n", sse.name, sse.url);
    let rig = Rig::start_with(
        0,
        "",
        "",
        &backend,
        |c| c.server.stream_idle_timeout = idle,
        "127.0.0.1:0",
    )
    .await;
    let tcp = TcpStream::connect(rig.router).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut ready = client.ready().await.unwrap();
    let req = Request::post(rig.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(())
        .unwrap();
    let (answer, mut body) = ready.send_request(req, false).unwrap();
    body.send_data(Bytes::from(PING), true).unwrap();
    let mut body = answer.await.unwrap().into_body();
    let (started, mut got) = (Instant::now(), 0);
    while let Some(chunk) = tokio::time::timeout(REQUEST_DEADLINE, body.data()).await.expect("more") {
        let chunk = chunk.expect("no reset while the client takes something");
        got += chunk.len();
        tokio::time::sleep(Duration::from_micros(4 * chunk.len() as u64)).await;
        body.flow_control().release_capacity(chunk.len()).unwrap();
    }
    assert!(started.elapsed() > 2 * idle, "took only {:?}", started.elapsed());
    assert!(got > 40 * 16 * 1024, "{got} bytes");
    drop(ready);
    conn.abort();
    rig.stop().await;
}

#[tokio::test]
async fn admin_changes_need_the_token() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    std::env::set_var("MRTR_HOSTILE_ADMIN_TOKEN", "correct-horse-battery-staple");
    let token = "token = \"${MRTR_HOSTILE_ADMIN_TOKEN}\"";
    let rig = Rig::start(1, "", token, "").await;
    let rss_before = rss_kib();
    let drain = "/backends/worker-0/drain";
    let draining = || async {
        let a = rig.admin_request(Method::GET, "/backends", &[]).await;
        assert_eq!(a.status, 200, "reads need no token by default");
        a.json()["backends"][0]["draining"].as_bool().unwrap()
    };

    let a = rig.admin_request(Method::POST, drain, &[]).await;
    assert_eq!(a.status, 401);
    assert_eq!(a.headers["www-authenticate"], "Bearer realm=\"mrtr-router admin\"");
    let a = rig
        .admin_request(
            Method::POST,
            drain,
            &[("authorization", "Bearer correct-horse-battery-stapler")],
        )
        .await;
    assert_eq!(a.status, 401);
    let challenge = a.headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.starts_with("Bearer ") && challenge.contains("error=\"invalid_token\""),
        "{challenge}"
    );
    let a = rig
        .admin_request(Method::POST, drain, &[("authorization", "Basic Y29ycmVjdC1ob3JzZQ==")])
        .await;
    assert_eq!(a.status, 401);
    assert!(!draining().await, "a refused drain changed nothing");
    let a = rig
        .admin_request(
            Method::POST,
            drain,
            &[("authorization", "Bearer correct-horse-battery-staple")],
        )
        .await;
    assert_eq!(a.status, 200, "{:?}", String::from_utf8_lossy(&a.body));
    assert!(draining().await);
    let undrain = "/backends/worker-0/undrain";
    let a = rig
        .admin_request(
            Method::POST,
            undrain,
            &[("authorization", "Bearer correct-horse-battery-staple")],
        )
        .await;
    assert_eq!(a.status, 200);
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;

    // protect_reads: the token for /backends and /debug/route too; never for probes or metrics.
    let rig = Rig::start(1, "", &format!("{token}\nprotect_reads = true"), "").await;
    for path in ["/backends", "/debug/route?key=k"] {
        assert_eq!(rig.admin_request(Method::GET, path, &[]).await.status, 401, "{path}");
        let a = rig
            .admin_request(
                Method::GET,
                path,
                &[("authorization", "bearer correct-horse-battery-staple")],
            )
            .await;
        assert_eq!(a.status, 200, "{path}");
    }
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(rig.admin_request(Method::GET, path, &[]).await.status, 200, "{path}");
    }
    rig.stop().await;

    // No token, and an admin listener on all addresses: changes are refused, reads answered.
    let rig = Rig::start_with(1, "", "", "", |_| {}, "0.0.0.0:0").await;
    let a = rig.admin_request(Method::POST, drain, &[]).await;
    assert_eq!(a.status, 403, "{:?}", String::from_utf8_lossy(&a.body));
    assert!(!draining_of(&rig).await);
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}

async fn draining_of(rig: &Rig) -> bool {
    let a = rig.admin_request(Method::GET, "/backends", &[]).await;
    a.json()["backends"][0]["draining"].as_bool().unwrap()
}

/// Asks `/healthz` on a connection of its own; the answer's time.
async fn healthz(admin: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut s, Duration::from_secs(5))
        .await
        .expect("/healthz answers and closes");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("ok\n"), "{text}");
    started.elapsed()
}

/// How many of `conns` the peer has closed (a read finds the end, or an error).
fn closed(conns: &[TcpStream]) -> usize {
    conns
        .iter()
        .filter(|s| {
            let mut buf = [0u8; 64];
            !matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}

#[tokio::test]
async fn admin_slowloris_cannot_blind_the_probes() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    let rig = Rig::start(1, "", "max_connections = 16\nheader_read_timeout = \"1500ms\"", "").await;
    let rss_before = rss_kib();
    let mut slow = Vec::new();
    let opened = Instant::now();
    for i in 0..120 {
        let mut s = TcpStream::connect(rig.admin).await.unwrap();
        // Half send part of a head and nothing more; half send nothing at all.
        if i % 2 == 0 {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await
                .unwrap();
        }
        slow.push(s);
    }
    // Past the cap, each new connection closed the oldest: at most 16 stay.
    until(REQUEST_DEADLINE, "all but 16 slow connections closed", || async {
        closed(&slow) >= 120 - 16
    })
    .await;
    // Probes get in at once, while the rest are still open.
    for _ in 0..5 {
        let took = healthz(rig.admin).await;
        assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
    }
    assert!(
        opened.elapsed() < Duration::from_millis(1500),
        "the checks above were too slow to mean anything"
    );
    assert!(
        rig.metric(r#"mrtr_connections_refused_total{reason="admin_cap"}"#)
            .await
            >= 104.0
    );
    // The rest are closed by the header read timeout.
    until(Duration::from_secs(10), "every slow connection closed", || async {
        closed(&slow) == 120
    })
    .await;

    drop(slow);
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}

/// A `/debug/route` body that stops coming is answered 408 at `admin.body_read_timeout`, not
/// held for as long as the client likes.
#[tokio::test]
async fn a_stalled_debug_route_body_gets_408_at_the_admin_body_read_timeout() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    let rig = Rig::start(1, "", "body_read_timeout = \"500ms\"", "").await;
    let rss_before = rss_kib();
    let mut s = TcpStream::connect(rig.admin).await.unwrap();
    s.write_all(b"POST /debug/route HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\":")
        .await
        .unwrap();
    let sent = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(REQUEST_DEADLINE, s.read(&mut buf))
            .await
            .expect("an answer before the deadline")
            .unwrap();
        assert!(n > 0, "closed without an answer: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let took = sent.elapsed();
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "answered after {took:?}"
    );
    drop(s);
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}

/// Sends `request` on a connection of its own and reads the answer to the close.
async fn raw_answer(addr: SocketAddr, request: &str) -> (String, serde_json::Value) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let got = read_to_close(&mut s, REQUEST_DEADLINE)
        .await
        .expect("an answer, then close");
    let text = String::from_utf8_lossy(&got).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{text:?}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (head.to_ascii_lowercase(), body)
}

#[tokio::test]
async fn connect_and_trace_are_answered_by_the_router() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    let rig = Rig::start(1, "", "", "").await;
    let rss_before = rss_kib();
    for request in [
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nConnection: close\r\n\r\n",
        "TRACE /mcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ] {
        let (head, body) = raw_answer(rig.router, request).await;
        assert!(head.starts_with("http/1.1 405"), "{head}");
        assert!(
            head.contains("\r\nallow: get, head, post, delete, options\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nmcp-router-error: method_not_allowed\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert_eq!(body["error"]["data"]["reason"], "method_not_allowed");
        assert_eq!(body["id"], serde_json::Value::Null);
    }

    // HTTP/2's CONNECT (`:authority` only).
    let tcp = TcpStream::connect(rig.router).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut ready = client.ready().await.unwrap();
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri("example.com:443")
        .body(())
        .unwrap();
    let (answer, _body) = ready.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, answer).await.unwrap().unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "GET, HEAD, POST, DELETE, OPTIONS");
    assert_eq!(resp.headers()["mcp-router-error"], "method_not_allowed");
    drop(ready);
    conn.abort();

    assert_eq!(rig.worker_requests(), 0, "nothing was forwarded");
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}

/// Sends `request` on a connection of its own and reads what comes back until the close.
async fn raw_bare(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A head the router refuses may be answered before it is all written: the rest may draw
    // a reset, so what was written is not checked.
    let _ = s.write_all(request).await;
    let got = read_to_close(&mut s, REQUEST_DEADLINE)
        .await
        .expect("an answer, then close");
    String::from_utf8_lossy(&got).to_ascii_lowercase()
}

/// Not a limit of the router's own: it pins down the list of docs/src/limits.md of the answers hyper
/// writes itself, bare (no JSON, no `Mcp-Router-Error`), before the router sees a request.
#[tokio::test]
async fn malformed_or_oversized_heads_get_the_documented_bare_answers() {
    if crate::support::ran_alone() {
        return;
    }
    let _row = ROWS.lock().await;
    let rig = Rig::start(1, "", "", "").await;
    let rss_before = rss_kib();
    let many: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let huge = format!("x-filler: {}\r\n", "a".repeat(70 * 1024));
    for (what, head, status) in [
        (
            "a header without a colon",
            "GET /mcp HTTP/1.1\r\nHost x\r\n\r\n".to_string(),
            "400",
        ),
        (
            "101 headers",
            format!("GET /mcp HTTP/1.1\r\nHost: x\r\n{many}\r\n"),
            "431",
        ),
        (
            "a 70 KiB head",
            format!("GET /mcp HTTP/1.1\r\nHost: x\r\n{huge}\r\n"),
            "431",
        ),
    ] {
        let got = raw_bare(rig.router, head.as_bytes()).await;
        assert!(got.starts_with(&format!("http/1.1 {status} ")), "{what}: {got}");
        assert!(got.contains("\r\ncontent-length: 0\r\n"), "{what}: {got}");
        assert!(!got.contains("mcp-router-error"), "{what}: {got}");
    }

    // HTTP/2: a header list over 64 KiB is answered 431 by h2.
    let tcp = TcpStream::connect(rig.router).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut ready = client.ready().await.unwrap();
    let req = Request::get(rig.url())
        .header("x-filler", "a".repeat(70 * 1024))
        .body(())
        .unwrap();
    let (answer, _body) = ready.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, answer).await.unwrap().unwrap();
    assert_eq!(resp.status(), 431);
    assert!(!resp.headers().contains_key("mcp-router-error"));
    drop(ready);
    conn.abort();

    assert_eq!(rig.worker_requests(), 0);
    rig.still_serves(rss_before, SLACK_KIB).await;
    rig.stop().await;
}
