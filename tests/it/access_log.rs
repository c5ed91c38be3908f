//! The access log (docs/src/observability.md), read from the stdout of the router binary run as a child
//! process: one line per request with the fields, JSON that parses (or `key=value` text), no
//! credential in any line, long values cut; and a stdout nobody reads neither slows nor stops
//! serving, the lines it cannot take being dropped and counted.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{confirm, metric, send, start_call, stream_call, BackendSpec, HttpClient};
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

/// A router binary serving in front of in-process workers.
struct RouterProcess {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    client: HttpClient,
    /// Lines of its stdout, when they are read.
    stdout: Option<mpsc::Receiver<String>>,
    /// Its stdout when nobody reads it (kept open: a full pipe, not a closed one).
    _unread: Option<ChildStdout>,
    stderr: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl RouterProcess {
    async fn start(extra: &str, backends: &[BackendSpec], read_stdout: bool) -> RouterProcess {
        let dir = tempfile::tempdir().unwrap();
        let (proxy, admin) = (crate::support::free_port(), crate::support::free_port());
        let mut text =
            format!("[server]\nlisten = \"127.0.0.1:{proxy}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{extra}\n");
        for b in backends {
            text.push_str(&format!("[[backend]]\nname = \"{}\"\nurl = \"{}\"\n", b.name, b.url));
        }
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        let mut child = Command::new(crate::support::bin())
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the router binary");
        let out = child.stdout.take().unwrap();
        let (stdout, unread) = match read_stdout {
            true => (Some(lines_of(out)), None),
            false => (None, Some(out)),
        };
        let stderr = lines_of(child.stderr.take().unwrap());
        let mut router = RouterProcess {
            child,
            proxy: format!("127.0.0.1:{proxy}").parse().unwrap(),
            admin: format!("127.0.0.1:{admin}").parse().unwrap(),
            client: crate::support::client(),
            stdout,
            _unread: unread,
            stderr,
            _dir: dir,
        };
        let (client, admin) = (router.client.clone(), router.admin);
        crate::support::wait_readyz(&mut router.child, &client, admin, 200, "the router serves").await;
        router
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy)
    }

    async fn post(&self, headers: &[(&str, &str)], body: &Value) -> crate::support::Answer {
        let body = Bytes::from(body.to_string());
        send(&self.client, Method::POST, &self.url("/mcp"), headers, body).await
    }

    /// The router's "started" log line, read past the lines logged before it (at most 10).
    fn started_line(&self) -> String {
        for _ in 0..10 {
            let line = self
                .stderr
                .recv_timeout(Duration::from_secs(10))
                .expect("a log line within 10 s");
            if line.contains("mrtr-router started") {
                return line;
            }
        }
        panic!("no \"mrtr-router started\" among the first log lines")
    }

    /// The next access line (waiting at most 10 s for it).
    fn next_line(&self) -> String {
        let stdout = self.stdout.as_ref().expect("stdout is read");
        stdout
            .recv_timeout(Duration::from_secs(10))
            .expect("an access line within 10 s")
    }

    /// No further access line comes within `wait`.
    fn assert_no_more_lines(&self, wait: Duration) {
        let stdout = self.stdout.as_ref().expect("stdout is read");
        if let Ok(line) = stdout.recv_timeout(wait) {
            panic!("one line per request, and this one is extra: {line}");
        }
    }

    async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.admin);
        let a = send(&self.client, Method::GET, &url, &[], Bytes::new()).await;
        String::from_utf8(a.body.to_vec()).unwrap()
    }

    /// SIGTERM, and the exit within the helper's deadline.
    async fn stop(mut self) {
        crate::support::signal(&self.child, "TERM");
        let status = crate::support::wait_for_exit(&mut self.child, "the router exits on SIGTERM").await;
        assert!(status.success(), "{status}");
    }
}

