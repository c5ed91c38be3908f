//! The status page's endpoints over HTTP (docs/src/observability.md, "The status page"): who
//! sees what (`/`, `/api/status`, `/api/events` under the rule of reads, the config and the
//! callers under the rule of changes, nothing sensitive on a non-loopback listener without
//! `admin.token`), the event stream, and the methods refused. The page in a browser is
//! tests/external/status_page.rs.

use std::path::Path;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use mrtr_router::{Config, Listeners, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::support::*;

const TOKEN: &str = "status-api-admin-token-0123456789";

/// A router with one worker and `admin` keys, its admin listener bound at `admin_bind`; the
/// admin address to connect to (loopback, whatever it is bound to).
struct Admin {
    url: String,
    client: HttpClient,
    _worker: mrtr_router::example::Worker,
    _stop: oneshot::Sender<()>,
}

impl Admin {
    async fn start(admin: &str, admin_bind: &str) -> Admin {
        let worker = start_worker("worker-0").await;
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:1\"\n{admin}\n\
             [quotas]\nrate = \"100/s\"\n[[backend]]\nname = \"worker-0\"\nurl = \"{}\"\n",
            worker.url()
        );
        let config = Config::parse(Path::new("status.toml"), &text).expect("valid test config");
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listener = TcpListener::bind(admin_bind).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            Router::new(config).run(Listeners { proxy, admin: listener }, async move {
                let _ = stopped.await;
            }),
        );
        Admin {
            url: format!("http://127.0.0.1:{port}"),
            client: client(),
            _worker: worker,
            _stop: stop,
        }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        send(
            &self.client,
            Method::GET,
            &format!("{}{path}", self.url),
            &headers,
            Bytes::new(),
        )
        .await
    }
}

#[tokio::test]
async fn a_loopback_listener_without_a_token_shows_everything_and_streams_updates() {
    let admin = Admin::start("", "127.0.0.1:0").await;
    let page = admin.get("/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&page.body).contains("<script src=\"/ui/status.js\""));
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert_eq!(admin.get("/ui/status.css", None).await.status, StatusCode::OK);
    assert_eq!(admin.get("/ui/../Cargo.toml", None).await.status, StatusCode::NOT_FOUND);
    let doc = admin.get("/api/status", None).await;
    assert_eq!(doc.status, StatusCode::OK);
    assert_eq!(doc.headers["cache-control"], "no-store");
    let doc = doc.json();
    assert_eq!(doc["access"]["sensitive"], true);
    assert!(doc["config"].as_str().unwrap().contains("[quotas]"));
    assert_eq!(doc["quotas"]["top_refused"], json!([]));
    assert_eq!(doc["backends"][0]["name"], "worker-0");

    // The stream: the whole document, then the new samples only, the config not again.
    let req = Request::get(format!("{}/api/events", admin.url))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = admin.client.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("script-src 'self'"));
    let mut body = resp.into_body();
    let mut seen = read_until(&mut body, "\n\n").await;
    let first = event(&seen);
    assert!(first["config"].is_string(), "{first}");
    while seen.matches("\n\n").count() < 3 {
        seen.push_str(&read_until(&mut body, "\n\n").await);
    }
    let events: Vec<&str> = seen.split("\n\n").filter(|e| !e.is_empty()).collect();
    let (a, b) = (event(events[1]), event(events[2]));
    assert!(a.get("config").is_none(), "an unchanged config is not sent again: {a}");
    assert_eq!(
        a["history"]["to"], b["history"]["from"],
        "each event starts where the last ended"
    );
    assert_eq!(b["router"]["history"]["requests"].as_array().unwrap().len(), 1);

    // Only GET and HEAD.
    let post = send(
        &admin.client,
        Method::POST,
        &format!("{}/api/status", admin.url),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(post.headers["allow"], "GET, HEAD");
}

/// The JSON of one event's `data:` line.
fn event(text: &str) -> Value {
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("a data line");
    serde_json::from_str(data).unwrap()
}

