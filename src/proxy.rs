//! The request path, in phases: read the request → find its keys → choose the backend →
//! forward → observe the answer (pin or finish the call) → stream it back.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::{Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use memchr::memmem;
use tokio::time::Sleep;

use crate::body::{ErrorHook, MessageSink, ProxyBody, MAX_OBSERVED_EVENT};
use crate::dialect::{self, Outcome, RequestEnvelope, SESSION_HEADER};
use crate::error::RouterError;
use crate::pins::{PinKey, PinKind};
use crate::pool::{DrivenBody, PooledConn, SendError};
use crate::route::{self, Decision, Matched, RequestKeys};
use crate::sealing::{self, Replacement};
use crate::state::{Shared, Snapshot};
use crate::upstream::{Backend, InflightGuard, UpstreamBody};

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1; `Upgrade` is not proxied).
const HOP_BY_HOP_COUNT: usize = 9;
static HOP_BY_HOP: [HeaderName; HOP_BY_HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Serves one request from the client at `peer` (its IP as a header value, made once per
/// connection). Never fails: every problem becomes a DESIGN §6 answer.
pub async fn handle(shared: Arc<Shared>, req: Request<Incoming>, peer: HeaderValue, tls: bool) -> Response<ProxyBody> {
    let snap = shared.snapshot();
    let started = Instant::now();
    let (mut parts, body) = req.into_parts();

    // Phase 1: read the body of a POST (bounded in size and time) to find its keys.
    let (bytes, stream) = if parts.method == Method::POST {
        match read_body(body, &snap).await {
            Ok(bytes) => (bytes, None),
            Err(e) => return router_error(&shared, e, None),
        }
    } else {
        (Bytes::new(), Some(body))
    };
    let envelope = if stream.is_none() {
        match dialect::parse_request(&bytes, &snap.config.routing.body_field) {
            Ok(env) => env,
            Err(_) => return router_error(&shared, RouterError::Parse, None),
        }
    } else {
        RequestEnvelope::default()
    };
    // The id borrows only the body, so it outlives `keys` (which also borrow the headers, moved
    // into the upstream request) without a copy.
    let error_id = envelope.id;
    let keys = RequestKeys::new(&parts.headers, &snap.config.routing.header, envelope);

    // Phase 2: choose the backend: sealed tokens first, then pins, then the ring.
    let unsealed = match snap.sealing.as_ref().map(|s| s.unseal(&keys, SystemTime::now())) {
        Some(Ok(u)) => u,
        Some(Err(rejected)) => {
            return router_error(
                &shared,
                RouterError::InvalidToken {
                    reason: rejected.reason(),
                },
                keys.id,
            )
        }
        None => None,
    };
    let decision = match route::decide(&snap, &shared.pins, &keys, unsealed.as_ref(), true) {
        Ok(d) => d,
        Err(e) => {
            if matches!(e, RouterError::PinnedBackendUnavailable { .. }) {
                shared.metrics.pins_lost.inc();
            }
            return router_error(&shared, e, keys.id);
        }
    };
    shared.metrics.decisions_by_source[decision.source as usize].inc();
    if decision.pin_lost {
        shared.metrics.pins_lost.inc();
    }

    // Phase 3: forward. One timer bounds the whole exchange, up to a JSON answer's last byte.
    let deadline = tokio::time::Instant::now() + snap.config.server.upstream_timeout;
    let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
    let upstream = Upstream {
        shared: &shared,
        snap: &snap,
    };
    let (conn, backend, guard) = match upstream.connect(&decision, keys.client_key(), timer.as_mut()).await {
        Ok(c) => c,
        Err(e) => return router_error(&shared, e, keys.id),
    };
    // The incarnation the request goes to: an ejection while it is in flight must void any
    // pin its answer makes.
    let sent_epoch = backend.epoch();
    let call = CallContext::new(&shared, &snap, &keys, &decision, (&backend, sent_epoch), &parts.method);
    let method_label = method_label(&parts.method, keys.method.as_deref());
    drop(keys);
    let body = match stream {
        Some(incoming) if incoming.is_end_stream() => Either::Left(Bytes::new()),
        Some(incoming) => Either::Right(incoming),
        // The backend gets back the state it issued, where the client's echo stands (found
        // by the same scan that read the wrapped state, so it is there).
        None => Either::Left(
            unsealed
                .as_ref()
                .and_then(|u| u.request_state.as_deref())
                .and_then(|original| {
                    let at = dialect::request_state_at(&bytes, &snap.config.routing.body_field)?;
                    Some(sealing::restore_request_state(&bytes, at, original))
                })
                .unwrap_or_else(|| bytes.clone()),
        ),
    };
    let session = unsealed.as_ref().and_then(|u| u.session_id.as_deref());
    let request = match build_upstream_request(&mut parts, body, &backend, &peer, tls, session) {
        Ok(r) => r,
        Err(_) => return router_error(&shared, RouterError::upstream_unavailable(&backend), error_id),
    };
    join_the_write_burst().await;
    let resp = match upstream.send(conn, &backend, request, timer.as_mut()).await {
        Ok(resp) => resp,
        Err(e) => return router_error(&shared, e, error_id),
    };

    // Phase 4: observe the answer; pins are in place before the client can read it.
    let status = resp.status();
    backend.observe_request(method_label, status, started.elapsed().as_secs_f64());
    let (mut resp_parts, resp_body) = resp.into_parts();
    let mut pinned = call.observe_head(status, &mut resp_parts.headers);
    strip_hop_by_hop(&mut resp_parts.headers);
    let content_type = resp_parts
        .headers
        .get(header::CONTENT_TYPE)
        .map_or(&b""[..], |v| v.as_bytes());
    let is_sse = starts_with_ignore_case(content_type, b"text/event-stream");
    let is_json = starts_with_ignore_case(content_type, b"application/json");
    let idle = snap.config.server.stream_idle_timeout;
    let body = if is_sse {
        // Pins made mid-stream cannot add headers any more: announce the token up front.
        pinned |= call.may_create_pin();
        if snap.sealing.is_some() {
            // Sealing changes the length of events.
            resp_parts.headers.remove(header::CONTENT_LENGTH);
        }
        let sink: MessageSink = Box::new(move |msg: &[u8]| {
            call.keep_session_alive();
            call.observe_message(msg).replacement
        });
        ProxyBody::stream(
            resp_body,
            None,
            Some(sink),
            idle,
            Some(guard),
            Some(upstream_error_hook(&shared, &backend)),
        )
    } else if is_json && call.observes_body() {
        match collect_json(resp_body, timer.as_mut()).await {
            Ok(Collected::Whole(bytes)) => {
                let seen = call.observe_message(&bytes);
                pinned |= seen.created;
                let bytes = match seen.replacement {
                    Some(r) => r.apply(&bytes).unwrap_or(bytes),
                    None => bytes,
                };
                set_content_length(&mut resp_parts.headers, bytes.len());
                ProxyBody::full(bytes)
            }
            Ok(Collected::Prefix(prefix, rest)) => ProxyBody::stream(
                rest,
                Some(prefix),
                None,
                idle,
                Some(guard),
                Some(upstream_error_hook(&shared, &backend)),
            ),
            Err(CollectError::Timeout) => {
                passive_failure(&shared, &snap, &backend, "timeout");
                let err = RouterError::UpstreamTimeout {
                    backend: backend.name.to_string(),
                };
                return router_error(&shared, err, error_id);
            }
            Err(CollectError::Upstream) => {
                passive_failure(&shared, &snap, &backend, "reset");
                return router_error(&shared, RouterError::upstream_unavailable(&backend), error_id);
            }
        }
    } else if resp_body.is_end_stream() {
        ProxyBody::empty()
    } else {
        ProxyBody::stream(
            resp_body,
            None,
            None,
            idle,
            Some(guard),
            Some(upstream_error_hook(&shared, &backend)),
        )
    };
    if let (true, Some(s)) = (pinned, &snap.sealing) {
        // Any replica routes a client that echoes this straight to this backend.
        if let Ok(v) = HeaderValue::from_str(&s.routing_token(&backend.name)) {
            resp_parts.headers.insert(snap.config.routing.header.clone(), v);
        }
    }
    join_the_write_burst().await;
    Response::from_parts(resp_parts, body)
}

/// Waits until every request that became ready in this turn of the event loop has got this far,
/// so that writes leave in bursts: a backend or client that had gone idle is then woken once per
/// burst, not once per request. Waking an idle peer costs the writer a cross-CPU interrupt, and
/// the peer a sleep and a wake-up; without this, nginx behind the router slept ~440 times per
/// 1000 requests (~80 behind HAProxy, which batches its sends the same way) and the router
/// spent ~5 µs per request in those wake-ups (BENCHMARKS.md, be-sleep in `bench/README.md`). The cost is one more poll of
/// the request's task.
async fn join_the_write_burst() {
    // Deferred, not rewoken at once: the scheduler runs every other ready task and polls the
    // I/O driver before it resumes the deferred ones.
    tokio::task::yield_now().await;
}

/// What forwarding one request needs.
struct Upstream<'a> {
    shared: &'a Arc<Shared>,
    snap: &'a Snapshot,
}

impl Upstream<'_> {
    /// A connection to the chosen backend: an idle one from its pool, else a new one. A backend
    /// that refuses the connection never saw the request, so an unpinned request moves once to
    /// the next candidate on the ring; pinned follow-ups never move, nor do requests whose token
    /// names the backend (this replica may hold no pin for a call another one started). The
    /// request counts as in flight from here on (bounded load reads that count).
    async fn connect(
        &self,
        decision: &Decision,
        fallback_key: Option<&str>,
        mut timer: Pin<&mut Sleep>,
    ) -> Result<(PooledConn, Arc<Backend>, InflightGuard), RouterError> {
        let (shared, snap) = (self.shared, self.snap);
        let unpinned = decision.pin_lost || (decision.matched.is_none() && decision.source != route::Source::Token);
        let mut backend = decision.backend.clone();
        let mut retried = false;
        loop {
            let guard = backend.start_request();
            if let Some(conn) = backend.pool.checkout() {
                return Ok((conn, backend, guard));
            }
            // Boxed: a cold path, kept out of every request's future.
            let connected = {
                let mut connect = Box::pin(backend.pool.connect(backend.authority()));
                within(timer.as_mut(), connect.as_mut()).await
            };
            let Some(result) = connected else {
                passive_failure(shared, snap, &backend, "timeout");
                return Err(RouterError::UpstreamTimeout {
                    backend: backend.name.to_string(),
                });
            };
            let e = match result {
                Ok(conn) => return Ok((conn, backend, guard)),
                Err(e) => e,
            };
            tracing::debug!(backend = %backend.name, error = %e, "upstream connect failed");
            passive_failure(shared, snap, &backend, "connect");
            let next = (unpinned && !retried)
                .then(|| shared.snapshot().ring.fallback(fallback_key, backend.key).cloned())
                .flatten();
            let Some(next) = next else {
                return Err(RouterError::upstream_unavailable(&backend));
            };
            backend = next;
            retried = true;
        }
    }

    /// Sends the request and waits for its answer's head. A pooled connection that turns out
    /// closed before the request went out is replaced once by a new one.
    async fn send(
        &self,
        conn: PooledConn,
        backend: &Backend,
        request: Request<UpstreamBody>,
        mut timer: Pin<&mut Sleep>,
    ) -> Result<Response<DrivenBody>, RouterError> {
        let (shared, snap) = (self.shared, self.snap);
        let failed = |e: SendError| {
            tracing::debug!(backend = %backend.name, error = %e.error(), "upstream request failed");
            "reset"
        };
        // The first attempt's future is pinned here rather than in an inner `async` block: each
        // layer of futures moves the request in and the answer out (~260 and ~200 bytes).
        let reused = conn.reused;
        let first = within(timer.as_mut(), std::pin::pin!(conn.send(request))).await;
        let result = match first {
            Some(Err(SendError::Unsent(request, e))) if reused => {
                tracing::debug!(backend = %backend.name, error = %e, "pooled connection closed; opening a new one");
                shared
                    .metrics
                    .upstream_resends
                    .with_label_values(&[&backend.name])
                    .inc();
                // Boxed: a cold path, kept out of every request's future.
                let mut resend = Box::pin(async {
                    let conn = backend.pool.connect(backend.authority()).await.map_err(|_| "connect")?;
                    conn.send(*request).await.map_err(failed)
                });
                within(timer.as_mut(), resend.as_mut()).await
            }
            other => other.map(|sent| sent.map_err(failed)),
        };
        match result {
            Some(Ok(resp)) => {
                backend.record_request_success();
                Ok(resp)
            }
            Some(Err(kind)) => {
                passive_failure(shared, snap, backend, kind);
                Err(RouterError::upstream_unavailable(backend))
            }
            None => {
                passive_failure(shared, snap, backend, "timeout");
                Err(RouterError::UpstreamTimeout {
                    backend: backend.name.to_string(),
                })
            }
        }
    }
}

