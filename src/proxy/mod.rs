//! The request path as a pipeline of phases, each a function returning `Result<_, RouterError>`:
//! read the body within its limits (`read`) → find its keys (`dialect::RequestKeys`) → decide
//! (`route::resolve`) → forward (`forward`, requests built by `headers`) → observe the answer
//! (`answer`, which hands it to the call's lifecycle in `crate::calls`). [`handle`] is the one
//! place where a [`RouterError`] becomes an answer and where each request is recorded: its
//! metrics, and, when the access log or tracing is on, its `telemetry::Observation` (written
//! out when the answer's body is done with).

mod admit;
mod answer;
mod deadline;
mod forward;
mod gate;
mod headers;
mod path;
mod read;

pub use deadline::ConnectionTimer;
pub use read::ConnectionShare;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Either;
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::calls::Call;
use crate::config::defaults;
use crate::dialect::{Reading, RequestKeys};
use crate::error::RouterError;
use crate::route;
use crate::sealing;
use crate::state::Shared;
use crate::telemetry::Observation;
use crate::upstream::{Backend, ClientBody, FaultCell};
use deadline::{within, Deadline};
use forward::Forward;

/// What a request's client connection lends it.
#[derive(Clone, Copy)]
struct Connection<'a> {
    share: Option<&'a ConnectionShare>,
    timer: Option<&'a ConnectionTimer>,
}

/// What one request did, filled in as its phases go; [`handle`] records it.
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
}

