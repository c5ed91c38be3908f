//! The request path: a pipeline of named phases over one request context (`phases`, whose doc
//! lists them in order), driven by `run_phases`, which awaits the I/O between them.
//!
//! Around them: `path` (the path every reader will take), `gate` (`[auth]`'s checks and what
//! backends receive instead of the bearer), `admit` (`[quotas]`), `read` (bodies within their
//! limits), `headers` (the upstream request), `forward` (connections and answer heads), `answer`
//! (the answer's body, handed to the call's lifecycle in `crate::calls`), `deadline`.
//! [`serve`] is the one place where a [`RouterError`] becomes an answer and where each request
//! is recorded: its metrics, and, when the access log or tracing is on, its
//! `telemetry::Observation` (written out when the answer's body is done with).

mod admit;
mod answer;
mod deadline;
mod forward;
mod gate;
mod headers;
mod path;
mod phases;
mod read;
mod resend;

pub use deadline::ConnectionTimer;
pub use read::ConnectionShare;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderValue;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::config::defaults;
use crate::error::RouterError;
use crate::state::Shared;
use crate::telemetry::Observation;
use crate::upstream::Backend;
use phases::Exchange;

/// What a request's client connection lends it.
#[derive(Clone, Copy)]
struct Connection<'a> {
    share: Option<&'a ConnectionShare>,
    timer: Option<&'a ConnectionTimer>,
}