/// Runs `f` until `timer` fires (`None`). The timer is registered once, however often it is
/// used: one per request is enough. `f` comes pinned by the caller, so its state is stored once,
/// in the caller's future (an `async fn` taking it by value would hold it twice).
fn within<'a, F: Future + ?Sized>(
    mut timer: Pin<&'a mut Sleep>,
    mut f: Pin<&'a mut F>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(out) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
}

/// Answers a request with a router error, counted by reason.
fn router_error(shared: &Shared, e: RouterError, id: Option<&str>) -> Response<ProxyBody> {
    if let RouterError::InvalidToken { reason } = &e {
        shared.metrics.tokens_rejected.with_label_values(&[reason]).inc();
    }
    shared.metrics.router_errors.with_label_values(&[e.reason()]).inc();
    e.to_response(id, crate::config::defaults::RETRY_AFTER_SECS)
}

/// Counts a failed request against the backend's health; ejects it after `unhealthy_after`.
fn passive_failure(shared: &Shared, snap: &Snapshot, backend: &Backend, kind: &str) {
    shared
        .metrics
        .upstream_errors
        .with_label_values(&[&backend.name, kind])
        .inc();
    if backend.record_failure(snap.config.health.unhealthy_after).is_some() {
        tracing::warn!(backend = %backend.name, kind, "backend ejected after failed requests");
        shared.rebuild();
    }
}

