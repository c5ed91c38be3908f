//! Test harness: a router started in-process on port 0 in front of example workers (real hyper
//! servers holding per-instance call state, see `mrtr_router::example`), plus a small client.

pub mod auth;
pub mod counting;
pub mod h2_frames;
pub mod otlp;
pub mod quotas;
pub mod tls_backend;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mrtr_router::example::Worker;
use mrtr_router::{Listeners, Router, RouterControl};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Any single request in a test gives up after this long, so a hang fails instead of stalling.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(20);

/// A backend line of the config: name, URL, weight.
#[derive(Clone)]
pub struct BackendSpec {
    pub name: String,
    pub url: String,
    pub weight: u32,
}

/// A router in front of workers, with its config file in a temp dir.
pub struct Fleet {
    pub router: SocketAddr,
    pub admin: SocketAddr,
    pub control: RouterControl,
    pub workers: Vec<Worker>,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    /// Extra config text (sections other than backends).
    pub extra: String,
    pub client: HttpClient,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

/// The router binary, for tests that run it as a child process: the one cargo built, or the
/// one `MRTR_TEST_ROUTER_BIN` names (the optimised build: docs/src/benchmarks.md, "Profile-guided
/// and post-link optimised build").
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("MRTR_TEST_ROUTER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mrtr-router").into())
    })
}

pub async fn start_worker(name: &str) -> Worker {
    Worker::start(name, TcpListener::bind("127.0.0.1:0").await.unwrap())
}

pub fn client() -> HttpClient {
    let mut c = Client::builder(TokioExecutor::new());
    c.pool_max_idle_per_host(1024);
    c.build_http()
}

/// A backend line for each of `workers`, weight 1.
pub fn specs_of(workers: &[Worker]) -> Vec<BackendSpec> {
    workers
        .iter()
        .map(|w| BackendSpec {
            name: w.state.name.clone(),
            url: w.url(),
            weight: 1,
        })
        .collect()
}

pub fn render_config(extra: &str, backends: &[BackendSpec]) -> String {
    // The listen addresses are placeholders: tests bind their own listeners on port 0.
    let mut text = if extra.contains("[server]") {
        extra.replace("[server]", "[server]\nlisten = \"127.0.0.1:0\"")
    } else {
        format!("[server]\nlisten = \"127.0.0.1:0\"\n{extra}")
    };
    // The admin listener's address is a placeholder too; `extra` may have an `[admin]` table.
    match text.contains("[admin]") {
        true => text = text.replace("[admin]", "[admin]\nlisten = \"127.0.0.1:1\""),
        false => text.push_str("\n[admin]\nlisten = \"127.0.0.1:1\"\n"),
    }
    for b in backends {
        text.push_str(&format!(
            "[[backend]]\nname = \"{}\"\nurl = \"{}\"\nweight = {}\n",
            b.name, b.url, b.weight
        ));
    }
    text
}

impl Fleet {
    /// `n` workers named worker-0.. behind a router with `extra` config (e.g. a `[routing]` table).
    pub async fn start(n: usize, extra: &str) -> Fleet {
        let mut workers = Vec::new();
        for i in 0..n {
            workers.push(start_worker(&format!("worker-{i}")).await);
        }
        Fleet::start_with(workers, extra).await
    }

    pub async fn start_with(workers: Vec<Worker>, extra: &str) -> Fleet {
        let specs = specs_of(&workers);
        Fleet::start_backends(workers, &specs, extra).await
    }

    /// A router in front of `specs` (which may name servers other than `workers`).
    pub async fn start_backends(workers: Vec<Worker>, specs: &[BackendSpec], extra: &str) -> Fleet {
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Fleet::start_on(proxy, workers, specs, extra.to_string()).await
    }

