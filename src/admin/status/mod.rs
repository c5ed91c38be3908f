//! The status page's data: `GET /api/status` (one JSON document) and `GET /api/events` (the same
//! document as server-sent events, one per history sample), and who sees which part of it
//! (docs/src/observability.md, "The status page").
//!
//! Every number is the metrics' own: read from the Prometheus collectors `/metrics` renders
//! (after the same refresh of the gauges it makes), or, where no metric holds it, from the state
//! `/backends` shows. The history (sparklines) comes from [`History`], sampled off the request
//! path.
//!
//! Who sees what: the document is a read (`/backends`'s rule: anyone, or the token with
//! `admin.protect_reads`); its sensitive members (`config`, `quotas.top_refused`, and the tools
//! catalog once there is one) follow the rule of changes: the token when `admin.token` is set,
//! else a loopback admin listener only. Elsewhere they are `null` and `access.redacted` names them.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures_util::Stream;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{Either, StreamBody};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::sync::watch;

mod document;

pub use document::build;

use super::history::{self, History};
use super::{refuse, reply, ui, AdminBody, Need};
use crate::state::{Shared, Snapshot};
use crate::upstream::{unix_ms, BackendKey};

/// Refused callers listed at most.
pub const TOP_REFUSED: usize = 10;
/// How long one `/api/events` stream lasts before the page opens the next (which starts with
/// the whole history again): a viewer whose access a reload took away keeps none for long.
pub const EVENTS_LIFETIME: std::time::Duration = std::time::Duration::from_secs(600);
/// The members only a request passing the rule of changes sees.
pub const SENSITIVE: [&str; 3] = ["config", "quotas.top_refused", "catalog"];

/// The status page's state beside the router's: when it started, the history, the ring shares
/// of the current snapshot (computed once per snapshot).
pub struct Status {
    started: Instant,
    started_ms: u64,
    pub(crate) history: History,
    /// The number of the newest sample, for the event streams to wait on.
    samples: watch::Sender<u64>,
    shares: Mutex<Option<(Weak<Snapshot>, Shares)>>,
}

/// Each ring member's share of new keys.
type Shares = Arc<Vec<(BackendKey, f64)>>;

/// What one reader may see, and from which sample on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// The sensitive members, and the drain controls: the rule of changes passes.
    pub sensitive: bool,
    /// The samples after this one (the whole ring when `None`).
    pub since: Option<u64>,
}

impl Status {
    pub fn new() -> Arc<Status> {
        Arc::new(Status {
            started: Instant::now(),
            started_ms: unix_ms(SystemTime::now()),
            history: History::new(),
            samples: watch::Sender::new(0),
            shares: Mutex::new(None),
        })
    }

    /// Takes one sample of the metrics into the history, and wakes the event streams.
    pub fn sample(&self, shared: &Shared) {
        let names: Vec<Arc<str>> = shared.backend_states().iter().map(|(b, _)| b.name.clone()).collect();
        let totals = history::totals(&shared.metrics, &names);
        let taken = self.history.record(&totals, unix_ms(SystemTime::now()));
        self.samples.send_replace(taken);
    }

    /// Each ring member's share of new keys in `snap` (computed once per snapshot).
    fn shares(&self, snap: &Arc<Snapshot>) -> Shares {
        let mut cached = self.shares.lock();
        if let Some((of, shares)) = cached.as_ref() {
            // The Weak keeps the old snapshot's allocation, so its address is never reused
            // while it is compared.
            if std::ptr::eq(of.as_ptr(), Arc::as_ptr(snap)) {
                return shares.clone();
            }
        }
        let shares = Arc::new(snap.ring.shares());
        *cached = Some((Arc::downgrade(snap), shares.clone()));
        shares
    }
}

/// Takes a sample every [`history::INTERVAL`] until aborted, and tells the event streams.
pub async fn sample(shared: Arc<Shared>, status: Arc<Status>) {
    let mut tick = tokio::time::interval(history::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        status.sample(&shared);
    }
}