fn upstream_error_hook(shared: &Arc<Shared>, backend: &Arc<Backend>) -> ErrorHook {
    let shared = shared.clone();
    let backend = backend.clone();
    Box::new(move |kind| {
        shared
            .metrics
            .upstream_errors
            .with_label_values(&[&backend.name, kind])
            .inc()
    })
}

/// The `method` label: the JSON-RPC method if it is a known MCP one (so clients cannot grow
/// the label set), else `other`; the HTTP method for requests without a body.
fn method_label(http: &Method, rpc: Option<&str>) -> &'static str {
    const KNOWN: [&str; 22] = [
        "initialize",
        "ping",
        "tools/call",
        "tools/list",
        "prompts/get",
        "prompts/list",
        "resources/read",
        "resources/list",
        "resources/templates/list",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "logging/setLevel",
        "tasks/get",
        "tasks/list",
        "tasks/result",
        "tasks/cancel",
        "tasks/update",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
        "confirm",
    ];
    match rpc {
        Some(m) => KNOWN.iter().find(|k| **k == m).copied().unwrap_or("other"),
        None if *http == Method::POST => "response",
        None if *http == Method::GET => "GET",
        None if *http == Method::DELETE => "DELETE",
        None => "other",
    }
}

/// Collects body frames; the common case, one frame, is kept without a copy.
#[derive(Default)]
struct BodyBuf {
    single: Option<Bytes>,
    buf: BytesMut,
}