    /// A router serving on `proxy` (bound already: a config may name its address).
    pub async fn start_on(proxy: TcpListener, workers: Vec<Worker>, specs: &[BackendSpec], extra: String) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, render_config(&extra, specs)).unwrap();
        let router = Router::from_file(&config_path).expect("valid test config");
        let control = router.control();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (router_addr, admin_addr) = (proxy.local_addr().unwrap(), admin.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(router.run(Listeners { proxy, admin }, async move {
            let _ = stopped.await;
        }));
        Fleet {
            router: router_addr,
            admin: admin_addr,
            control,
            workers,
            dir,
            config_path,
            extra,
            client: client(),
            stop: Some(stop),
            served: Some(served),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.router)
    }

    /// Rewrites the config file with these backends and reloads it.
    pub fn reconfigure(&self, backends: &[BackendSpec]) {
        std::fs::write(&self.config_path, render_config(&self.extra, backends)).unwrap();
        self.control.reload().expect("reload accepted");
    }

    pub fn specs(&self) -> Vec<BackendSpec> {
        specs_of(&self.workers)
    }

    pub fn worker(&self, name: &str) -> &Worker {
        self.workers
            .iter()
            .find(|w| w.state.name == name)
            .expect("known worker")
    }

    pub fn total_unknown_followups(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.state.unknown_followups.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    }

    /// Requests that reached any worker.
    pub fn total_requests(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.state.requests.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    }

    pub fn total_executions(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.state.executions.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    }

    pub async fn post(&self, headers: &[(&str, &str)], body: &Value) -> Answer {
        send(
            &self.client,
            Method::POST,
            &self.url(),
            headers,
            Bytes::from(body.to_string()),
        )
        .await
    }

    pub async fn metrics(&self) -> String {
        let a = send(
            &self.client,
            Method::GET,
            &format!("http://{}/metrics", self.admin),
            &[],
            Bytes::new(),
        )
        .await;
        String::from_utf8(a.body.to_vec()).unwrap()
    }

    /// Waits until the router's metric `series` reads `want` (polling its `/metrics`), for at
    /// most `limit`; fails with what it read last.
    pub async fn wait_metric(&self, series: &str, want: f64, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let got = metric(&self.metrics().await, series);
            if got == Some(want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{series} is {got:?} after {limit:?}, not {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Begins the router's graceful shutdown, as SIGTERM does, and returns at once. Whether the
    /// signal reached a router still running: false when shutdown was begun before, or the router
    /// already returned by itself.
    #[must_use]
    pub fn begin_shutdown(&mut self) -> bool {
        self.stop.take().is_some_and(|s| s.send(()).is_ok())
    }

    /// Begins the shutdown and asserts that the router stops within 5 s, well inside its
    /// timeouts: `what` is what must not have held it.
    pub async fn assert_stops_promptly(&mut self, what: &str) {
        let stopping = std::time::Instant::now();
        assert!(self.begin_shutdown(), "the router was running");
        assert!(
            self.wait_stopped(Duration::from_secs(10)).await,
            "{what} held the shutdown"
        );
        assert!(stopping.elapsed() < Duration::from_secs(5), "{:?}", stopping.elapsed());
    }

    /// Waits up to `limit` for the router's run to return: whether it did (also true when an
    /// earlier call saw it return). Panics if the run panicked.
    pub async fn wait_stopped(&mut self, limit: Duration) -> bool {
        let Some(run) = self.served.as_mut() else {
            return true;
        };
        match tokio::time::timeout(limit, run).await {
            Err(_) => false,
            Ok(joined) => {
                self.served = None;
                joined.expect("the router's run does not panic");
                true
            }
        }
    }

    /// Stops the router (graceful) and waits for it.
    pub async fn shutdown(mut self) {
        let _ = self.begin_shutdown();
        assert!(self.wait_stopped(Duration::from_secs(30)).await, "router stops");
    }
}

/// A whole answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub fn worker(&self) -> String {
        self.headers
            .get("x-worker")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }
    pub fn router_error(&self) -> Option<&str> {
        self.headers.get("mcp-router-error").map(|v| v.to_str().unwrap())
    }
}

pub async fn send(client: &HttpClient, method: Method, url: &str, headers: &[(&str, &str)], body: Bytes) -> Answer {
    let mut req = Request::builder().method(method).uri(url);
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).unwrap();
    let fut = async {
        let resp = client.request(req).await.expect("request reaches the router");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("whole answer").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    };
    tokio::time::timeout(REQUEST_DEADLINE, fut)
        .await
        .expect("answer within the test deadline")
}

/// Body of a `tools/call` starting call `mid` (2a) that needs `rounds` rounds.
pub fn start_call(mid: &str, rounds: u32) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "messageId": mid, "method": "tools/call",
           "params": {"name": "transfer-funds", "arguments": {"to": "123-456-789", "amount": 5, "rounds": rounds}}})
}

/// Body of the `confirm` answering round `round` of call `mid`.
pub fn confirm(mid: &str, round: u32) -> Value {
    json!({"jsonrpc": "2.0", "id": round + 1, "messageId": mid, "method": "confirm", "params": {"approved": true, "round": round}})
}

/// Reads a metric sample's value from Prometheus text, e.g. `mrtr_pins{kind="client"}`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The sum of every sample of metric `name` whose series contains each of `with` (label
/// matchers such as `kind="tls"`): e.g. all upstream errors, whatever their labels.
pub fn metric_sum(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok()))
        .sum()
}

/// Polls `cond` every 5 ms until it holds; fails after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Resident set size of this process, in KiB (`VmRSS` of /proc/self/status), after handing the
/// allocator's free pages back: the tests ask what is still held, not how high a burst of
/// concurrent requests once drove the allocator's arenas (a busy machine drives it higher).
pub fn rss_kib() -> u64 {
    // SAFETY: malloc_trim only releases free memory of glibc's arenas; it is thread-safe.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

/// Body of a `tools/call` of the example worker's SSE `stream` tool.
pub fn stream_call(mid: Option<&str>, args: Value) -> Value {
    let mut v =
        json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "stream", "arguments": args}});
    if let Some(m) = mid {
        v["messageId"] = json!(m);
    }
    v
}

/// Reads body frames until `needle` has been seen; returns everything read.
pub async fn read_until(body: &mut hyper::body::Incoming, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let frame = tokio::time::timeout(REQUEST_DEADLINE, body.frame())
            .await
            .expect("next frame in time");
        let frame = frame.expect("stream still open").expect("no stream error");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    seen
}