/// What one request did, filled in as its phases go; [`serve`] records it.
#[derive(Default)]
struct Record {
    /// The request's JSON-RPC id as the client wrote it (a router error echoes it).
    id: Option<RpcId>,
    /// The backend's answer head: who answered, the `method` label, the status, and the time
    /// from the request head to it.
    answered: Option<(Arc<Backend>, &'static str, StatusCode, f64)>,
    /// The access log's and the trace's view, when either is on.
    obs: Option<Box<Observation>>,
    /// What `[quotas]` counts of the request in flight, held until its answer's body ends.
    admitted: Option<crate::quotas::Admission>,
    /// The caller `[quotas]` counted the request against: a refusal is noted under it.
    quota_caller: Option<crate::quotas::CallerKey>,
}

/// Serves one request from the client at `peer` (its IP as a header value, made once per
/// connection). Never fails: every problem becomes an answer of docs/src/errors.md. `share` is
/// its connection's share of the body budget, `timer` (HTTP/1.1) what holds the timer its
/// connection's requests share: the connection's own state, which holds it at no allocation
/// of its own.
///
/// Boxed: the request's state is large (`run_phases`'s future alone 3,552 bytes, release
/// build, `-Zprint-type-sizes`), and a future is copied whole each time it is
/// moved; boxed here, it is moved as a pointer. Built in its box (`Box::write` into an
/// uninitialised one): `Box::pin(async { .. })` builds it on the stack and copies all of it
/// in, a memcpy of ~400 instructions per request.
pub fn serve(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    peer: HeaderValue,
    tls: bool,
    share: Option<Arc<ConnectionShare>>,
    timer: Option<Arc<impl AsRef<ConnectionTimer> + Send + Sync + 'static>>,
) -> Pin<Box<impl Future<Output = Response<ProxyBody>> + Send>> {
    let slot = Box::new_uninit();
    Box::into_pin(Box::write(slot, async move {
        let started = Instant::now();
        let mut record = Record::default();
        let connection = Connection {
            share: share.as_deref(),
            timer: timer.as_deref().map(AsRef::as_ref),
        };
        let result = run_phases(&shared, req, &peer, tls, connection, started, &mut record).await;
        if let Some((backend, method, status, seconds)) = &record.answered {
            backend.observe_request(method, *status, *seconds);
        }
        let mut response = match result {
            Ok(response) => response,
            Err(e) => {
                if let (Some((quota, scope)), Some(caller)) = (e.quota_labels(), record.quota_caller) {
                    if let Some(quotas) = &shared.snapshot().quotas {
                        quotas.refused.note(caller, quota, scope, Instant::now());
                    }
                }
                if let Some(obs) = &mut record.obs {
                    obs.error = Some(e.reason());
                    obs.quota = e.quota_labels();
                }
                router_error(&shared, e, record.id.as_ref().map(RpcId::as_str))
            }
        };
        if let Some(admitted) = record.admitted.take() {
            response.body_mut().on_end(Box::new(move |_| drop(admitted)));
        }
        if let Some(mut obs) = record.obs.take() {
            // Written out when the body is done with: a stream's line has its whole size.
            obs.status = response.status().as_u16();
            response.body_mut().on_end(Box::new(move |sent| obs.bytes_out = sent));
        }
        response
    }))
}

/// The request path: its phases in their order (`phases`), over one request context. Every
/// `?` is a refusal that `serve` turns into an answer.
async fn run_phases(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    peer: &HeaderValue,
    tls: bool,
    connection: Connection<'_>,
    started: Instant,
    record: &mut Record,
) -> Result<Response<ProxyBody>, RouterError> {
    let mut cx = Exchange::new(shared, peer, tls, connection, started, record);
    let (parts, body) = req.into_parts();
    cx.observe(&parts);
    // The path the backend will see, and the method, judged before anything else.
    cx.judge(&parts, &body)?;
    // Each async phase's future is made only when its feature is on: off, it costs a branch.
    if cx.snap.auth.is_some() {
        if let Some(metadata) = cx.authenticate(&parts).await? {
            return Ok(metadata);
        }
    }
    cx.caller(&parts.headers);
    let read = cx.read(&parts.method, body).await?;
    let handles = cx.handles(&parts.headers, &read)?;
    cx.authorize(&handles)?;
    let routed = cx.decide(&handles)?;
    let open_call = match cx.snap.quotas.is_some() {
        true => cx.admit(&handles, &routed, &parts.method).await?,
        false => None,
    };
    // One deadline bounds the exchange with the backend, up to a JSON answer's last byte. The
    // driver awaits the exchange's I/O itself, between the phases: a phase that awaited it would
    // be a future holding the I/O's, moved whole at each call (Pingora's split too).
    let mut own_timer = std::pin::pin!(None);
    let mut deadline = cx.deadline(own_timer.as_mut());
    cx.route_taken(&routed);
    let (forward, trace) = cx.connecting();
    let reached = forward
        .connect(&routed.decision, &handles, deadline.reborrow(), trace)
        .await?;
    let conn = cx.connected(&handles, &routed, &parts.method, open_call, reached);
    drop(handles);
    let (sending, request) = cx.upstream_request(parts, read, &routed, &conn)?;
    let sent = std::pin::pin!(conn.send(request));
    join_the_write_burst().await;
    let response = match deadline::within(deadline.reborrow(), sent).await {
        // The usual case: the first attempt's answer, taken without another future.
        Some(Ok(answer)) => forward::answered(cx.forwarding().1, answer),
        first => not_answered_at_once(&mut cx, first, &sending, deadline.reborrow()).await?,
    };
    let mut answered = cx.answered(response);
    let collected = match answered.whole_body() {
        Some(body) => Some(read::collect_json(body, deadline).await),
        None => None,
    };
    let answer = cx.answer(answered, collected)?;
    join_the_write_burst().await;
    Ok(answer)
}

/// The first attempt did not answer (unsent on a closed pooled connection, refused, failed, or
/// past the deadline): sent once more where that is safe (`Forward::answer`), and a first
/// round that may run twice goes once to the next backend (`resend`).
async fn not_answered_at_once(
    cx: &mut Exchange<'_>,
    first: Option<Result<Response<crate::upstream::DrivenBody>, crate::upstream::SendError>>,
    sending: &phases::Sending,
    mut deadline: deadline::Deadline<'_>,
) -> Result<Response<crate::upstream::DrivenBody>, RouterError> {
    let (forward, backend) = cx.forwarding();
    let client_fault = sending.client_fault.as_ref();
    let mut response = forward
        .answer(first, sending.reused, backend, client_fault, deadline.reborrow())
        .await;
    if response.as_ref().is_err_and(|failed| cx.may_resend(failed)) {
        if let Some(again) = cx.resend(deadline).await {
            response = again;
        }
    }
    response
}

/// A request's JSON-RPC id as the client wrote it: short ones (almost all) copied inline, so
/// keeping it costs no allocation and no reference count.
enum RpcId {
    Inline([u8; 23], u8),
    Long(Box<str>),
}

impl RpcId {
    #[inline]
    fn new(raw: &str) -> RpcId {
        let mut inline = [0u8; 23];
        match inline.get_mut(..raw.len()) {
            Some(slot) => {
                slot.copy_from_slice(raw.as_bytes());
                RpcId::Inline(inline, raw.len() as u8)
            }
            None => RpcId::Long(raw.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole: always UTF-8.
            RpcId::Inline(bytes, len) => std::str::from_utf8(&bytes[..*len as usize]).unwrap_or("null"),
            RpcId::Long(s) => s,
        }
    }
}

/// Waits until every request that became ready in this turn of the event loop has got this far,
/// so that writes leave in bursts: a backend or client that had gone idle is then woken once per
/// burst, not once per request. Waking an idle peer costs the writer a cross-CPU interrupt, and
/// the peer a sleep and a wake-up; without this, nginx behind the router slept ~440 times per
/// 1000 requests (~80 behind HAProxy, which batches its sends the same way) and the router
/// spent ~5 µs a request in those wake-ups (bench/FINDINGS.md, be-sleep in `bench/README.md`).
/// The cost is one more poll of the request's task.
async fn join_the_write_burst() {
    // Deferred, not rewoken at once: the scheduler runs every other ready task and polls the
    // I/O driver before it resumes the deferred ones.
    tokio::task::yield_now().await;
}

/// Answers a request with a router error, counted by reason.
fn router_error(shared: &Shared, e: RouterError, id: Option<&str>) -> Response<ProxyBody> {
    let metrics = &shared.metrics;
    match &e {
        RouterError::InvalidToken { reason } => metrics.tokens_rejected.with_label_values(&[reason]).inc(),
        RouterError::PinnedBackendUnavailable { .. } => metrics.pins_lost.inc(),
        _ => {}
    }
    if let Some((quota, scope)) = e.quota_labels() {
        metrics.quota_refusals.with_label_values(&[quota, scope]).inc();
    }
    if let Some(result) = e.auth_result() {
        metrics.count_auth(result);
    }
    metrics.router_errors.with_label_values(&[e.reason()]).inc();
    let name_backend = e.backend().is_some() && shared.snapshot().config.server.errors_name_backends;
    e.render(id, defaults::RETRY_AFTER_SECS, name_backend)
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