impl BodyBuf {
    fn len(&self) -> usize {
        self.buf.len() + self.single.as_ref().map_or(0, |s| s.len())
    }

    fn push(&mut self, data: Bytes) {
        match self.single.take() {
            None if self.buf.is_empty() => self.single = Some(data),
            prev => {
                if let Some(p) = prev {
                    self.buf.extend_from_slice(&p);
                }
                self.buf.extend_from_slice(&data);
            }
        }
    }

    fn finish(self) -> Bytes {
        self.single.unwrap_or_else(|| self.buf.freeze())
    }
}

/// Reads a POST body whole: at most `max_body_bytes`, within `body_read_timeout`.
async fn read_body(mut body: Incoming, snap: &Snapshot) -> Result<Bytes, RouterError> {
    let result = read_limited(&mut body, snap).await;
    if let Err(RouterError::BodyTooLarge { .. }) = result {
        // A lingering close: read and drop what the client is still sending (bounded), so
        // that it reads the 413 instead of a connection reset.
        let drain = async {
            let mut seen = 0;
            while let Some(Ok(frame)) = body.frame().await {
                seen += frame.data_ref().map_or(0, |d| d.len());
                if seen > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    }
    result
}

/// How much of a refused body is read and dropped before the 413 goes out, and for how long.
const LINGER_BYTES: usize = 16 * 1024 * 1024;
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);

async fn read_limited(body: &mut Incoming, snap: &Snapshot) -> Result<Bytes, RouterError> {
    let limit = snap.config.server.max_body_bytes;
    // hyper has parsed `Content-Length` already: a declared length is the body's exact size.
    if body.size_hint().exact().is_some_and(|n| n > limit as u64) {
        return Err(RouterError::BodyTooLarge { limit });
    }
    let mut acc = BodyBuf::default();
    let push = |acc: &mut BodyBuf, frame: Result<http_body::Frame<Bytes>, hyper::Error>| {
        let Ok(data) = frame.map_err(|_| RouterError::Parse)?.into_data() else {
            return Ok(());
        };
        if acc.len() + data.len() > limit {
            return Err(RouterError::BodyTooLarge { limit });
        }
        acc.push(data);
        Ok(())
    };
    // Usually the whole body came with the headers: take what is there without arming a timer.
    loop {
        match body.frame().now_or_never() {
            Some(Some(frame)) => push(&mut acc, frame)?,
            Some(None) => return Ok(acc.finish()),
            None => break,
        }
    }
    let rest = async {
        while let Some(frame) = body.frame().await {
            push(&mut acc, frame)?;
        }
        Ok(())
    };
    match tokio::time::timeout(snap.config.server.body_read_timeout, rest).await {
        Ok(r) => r.map(|()| acc.finish()),
        Err(_) => Err(RouterError::BodyTimeout),
    }
}

enum Collected {
    Whole(Bytes),
    /// Too large to observe: what was read, and the rest still to stream.
    Prefix(Bytes, DrivenBody),
}

enum CollectError {
    Timeout,
    Upstream,
}

/// Reads a JSON answer whole (up to [`MAX_OBSERVED_EVENT`]) before the upstream deadline.
async fn collect_json(mut body: DrivenBody, timer: Pin<&mut Sleep>) -> Result<Collected, CollectError> {
    let read = async move {
        let mut acc = BodyBuf::default();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| CollectError::Upstream)?.into_data() else {
                continue;
            };
            acc.push(data);
            if acc.len() > MAX_OBSERVED_EVENT {
                return Ok(Collected::Prefix(acc.finish(), body));
            }
        }
        Ok(Collected::Whole(acc.finish()))
    };
    within(timer, std::pin::pin!(read)).await.ok_or(CollectError::Timeout)?
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // A look at the names first: most messages carry one hop-by-hop header or none, and each
    // removal hashes its name.
    let mut present = [false; HOP_BY_HOP_COUNT];
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name) {
            present[i] = true;
        }
    }
    if !present.contains(&true) {
        return;
    }
    // Headers named in `Connection` are hop-by-hop too. Usually it says only `keep-alive` or
    // `close`, which names none. One lookup takes `Connection` out with all its values.
    if std::mem::take(&mut present[0]) {
        if let header::Entry::Occupied(e) = headers.entry(header::CONNECTION) {
            // Collecting from the values as they are drained cost ~400 instructions even when
            // there was nothing to collect; the plain case is checked first.
            let named: Vec<HeaderName> = match e.iter().all(|v| is_plain_connection_value(v.as_bytes())) {
                true => Vec::new(),
                false => e.iter().flat_map(names_in_connection_value).collect(),
            };
            e.remove();
            for name in &named {
                headers.remove(name);
            }
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(name);
    }
}