/// The status page's paths: `Some` answer for `/`, `/ui/*` and `/api/*`, `None` for the rest.
pub async fn route(
    shared: &Arc<Shared>,
    status: &Arc<Status>,
    req: &Request<Incoming>,
    loopback: bool,
) -> Option<Response<AdminBody>> {
    let path = req.uri().path();
    let page = path == "/" || path.starts_with("/ui/");
    if !page && !path.starts_with("/api/") {
        return None;
    }
    let mut answer = answer(shared, status, req, loopback, page);
    ui::secure(answer.headers_mut());
    Some(answer)
}

fn answer(
    shared: &Arc<Shared>,
    status: &Arc<Status>,
    req: &Request<Incoming>,
    loopback: bool,
    page: bool,
) -> Response<AdminBody> {
    let path = req.uri().path();
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "use GET\n");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp.map(Either::Left);
    }
    if page {
        // The page and its assets hold no data: anyone may load them (a browser cannot send
        // a bearer token on navigation, so the page must load to ask for it).
        return ui::asset(path).map(Either::Left);
    }
    if let Some(refused) = refuse(shared, req.headers(), Need::Read, loopback) {
        return refused.map(Either::Left);
    }
    let view = View {
        sensitive: refuse(shared, req.headers(), Need::Change, loopback).is_none(),
        since: since(req.uri().query()),
    };
    let mut resp = match path {
        "/api/status" => {
            let doc = build(shared, status, view);
            reply(StatusCode::OK, "application/json", format!("{doc}\n")).map(Either::Left)
        }
        "/api/events" => {
            let auth = req.headers().get(header::AUTHORIZATION).cloned();
            let mut resp = Response::new(Either::Right(events(shared, status, auth, loopback, view)));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            resp
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: /api/status, /api/events\n",
        )
        .map(Either::Left),
    };
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `since=N` of a query: the samples after the N-th.
fn since(query: Option<&str>) -> Option<u64> {
    query?.split('&').find_map(|kv| kv.strip_prefix("since="))?.parse().ok()
}

/// The body of `/api/events`: the status document once at once, then again after every sample
/// with only the new samples' history (and without `config` while it is the one already sent),
/// until [`EVENTS_LIFETIME`] passes, a shutdown begins, or
/// the reader's access is taken away (a reload changed the token).
pub type Events = StreamBody<Pin<Box<dyn Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>>;

struct Reader {
    shared: Arc<Shared>,
    status: Arc<Status>,
    samples: watch::Receiver<u64>,
    headers: HeaderMap,
    loopback: bool,
    since: Option<u64>,
    first: bool,
    until: tokio::time::Instant,
    /// The digest of the config text last sent: an event leaves out a config already sent.
    config_sent: Option<u64>,
}

fn events(shared: &Arc<Shared>, status: &Arc<Status>, auth: Option<HeaderValue>, loopback: bool, view: View) -> Events {
    let mut headers = HeaderMap::new();
    if let Some(a) = auth {
        headers.insert(header::AUTHORIZATION, a);
    }
    let reader = Reader {
        shared: shared.clone(),
        status: status.clone(),
        samples: status.samples.subscribe(),
        headers,
        loopback,
        since: view.since,
        first: true,
        until: tokio::time::Instant::now() + EVENTS_LIFETIME,
        config_sent: None,
    };
    let stream = futures_util::stream::unfold(reader, |mut r| async move {
        // The next sample; a sampler that stopped (a shutdown ends it) ends the stream within
        // two intervals.
        while !r.first {
            let wait = (tokio::time::Instant::now() + 2 * history::INTERVAL).min(r.until);
            match tokio::time::timeout_at(wait, r.samples.changed()).await {
                Ok(Ok(())) => break,
                Ok(Err(_)) => return None,
                Err(_) if wait == r.until || r.shared.shutting_down.load(Ordering::SeqCst) => return None,
                Err(_) => continue,
            }
        }
        if r.shared.shutting_down.load(Ordering::SeqCst)
            || refuse(&r.shared, &r.headers, Need::Read, r.loopback).is_some()
        {
            return None;
        }
        let view = View {
            sensitive: refuse(&r.shared, &r.headers, Need::Change, r.loopback).is_none(),
            since: r.since,
        };
        let mut doc = build(&r.shared, &r.status, view);
        let to = doc["history"]["to"].as_u64().unwrap_or(0);
        let config = doc["config"].as_str().map(digest);
        if config.is_some() && config == r.config_sent {
            doc.as_object_mut().map(|d| d.remove("config"));
        }
        r.config_sent = config;
        let retry = if r.first { "retry: 2000\n" } else { "" };
        r.first = false;
        r.since = Some(to);
        let event = format!("{retry}id: {to}\nevent: status\ndata: {doc}\n\n");
        Some((Ok(Frame::data(Bytes::from(event))), r))
    });
    StreamBody::new(Box::pin(stream))
}

