//! The status page (`GET /` on the admin listener, docs/src/observability.md) in a real browser:
//! headless Chromium driven by tests/browser/driver.mjs (tools/browser.rs), against a router in
//! front of example workers with traffic. What a person sees is checked against `/metrics` and
//! `/api/status` read at the same moment; a killed backend turns down on the page within the
//! health interval; a drain through the page needs the token, moves new calls off the backend
//! and lets its pinned calls finish there; a backend named with markup shows as text and runs
//! nothing; the page asks nothing of any host but the admin listener. The screenshot in the book
//! (docs/src/images/status-page.png) is taken here, so it is always the page as it is.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

use crate::support::*;
use crate::tools::browser::Browser;

const TOKEN: &str = "status-page-admin-token-0123456789";
const XSS: &str = "<img src=x onerror=alert(1)>";
/// `[health]`: a killed backend is down within `interval × unhealthy_after + timeout`.
const HEALTH_INTERVAL: Duration = Duration::from_millis(200);

fn tool_call(tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
}

async fn get(fleet: &Fleet, path: &str, token: Option<&str>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let url = format!("http://{}{path}", fleet.admin);
    send(&fleet.client, Method::GET, &url, &headers, Bytes::new()).await
}

/// The page's row of `name`.
fn row<'a>(page: &'a Value, name: &str) -> &'a Value {
    page["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["key"] == name)
        .unwrap_or_else(|| panic!("no row for {name:?}: {page:#}"))
}

fn api_backend<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap()
}