/// Sets `Content-Length` to `len` unless it says so already: the usual case, a body passed on
/// unchanged, then costs one lookup instead of formatting and inserting a value.
fn set_content_length(headers: &mut HeaderMap, len: usize) {
    let mut current = headers.get_all(header::CONTENT_LENGTH).iter();
    let says_len = match (current.next(), current.next()) {
        (Some(v), None) => v.to_str().ok().and_then(|v| v.parse::<usize>().ok()) == Some(len),
        _ => false,
    };
    if !says_len {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
}

/// The header names a `Connection` value lists (besides `keep-alive` and `close`).
fn names_in_connection_value(v: &HeaderValue) -> Vec<HeaderName> {
    v.to_str()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|n| !is_plain_connection_value(n.as_bytes()))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect()
}

/// `keep-alive` and `close`: the `Connection` values that name no header.
fn is_plain_connection_value(v: &[u8]) -> bool {
    v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close")
}

/// Which of [`HOP_BY_HOP`] `name` is. Most names are rejected by their length alone.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    let name = name.as_str();
    match name.len() {
        2 | 7 | 10 | 16..=19 => HOP_BY_HOP.iter().position(|h| h.as_str() == name),
        _ => None,
    }
}

/// The request for `backend`: the client's headers (moved out of `parts`) less hop-by-hop
/// ones, plus `Host` and the `X-Forwarded-*` set.
fn build_upstream_request(
    parts: &mut http::request::Parts,
    body: Either<Bytes, Incoming>,
    backend: &Backend,
    peer: &HeaderValue,
    tls: bool,
    session_override: Option<&str>,
) -> Result<Request<UpstreamBody>, http::Error> {
    let target = backend.target_for(parts.uri.path_and_query())?;
    let mut headers = std::mem::take(&mut parts.headers);
    strip_hop_by_hop(&mut headers);
    if let Some(session) = session_override {
        headers.insert(SESSION_HEADER, HeaderValue::from_str(session)?);
    }
    let host = headers.insert(header::HOST, backend.host().clone()).or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host);
    }
    // One lookup: the entry both reads a client's list and replaces it.
    match headers.entry(X_FORWARDED_FOR) {
        header::Entry::Occupied(mut e) => {
            let joined = e.get().to_str().ok().and_then(|prev| {
                HeaderValue::from_str(&format!("{prev}, {}", peer.to_str().unwrap_or("unknown"))).ok()
            });
            e.insert(joined.unwrap_or_else(|| peer.clone()));
        }
        header::Entry::Vacant(e) => {
            e.insert(peer.clone());
        }
    }
    headers.insert(
        X_FORWARDED_PROTO,
        HeaderValue::from_static(if tls { "https" } else { "http" }),
    );
    let body = match body {
        Either::Left(bytes) => {
            if !bytes.is_empty() || parts.method == Method::POST {
                set_content_length(&mut headers, bytes.len());
            }
            Either::Left(Full::new(bytes))
        }
        Either::Right(incoming) => Either::Right(incoming),
    };
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = http::Uri::from(target);
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    Ok(req)
}

