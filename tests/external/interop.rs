//! Interop with the official MCP Python SDK (`mcp==2.3.0`, pinned in tests/interop/requirements.txt):
//! three SDK server processes behind the router, each sealing `requestState` with its own
//! per-process key, driven by the SDK client. The test script installs the venv first; without
//! it these tests fail (they never skip).

use crate::support::tls_backend;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::support::*;
use crate::tools::sdk_script;
use bytes::Bytes;
use http::Method;
use serde_json::Value;

/// SDK server processes, killed on drop; `scheme` is how they are reached.
struct SdkServers(Vec<(Child, String, u16)>, &'static str);

impl SdkServers {
    /// A backend line for each server, weight 1.
    fn specs(&self) -> Vec<BackendSpec> {
        self.0
            .iter()
            .map(|(_, name, port)| BackendSpec {
                name: name.clone(),
                url: format!("{}://127.0.0.1:{port}", self.1),
                weight: 1,
            })
            .collect()
    }
}

impl Drop for SdkServers {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start_sdk_servers(n: usize) -> SdkServers {
    start_sdk_servers_with(n, None)
}

/// `n` SDK servers; with `tls` (certificate and key files), serving HTTPS (uvicorn's TLS).
fn start_sdk_servers_with(n: usize, tls: Option<(&std::path::Path, &std::path::Path)>) -> SdkServers {
    let mut servers = SdkServers(Vec::new(), if tls.is_some() { "https" } else { "http" });
    for i in 0..n {
        let name = format!("sdk-{i}");
        let mut command = sdk_script("server.py");
        command.args(["--port", "0", "--name", &name]);
        if let Some((cert, key)) = tls {
            command.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start server.py");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(port) = line.strip_prefix("READY ") {
                    let _ = tx.send(port.trim().parse::<u16>().unwrap());
                }
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                panic!("SDK server {name} did not print READY within 60 s");
            }
        };
        servers.0.push((child, name, port));
    }
    servers
}

/// Runs one client.py scenario against `url`; returns its JSON summary. Fails on a non-zero exit.
async fn scenario(url: &str, args: &[&str]) -> Value {
    let mut cmd = tokio::process::Command::from(sdk_script("client.py"));
    cmd.arg(url).args(args).args(["--timeout", "90"]);
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("client.py finished")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "no summary from client.py {args:?}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        out.status.success(),
        "client.py {args:?} failed: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary["failed"], 0, "{summary}");
    summary
}

fn instances(summary: &Value) -> usize {
    summary["instances"].as_object().map_or(0, |m| m.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_traffic_through_the_router() {
    let servers = start_sdk_servers(3);
    let fleet = Fleet::start_backends(Vec::new(), &servers.specs(), "").await;
    sdk_traffic(&fleet).await;
}

/// The same traffic to SDK servers that serve HTTPS (uvicorn with a certificate this test's CA
/// signed), reached by `https://` URLs and verified against `[upstream] tls_ca`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_traffic_through_the_router_to_https_backends() {
    let dir = tempfile::tempdir().unwrap();
    let ca = tls_backend::Ca::new("interop CA");
    let ca_file = tls_backend::write(dir.path(), "ca.pem", &ca.pem());
    let (cert, key) = ca.server(&["127.0.0.1"]).write(dir.path(), "sdk");
    let servers = start_sdk_servers_with(3, Some((&cert, &key)));
    assert!(servers.specs().iter().all(|s| s.url.starts_with("https://")));
    let extra = format!("[upstream]\ntls_ca = \"{}\"\n", ca_file.display());
    let fleet = Fleet::start_backends(Vec::new(), &servers.specs(), &extra).await;
    sdk_traffic(&fleet).await;
    let m = fleet.metrics().await;
    assert_eq!(
        metric_sum(&m, "mrtr_upstream_errors_total", &["kind=\"tls\""]),
        0.0,
        "no TLS failure:\n{m}"
    );
}

/// Every interop scenario through `fleet`, and what the router must have learned from them.
async fn sdk_traffic(fleet: &Fleet) {
    let url = fleet.url();

    // Naive spreading breaks these (WIRE.md); through the router every one must pass.
    let multi = scenario(&url, &["multiround", "--calls", "30"]).await;
    assert!(multi["ok"].as_u64().unwrap() >= 30, "{multi}");
    assert!(
        instances(&multi) >= 2,
        "multi-round calls spread over instances: {multi}"
    );

    let sessions = scenario(&url, &["sessions", "--sessions", "20", "--calls", "10"]).await;
    assert!(sessions["ok"].as_u64().unwrap() >= 20, "{sessions}");
    assert!(instances(&sessions) >= 2, "sessions spread over instances: {sessions}");

    scenario(&url, &["elicitation"]).await;
    scenario(&url, &["progress"]).await;
    scenario(&url, &["progress", "--legacy"]).await;
    scenario(&url, &["task"]).await;

    let m = fleet.metrics().await;
    for kind in ["request_state", "session", "task"] {
        let created = metric(&m, &format!("mrtr_pins_created_total{{kind=\"{kind}\"}}")).unwrap_or(0.0);
        assert!(created > 0.0, "no {kind} pins were learned:\n{m}");
    }
    let finished = metric(&m, "mrtr_pins_finished_total{kind=\"request_state\"}").unwrap_or(0.0);
    assert!(
        finished >= 60.0,
        "each round's state is finished when the next round or the result arrives: {finished}"
    );
    assert!(metric(&m, "mrtr_rounds_per_call_count").unwrap_or(0.0) >= 30.0);
    assert_eq!(
        metric(&m, "mrtr_router_errors_total{reason=\"pinned_backend_unavailable\"}"),
        Some(0.0)
    );

    bad_handles_reach_a_backend_and_its_error_comes_back(fleet).await;
}

const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"0"},"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}"#;