/// The page's numbers per backend (pins, in flight, up) equal `/api/status`'s and `/metrics`'s,
/// all three read after the traffic stopped.
async fn page_matches_the_metrics(fleet: &Fleet, browser: &mut Browser, names: &[String]) {
    // A sweep (once a second) counts the pins per backend; then two updates of the page.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    browser.wait_updates(2).await;
    let page = browser.read().await;
    let doc = get(fleet, "/api/status", None).await.json();
    let metrics = fleet.metrics().await;
    for name in names {
        let (shown, api) = (row(&page, name), api_backend(&doc, name));
        let label = format!("backend=\"{name}\"");
        let pins = metric_sum(&metrics, "mrtr_backend_pins", &[&label]);
        let inflight = metric_sum(&metrics, "mrtr_backend_inflight", &[&label]);
        let up = metric_sum(&metrics, "mrtr_backend_up", &[&label]);
        assert_eq!(
            shown["pins"].as_f64(),
            Some(pins),
            "{name}: pins on the page and in /metrics"
        );
        assert_eq!(api["pins"]["total"].as_f64(), Some(pins), "{name}: pins in /api/status");
        assert_eq!(shown["inflight"].as_f64(), Some(inflight), "{name}: in flight");
        assert_eq!(
            api["inflight"].as_f64(),
            Some(inflight),
            "{name}: in flight in /api/status"
        );
        assert_eq!(shown["up"].as_bool(), Some(up == 1.0), "{name}: up");
        assert_eq!(api["up"].as_bool(), Some(up == 1.0), "{name}: up in /api/status");
    }
    let total: f64 = metric_sum(&metrics, "mrtr_pins", &[]);
    assert_eq!(page["router_pins"].as_f64(), Some(total), "pins in all");
    assert_eq!(doc["router"]["pins"]["total"].as_f64(), Some(total));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_fleet_live_and_safely_and_drains_with_the_token() {
    let workers = vec![
        start_worker("worker-0").await,
        start_worker("worker-1").await,
        start_worker(XSS).await,
    ];
    let names: Vec<String> = workers.iter().map(|w| w.state.name.clone()).collect();
    let extra = format!(
        "[admin]\ntoken = \"{TOKEN}\"\n\
         [health]\ninterval = \"{}ms\"\ntimeout = \"200ms\"\nunhealthy_after = 2\nhealthy_after = 2\n\
         [quotas]\n[[quotas.tool]]\nname = \"flood\"\nrate = \"1/m\"\nburst = 1\n",
        HEALTH_INTERVAL.as_millis()
    );
    let mut fleet = Fleet::start_with(workers, &extra).await;
    let origin = format!("http://{}", fleet.admin);

    // The page and its data carry the headers that keep it from running anything else.
    let page = get(&fleet, "/", None).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.headers["content-security-policy"],
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    );
    for (h, v) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ] {
        assert_eq!(page.headers[h], v, "{h}");
        assert_eq!(
            get(&fleet, "/ui/status.js", None).await.headers[h],
            v,
            "{h} on an asset"
        );
        assert_eq!(get(&fleet, "/api/status", None).await.headers[h], v, "{h} on the data");
    }

    // Traffic: calls left waiting for their second round (pins), finished ones, keyless ones.
    for i in 0..12 {
        let a = fleet.post(&[], &start_call(&format!("open-{i}"), 2)).await;
        assert_eq!(a.status, 200);
    }
    for i in 0..6 {
        let mid = format!("done-{i}");
        fleet.post(&[], &start_call(&mid, 2)).await;
        fleet.post(&[], &confirm(&mid, 2)).await;
    }

    let mut browser = Browser::start().await;
    browser.goto(&format!("{origin}/")).await;
    browser.wait_updates(1).await;
    let first = browser.read().await;
    assert_eq!(first["title"], "mrtr-router status");

    // Without the token: read-only, the config and the callers withheld.
    assert_eq!(first["mode"], "read-only", "{first:#}");
    assert!(
        first["access_note"].as_str().unwrap().contains("admin token"),
        "{first:#}"
    );
    assert_eq!(first["config"], Value::Null, "no config without the token");

    // The backend named with markup is its characters, and nothing ran.
    let probe = row(&first, XSS);
    assert_eq!(probe["name"], XSS);
    assert_eq!(first["images"], 0, "no element was made from a name");

    // The numbers are the metrics'.
    page_matches_the_metrics(&fleet, &mut browser, &names).await;

    // Without the token a drain is refused, and the page says so.
    browser
        .call(json!({"op": "click", "backend": "worker-1", "action": "drain"}))
        .await;
    let refused = browser.call(json!({"op": "wait_notice", "contains": "refused"})).await;
    assert!(refused["notice"].as_str().unwrap().contains("401"), "{refused:#}");
    assert!(!fleet.control.backend("worker-1").unwrap().draining);

    // With the token: the controls, the config (redacted) and the callers.
    let with = browser.call(json!({"op": "token", "value": TOKEN})).await;
    assert_eq!(with["mode"], "controls on");
    let config = with["config"].as_str().expect("the config with the token");
    assert!(config.contains(&format!("name = \"{XSS}\"")), "{config}");
    assert!(
        config.contains("token = \"<redacted>\"") && !config.contains(TOKEN),
        "{config}"
    );

    // A call pinned to worker-1, then worker-1 drained through the page: new calls leave it,
    // the pinned call finishes there.
    let mut pinned = None;
    for i in 0..64 {
        let mid = format!("pinned-{i}");
        if fleet.post(&[], &start_call(&mid, 2)).await.worker() == "worker-1" {
            pinned = Some(mid);
            break;
        }
    }
    let pinned = pinned.expect("a call on worker-1");
    browser
        .call(json!({"op": "click", "backend": "worker-1", "action": "drain"}))
        .await;
    let drained = browser
        .call(json!({"op": "wait_notice", "contains": "drain: worker-1 done"}))
        .await;
    assert!(!drained["notice"].as_str().unwrap().contains("refused"), "{drained:#}");
    assert!(fleet.control.backend("worker-1").unwrap().draining);
    for i in 0..30 {
        let a = fleet.post(&[], &start_call(&format!("after-drain-{i}"), 2)).await;
        assert_ne!(a.worker(), "worker-1", "a new call reached the drained backend");
    }
    let finished = fleet.post(&[], &confirm(&pinned, 2)).await;
    assert_eq!(
        finished.worker(),
        "worker-1",
        "the pinned call finishes where it started"
    );
    assert_eq!(finished.json()["result"]["content"][0]["text"], "done");
    browser.wait_updates(1).await;
    let shown = browser.read().await;
    assert!(
        row(&shown, "worker-1")["state"].as_str().unwrap().contains("draining"),
        "{shown:#}"
    );
    assert_eq!(row(&shown, "worker-1")["drain_hidden"], true);

    // Callers refused by a quota, as the access log names them.
    for _ in 0..8 {
        fleet.post(&[], &tool_call("flood")).await;
    }
    browser.wait_updates(2).await;
    let quotas = browser.read().await;
    assert_eq!(quotas["quotas_shown"], true);
    let top = quotas["top_refused"].as_array().unwrap();
    assert_eq!(top.first(), Some(&json!(["127.0.0.1", "rate/tool", "7"])), "{quotas:#}");
    assert_eq!(quotas["auth_shown"], false, "no [auth] section without [auth]");
    assert_eq!(quotas["catalog_shown"], false, "no catalog yet");

    // The numbers still match, with pins, a drain and refusals in them.
    page_matches_the_metrics(&fleet, &mut browser, &names).await;

    // A backend killed: down on the page within the health interval's ejection bound.
    let victim = fleet.workers.remove(0);
    let killed = Instant::now();
    victim.stop().await;
    let bound = HEALTH_INTERVAL * 2 + Duration::from_millis(200) + Duration::from_secs(2);
    loop {
        let page = browser.read().await;
        if row(&page, "worker-0")["up"] == false {
            let health = row(&page, "worker-0")["health"].as_str().unwrap().to_string();
            assert!(health.contains("ejected by active health checks"), "{health}");
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "worker-0 still up on the page after {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shown_after = killed.elapsed();

    // The picture in the book: the page as it is now, under a little traffic.
    let (client, url) = (fleet.client.clone(), fleet.url());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let load = tokio::spawn(async move {
        for i in 0..1000u32 {
            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let mid = format!("load-{i}");
            let body = Bytes::from(start_call(&mid, 2).to_string());
            send(&client, Method::POST, &url, &[], body).await;
            if i % 3 != 0 {
                let body = Bytes::from(confirm(&mid, 2).to_string());
                send(&client, Method::POST, &url, &[], body).await;
            }
            tokio::time::sleep(Duration::from_millis(10 + u64::from(i % 40))).await;
        }
    });
    browser.wait_updates(8).await;
    let image = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/images/status-page.png");
    std::fs::create_dir_all(image.parent().unwrap()).unwrap();
    browser
        .call(json!({"op": "screenshot", "path": image.to_str().unwrap()}))
        .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.await.unwrap();
    let png = std::fs::read(&image).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());

    // Forgetting the token makes the page read-only again.
    let forgot = browser.call(json!({"op": "forget_token"})).await;
    assert_eq!(forgot["config"], Value::Null);

    // Nothing fired, nothing was blocked, nothing went anywhere but the admin listener.
    let report = browser.call(json!({"op": "report"})).await;
    assert_eq!(report["dialogs"], json!([]), "{report:#}");
    assert_eq!(report["pageErrors"], json!([]), "{report:#}");
    let last = browser.read().await;
    assert_eq!(last["csp_violations"], json!([]), "{last:#}");
    let requests = report["requests"].as_array().unwrap();
    assert!(requests.len() > 3, "{report:#}");
    for r in requests {
        let url = r.as_str().unwrap();
        assert!(url.starts_with(&format!("{origin}/")), "a request elsewhere: {url}");
        assert!(!url.ends_with("/x"), "the probe's image was requested: {url}");
    }
    println!(
        "status page: worker-0 down on the page {shown_after:?} after it was killed; {} requests, all to {origin}",
        requests.len()
    );
    browser.close().await;
}