/// What the answer needs to know about the call its request belongs to. Owned by the
/// request (JSON answers) or moved into the SSE body's event sink.
struct CallContext {
    shared: Arc<Shared>,
    snap: Arc<Snapshot>,
    backend: crate::upstream::BackendKey,
    epoch: u32,
    /// Client keys the request carried (routing id, messageId).
    client_keys: [Option<PinKey>; 2],
    /// The pin that routed this request, if any.
    matched: Option<Matched>,
    session: Option<PinKey>,
    is_delete: bool,
    /// `tasks/cancel`: a successful answer ends the task.
    is_task_cancel: bool,
    /// Whether the body may carry an outcome (a POST of a JSON-RPC request).
    observes_body: bool,
    may_create_pin: bool,
    backend_name: Arc<str>,
    /// The session id exactly as the client sent it (maybe sealed), echoed back in answers.
    client_session: Option<HeaderValue>,
}

/// What observing one message did.
#[derive(Default)]
pub struct Observed {
    /// A new pin was made for this call.
    pub created: bool,
    /// A string in the message to seal for the client.
    pub replacement: Option<Replacement>,
}

impl CallContext {
    fn new(
        shared: &Arc<Shared>,
        snap: &Arc<Snapshot>,
        keys: &RequestKeys,
        decision: &Decision,
        (backend, epoch): (&Backend, u32),
        method: &Method,
    ) -> CallContext {
        let mut client_keys = [None, None];
        for (slot, key) in client_keys.iter_mut().zip(keys.client_pin_keys()) {
            *slot = Some(key);
        }
        CallContext {
            shared: shared.clone(),
            snap: snap.clone(),
            backend: backend.key,
            epoch,
            client_keys,
            matched: decision.matched.filter(|_| !decision.pin_lost),
            session: keys.session_id.map(|s| PinKey::new(PinKind::Session, s.as_bytes())),
            is_delete: *method == Method::DELETE,
            is_task_cancel: keys.method.as_deref() == Some("tasks/cancel"),
            observes_body: *method == Method::POST && keys.method.is_some() && keys.id.is_some(),
            may_create_pin: keys.may_create_pin(),
            backend_name: backend.name.clone(),
            client_session: keys.session_id.and_then(|s| HeaderValue::from_str(s).ok()),
        }
    }