/// Handles no pin knows are routed as if keyless; the SDK's own error reaches the client unchanged.
async fn bad_handles_reach_a_backend_and_its_error_comes_back(fleet: &Fleet) {
    let v2026 = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "confirm_transfer"),
        ("accept", "application/json, text/event-stream"),
    ];
    let retry = |state: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"confirm_transfer","arguments":{{"amount":1000}},"requestState":{},"inputResponses":{{"approve":{{"action":"accept","content":{{"approved":true}}}}}},"_meta":{META}}}}}"#,
            serde_json::Value::from(state)
        )
    };
    let a = send(
        &fleet.client,
        Method::POST,
        &fleet.url(),
        &v2026,
        Bytes::from(retry("v1.not-a-state-anyone-issued")),
    )
    .await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.router_error(), None, "the backend's answer, not the router's");
    assert_eq!(a.json()["error"]["message"], "Invalid or expired requestState");

    // A megabyte-sized requestState is bounded by max_body_bytes before any backend sees it.
    let huge = "A".repeat(2 << 20);
    let a = send(
        &fleet.client,
        Method::POST,
        &fleet.url(),
        &v2026,
        Bytes::from(retry(&huge)),
    )
    .await;
    assert_eq!((a.status.as_u16(), a.router_error()), (413, Some("body_too_large")));

    // An unknown legacy session: the SDK's 404 passes through.
    let ping = Bytes::from_static(br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#);
    let headers = [
        ("mcp-session-id", "0123456789abcdef0123456789abcdef"),
        ("accept", "application/json, text/event-stream"),
    ];
    let a = send(&fleet.client, Method::POST, &fleet.url(), &headers, ping).await;
    assert_eq!(a.status, 404, "{a:?}");
    assert_eq!(a.router_error(), None);

    // An unknown task id.
    let get = format!(
        r#"{{"jsonrpc":"2.0","id":6,"method":"tasks/get","params":{{"taskId":"no-such-task","_meta":{META}}}}}"#
    );
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tasks/get"),
        ("mcp-name", "no-such-task"),
        ("accept", "application/json, text/event-stream"),
    ];
    let a = send(&fleet.client, Method::POST, &fleet.url(), &headers, Bytes::from(get)).await;
    assert!(a.status.is_client_error(), "{a:?}");
    assert_eq!(a.router_error(), None);
    // None of these created a pin.
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_router_errors_total{reason=\"body_too_large\"}"),
        Some(1.0)
    );
}

/// An L4 balancer: each new connection goes to the next router in turn, as a plain TCP load
/// balancer in front of router replicas would.
async fn alternate(targets: Vec<std::net::SocketAddr>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut next = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            let target = targets[next % targets.len()];
            next += 1;
            tokio::spawn(async move {
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_traffic_across_two_router_replicas_with_sealed_tokens() {
    let servers = start_sdk_servers(3);
    let keys = "[tokens]\nkeys = [\"interop-key-0123456789abcdef0123456789\"]\n";
    let specs = servers.specs();
    let a = Fleet::start_backends(Vec::new(), &specs, keys).await;
    let b = Fleet::start_backends(Vec::new(), &specs, keys).await;
    let lb = alternate(vec![a.router, b.router]).await;
    let url = format!("http://{lb}/mcp");
    // A new connection per request: consecutive rounds reach different replicas.
    let multi = scenario(&url, &["multiround", "--calls", "30", "--no-keepalive"]).await;
    assert!(multi["ok"].as_u64().unwrap() >= 30, "{multi}");
    let sessions = scenario(
        &url,
        &["sessions", "--sessions", "10", "--calls", "10", "--no-keepalive"],
    )
    .await;
    assert!(sessions["ok"].as_u64().unwrap() >= 10, "{sessions}");
    scenario(&url, &["elicitation", "--no-keepalive"]).await;
    for fleet in [&a, &b] {
        let m = fleet.metrics().await;
        let by_token = metric(&m, "mrtr_route_decisions_total{source=\"token\"}").unwrap_or(0.0);
        assert!(
            by_token > 20.0,
            "each replica routed the other's follow-ups by token ({by_token}):\n{m}"
        );
        assert_eq!(
            metric(&m, "mrtr_tokens_rejected_total{reason=\"bad_signature\"}"),
            Some(0.0)
        );
    }
}

/// Sends `tools/list` bursts of `BURST` concurrent requests through `fleet`, `gaps` apart (each
/// burst's requests then wait on `BURST` pooled connections the backend closes after its
/// keep-alive); returns every answer that was not a 200 from the backend.
async fn spaced_bursts(fleet: &Fleet, gaps: &[Duration]) -> Vec<String> {
    const BURST: usize = 4;
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
        ("accept", "application/json, text/event-stream"),
    ];
    let body = Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{META}}}}}"#
    ));
    let mut failures = Vec::new();
    for (burst, gap) in std::iter::once(Duration::ZERO).chain(gaps.iter().copied()).enumerate() {
        tokio::time::sleep(gap).await;
        let url = fleet.url();
        let answers = futures_util::future::join_all(
            (0..BURST).map(|_| send(&fleet.client, Method::POST, &url, &headers, body.clone())),
        )
        .await;
        for a in answers {
            if a.status != 200 || a.router_error().is_some() || a.json()["result"]["tools"].as_array().is_none() {
                failures.push(format!(
                    "burst {burst} after {gap:?}: {} {:?}",
                    a.status,
                    a.router_error()
                ));
            }
        }
    }
    failures
}