/// What the page costs with 100 backends (docs/src/observability.md states these figures): the
/// time to its first picture, the size of the first and of a later event, and the tab's time to
/// render an update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_with_100_backends() {
    let mut workers = Vec::new();
    for i in 0..100 {
        workers.push(start_worker(&format!("w-{i:03}")).await);
    }
    let fleet = Fleet::start_with(workers, "").await;
    for i in 0..300 {
        fleet.post(&[], &start_call(&format!("c-{i}"), 2)).await;
    }
    let whole = get(&fleet, "/api/status", None).await.body.len();
    let mut browser = Browser::start().await;
    let t = Instant::now();
    browser.goto(&format!("http://{}/", fleet.admin)).await;
    let first_picture = t.elapsed();
    browser.wait_updates(5).await;
    let later = browser.read().await;
    assert_eq!(later["backends"].as_array().unwrap().len(), 100);
    let (first_bytes, update_bytes) = (
        later["first_event_bytes"].as_u64().unwrap(),
        later["event_bytes"].as_u64().unwrap(),
    );
    let render = later["render_ms"].as_f64().unwrap();
    println!(
        "100 backends: first picture after {first_picture:?}; /api/status {whole} bytes; first event {first_bytes} bytes, \
         an update {update_bytes} bytes; the tab renders an update in {render} ms"
    );
    assert!(update_bytes < 100_000, "{update_bytes} bytes an update");
    assert!(render < 250.0, "{render} ms to render an update");
    let report = browser.call(json!({"op": "report"})).await;
    assert_eq!(report["pageErrors"], json!([]), "{report:#}");
    browser.close().await;
}