    fn observes_body(&self) -> bool {
        self.observes_body
    }

    fn may_create_pin(&self) -> bool {
        self.may_create_pin
    }

    /// A stream in a session (the GET stream a client listens on for hours, or a long tool
    /// call) keeps the session's pin alive: each event, `: ping` comments included, counts as
    /// activity, so the pin never idles out under a client that is still listening. (An idle
    /// stream is closed after `stream_idle_timeout`, so a live one always has events.)
    fn keep_session_alive(&self) {
        if let Some(key) = self.session {
            self.shared.pins.lookup(key, &self.snap.ttls);
        }
    }

    /// Pins `key`; true when the pin is new.
    fn pin(&self, key: PinKey, kind: PinKind, rounds: u32) -> bool {
        let c = self;
        let created = c.shared.pins.pin(key, kind, c.backend, c.epoch, rounds, &c.snap.ttls);
        if created {
            c.shared.metrics.pins_created_by_kind[kind as usize].inc();
        }
        created
    }

    fn finish(&self, key: PinKey) -> Option<u32> {
        let c = self;
        let pin = c.shared.pins.finish(key, &c.snap.ttls)?;
        c.shared.metrics.pins_finished_by_kind[pin.kind as usize].inc();
        Some(pin.rounds)
    }

    /// Session pins come from response headers: in place before any body byte is sent.
    /// With sealing, the client gets the session id sealed (and its own sealed id echoed back).
    /// Returns true when a pin was made.
    fn observe_head(&self, status: StatusCode, headers: &mut HeaderMap) -> bool {
        let c = self;
        match c.session {
            // A backend issues a session only in a successful answer to a request without one
            // (the SDK attaches a fresh id even to its 4xx answers: those create nothing).
            None if status.is_success() => {
                let Some(id) = headers.get(SESSION_HEADER).filter(|v| !v.is_empty()).cloned() else {
                    return false;
                };
                let visible = match (&c.snap.sealing, id.to_str()) {
                    (Some(s), Ok(raw)) => HeaderValue::from_str(&s.wrap_session(raw, &c.backend_name)).unwrap_or(id),
                    _ => id,
                };
                let created = self.pin(PinKey::new(PinKind::Session, visible.as_bytes()), PinKind::Session, 0);
                headers.insert(SESSION_HEADER, visible);
                created
            }
            Some(session) => {
                // "Session not found", or the session was deleted: the session is over.
                if status == StatusCode::NOT_FOUND || (c.is_delete && status.is_success()) {
                    self.finish(session);
                }
                if let (Some(_), Some(sent), true) =
                    (&c.snap.sealing, &c.client_session, headers.contains_key(SESSION_HEADER))
                {
                    headers.insert(SESSION_HEADER, sent.clone());
                }
                false
            }
            None => false,
        }
    }