/// uvicorn (the SDK's server) closes a connection idle for 5 s. With the default
/// `upstream.idle_timeout` (4 s) the router never offers it a connection that old; with a
/// longer one it sees the close before reusing the connection. Either way, requests spaced
/// just around 5 s apart never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spaced_around_uvicorns_keep_alive_never_fail() {
    let servers = start_sdk_servers(1);
    let default = Fleet::start_backends(Vec::new(), &servers.specs(), "").await;
    let longer = Fleet::start_backends(Vec::new(), &servers.specs(), "[upstream]\nidle_timeout = \"60s\"\n").await;
    let ms = Duration::from_millis;
    let (near_gaps, past_gaps) = (
        [ms(4900), ms(4980), ms(5000), ms(5020), ms(5100)],
        [ms(5200), ms(5300), ms(5500)],
    );
    // Around the 5 s keep-alive for the default pool; past it (the close has certainly
    // arrived) for the 60 s one, where a request racing the close could not be told from one
    // the backend read.
    let (near, past) = tokio::join!(spaced_bursts(&default, &near_gaps), spaced_bursts(&longer, &past_gaps),);
    assert!(near.is_empty(), "default idle_timeout: {near:#?}");
    assert!(past.is_empty(), "idle_timeout 60s: {past:#?}");
    for (fleet, what, gaps) in [
        (&default, "default", near_gaps.len()),
        (&longer, "60s", past_gaps.len()),
    ] {
        let m = fleet.metrics().await;
        assert_eq!(
            metric_sum(&m, "mrtr_upstream_errors_total", &[]),
            0.0,
            "{what}: no upstream error:\n{m}"
        );
        // Every burst needed a fresh connection: the pool really was emptied (by the router's
        // idle_timeout, or by uvicorn's close seen at checkout), so the test proved something.
        let opened = metric(&m, "mrtr_upstream_connections_opened_total{backend=\"sdk-0\"}").unwrap_or(0.0);
        assert!(
            opened > gaps as f64,
            "{what}: {opened} connections opened for {} bursts",
            gaps + 1
        );
    }
}

/// The SDK's client in a legacy session under `[quotas]`: a new call inside the session meets the
/// rate (a session alone makes no follow-up), while the answers to a call's elicitations, posted
/// in the same session after the rate is spent, pass and the call completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_session_calls_meet_the_rate_while_their_elicitation_answers_pass() {
    let servers = start_sdk_servers(2);
    let quotas = "[quotas]\ncaller = \"ip\"\nrate = \"1/m\"\nburst = 12\n";
    let fleet = Fleet::start_backends(Vec::new(), &servers.specs(), quotas).await;
    let summary = scenario(&fleet.url(), &["session_quota", "--calls", "40"]).await;
    assert_eq!(
        summary["refused"], true,
        "a call in the session was refused by the rate: {summary}"
    );
    assert!(
        summary["refusal"]
            .as_str()
            .is_some_and(|r| r.contains("429") || r.contains("rate")),
        "{summary}"
    );
    let ok = summary["whoami_ok"].as_u64().unwrap();
    assert!(ok > 0 && ok < 12, "the burst bounds the session's new calls: {summary}");
    // Only the one whoami was refused: never an elicitation answer, nor the session's DELETE.
    assert_eq!(summary["http_429"], 1, "{summary}");
    assert_eq!(summary["http"]["POST POST 202 application/json"], 3, "{summary}");
    let m = fleet.metrics().await;
    let refused = metric_sum(&m, "mrtr_quota_refusals_total", &["quota=\"rate\""]);
    assert_eq!(refused, 1.0, "{m}");
}
