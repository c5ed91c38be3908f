//! `[quotas]` in tests (docs/src/quotas.md): what a quota's refusal must carry, an SSE answer
//! held open, and latency percentiles.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::Value;

use super::{read_until, Answer, HttpClient, REQUEST_DEADLINE};

/// Each quota's `Mcp-Router-Error`, JSON-RPC code and `quota` label (docs/src/errors.md).
pub const REFUSALS: [(&str, i64, &str); 3] = [
    ("rate_limited", -32015, "rate"),
    ("too_many_in_flight", -32016, "in_flight"),
    ("too_many_open_calls", -32017, "open_calls"),
];

/// Asserts that `a` is a quota's refusal as docs/src/quotas.md writes it, answering the
/// request whose JSON-RPC id was `id`, and returns its reason: 429 (never 401 or 403), a
/// JSON-RPC error with the quota's code echoing the id, `data` naming the quota, its scope and
/// the retry time, `Retry-After` the same, and the `RateLimit-Policy` / `RateLimit` pair on a
/// rate's refusal only.
pub fn assert_quota_refusal(a: &Answer, id: &Value) -> &'static str {
    assert_eq!(a.status, 429, "{a:?}");
    let reason = a.router_error().unwrap_or_else(|| panic!("no Mcp-Router-Error: {a:?}"));
    let &(reason, code, quota) = REFUSALS
        .iter()
        .find(|r| r.0 == reason)
        .unwrap_or_else(|| panic!("{reason:?} is not a quota's reason: {a:?}"));
    assert_eq!(a.headers["content-type"], "application/json");
    let body = a.json();
    assert_eq!(body["id"], *id, "{body}");
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(body["error"]["code"], code, "{body}");
    let data = &body["error"]["data"];
    assert_eq!(
        (&data["reason"], &data["quota"]),
        (&reason.into(), &quota.into()),
        "{body}"
    );
    let scope = data["scope"].as_str().unwrap_or_default();
    assert!(["caller", "tool", "overflow"].contains(&scope), "{body}");
    let retry: u64 = a
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After in whole seconds: {a:?}"));
    assert!(retry >= 1, "{a:?}");
    assert_eq!(data["retry_after"], retry, "{body}");
    let header = |name| a.headers.get(name).map(|v| v.to_str().unwrap().to_string());
    match (header("ratelimit-policy"), header("ratelimit")) {
        (Some(policy), Some(state)) => {
            assert_eq!(reason, "rate_limited", "RateLimit headers on a {reason}: {a:?}");
            // The policy is the tool's for a tool's rate, else the caller's.
            let name = if scope == "tool" { "tool" } else { "caller" };
            assert!(
                policy.starts_with(&format!("\"{name}\";q=")) && policy.contains(";w="),
                "{policy}"
            );
            assert!(state.starts_with(&format!("\"{name}\";r=0;t=")), "{state}");
        }
        (None, None) => assert_ne!(reason, "rate_limited", "a rate's refusal without RateLimit: {a:?}"),
        other => panic!("one RateLimit header without the other: {other:?}"),
    }
    reason
}

/// POSTs `body` asking for SSE and returns the answer's head, its body still to read.
pub async fn open_sse(
    client: &HttpClient,
    url: &str,
    headers: &[(String, String)],
    body: &Value,
) -> http::Response<Incoming> {
    let mut req = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    tokio::time::timeout(REQUEST_DEADLINE, client.request(req))
        .await
        .expect("an answer's head in time")
        .expect("the router answers")
}

/// A gated `stream` answer of the example worker, read up to its `: ping` (the worker now
/// holds it until released): the body, and the worker that holds it.
pub async fn held_sse(client: &HttpClient, url: &str, headers: &[(String, String)], id: u64) -> (Incoming, String) {
    let mut body = super::stream_call(None, serde_json::json!({"events": 2, "gated": true}));
    body["id"] = id.into();
    let resp = open_sse(client, url, headers, &body).await;
    assert_eq!(resp.status(), 200, "{:?}", resp.headers());
    let worker = resp.headers()["x-worker"].to_str().unwrap().to_string();
    let mut body = resp.into_body();
    read_until(&mut body, ": ping").await;
    (body, worker)
}

/// The `q` quantile (0..=1) of `samples`, nearest rank.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// What an unfinished body's stream was answered: status, `Mcp-Router-Error`, `Retry-After`
/// and the JSON-RPC error code.
type BodyAnswer = (u16, Option<String>, Option<String>, Option<i64>);