async fn workers(n: usize) -> (Vec<mrtr_router::example::Worker>, Vec<BackendSpec>) {
    let mut workers = Vec::new();
    for i in 0..n {
        workers.push(crate::support::start_worker(&format!("worker-{i}")).await);
    }
    let specs = crate::support::specs_of(&workers);
    (workers, specs)
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

#[tokio::test]
async fn json_lines_one_per_request_with_the_fields_and_no_credentials() {
    let (_workers, specs) = workers(2).await;
    let extra = format!(
        "[log]\nformat = \"json\"\naccess = true\n[tokens]\nkeys = [\"{}\"]\n",
        "k".repeat(40)
    );
    let router = RouterProcess::start(&extra, &specs, true).await;
    // The router's own logs are JSON too.
    let started: Value = serde_json::from_str(&router.started_line()).unwrap();
    assert_eq!(started["message"], "mrtr-router started", "{started}");
    let line = || -> Value {
        let text = router.next_line();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    };

    // Round 1 of a call, with a credential and the client's trace context.
    let traceparent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    let first = router
        .post(
            &[
                ("authorization", "Bearer SECRET-AUTHZ-1"),
                ("traceparent", &traceparent),
            ],
            &start_call("call-a1", 2),
        )
        .await;
    assert_eq!(first.status, 200);
    let token = first.headers["mcp-routing-id"].to_str().unwrap().to_string();
    assert!(token.starts_with("mrt"), "sealing is on: {token}");
    let l1 = line();
    let worker = first.worker();
    for (field, want) in [
        ("client", json!("127.0.0.1")),
        ("http_method", json!("POST")),
        ("path", json!("/mcp")),
        ("mcp_method", json!("tools/call")),
        ("mcp_name", json!("transfer-funds")),
        ("status", json!(200)),
        ("backend", json!(worker)),
        ("route", json!("ring")),
        ("pin", json!("client created")),
        ("bytes_out", json!(first.body.len())),
        ("trace_id", json!(TRACE_ID)),
    ] {
        assert_eq!(l1[field], want, "{field}: {l1}");
    }
    assert!(l1["ts"].as_str().unwrap().ends_with('Z'), "{l1}");
    assert!(l1["duration_ms"].as_f64().unwrap() > 0.0, "{l1}");
    assert!(l1.get("error").is_none(), "{l1}");

    // Round 2 carries every kind of secret: the sealed token, a requestState, a session id,
    // credentials. None of them is written.
    let mut round2 = confirm("call-a1", 2);
    round2["params"]["requestState"] = json!("SECRET-STATE-2");
    let secrets = [
        ("mcp-routing-id", token.as_str()),
        ("authorization", "Bearer SECRET-AUTHZ-2"),
        ("mcp-session-id", "SECRET-SESSION-3"),
        ("cookie", "sid=SECRET-COOKIE-4"),
        ("proxy-authorization", "Basic SECRET-PROXY-5"),
    ];
    let second = router.post(&secrets, &round2).await;
    assert_eq!(second.status, 200);
    let l2 = line();
    assert_eq!(
        (l2["mcp_method"].as_str(), l2["route"].as_str()),
        (Some("confirm"), Some("token")),
        "{l2}"
    );
    assert_eq!(l2["backend"], json!(worker));

    // A streamed answer: its line comes when the stream has ended, with all of its bytes.
    let streamed = router.post(&[], &stream_call(None, json!({"events": 3}))).await;
    assert_eq!(streamed.status, 200);
    let l3 = line();
    assert_eq!(l3["bytes_out"], json!(streamed.body.len()), "{l3}");
    assert!(streamed.body.len() > 100);

    // A request the router answers itself: its reason, and no backend or route.
    let bad = send(
        &router.client,
        Method::POST,
        &router.url("/mcp"),
        &[],
        Bytes::from_static(b"{nope"),
    )
    .await;
    assert_eq!(bad.router_error(), Some("parse_error"));
    let l4 = line();
    assert_eq!(
        (l4["status"].as_u64(), l4["error"].as_str()),
        (Some(400), Some("parse_error")),
        "{l4}"
    );
    assert!(l4.get("backend").is_none() && l4.get("route").is_none() && l4.get("mcp_method").is_none());

    // Long values are cut: a 30 KB path and header, a 600 KB method, a 300 KB tool name.
    let long_path = format!("/{}?token=SECRET-QUERY-6", "p".repeat(30_000));
    let filler = "f".repeat(30_000);
    let big = json!({"jsonrpc": "2.0", "id": 9, "method": "m".repeat(600_000),
                     "params": {"name": "n".repeat(300_000)}});
    let long = send(
        &router.client,
        Method::POST,
        &router.url(&long_path),
        &[("x-filler", &filler)],
        Bytes::from(big.to_string()),
    )
    .await;
    assert_eq!(long.status, 200);
    let text5 = router.next_line();
    assert!(text5.len() < 2048, "a {} byte line", text5.len());
    let l5: Value = serde_json::from_str(&text5).unwrap();
    assert!(l5["path"].as_str().unwrap().ends_with('…'), "{l5}");
    assert!(!text5.contains("ffff"), "header values are not logged");

    // A head too large for the router (a million-byte header) is refused (431, or the
    // connection closed on it) before it is a request: it makes no line at all.
    let huge = "h".repeat(1_000_000);
    let req = http::Request::post(router.url("/mcp"))
        .header("x-huge", huge.as_str())
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    if let Ok(Ok(resp)) = tokio::time::timeout(crate::support::REQUEST_DEADLINE, router.client.request(req)).await {
        assert_eq!(resp.status(), 431);
    }
    router.assert_no_more_lines(Duration::from_millis(300));

    for l in [&l1, &l2, &l3, &l4, &l5] {
        let text = l.to_string();
        for secret in ["SECRET", token.as_str(), "Bearer", "sid="] {
            assert!(!text.contains(secret), "{secret} written: {text}");
        }
    }
    let logs: Vec<String> = router.stderr.try_iter().collect();
    for l in &logs {
        assert!(
            !l.contains("SECRET") && !l.contains(&token),
            "in the router's own log: {l}"
        );
    }
    router.stop().await;
}

#[tokio::test]
async fn a_line_names_the_quota_caller_and_the_quota_that_refused() {
    let (_workers, specs) = workers(1).await;
    let extra = "[log]\nformat = \"json\"\naccess = true\n\
                 [quotas]\ncaller = \"ip\"\ntrusted_proxies = [\"127.0.0.1/32\"]\nrate = \"1/m\"\nburst = 1\n\
                 [[quotas.tool]]\nname = \"whoami\"\nrate = \"1/m\"\nburst = 1\n";
    let router = RouterProcess::start(extra, &specs, true).await;
    let next = || -> Value { serde_json::from_str(&router.next_line()).unwrap() };
    let behind_proxy = [("x-forwarded-for", "203.0.113.7")];
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    assert_eq!(router.post(&behind_proxy, &ping).await.status, 200);
    let admitted = next();
    // The client is the TCP peer; the caller the address the trusted proxy vouched for.
    assert_eq!(
        (&admitted["client"], &admitted["caller"]),
        (&json!("127.0.0.1"), &json!("203.0.113.7"))
    );
    assert!(admitted.get("quota").is_none(), "{admitted}");
    assert_eq!(router.post(&behind_proxy, &ping).await.status, 429);
    let refused = next();
    assert_eq!(refused["caller"], "203.0.113.7", "{refused}");
    assert_eq!(
        (&refused["quota"], &refused["error"]),
        (&json!("rate/caller"), &json!("rate_limited"))
    );
    // A tool's own rate says so; an IPv6 caller is its /64.
    let whoami = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "whoami"}});
    let v6 = [("x-forwarded-for", "2001:db8:1:2::77")];
    assert_eq!(router.post(&v6, &whoami).await.status, 200);
    assert_eq!(next()["caller"], "2001:db8:1:2::/64");
    assert_eq!(router.post(&v6, &whoami).await.status, 429);
    let refused = next();
    assert_eq!(
        (&refused["caller"], &refused["quota"]),
        (&json!("2001:db8:1:2::/64"), &json!("rate/tool"))
    );
    router.stop().await;
}