/// A TCP port nothing listens on right now (bound once on 127.0.0.1 and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the router binary with `--config path`, its output discarded.
pub fn spawn_router(config: &Path) -> Child {
    Command::new(bin())
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the router binary")
}

/// Sends `signal` (e.g. "TERM", "HUP") to a child process.
pub fn signal(child: &Child, signal: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {}", child.id());
}

/// How long the helpers below wait for a router child process.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(10);

/// Polls `http://{admin}/readyz` (each request bounded to 1 s, every 10 ms) until it answers
/// `status`. After [`CHILD_DEADLINE`] kills `child` (the router process) and panics with `what`.
pub async fn wait_readyz(child: &mut Child, client: &HttpClient, admin: SocketAddr, status: u16, what: &str) {
    let url = format!("http://{admin}/readyz");
    let deadline = tokio::time::Instant::now() + CHILD_DEADLINE;
    loop {
        let req = Request::get(&url).body(Full::new(Bytes::new())).unwrap();
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(1), client.request(req)).await {
            if r.status() == status {
                return;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("timed out waiting for: {what} (/readyz never answered {status})");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `child` every 25 ms until it exits and returns its status. After [`CHILD_DEADLINE`] kills
/// it and panics with `what`.
pub async fn wait_for_exit(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = tokio::time::Instant::now() + CHILD_DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The values of header `name`, in order, among those the `/echo` worker reports it received.
pub fn echoed(answer: &Value, name: &str) -> Vec<String> {
    answer["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == name)
        .map(|h| h[1].as_str().unwrap().to_string())
        .collect()
}

/// A JSON POST to `/mcp` as raw HTTP/1.1 bytes, for tests that write to a socket themselves:
/// `Host: host`, `Content-Type: application/json`, the body's `Content-Length`, then `extra`
/// (whole header lines, each ending in CRLF).
pub fn raw_mcp_post(host: impl std::fmt::Display, extra: &str, body: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// Reads until the peer closes or resets the connection and returns what came; `None` if it
/// is still open after `limit`.
pub async fn read_to_close<S: tokio::io::AsyncRead + Unpin>(s: &mut S, limit: Duration) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

/// A purpose-built backend on a real socket, named `name`: hyper's HTTP/1 server calls
/// `answer` with each request's method and whole body. For servers the example workers cannot
/// play (sessions, escaped `requestState`s).
pub async fn test_backend<F, Fut, B>(name: &str, answer: F) -> BackendSpec
where
    F: Fn(Method, Bytes) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<B>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let answer = answer.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = answer.clone();
                async move {
                    let method = req.method().clone();
                    let body = req.into_body().collect().await?.to_bytes();
                    Ok::<_, hyper::Error>(answer(method, body).await)
                }
            });
            let io = hyper_util::rt::TokioIo::new(sock);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
        }
    });
    BackendSpec {
        name: name.to_string(),
        url: format!("http://{addr}"),
        weight: 1,
    }
}

/// Names the copy of a test that runs in a process of its own ([`ran_alone`]).
const ALONE: &str = "MRTR_IT_ALONE";

/// Runs the calling test in a process of its own, and says so: the caller then returns, its
/// verdict given by that process. A test that measures the whole process (its memory, its CPU
/// time) or changes it (its environment) calls this first, since every other test of this
/// binary runs beside it in one process. In the copy (this binary again, `MRTR_IT_ALONE` set,
/// that one test and no other) it says false, and the test's body runs.
pub fn ran_alone() -> bool {
    if std::env::var_os(ALONE).is_some() {
        return false;
    }
    let thread = std::thread::current();
    // With `--test-threads=1` every test runs on the main thread, one after another: alone.
    let Some(name) = thread.name().filter(|n| *n != "main") else {
        return false;
    };
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .output()
        .expect("the test binary runs");
    let ran = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && ran.contains("1 passed"),
        "{name}, run in a process of its own, failed:\n{ran}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What it printed (its figures), as the test's own output: shown with `--nocapture`.
    print!("{ran}");
    true
}

/// A child process killed when the test ends, passed or failed.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads one HTTP/1.1 request (head, then a Content-Length body) from `conn`: `None` when the
/// connection closes first, or nothing comes for [`REQUEST_DEADLINE`].
pub async fn read_http_request(conn: &mut TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Some(text);
            }
        }
        let n = tokio::time::timeout(REQUEST_DEADLINE, conn.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A backend that reads each request whole, then closes the connection without a byte of
/// answer; it counts what it read (the catalog's asks aside).
pub async fn resetter() -> (BackendSpec, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                // The catalog's asks (with `[catalog]` on) are not what a test counts.
                let read = read_http_request(&mut sock).await;
                if read.is_some_and(|r| !r.contains("mrtr-router catalog")) {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                // Dropped: closed with no answer.
            });
        }
    });
    let spec = BackendSpec {
        name: "resetter".into(),
        url: format!("http://{addr}"),
        weight: 1,
    };
    (spec, seen)
}