    /// Acts on one JSON-RPC message from the backend (a JSON body or one SSE event).
    fn observe_message(&self, msg: &[u8]) -> Observed {
        let c = self;
        let mut seen = Observed::default();
        // Cheap pre-check: only responses matter, and they carry "result" or "error".
        if !RESPONSE_MARKERS.iter().any(|m| m.find(msg).is_some()) {
            return seen;
        }
        let prior = c.matched.filter(|m| m.pin.kind != PinKind::Session);
        // Single-round traffic: no pin to finish, and an answer without these fields cannot
        // continue a call, so there is nothing to parse.
        if prior.is_none() && !CONTINUATION_MARKERS.iter().any(|m| m.find(msg).is_some()) {
            return seen;
        }
        let outcome = dialect::parse_outcome(msg);
        let rounds = prior.map_or(0, |m| m.pin.rounds) + 1;
        match outcome {
            Outcome::NotAResponse => {}
            Outcome::Pending => {
                for key in c.client_keys.iter().flatten() {
                    seen.created |= self.pin(*key, PinKind::Client, rounds);
                }
            }
            Outcome::InputRequired { request_state, at } => {
                // The client echoes the sealed state when sealing is on: pin what it will send.
                let wrapped = c
                    .snap
                    .sealing
                    .as_ref()
                    .map(|s| s.wrap_request_state(&request_state, &c.backend_name));
                let visible = wrapped.as_deref().unwrap_or(&request_state);
                seen.replacement = wrapped.as_deref().map(|w| Replacement::new(msg, at, w));
                let key = PinKey::new(PinKind::RequestState, visible.as_bytes());
                seen.created = self.pin(key, PinKind::RequestState, rounds);
                // The previous round's state is done with, unless the server asked again with
                // the same one: then the pin just made is that state's, and it goes on.
                if let Some(m) = prior.filter(|m| m.pin.kind == PinKind::RequestState && m.key != key) {
                    self.finish(m.key);
                }
            }
            Outcome::Task { task_id, terminal } => {
                let key = PinKey::new(PinKind::Task, task_id.as_bytes());
                if terminal {
                    self.finish(key);
                } else {
                    seen.created = self.pin(key, PinKind::Task, rounds);
                }
                self.finish_call(prior, None);
            }
            Outcome::Final => {
                if let Some(m) = c.matched.filter(|m| m.pin.kind == PinKind::Task && c.is_task_cancel) {
                    self.finish(m.key);
                }
                self.finish_call(prior, Some(rounds))
            }
            Outcome::Error => self.finish_call(prior, Some(rounds)),
        }
        seen
    }

    /// A final answer ends the call under every key it was pinned by.
    fn finish_call(&self, prior: Option<Matched>, rounds: Option<u32>) {
        let mut finished = false;
        if let Some(m) = prior.filter(|m| m.pin.kind != PinKind::Task) {
            finished |= self.finish(m.key).is_some();
        }
        for key in self.client_keys.iter().flatten() {
            finished |= self.finish(*key).is_some();
        }
        if let (true, Some(rounds)) = (finished, rounds) {
            self.shared.metrics.rounds_per_call.observe(rounds as f64);
        }
    }
}

fn starts_with_ignore_case(value: &[u8], prefix: &[u8]) -> bool {
    value.len() >= prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix)
}

// These markers are searched with searchers built once (`memmem::find` builds one per call).

/// Fields one of which every JSON-RPC response carries.
static RESPONSE_MARKERS: LazyLock<[memmem::Finder<'static>; 2]> =
    LazyLock::new(|| [b"\"result\"".as_slice(), b"\"error\""].map(memmem::Finder::new));

/// Fields one of which every answer that continues a call carries (DESIGN §4).
static CONTINUATION_MARKERS: LazyLock<[memmem::Finder<'static>; 3]> =
    LazyLock::new(|| [b"\"pending\"".as_slice(), b"\"resultType\"", b"\"taskId\""].map(memmem::Finder::new));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_stripped_and_only_those() {
        let mut h = HeaderMap::new();
        for name in &HOP_BY_HOP {
            h.append(name.clone(), HeaderValue::from_static("v"));
        }
        h.append(header::CONNECTION, HeaderValue::from_static("Keep-Alive, X-A,x-b"));
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        for n in [
            "x-a",
            "x-b",
            "x-c",
            "content-type",
            "mcp-session-id",
            "te-x",
            "upgrades",
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static("v"));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "mcp-session-id", "te-x", "upgrades", "x-c"]);

        // Only `keep-alive`: the common answer from nginx.
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), [header::CONTENT_LENGTH]);
    }

    #[test]
    fn content_length_is_set_unless_it_already_says_the_length() {
        let lengths = |h: &HeaderMap| h.get_all(header::CONTENT_LENGTH).iter().cloned().collect::<Vec<_>>();
        let mut h = HeaderMap::new();
        set_content_length(&mut h, 12);
        assert_eq!(lengths(&h), ["12"]);
        set_content_length(&mut h, 12);
        assert_eq!(lengths(&h), ["12"]);
        set_content_length(&mut h, 7);
        assert_eq!(lengths(&h), ["7"]);
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        set_content_length(&mut h, 7);
        assert_eq!(lengths(&h), ["7"], "duplicates collapse to one");
    }
}