/// POST bodies that never finish: HTTP/2 streams that each declare a 1 MiB body, send `part`
/// bytes of it and stop, on connections of their own (a caller taking the body budget).
pub struct UnfinishedBodies {
    part: usize,
    streams: usize,
    answers: Vec<tokio::task::JoinHandle<Option<BodyAnswer>>>,
    sending: Vec<h2::SendStream<Bytes>>,
    clients: Vec<h2::client::SendRequest<Bytes>>,
    conns: Vec<tokio::task::JoinHandle<Result<(), h2::Error>>>,
}

impl UnfinishedBodies {
    /// `connections` × `streams` unfinished bodies to `fleet`, each request with `headers`.
    pub async fn open(
        fleet: &super::Fleet,
        headers: &[(&str, &str)],
        connections: usize,
        streams: usize,
        part: usize,
    ) -> UnfinishedBodies {
        let mut bodies = UnfinishedBodies {
            part,
            streams: connections * streams,
            answers: Vec::new(),
            sending: Vec::new(),
            clients: Vec::new(),
            conns: Vec::new(),
        };
        let part = Bytes::from(vec![b' '; part]);
        for _ in 0..connections {
            let tcp = tokio::net::TcpStream::connect(fleet.router).await.unwrap();
            let (client, conn) = h2::client::handshake(tcp).await.unwrap();
            bodies.conns.push(tokio::spawn(conn));
            for _ in 0..streams {
                let mut ready = client.clone().ready().await.unwrap();
                let mut req = Request::post(fleet.url())
                    .header("content-type", "application/json")
                    .header("content-length", 1 << 20);
                for (k, v) in headers {
                    req = req.header(*k, *v);
                }
                let (answer, mut body) = ready.send_request(req.body(()).unwrap(), false).unwrap();
                body.send_data(part.clone(), false).unwrap();
                bodies.sending.push(body);
                bodies.answers.push(tokio::spawn(async move {
                    let resp = answer.await.ok()?;
                    let status = resp.status().as_u16();
                    let header = |n: &str| resp.headers().get(n).map(|v| v.to_str().unwrap().to_string());
                    let reason = header("mcp-router-error");
                    let retry = header("retry-after");
                    let mut body = resp.into_body();
                    let mut text = Vec::new();
                    while let Some(Ok(chunk)) = body.data().await {
                        text.extend_from_slice(&chunk);
                    }
                    let code = serde_json::from_slice::<Value>(&text).ok()?["error"]["code"].as_i64();
                    Some((status, reason, retry, code))
                }));
            }
            bodies.clients.push(client);
        }
        bodies
    }

    /// Waits until every stream is either held whole (its part read and buffered) or refused,
    /// sampling the router's `mrtr_body_buffer_bytes` all along (of which `others` bytes are
    /// held by other bodies): the bytes these hold then, and the most held at any sample.
    pub async fn settle(&self, fleet: &super::Fleet, others: usize) -> (usize, usize) {
        let mut peak = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let refused = self.answers.iter().filter(|a| a.is_finished()).count();
            let all = super::metric(&fleet.metrics().await, "mrtr_body_buffer_bytes").unwrap_or(0.0) as usize;
            let held = all.saturating_sub(others);
            peak = peak.max(held);
            if held.is_multiple_of(self.part) && refused + held / self.part == self.streams {
                return (held, peak);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never settled: {held} bytes held, {refused} streams answered"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asserts that every stream answered so far was refused as a body share's refusal is
    /// (503 `router_overloaded`, `Retry-After: 1`, -32005), and returns how many were.
    pub async fn refused(&mut self) -> usize {
        let mut refused = 0;
        for answer in self.answers.iter_mut().filter(|a| a.is_finished()) {
            let (status, reason, retry, code) = answer.await.unwrap().expect("an answer, not a reset");
            assert_eq!(
                (status, reason.as_deref(), retry.as_deref(), code),
                (503, Some("router_overloaded"), Some("1"), Some(-32005))
            );
            refused += 1;
        }
        refused
    }

    /// Closes every connection and waits until the router holds no body bytes but the `others`
    /// that other bodies hold.
    pub async fn close(self, fleet: &super::Fleet, others: usize) {
        drop((self.sending, self.clients));
        for conn in &self.conns {
            conn.abort();
        }
        let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
        while super::metric(&fleet.metrics().await, "mrtr_body_buffer_bytes") != Some(others as f64) {
            assert!(std::time::Instant::now() < deadline, "the share was never given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