/// Serves one request from the client at `peer` (its IP as a header value, made once per
/// connection). Never fails: every problem becomes an answer of docs/src/errors.md. `share` is
/// its connection's share of the body budget, `timer` (HTTP/1.1) what holds the timer its
/// connection's requests share: the connection's own state, which holds it at no allocation
/// of its own.
///
/// Boxed: the request's state is large (~3.9 KiB), and a future is copied whole each time it is
/// moved; boxed here, it is moved as a pointer. Built in its box (`Box::write` into an
/// uninitialised one): `Box::pin(async { .. })` builds it on the stack and copies all of it
/// in, a memcpy of ~400 instructions per request.
pub fn handle(
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
        let result = handle_inner(&shared, req, &peer, tls, connection, started, &mut record).await;
        if let Some((backend, method, status, seconds)) = &record.answered {
            backend.observe_request(method, *status, *seconds);
        }
        let mut response = match result {
            Ok(response) => response,
            Err(e) => {
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

async fn handle_inner(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    peer: &HeaderValue,
    tls: bool,
    client_conn: Connection<'_>,
    started: Instant,
    record: &mut Record,
) -> Result<Response<ProxyBody>, RouterError> {
    let snap = shared.snapshot();
    let routing = &snap.config.routing;
    let (parts, body) = req.into_parts();
    if snap.config.log.access || snap.tracing.is_some() {
        let access = snap.config.log.access.then_some(snap.config.log.format);
        record.obs = Some(Observation::begin(&parts, peer, started, access, snap.tracing.as_ref()));
    }
    // Every decision below that reads the path reads the one the backend will see.
    path::check(parts.uri.path())?;

    // Who calls, from the head alone: a stranger's body is never read.
    let caller = match (&snap.config.auth, &snap.auth) {
        (Some(cfg), Some(resource)) => {
            if parts.method == Method::GET && resource.is_metadata_path(parts.uri.path()) {
                return Ok(gate::metadata(resource).map(ProxyBody::from));
            }
            let caller = gate::authenticate(shared, cfg, resource, &parts).await?;
            if let (Some(obs), Some(c)) = (&mut record.obs, &caller) {
                obs.caller(&c.verified.subject, c.verified.client_id.as_deref());
            }
            caller
        }
        _ => None,
    };

    // The caller `[quotas]` counts against, from the head too: its share of the body budget
    // bounds the body's read.
    let tag = caller.as_ref().map(|c| c.tag);
    let quota_caller = snap.quotas.as_ref().map(|quotas| {
        let key = admit::caller(quotas, &parts.headers, peer, tag.as_ref());
        if let Some(obs) = &mut record.obs {
            obs.quota_caller(key.log_text(), admit::client_ip(quotas, &parts.headers, peer));
        }
        key
    });

    // Read: a POST's body whole (bounded in size and time, and held within the budget all
    // bodies share until the request ends); other methods stream theirs. CONNECT and TRACE
    // are no MCP methods: answered here, never forwarded.
    let (bytes, stream, _held) = match parts.method == Method::POST {
        true => {
            let body_share = snap
                .quotas
                .as_ref()
                .zip(quota_caller)
                .and_then(|(q, c)| q.body_share(c));
            let share = client_conn.share;
            let (bytes, held) = read::read_body(body, &snap, &shared.metrics.body_buffer, share, body_share).await?;
            (bytes, None, held)
        }
        false => {
            judge_method(&parts.method, &body, &snap)?;
            (Bytes::new(), Some(body), read::Held::nothing())
        }
    };

    // Keys: every handle the headers and the body carry.
    let body_to_scan = stream.is_none().then_some(&bytes[..]);
    let keys =
        RequestKeys::read(&parts.headers, &routing.header, &routing.body_field, body_to_scan).map_err(unreadable)?;
    if let Some(obs) = &mut record.obs {
        obs.keys(keys.method.as_deref(), keys.name.as_deref());
    }
    record.id = keys.id.map(RpcId::new);
    if let Some(why) = keys.batch_refused() {
        return Err(RouterError::BatchRefused { why });
    }
    if let (Some(resource), Some(caller)) = (&snap.auth, &caller) {
        gate::authorize(resource, caller, &keys)?;
    }
    if keys.names_disagree() {
        return Err(RouterError::HeaderMismatch);
    }

    // Decide: sealed tokens first, then pins, then the ring.
    let (decision, unsealed) = route::resolve(&snap, &shared.pins, &keys, tag.as_ref(), route::Lookup::Refresh)?;
    if caller.is_some() {
        // Accepted: its token, its scopes, and every handle it presents are its own.
        shared.metrics.auth_by_result[0].inc();
    }
    // Admitted by the caller's quotas, before any backend is asked.
    let mut open_call = None;
    if let (Some(quotas), Some(caller)) = (&snap.quotas, quota_caller) {
        let ask = admit::Ask {
            keys: &keys,
            follow_up: decision.follow_up,
            ends_a_session: parts.method == Method::DELETE && keys.session_id.is_some(),
        };
        let mut admitted = admit::admit(quotas, caller, ask).await?;
        open_call = admitted.take_open_call();
        record.admitted = Some(admitted);
    }
    shared.metrics.decisions_by_source[decision.source as usize].inc();
    if decision.pin_lost {
        shared.metrics.pins_lost.inc();
    }
    if let Some(obs) = &mut record.obs {
        let pin_used = decision
            .matched
            .filter(|_| !decision.pin_lost)
            .map(|m| m.pin.kind.label());
        obs.routed(decision.source.label(), &decision.backend.name, pin_used);
    }

    // Forward. One deadline bounds the whole exchange, up to a JSON answer's last byte.
    let at = tokio::time::Instant::now() + snap.config.server.upstream_timeout;
    let mut own_timer = std::pin::pin!(None);
    let mut deadline = Deadline::new(at, client_conn.timer, own_timer.as_mut());
    let forward = Forward { shared, snap: &snap };
    let trace = record.obs.as_mut().and_then(|o| o.trace.as_mut());
    let (conn, backend, guard) = forward
        .connect(&decision, keys.client_key(), deadline.reborrow(), trace)
        .await?;
    // The incarnation the request goes to: an ejection while it is in flight voids any pin
    // its answer makes.
    let mut call = Call::new(
        shared,
        &snap,
        &keys,
        &decision,
        backend.incarnation(),
        &parts.method,
        unsealed.as_ref(),
    );
    call.issue_to(tag);
    call.hold(open_call);
    if let Some(obs) = &mut record.obs {
        obs.sent_to(&backend.name);
        call.note_pins_in(obs.pins_created.clone());
    }
    let method = method_label(&parts.method, keys.method.as_deref());
    drop(keys);
    // A streamed body's failure is its client's, never the backend's.
    let mut client_fault = None;
    let body = match stream {
        Some(incoming) if incoming.is_end_stream() => Either::Left(Bytes::new()),
        Some(incoming) => {
            let timeout = snap.config.server.body_read_timeout;
            let fault = client_fault.insert(FaultCell::default()).clone();
            Either::Right(ClientBody::new(incoming, timeout, fault))
        }
        // The backend gets back the state and the task id it issued.
        None => Either::Left(match &unsealed {
            Some(u) if sealing::restores_body(u) => sealing::restore_originals(&bytes, &routing.body_field, u),
            _ => bytes.clone(),
        }),
    };
    let originals = headers::Originals {
        session: unsealed.as_ref().and_then(|u| u.session_id.as_deref()),
        task: unsealed.as_ref().and_then(|u| u.task_id.as_deref()),
    };
    let identity = snap.config.auth.as_ref().map(|cfg| gate::Identity {
        cfg,
        caller: caller.as_deref(),
    });
    let mut request = headers::build_upstream_request(parts, body, &backend, peer, tls, originals, identity)
        .map_err(|_| RouterError::upstream_unavailable(&backend.name))?;
    if let Some(trace) = record.obs.as_ref().and_then(|o| o.trace.as_ref()) {
        trace.inject(request.headers_mut());
    }
    let reused = conn.reused;
    let sending = std::pin::pin!(conn.send(request));
    join_the_write_burst().await;
    let first = within(deadline.reborrow(), sending).await;
    let resp = forward
        .answer(first, reused, &backend, client_fault.as_ref(), deadline.reborrow())
        .await?;

    // Observe the answer; pins are in place before the client can read it.
    let elapsed = started.elapsed().as_secs_f64();
    record.answered = Some((backend.clone(), method, resp.status(), elapsed));
    let status = resp.status();
    let (mut parts, body) = resp.into_parts();
    let head = answer::head(&call, status, &mut parts);
    let body = match head.kind {
        answer::Kind::Sse => {
            // A stream waits on no deadline: its connection holds no timer while it streams.
            if let Some(timer) = client_conn.timer {
                timer.release();
            }
            answer::sse(&forward, call, &mut parts, head.pinned, body, &backend, guard)
        }
        answer::Kind::Json => {
            let collected = read::collect_json(body, deadline).await;
            answer::json(&forward, &call, &mut parts, head, collected, &backend, guard)?
        }
        answer::Kind::Other => answer::other(&forward, &call, &mut parts, head.pinned, body, &backend, guard),
    };
    join_the_write_burst().await;
    Ok(Response::from_parts(parts, body))
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

/// Whether a request of `method` other than POST is forwarded. CONNECT and TRACE are no MCP
/// methods. With `[auth]` or `[quotas]` on, neither is any method but the Streamable HTTP ones
/// (GET, DELETE) and HEAD and OPTIONS, nor one of those with a body: such a body would stream
/// to a backend unread, past the scopes and the tool quotas that a POST's body is judged by.
fn judge_method(method: &Method, body: &Incoming, snap: &crate::state::Snapshot) -> Result<(), RouterError> {
    let judged = snap.config.auth.is_some() || snap.config.quotas.is_some();
    match *method {
        Method::CONNECT | Method::TRACE => Err(RouterError::MethodNotAllowed { method: method.clone() }),
        Method::GET | Method::DELETE | Method::HEAD | Method::OPTIONS if judged && !body.is_end_stream() => {
            Err(RouterError::BodyNotAllowed { method: method.clone() })
        }
        Method::GET | Method::DELETE | Method::HEAD | Method::OPTIONS => Ok(()),
        _ if judged => Err(RouterError::MethodNotAllowed { method: method.clone() }),
        _ => Ok(()),
    }
}

/// A body the router cannot read as one request: not JSON, or readable two ways.
fn unreadable(e: crate::dialect::Unreadable) -> RouterError {
    match e {
        crate::dialect::Unreadable::NotJson(_) => RouterError::Parse,
        crate::dialect::Unreadable::Ambiguous(a) => RouterError::AmbiguousBody {
            key: a.key,
            why: match a.how {
                Reading::Twice => "it stands twice",
                Reading::Spelled => "it stands in another spelling",
                Reading::Shape => "its value is not of its shape",
            },
        },
    }
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
        if let Some(i) = crate::auth::AUTH_RESULTS.iter().position(|r| *r == result) {
            metrics.auth_by_result[i].inc();
        }
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