#[tokio::test]
async fn a_non_loopback_listener_without_a_token_never_serves_the_sensitive_members() {
    let admin = Admin::start("", "0.0.0.0:0").await;
    assert_eq!(admin.get("/", None).await.status, StatusCode::OK);
    let doc = admin.get("/api/status", None).await.json();
    assert_eq!(doc["config"], Value::Null);
    assert_eq!(doc["quotas"]["top_refused"], Value::Null);
    assert_eq!(doc["access"]["change"], false);
    assert_eq!(
        doc["access"]["redacted"],
        json!(["config", "quotas.top_refused", "catalog"])
    );
    assert!(
        doc["access"]["why"].as_str().unwrap().contains("not on loopback"),
        "{doc}"
    );
    // The numbers are there, as /metrics shows them to anyone.
    assert_eq!(doc["backends"][0]["up"], true);
    // Not even with a token: none is configured.
    let with = admin.get("/api/status", Some("anything")).await.json();
    assert_eq!(with["config"], Value::Null);
    let drain = send(
        &admin.client,
        Method::POST,
        &format!("{}/backends/worker-0/drain", admin.url),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(drain.status, StatusCode::FORBIDDEN);
    // The catalog tells the tools' descriptions: a sensitive read.
    assert_eq!(admin.get("/catalog", None).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn with_protect_reads_the_data_needs_the_token_and_the_page_does_not() {
    let admin = Admin::start(&format!("token = \"{TOKEN}\"\nprotect_reads = true"), "127.0.0.1:0").await;
    assert_eq!(
        admin.get("/", None).await.status,
        StatusCode::OK,
        "the page loads to ask for the token"
    );
    assert_eq!(admin.get("/ui/status.js", None).await.status, StatusCode::OK);
    for path in ["/api/status", "/api/events"] {
        let refused = admin.get(path, None).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(refused.headers["x-content-type-options"], "nosniff");
        assert_eq!(admin.get(path, Some("wrong")).await.status, StatusCode::UNAUTHORIZED);
    }
    let doc = admin.get("/api/status", Some(TOKEN)).await.json();
    assert_eq!(doc["access"]["sensitive"], true);
    let config = doc["config"].as_str().unwrap();
    assert!(
        config.contains("token = \"<redacted>\"") && !config.contains(TOKEN),
        "{config}"
    );
}

#[tokio::test]
async fn with_a_token_but_open_reads_the_numbers_are_open_and_the_config_is_not() {
    let admin = Admin::start(&format!("token = \"{TOKEN}\""), "127.0.0.1:0").await;
    let doc = admin.get("/api/status", None).await.json();
    assert_eq!(doc["access"]["sensitive"], false);
    assert_eq!(doc["config"], Value::Null);
    assert!(doc["access"]["why"].as_str().unwrap().contains("admin token"));
    let with = admin.get("/api/status", Some(TOKEN)).await.json();
    assert!(with["config"].is_string());
    // The catalog is a sensitive read: the token (then 404 here, the catalog being off).
    assert_eq!(admin.get("/catalog", None).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(admin.get("/catalog", Some(TOKEN)).await.status, StatusCode::NOT_FOUND);
}

/// A page of another site cannot make a visiting browser drain a backend through a loopback
/// listener without `admin.token`: the browser says where the page came from.
#[tokio::test]
async fn a_change_from_another_site_s_page_is_refused() {
    let admin = Admin::start("", "127.0.0.1:0").await;
    let drain = format!("{}/backends/worker-0/drain", admin.url);
    let own = admin.url.clone();
    let host = own.trim_start_matches("http://").to_string();
    let refused = [
        vec![("origin", "http://evil.example")],
        vec![("origin", "null")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "none")],
        vec![("origin", "http://evil.example"), ("host", host.as_str())],
    ];
    for headers in &refused {
        let a = send(&admin.client, Method::POST, &drain, headers, Bytes::new()).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{headers:?}");
    }
    let backends = admin.get("/backends", None).await.json();
    assert_eq!(backends["backends"][0]["draining"], false, "nothing was drained");
    // The listener's own page, and a tool that is no browser, may.
    for headers in [vec![("origin", own.as_str())], vec![]] {
        let a = send(&admin.client, Method::POST, &drain, &headers, Bytes::new()).await;
        assert_eq!(a.status, StatusCode::OK, "{headers:?}: {a:?}");
    }
}

/// DNS rebinding: a page on a name that comes to resolve to 127.0.0.1 is same-origin with what it
/// reaches there, so a loopback listener answers only requests addressed by IP or `localhost`.
#[tokio::test]
async fn a_loopback_listener_answers_only_its_own_names() {
    let admin = Admin::start("", "127.0.0.1:0").await;
    let port = admin.url.rsplit(':').next().unwrap().to_string();
    let rebound = format!("rebound.example:{port}");
    for path in ["/api/status", "/catalog", "/metrics", "/"] {
        let a = send(
            &admin.client,
            Method::GET,
            &format!("{}{path}", admin.url),
            &[("host", rebound.as_str())],
            Bytes::new(),
        )
        .await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}");
    }
    let drain = format!("{}/backends/worker-0/drain", admin.url);
    let same_origin = format!("http://{rebound}");
    let headers = [("host", rebound.as_str()), ("origin", same_origin.as_str())];
    let a = send(&admin.client, Method::POST, &drain, &headers, Bytes::new()).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let backends = admin.get("/backends", None).await.json();
    assert_eq!(backends["backends"][0]["draining"], false, "nothing was drained");
    let localhost = format!("localhost:{port}");
    let a = send(
        &admin.client,
        Method::GET,
        &format!("{}/api/status", admin.url),
        &[("host", localhost.as_str())],
        Bytes::new(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["access"]["sensitive"], true);
}
