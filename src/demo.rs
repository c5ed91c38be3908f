//! `mrtr-router demo`: the router from `config.toml` in front of built-in example workers,
//! with a few two-round calls driven through it so a new user sees routing and pins work.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::example::Worker;
use crate::{Config, Listeners, Router};

/// Runs the demo until `shutdown` resolves.
pub async fn run(
    config_path: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let mut config = Config::load(config_path).map_err(|e| e.to_string())?;
    if let Ok((open_file_limit, _)) = crate::raise_open_file_limit() {
        fit_connections(&mut config, open_file_limit);
    }
    if config.server.tls.is_some() {
        return Err(format!(
            "demo drives its calls over plain HTTP; run it with a config without server.tls_cert / server.tls_key (not {})",
            config_path.display()
        ));
    }
    let mut workers = Vec::new();
    for b in &config.backends {
        let addr: SocketAddr = b.authority.as_str().parse().map_err(|_| {
            format!(
                "demo starts workers itself, so backend {} must use a local IP:port, not {}",
                b.name, b.authority
            )
        })?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "demo only starts workers on loopback; backend {} is at {addr}",
                b.name
            ));
        }
        let w = Worker::bind(&b.name, addr)
            .await
            .map_err(|e| format!("cannot start example worker {} on {addr}: {e}", b.name))?;
        println!("example worker {:<10} listening on {}", b.name, w.url());
        workers.push(w);
    }
    let listeners = Listeners::bind(&config)
        .await
        .map_err(|e| format!("cannot bind router listeners: {e}"))?;
    let proxy_addr = listeners.proxy.local_addr().map_err(|e| e.to_string())?;
    let admin_addr = listeners.admin.local_addr().map_err(|e| e.to_string())?;
    // From the config as fitted, not the file: the demo does not follow edits to the file.
    let router = Router::new(config);
    let served = tokio::spawn(router.run(listeners, shutdown));
    println!("mrtr-router listening on http://{proxy_addr}/mcp\n");

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://{proxy_addr}/mcp");
    for (i, by_header) in [(1, false), (2, true), (3, false), (4, true)] {
        let call = format!("transfer-{i}");
        let routing_id = by_header.then(|| format!("r-{i}"));
        let start = json!({"jsonrpc": "2.0", "id": 1, "messageId": call, "method": "tools/call",
            "params": {"name": "transfer-funds", "arguments": {"to": "123-456-789", "amount": 500 * i}}});
        let confirm =
            json!({"jsonrpc": "2.0", "id": 2, "messageId": call, "method": "confirm", "params": {"approved": true}});
        let (w1, r1) = post(&client, &url, routing_id.as_deref(), &start).await?;
        let (w2, r2) = post(&client, &url, routing_id.as_deref(), &confirm).await?;
        let key = match &routing_id {
            Some(r) => format!("Mcp-Routing-Id {r}"),
            None => format!("messageId {call}"),
        };
        let state1 = if r1["result"]["pending"] == true {
            "pending"
        } else {
            "?"
        };
        let state2 = r2["result"]["content"][0]["text"].as_str().unwrap_or("?");
        println!("call {call:<11} key {key:<24} round 1 → {w1} ({state1}), round 2 → {w2} ({state2})");
    }
    let (w, _) = post(
        &client,
        &url,
        None,
        &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "whoami"}}),
    )
    .await?;
    println!("keyless whoami                                   → {w} (least outstanding requests)");
    println!("\nmetrics:  http://{admin_addr}/metrics");
    println!("explain:  http://{admin_addr}/debug/route?key=transfer-1");
    println!("try:      curl -s {url} -H 'Mcp-Routing-Id: r-9' -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"messageId\":\"x\",\"method\":\"tools/call\",\"params\":{{\"name\":\"transfer-funds\"}}}}'");
    println!("\nserving until Ctrl-C");
    let _ = served.await;
    for w in workers {
        w.stop().await;
    }
    Ok(())
}

/// Lowers `server.max_connections` to a quarter of the open-file limit: the demo's config fits
/// the machine it runs on, whatever the file says, so the demo shows no warning that the limit
/// caps it. A quarter is well inside what the router affords (half of what the limit leaves
/// after a reserve; see `server.max_connections` in the configuration reference), and plenty
/// for a demo. A served config keeps its value, and the router warns when the limit caps it.
fn fit_connections(config: &mut Config, open_file_limit: u64) {
    let quarter = usize::try_from(open_file_limit / 4).unwrap_or(usize::MAX).max(1);
    config.server.max_connections = config.server.max_connections.min(quarter);
}

async fn post(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    url: &str,
    routing_id: Option<&str>,
    body: &Value,
) -> Result<(String, Value), String> {
    let mut req = Request::post(url).header("content-type", "application/json");
    if let Some(r) = routing_id {
        req = req.header("mcp-routing-id", r);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| "demo request timed out".to_string())?
        .map_err(|e| format!("demo request failed: {e}"))?;
    let worker = resp
        .headers()
        .get("x-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let v = serde_json::from_slice(&bytes).map_err(|e| format!("demo answer not JSON: {e}"))?;
    Ok((worker, v))
}