fn digest(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use serde_json::{json, Value};

    fn shared(extra: &str, backends: usize) -> Arc<Shared> {
        let mut text = String::from(extra);
        for i in 0..backends {
            text.push_str(&format!(
                "[[backend]]\nname = \"b-{i}\"\nurl = \"http://127.0.0.1:{}\"\n",
                10_000 + i
            ));
        }
        Shared::new(Config::parse(std::path::Path::new("t.toml"), &text).unwrap(), None)
    }

    const OPEN: View = View {
        sensitive: true,
        since: None,
    };

    #[test]
    fn the_document_has_every_member_the_book_lists() {
        let s = shared("[quotas]\nrate = \"10/s\"\n", 2);
        let status = Status::new();
        status.sample(&s);
        let doc = build(&s, &status, OPEN);
        for key in [
            "version",
            "commit",
            "generated_at_ms",
            "started_at_ms",
            "uptime_seconds",
            "access",
            "history",
            "router",
            "backends",
            "quotas",
            "auth",
            "config",
        ] {
            assert!(doc.get(key).is_some(), "{key} missing: {doc:#}");
        }
        assert_eq!(doc["version"], env!("CARGO_PKG_VERSION"));
        for key in [
            "connections",
            "connections_parked",
            "requests_per_second",
            "errors_per_second",
            "errors",
            "route_decisions",
            "ring_members",
            "pins",
            "pins_lost",
            "rounds_per_call",
            "body_buffer",
            "config_reloads",
            "history",
        ] {
            assert!(doc["router"].get(key).is_some(), "router.{key} missing: {doc:#}");
        }
        assert_eq!(
            doc["router"]["errors"].as_object().unwrap().len(),
            crate::error::RouterError::REASONS.len()
        );
        assert_eq!(doc["router"]["connections"]["http1"], 0);
        let b = &doc["backends"][0];
        for key in [
            "name",
            "url",
            "weight",
            "up",
            "health",
            "incarnation",
            "draining",
            "removed",
            "on_ring",
            "ring_share",
            "inflight",
            "connections",
            "pins",
            "requests_total",
            "errors_total",
            "history",
        ] {
            assert!(b.get(key).is_some(), "backends[].{key} missing: {b:#}");
        }
        assert_eq!(b["name"], "b-0");
        assert_eq!(b["up"], true);
        assert_eq!(b["pins"]["total"], 0);
        assert!((b["ring_share"].as_f64().unwrap() - 0.5).abs() < 0.2, "{b}");
        assert_eq!(b["history"]["requests"].as_array().unwrap().len(), 1);
        assert!(doc["config"].as_str().unwrap().contains("[quotas]"));
        assert_eq!(doc["quotas"]["top_refused"], json!([]));
        assert_eq!(doc["auth"], Value::Null, "no [auth]");
        assert_eq!(doc["access"]["redacted"], json!([]));
    }

    #[test]
    fn sensitive_members_are_null_for_a_reader_without_the_rule_of_changes() {
        let s = shared(
            "[quotas]\nrate = \"10/s\"\n[admin]\ntoken = \"0123456789abcdef0123\"\n",
            1,
        );
        let status = Status::new();
        let view = View {
            sensitive: false,
            since: None,
        };
        let doc = build(&s, &status, view);
        assert_eq!(doc["config"], Value::Null);
        assert_eq!(doc["quotas"]["top_refused"], Value::Null);
        assert_eq!(doc["access"]["sensitive"], false);
        assert_eq!(doc["access"]["redacted"], json!(SENSITIVE));
        assert!(doc["access"]["why"].as_str().unwrap().contains("admin token"));
        // The token itself is never in the document, even for one who may see the config.
        let open = build(&s, &status, OPEN).to_string();
        assert!(!open.contains("0123456789abcdef0123"), "{open}");
        assert!(open.contains("<redacted>"));
    }

    #[test]
    fn the_numbers_are_the_metrics_own() {
        let s = shared("", 2);
        let status = Status::new();
        s.metrics.backend_inflight.with_label_values(&["b-1"]).set(3);
        s.metrics
            .backend_pins
            .with_label_values(&["b-1", "request_state"])
            .set(2);
        s.metrics
            .requests_total
            .with_label_values(&["b-1", "tools/call", "200"])
            .inc_by(5);
        s.metrics
            .requests_total
            .with_label_values(&["b-1", "tools/call", "502"])
            .inc();
        s.metrics.upstream_errors.with_label_values(&["b-1", "connect"]).inc();
        s.metrics.router_errors.with_label_values(&["no_backend"]).inc_by(4);
        let doc = build(&s, &status, OPEN);
        let b1 = doc["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "b-1")
            .unwrap();
        assert_eq!(b1["inflight"], 3);
        assert_eq!(b1["pins"]["request_state"], 2);
        assert_eq!(b1["pins"]["total"], 2);
        assert_eq!(
            (b1["requests_total"].as_u64(), b1["errors_total"].as_u64()),
            (Some(7), Some(2))
        );
        assert_eq!(doc["router"]["errors"]["no_backend"], 4);
        let rendered = s.metrics.render();
        assert!(rendered.contains("mrtr_backend_pins{backend=\"b-1\",kind=\"request_state\"} 2"));
    }

    #[test]
    fn events_since_a_sample_carry_only_the_newer_samples() {
        let s = shared("", 1);
        let status = Status::new();
        for _ in 0..5 {
            status.sample(&s);
        }
        let view = View {
            sensitive: true,
            since: Some(3),
        };
        let doc = build(&s, &status, view);
        assert_eq!(
            (doc["history"]["from"].as_u64(), doc["history"]["to"].as_u64()),
            (Some(3), Some(5))
        );
        assert_eq!(doc["router"]["history"]["requests"].as_array().unwrap().len(), 2);
        assert_eq!(doc["backends"][0]["history"]["errors"].as_array().unwrap().len(), 2);
        assert_eq!(since(Some("a=1&since=42")), Some(42));
        assert_eq!(since(Some("since=x")), None);
    }

    /// The cost of one update with 100 backends, as docs/src/observability.md states it (run
    /// with `--nocapture` to see the figures; the bound only catches a cost gone wild).
    #[test]
    fn update_cost_with_100_backends() {
        let s = shared("", 100);
        let status = Status::new();
        for (b, _) in s.backend_states() {
            s.metrics
                .requests_total
                .with_label_values(&[&b.name, "tools/call", "200"])
                .inc();
            s.metrics
                .requests_total
                .with_label_values(&[&b.name, "confirm", "200"])
                .inc();
        }
        for _ in 0..history::SAMPLES {
            status.sample(&s);
        }
        let rounds = 20;
        let t = Instant::now();
        for _ in 0..rounds {
            status.sample(&s);
        }
        let sample = t.elapsed() / rounds;
        let t = Instant::now();
        let mut full = 0;
        for _ in 0..rounds {
            full = build(&s, &status, OPEN).to_string().len();
        }
        let whole = t.elapsed() / rounds;
        let since = View {
            sensitive: true,
            since: Some(status.history.taken() - 1),
        };
        // As an event after the first: the new sample only, the config (unchanged) left out.
        let t = Instant::now();
        let mut update = 0;
        for _ in 0..rounds {
            let mut doc = build(&s, &status, since);
            doc.as_object_mut().map(|d| d.remove("config"));
            update = doc.to_string().len();
        }
        let one = t.elapsed() / rounds;
        println!(
            "100 backends: sample {sample:?}; whole document {whole:?} ({full} bytes); update {one:?} ({update} bytes); ring {} bytes",
            history::memory(100)
        );
        assert!(one < std::time::Duration::from_millis(250), "{one:?}");
    }
}
