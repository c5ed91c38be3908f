//! The router's own errors name no backend (docs/src/errors.md): every error a client can make
//! the router answer is scanned for every configured backend's name and URL. The name stays in
//! the metrics (and the logs, the access log and traces); `server.errors_name_backends = true`
//! puts it into the message for operators who want it there.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::{Method, Response};
use http_body_util::Full;
use serde_json::json;

const KEY: &str = "opaque-errors-key-0123456789abcdef012345";

/// Fails when `answer` (status line aside: its headers and body) names any of `backends`, by
/// name, URL or `host:port`.
fn names_no_backend(answer: &Answer, backends: &[BackendSpec], what: &str) {
    let mut seen = String::from_utf8_lossy(&answer.body).to_string();
    for (name, value) in &answer.headers {
        seen.push_str(&format!("\n{name}: {}", String::from_utf8_lossy(value.as_bytes())));
    }
    for b in backends {
        let host_port = b.url.split("://").nth(1).unwrap_or(&b.url);
        for needle in [b.name.as_str(), b.url.as_str(), host_port] {
            assert!(
                !seen.contains(needle),
                "{what}: the answer names backend {needle:?}:\n{seen}"
            );
        }
    }
}

fn call(id: u64) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "whoami"}})
}

/// A backend that answers after `delay`.
async fn slow_backend(name: &str, delay: Duration) -> BackendSpec {
    test_backend(name, move |_: Method, _: Bytes| async move {
        tokio::time::sleep(delay).await;
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            )))
            .unwrap()
    })
    .await
}