#[tokio::test]
async fn text_lines_by_default_format() {
    let (_workers, specs) = workers(1).await;
    let router = RouterProcess::start("[log]\naccess = true\n", &specs, true).await;
    let whoami = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}});
    let a = router.post(&[], &whoami).await;
    assert_eq!(a.status, 200);
    let line = router.next_line();
    let (ts, rest) = line.split_once(' ').unwrap();
    assert!(ts.ends_with('Z') && ts.len() == 24, "{line}");
    let want = "access client=127.0.0.1 http_method=POST path=/mcp mcp_method=tools/call mcp_name=whoami status=200 \
                backend=worker-0 route=keyless duration_ms=";
    assert!(rest.starts_with(want), "{line}");
    assert!(rest.ends_with(&format!(" bytes_out={}", a.body.len())), "{line}");
    let started = router.started_line();
    assert!(
        started.contains("mrtr-router started") && !started.starts_with('{'),
        "{started}"
    );
    router.stop().await;
}

#[tokio::test]
async fn a_stdout_nobody_reads_neither_slows_nor_stops_serving() {
    let (_workers, specs) = workers(2).await;
    let router = RouterProcess::start("[log]\naccess = true\n", &specs, false).await;
    // Enough requests to fill the pipe (64 KiB), the write the writer is stuck in (64 KiB) and
    // its queue (8192 lines), and then some.
    const N: usize = 12_000;
    const CONCURRENCY: usize = 32;
    let whoami = Bytes::from(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}}).to_string(),
    );
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..CONCURRENCY {
        let (client, url, body) = (router.client.clone(), router.url("/mcp"), whoami.clone());
        tasks.spawn(async move {
            let mut slowest = Duration::ZERO;
            for _ in (t..N).step_by(CONCURRENCY) {
                let one = Instant::now();
                let a = send(&client, Method::POST, &url, &[], body.clone()).await;
                assert_eq!(a.status, 200);
                slowest = slowest.max(one.elapsed());
            }
            slowest
        });
    }
    let mut slowest = Duration::ZERO;
    while let Some(done) = tasks.join_next().await {
        slowest = slowest.max(done.unwrap());
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(90), "{N} requests took {took:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "no request waited for the log: {slowest:?}"
    );
    let dropped = metric(&router.metrics().await, "mrtr_log_lines_dropped_total").unwrap();
    // At most the queue and what fits in the pipe and the stuck write got through.
    let through_at_most = 8192 + 2 * 64 * 1024 / 150;
    assert!(
        dropped as usize >= N - through_at_most,
        "dropped {dropped} of {N} lines"
    );
    eprintln!("{N} requests in {took:?} (slowest {slowest:?}) with stdout unread; {dropped} lines dropped");
    router.stop().await;
}