fn down(name: &str) -> BackendSpec {
    BackendSpec {
        name: name.into(),
        url: format!("http://127.0.0.1:{}", free_port()),
        weight: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_a_client_can_trigger_names_a_backend() {
    let mut all = Vec::new();
    let mut answers: Vec<(String, Answer)> = Vec::new();

    // 502: nothing listens.
    let gone = down("charlie-down-43");
    let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&gone), "").await;
    let a = fleet.post(&[], &call(1)).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (502, Some("upstream_unavailable")),
        "{a:?}"
    );
    let m = fleet.metrics().await;
    assert_eq!(
        metric(
            &m,
            "mrtr_upstream_errors_total{backend=\"charlie-down-43\",kind=\"connect\"}"
        ),
        Some(1.0),
        "the metrics keep the name:\n{m}"
    );
    answers.push(("upstream_unavailable".into(), a));
    all.push(gone);

    // 502: TLS to a backend that speaks plain HTTP.
    let plain = start_worker("delta-tls-57").await;
    let tls = BackendSpec {
        name: "delta-tls-57".into(),
        url: format!("https://{}", plain.addr),
        weight: 1,
    };
    let fleet = Fleet::start_backends(vec![plain], std::slice::from_ref(&tls), "").await;
    let a = fleet.post(&[], &call(2)).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (502, Some("upstream_tls")),
        "{a:?}"
    );
    answers.push(("upstream_tls".into(), a));
    all.push(tls);

    // 504: an answer slower than upstream_timeout.
    let slow = slow_backend("bravo-slow-29", Duration::from_secs(3)).await;
    let fleet = Fleet::start_backends(
        Vec::new(),
        std::slice::from_ref(&slow),
        "[server]\nupstream_timeout = \"200ms\"\n",
    )
    .await;
    let a = fleet.post(&[], &call(3)).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (504, Some("upstream_timeout")),
        "{a:?}"
    );
    answers.push(("upstream_timeout".into(), a));
    all.push(slow);

    // 503 upstream_busy: its one connection is taken and stays so past queue_timeout.
    let busy = slow_backend("echo-busy-61", Duration::from_millis(1500)).await;
    let extra = "[upstream]\nmax_connections_per_backend = 1\nqueue_timeout = \"100ms\"\n";
    let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&busy), extra).await;
    let (client, url) = (fleet.client.clone(), fleet.url());
    let holder = tokio::spawn(async move { send(&client, Method::POST, &url, &[], call(4).to_string().into()).await });
    fleet
        .wait_metric(
            "mrtr_backend_inflight{backend=\"echo-busy-61\"}",
            1.0,
            Duration::from_secs(5),
        )
        .await;
    let a = fleet.post(&[], &call(5)).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (503, Some("upstream_busy")),
        "{a:?}"
    );
    answers.push(("upstream_busy".into(), a));
    assert_eq!(holder.await.unwrap().status, 200);
    all.push(busy);

    // 503 pinned_backend_unavailable, then no_backend: the instance holding a call goes, then
    // the last one. Tokens on, with every limit a client can reach.
    let extra = format!(
        "[tokens]\nkeys = [\"{KEY}\"]\n[health]\ninterval = \"50ms\"\nunhealthy_after = 1\n\
         [routing]\nmax_rounds = 2\nmax_pins = 3\n[server]\nmax_body_bytes = 1024\n"
    );
    let workers = vec![
        start_worker("alpha-pinned-17").await,
        start_worker("foxtrot-other-71").await,
    ];
    let mut fleet = Fleet::start_with(workers, &extra).await;
    all.extend(fleet.specs());
    let started = fleet.post(&[], &start_call("lost-1", 5)).await;
    assert_eq!(started.json()["result"]["pending"], true, "{started:?}");
    let token = started.headers["mcp-routing-id"].to_str().unwrap().to_string();
    let holder = started.worker();

    // The limits and refusals, while both instances serve.
    let r2 = fleet.post(&[("mcp-routing-id", &token)], &confirm("lost-1", 2)).await;
    let token2 = r2.headers["mcp-routing-id"].to_str().unwrap().to_string();
    let a = fleet.post(&[("mcp-routing-id", &token2)], &confirm("lost-1", 3)).await;
    assert_eq!(a.router_error(), Some("too_many_rounds"), "{a:?}");
    answers.push(("too_many_rounds".into(), a));
    for i in 0..4 {
        let a = fleet.post(&[], &start_call(&format!("fill-{i}"), 5)).await;
        if a.router_error().is_some() {
            assert_eq!(a.router_error(), Some("pin_capacity"), "{a:?}");
            answers.push(("pin_capacity".into(), a));
        }
    }
    let mut bad = token.clone().into_bytes();
    let at = bad.len() / 2;
    bad[at] = if bad[at] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bad).unwrap();
    let a = fleet.post(&[("mcp-routing-id", &bad)], &call(6)).await;
    assert_eq!(a.router_error(), Some("invalid_routing_token"), "{a:?}");
    answers.push(("invalid_routing_token".into(), a));
    let url = fleet.url();
    let a = send(&fleet.client, Method::POST, &url, &[], Bytes::from_static(b"{not json")).await;
    answers.push(("parse_error".into(), a));
    let big = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"pad": "x".repeat(2000)}});
    answers.push(("body_too_large".into(), fleet.post(&[], &big).await));
    let mismatch = json!({"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"taskId": "t-1"}});
    answers.push((
        "header_mismatch".into(),
        fleet.post(&[("mcp-name", "other")], &mismatch).await,
    ));
    answers.push((
        "method_not_allowed".into(),
        send(&fleet.client, Method::TRACE, &url, &[], Bytes::new()).await,
    ));

    let at = fleet.workers.iter().position(|w| w.state.name == holder).unwrap();
    fleet.workers.remove(at).stop().await;
    eventually(Duration::from_secs(5), "the holder is ejected", || {
        !fleet.control.backend(&holder).unwrap().healthy
    })
    .await;
    let a = fleet.post(&[("mcp-routing-id", &token2)], &confirm("lost-1", 2)).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (503, Some("pinned_backend_unavailable")),
        "{a:?}"
    );
    answers.push(("pinned_backend_unavailable".into(), a));
    let other = fleet.workers[0].state.name.clone();
    fleet.workers.remove(0).stop().await;
    eventually(Duration::from_secs(5), "the last instance is ejected", || {
        !fleet.control.backend(&other).unwrap().healthy
    })
    .await;
    // (A request that cannot start a call: the full pin table refuses those first.)
    let a = fleet
        .post(&[], &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}))
        .await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (503, Some("no_backend")),
        "{a:?}"
    );
    answers.push(("no_backend".into(), a));

    let reasons: Vec<&str> = answers.iter().map(|(r, _)| r.as_str()).collect();
    for want in [
        "pin_capacity",
        "parse_error",
        "body_too_large",
        "header_mismatch",
        "method_not_allowed",
    ] {
        assert!(reasons.contains(&want), "{want} was triggered: {reasons:?}");
    }
    for (what, a) in &answers {
        assert_eq!(a.router_error(), Some(what.as_str()), "{a:?}");
        names_no_backend(a, &all, what);
    }
}

#[tokio::test]
async fn errors_name_the_backend_when_the_operator_asks() {
    let gone = down("golf-named-83");
    let extra = "[server]\nerrors_name_backends = true\n";
    let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&gone), extra).await;
    let a = fleet.post(&[], &call(1)).await;
    assert_eq!(a.router_error(), Some("upstream_unavailable"), "{a:?}");
    let message = a.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("golf-named-83"), "{message}");
    // Errors about no backend in particular say nothing more.
    let url = fleet.url();
    let a = send(&fleet.client, Method::POST, &url, &[], Bytes::from_static(b"{")).await;
    assert_eq!(a.json()["error"]["message"], "request body is not valid JSON");
}
