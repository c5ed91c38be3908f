//! The phases of one request, in the order `run_phases` runs them, each a method over the one
//! request context ([`Exchange`], Pingora's CTX), the fallible ones returning
//! `Result<_, RouterError>`:
//!
//! judge → authenticate → caller → read → handles → authorize → decide → admit →
//! route_taken → (connect) → connected → upstream_request → (send) → answered →
//! (collect_json) → answer
//!
//! The driver awaits the exchange's I/O itself, in the parentheses (`Forward::connect`, the
//! send and `Forward::answer`, a JSON answer's body by `read::collect_json`): a phase that
//! awaited it would be a future holding the I/O's futures, kilobytes copied at each call. The order is what keeps the edge's invariants: a
//! method never forwarded is refused whoever asks; who calls is known from the head before any
//! body is read; the handles are read only from a body the read phase produced ([`Read`]);
//! whether a request is a follow-up is one function (`route::is_follow_up`), asked by `decide`,
//! whose answer `admit` uses; identity headers are written by `upstream_request`, which builds
//! the upstream request, after the hop-by-hop headers are removed.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response};
use http_body::Body;
use http_body_util::Either;
use hyper::body::Incoming;

use super::deadline::Deadline;
use super::forward::Forward;
use super::read::{self, Held};
use super::{admit, answer, gate, headers, method_label, Connection, Record, RpcId};
use crate::auth::Caller;
use crate::body::ProxyBody;
use crate::calls::Call;
use crate::dialect::{Reading, RequestHandles, Unreadable};
use crate::error::RouterError;
use crate::quotas::{CallerKey, OpenCall};
use crate::route::{self, Decision};
use crate::sealing::{self, Unsealed};
use crate::state::{Shared, Snapshot};
use crate::telemetry::{Observation, RequestTrace};
use crate::upstream::{
    Backend, BackendKey, ClientBody, DrivenBody, FaultCell, InflightGuard, PooledConn, UpstreamBody,
};

/// One request on its way through the phases: what the connection lends it, and what each
/// phase found for the next.
pub(super) struct Exchange<'c> {
    pub shared: &'c Arc<Shared>,
    pub snap: Arc<Snapshot>,
    /// The client's IP, as a header value made once per connection.
    pub peer: &'c HeaderValue,
    pub tls: bool,
    pub connection: Connection<'c>,
    pub started: Instant,
    /// What is recorded of the request whatever its end (metrics, the access log, traces).
    pub record: &'c mut Record,
    /// The caller `[auth]` verified (authenticate); none on a public path or without `[auth]`.
    caller: Option<Arc<Caller>>,
    /// The caller `[quotas]` counts the request against (caller).
    quota_caller: Option<CallerKey>,
    /// The exchange with the chosen backend, from `connected` until the answer is observed:
    /// kept here, never moved from phase to phase (its call alone is hundreds of bytes).
    at_backend: Option<AtBackend<'c>>,
}

/// What the exchange with the chosen backend holds until its answer is observed.
struct AtBackend<'c> {
    backend: Arc<Backend>,
    /// Taken by the answer's body, which holds it until it ends.
    guard: Option<InflightGuard>,
    call: Call,
    /// The `method` label of the request's metrics.
    method: &'static str,
    /// The request body's share of the budget, given back once the answer's head (a JSON
    /// answer: its whole body) is in.
    held: Held<'c>,
    /// A first round that may be sent again elsewhere (`resend`).
    resend: Option<Box<Resend>>,
}

/// What sending a first round again needs: the copy (once the request is built) and the key
/// that orders the ring for it.
pub(super) struct Resend {
    pub request: Option<Box<Request<UpstreamBody>>>,
    pub key: Option<Box<str>>,
    /// The backends serving the request's tool, when the catalog routes it: the only ones it
    /// may go to (under a lock, those serving the approved definition).
    pub among: Option<Vec<BackendKey>>,
}

/// A request's body as the read phase left it: read whole (a POST's, held within the body
/// budget until the answer's head is in, or a JSON answer's last byte), or still to stream
/// (any other method's).
pub(super) enum Read<'c> {
    Whole(Bytes, Held<'c>),
    Streamed(Incoming),
}

/// The route `decide` chose: the backend and why, and what the request's sealed handles hold.
pub(super) struct Routed {
    pub decision: Decision,
    unsealed: Option<Box<Unsealed>>,
}

/// What sending the request needs to know beside it (the driver sends it, and awaits the
/// answer's head with `Forward::answer`).
pub(super) struct Sending {
    /// A streamed body's failure: its client's, never the backend's.
    pub client_fault: Option<FaultCell>,
    /// The connection came from the pool (it may turn out closed: then sent again).
    pub reused: bool,
}

/// The backend's answer head, observed.
pub(super) struct Answered {
    parts: http::response::Parts,
    /// Taken by the driver to be read whole when [`Answered::whole_body`] says so.
    body: Option<DrivenBody>,
    head: answer::Head,
}

impl Answered {
    /// A JSON answer's body, for the driver to read whole (within the deadline) before
    /// [`Exchange::answer`]: its messages are observed before the client may have them.
    pub fn whole_body(&mut self) -> Option<DrivenBody> {
        match self.head.kind {
            answer::Kind::Json => self.body.take(),
            _ => None,
        }
    }
}

impl<'c> Exchange<'c> {
    pub fn new(
        shared: &'c Arc<Shared>,
        peer: &'c HeaderValue,
        tls: bool,
        connection: Connection<'c>,
        started: Instant,
        record: &'c mut Record,
    ) -> Exchange<'c> {
        Exchange {
            shared,
            snap: shared.snapshot(),
            peer,
            tls,
            connection,
            started,
            record,
            caller: None,
            quota_caller: None,
            at_backend: None,
        }
    }

    /// Starts the access log's and the trace's view of the request, when either is on.
    pub fn observe(&mut self, parts: &Parts) {
        let (snap, log) = (&self.snap, &self.snap.config.log);
        if log.access || snap.tracing.is_some() {
            let access = log.access.then_some(log.format);
            let obs = Observation::begin(parts, self.peer, self.started, access, snap.tracing.as_ref());
            self.record.obs = Some(obs);
        }
    }

    /// Who calls, from the head alone (a stranger's body is never read): `[auth]`'s checks
    /// (docs/src/authorization.md). `Some` answer: the Protected Resource Metadata, served here.
    pub async fn authenticate(&mut self, parts: &Parts) -> Result<Option<Response<ProxyBody>>, RouterError> {
        let (Some(cfg), Some(resource)) = (&self.snap.config.auth, &self.snap.auth) else {
            return Ok(None);
        };
        if parts.method == Method::GET && resource.is_metadata_path(parts.uri.path()) {
            return Ok(Some(gate::metadata(resource).map(ProxyBody::from)));
        }
        let caller = gate::authenticate(self.shared, cfg, resource, parts).await?;
        if let (Some(obs), Some(c)) = (&mut self.record.obs, &caller) {
            obs.caller(&c.verified.subject, c.verified.client_id.as_deref());
        }
        self.caller = caller;
        Ok(None)
    }

    /// The caller `[quotas]` counts the request against, from the head too: its share of the
    /// body budget bounds the body's read.
    pub fn caller(&mut self, headers: &HeaderMap) {
        let Some(quotas) = &self.snap.quotas else {
            return;
        };
        let tag = self.caller.as_ref().map(|c| c.tag);
        let key = admit::caller(quotas, headers, self.peer, tag.as_ref());
        if let Some(obs) = &mut self.record.obs {
            obs.quota_caller(key.log_text(), admit::client_ip(quotas, headers, self.peer));
        }
        self.quota_caller = Some(key);
        self.record.quota_caller = Some(key);
    }

    /// The path every later decision reads (the one the backend will see: no dot segments, no
    /// encoded slashes), and whether the request's method (and a body on a method that takes
    /// none) is forwarded at all: judged first, so a method never forwarded is 405 whoever asks.
    pub fn judge(&self, parts: &Parts, body: &Incoming) -> Result<(), RouterError> {
        super::path::check(parts.uri.path())?;
        match parts.method == Method::POST {
            true => Ok(()),
            false => judge_method(&parts.method, body, &self.snap),
        }
    }

    /// The deadline of the exchange with the backend: `upstream_timeout` from now, on the
    /// connection's timer (or `own_timer`).
    pub fn deadline<'t>(&self, own_timer: std::pin::Pin<&'t mut Option<tokio::time::Sleep>>) -> Deadline<'t>
    where
        'c: 't,
    {
        let at = tokio::time::Instant::now() + self.snap.config.server.upstream_timeout;
        Deadline::new(at, self.connection.timer, own_timer)
    }

    /// What connecting to the chosen backend needs: the forwarder, and the request's trace.
    pub fn connecting(&mut self) -> (Forward<'_>, Option<&mut RequestTrace>) {
        let trace = self.record.obs.as_mut().and_then(|o| o.trace.as_mut());
        let forward = Forward {
            shared: self.shared,
            snap: &self.snap,
        };
        (forward, trace)
    }

    /// A POST's body whole (bounded in size and time, held within the budget all bodies share
    /// until the answer is observed); any other method's streams, if the method is forwarded
    /// at all.
    pub async fn read(&self, method: &Method, body: Incoming) -> Result<Read<'c>, RouterError> {
        if *method != Method::POST {
            return Ok(Read::Streamed(body));
        }
        let quotas = self.snap.quotas.as_ref();
        let caller_share = quotas.zip(self.quota_caller).and_then(|(q, c)| q.body_share(c));
        let budget = &self.shared.metrics.body_buffer;
        let share = self.connection.share;
        let (bytes, held) = read::read_body(body, &self.snap, budget, share, caller_share).await?;
        Ok(Read::Whole(bytes, held))
    }

    /// Every handle the headers and the read body carry, and what the body asks for; a body
    /// that reads two ways and a batch that cannot be one request are refused here (headers
    /// that disagree with the body, by [`Exchange::authorize`]).
    pub fn handles<'r>(
        &mut self,
        headers: &'r HeaderMap,
        read: &'r Read<'_>,
    ) -> Result<RequestHandles<'r>, RouterError> {
        let routing = &self.snap.config.routing;
        let body = match read {
            Read::Whole(bytes, _) => Some(&bytes[..]),
            Read::Streamed(_) => None,
        };
        let handles = RequestHandles::read(headers, &routing.header, &routing.body_field, body).map_err(unreadable)?;
        if let Some(obs) = &mut self.record.obs {
            obs.mcp(handles.method.as_deref(), handles.name.as_deref());
        }
        self.record.id = handles.id.map(RpcId::new);
        if let Some(why) = handles.batch_refused() {
            return Err(RouterError::BatchRefused { why });
        }
        Ok(handles)
    }

    /// Whether the caller's scopes cover what the body asks for (every message of a batch).
    #[inline]
    pub fn authorize(&self, handles: &RequestHandles) -> Result<(), RouterError> {
        if let (Some(resource), Some(caller)) = (&self.snap.auth, &self.caller) {
            gate::authorize(resource, caller, handles)?;
        }
        match handles.names_disagree() {
            true => Err(RouterError::HeaderMismatch),
            false => Ok(()),
        }
    }

    /// The backend: sealed handles first (verified, and bound to the caller), then pins, then
    /// the ring (docs/src/routing.md).
    #[inline]
    pub fn decide(&self, handles: &RequestHandles) -> Result<Routed, RouterError> {
        let tag = self.caller.as_ref().map(|c| c.tag);
        let lookup = route::Lookup::Refresh;
        let (decision, unsealed) = route::resolve(&self.snap, &self.shared.pins, handles, tag.as_ref(), lookup)?;
        if self.caller.is_some() {
            // Accepted: its bearer, its scopes, and every handle it presents are its own.
            self.shared.metrics.count_auth("ok");
        }
        Ok(Routed { decision, unsealed })
    }

    /// The caller's quotas, before any backend is asked (docs/src/quotas.md): the request is
    /// counted until its answer's body ends; the open-call slot it reserved, if any, goes to
    /// its call.
    pub async fn admit(
        &mut self,
        handles: &RequestHandles<'_>,
        routed: &Routed,
        method: &Method,
    ) -> Result<Option<OpenCall>, RouterError> {
        let (Some(quotas), Some(caller)) = (&self.snap.quotas, self.quota_caller) else {
            return Ok(None);
        };
        let ask = admit::Ask {
            handles,
            follow_up: routed.decision.follow_up,
            ends_a_session: *method == Method::DELETE && handles.session_id.is_some(),
        };
        let mut admitted = admit::admit(quotas, caller, ask).await?;
        let open_call = admitted.take_open_call();
        self.record.admitted = Some(admitted);
        Ok(open_call)
    }

    /// The route taken, counted and noted (metrics, the access log, the trace), before a
    /// connection to its backend is sought (`Forward::connect`, awaited by the driver).
    pub fn route_taken(&mut self, routed: &Routed) {
        let decision = &routed.decision;
        decision.source.count(&self.shared.metrics);
        if decision.pin_lost {
            self.shared.metrics.pins_lost.inc();
        }
        if let Some(obs) = &mut self.record.obs {
            let pin_used = decision
                .matched
                .filter(|_| !decision.pin_lost)
                .map(|m| m.pin.kind.label());
            obs.routed(decision.source.label(), &decision.backend.name, pin_used);
        }
    }

    /// What forwarding needs of the context: the shared state and the snapshot, and the
    /// backend the request went to (once `connected`).
    pub fn forwarding(&self) -> (Forward<'_>, &Backend) {
        let forward = Forward {
            shared: self.shared,
            snap: &self.snap,
        };
        let backend = &self
            .at_backend
            .as_ref()
            .expect("connected before it is forwarded")
            .backend;
        (forward, backend)
    }

    /// The call the request is part of, once a connection to the backend (or, when it refused
    /// an unpinned request, the next one on the ring) is had: bound to the incarnation it goes
    /// to, so that an ejection while it is in flight voids any pin its answer makes.
    pub fn connected(
        &mut self,
        handles: &RequestHandles<'_>,
        routed: &Routed,
        method: &Method,
        open_call: Option<OpenCall>,
        (conn, backend, guard): (PooledConn, Arc<Backend>, InflightGuard),
    ) -> PooledConn {
        let incarnation = backend.incarnation();
        let unsealed = routed.unsealed.as_deref();
        if let Some(obs) = &mut self.record.obs {
            obs.sent_to(&backend.name);
        }
        // Made where it stays (the call is hundreds of bytes), then told the rest.
        let at = self.at_backend.insert(AtBackend {
            call: Call::new(
                self.shared,
                &self.snap,
                handles,
                &routed.decision,
                incarnation,
                method,
                unsealed,
            ),
            backend,
            guard: Some(guard),
            method: method_label(method, handles.method.as_deref()),
            held: Held::nothing(),
            resend: None,
        });
        at.call.issue_to(self.caller.as_ref().map(|c| c.tag));
        at.call.filter_list_for(self.caller.as_ref());
        at.call.hold(open_call);
        if let Some(obs) = &self.record.obs {
            at.call.note_pins_in(obs.pins_created.clone());
        }
        let resend = self.resend_of(handles, routed, method);
        if let Some(at) = self.at_backend.as_mut() {
            at.resend = resend;
        }
        conn
    }

    /// The request as the backend gets it (the hop-by-hop headers out, then what the router
    /// owns set: the identity headers, the backend's own handles back, `Host`,
    /// `X-Forwarded-*`), and the connection to send it on (the driver sends it and awaits the
    /// answer's head).
    // Inlined into the driver: the request (280 bytes) is then built where the driver keeps
    // it rather than returned and moved (about 200 fewer instructions per request, callgrind).
    #[inline(always)]
    pub fn upstream_request(
        &mut self,
        parts: Parts,
        read: Read<'c>,
        routed: &Routed,
        conn: &PooledConn,
    ) -> Result<(Sending, Request<UpstreamBody>), RouterError> {
        let unsealed = routed.unsealed.as_deref();
        // A streamed body's failure is its client's, never the backend's.
        let mut client_fault = None;
        let (body, held) = match read {
            Read::Streamed(incoming) if incoming.is_end_stream() => (Either::Left(Bytes::new()), Held::nothing()),
            Read::Streamed(incoming) => {
                let timeout = self.snap.config.server.body_read_timeout;
                let fault = client_fault.insert(FaultCell::default()).clone();
                (
                    Either::Right(ClientBody::new(incoming, timeout, fault)),
                    Held::nothing(),
                )
            }
            // The backend gets back the state and the task ids it issued.
            Read::Whole(bytes, held) => {
                let body = match unsealed {
                    Some(u) if sealing::restores_body(u) => {
                        sealing::restore_originals(&bytes, &self.snap.config.routing.body_field, u)
                    }
                    _ => bytes,
                };
                (Either::Left(body), held)
            }
        };
        let originals = headers::Originals {
            session: unsealed.and_then(|u| u.session_id.as_deref()),
            task: unsealed.and_then(|u| u.task_id.as_deref()),
        };
        let identity = self.snap.config.auth.as_ref().map(|cfg| gate::Identity {
            cfg,
            caller: self.caller.as_deref(),
        });
        let (peer, tls) = (self.peer, self.tls);
        let at = self.at_backend.as_mut().expect("connected before its request is built");
        at.held = held;
        let backend = &at.backend;
        let mut request = headers::build_upstream_request(parts, body, backend, peer, tls, originals, identity)
            .map_err(|_| RouterError::upstream_unavailable(&backend.name))?;
        if let Some(trace) = self.record.obs.as_ref().and_then(|o| o.trace.as_ref()) {
            trace.inject(request.headers_mut());
        }
        if let Some(resend) = at.resend.as_mut() {
            resend.request = copy_of(&request);
        }
        if at.call.reads_tools_list() {
            // The catalog (and the scope filter) read the list: it comes unencoded.
            request.headers_mut().remove(http::header::ACCEPT_ENCODING);
        }
        let sending = Sending {
            client_fault,
            reused: conn.reused,
        };
        Ok((sending, request))
    }

    /// Whether a copy to send again elsewhere is kept.
    pub(super) fn has_resend_copy(&self) -> bool {
        let resend = self.at_backend.as_ref().and_then(|at| at.resend.as_ref());
        resend.is_some_and(|r| r.request.is_some())
    }

    /// What sending again needs (the copy, the ring key), taken.
    pub(super) fn take_resend(&mut self) -> Option<Box<Resend>> {
        self.at_backend.as_mut()?.resend.take()
    }

    /// The backend the request went to, by its `BackendKey`.
    pub(super) fn backend_key(&self) -> crate::upstream::BackendKey {
        self.at_backend
            .as_ref()
            .expect("connected before it is sent again")
            .backend
            .key
    }

    /// The request went on to `backend` (a retry): the call, the in-flight count and the
    /// access log follow it.
    pub(super) fn moved_to(&mut self, backend: Arc<Backend>, guard: InflightGuard) {
        let at = self.at_backend.as_mut().expect("connected before it is sent again");
        at.call.retarget(backend.incarnation());
        if let Some(obs) = &mut self.record.obs {
            obs.sent_to(&backend.name);
        }
        at.backend = backend;
        at.guard = Some(guard);
    }

    /// The backend's answer head is in: recorded for the metrics and the access log, and
    /// observed (a session id pins the session; hop-by-hop headers out).
    pub fn answered(&mut self, response: Response<DrivenBody>) -> Answered {
        let at = self.at_backend.as_ref().expect("connected before it is answered");
        let elapsed = self.started.elapsed().as_secs_f64();
        let status = response.status();
        self.record.answered = Some((at.backend.clone(), at.method, status, elapsed));
        let (mut parts, body) = response.into_parts();
        let head = answer::head(&at.call, status, &mut parts);
        if matches!(head.kind, answer::Kind::Sse) {
            // A stream waits on no deadline: its connection holds no timer while it streams.
            if let Some(timer) = self.connection.timer {
                timer.release();
            }
        }
        Answered {
            parts,
            body: Some(body),
            head,
        }
    }

    /// The answer for the client, observed on its way: pins are in place before the client can
    /// read what needs them. A JSON answer's body comes read whole (`collected`, by the driver).
    pub fn answer(
        &mut self,
        answered: Answered,
        collected: Option<Result<read::Collected, read::CollectError>>,
    ) -> Result<Response<ProxyBody>, RouterError> {
        let Answered { mut parts, body, head } = answered;
        let forward = Forward {
            shared: self.shared,
            snap: &self.snap,
        };
        // Used where it lies, not moved out whole (its call alone is hundreds of bytes); only a
        // stream's body takes the call. Let go (the body budget's share with it) once the
        // answer's body is made.
        let at = self.at_backend.as_mut().expect("connected before it is answered");
        let guard = at.guard.take().expect("held until the answer");
        let body = match (collected, body) {
            (Some(collected), _) => answer::json(&forward, &at.call, &mut parts, head, collected, &at.backend, guard)?,
            (None, Some(body)) if matches!(head.kind, answer::Kind::Sse) => {
                let AtBackend { backend, call, .. } = self.at_backend.take().expect("connected before it is answered");
                answer::sse(&forward, call, &mut parts, head.pinned, body, &backend, guard)
            }
            (None, Some(body)) => answer::other(&forward, &at.call, &mut parts, head.pinned, body, &at.backend, guard),
            (None, None) => unreachable!("a JSON answer's body comes read whole"),
        };
        self.at_backend = None;
        Ok(Response::from_parts(parts, body))
    }
}

/// Whether a request of `method` other than POST is forwarded. CONNECT and TRACE are no MCP
/// methods. With `[auth]` or `[quotas]` on, neither is any method but the Streamable HTTP ones
/// (GET, DELETE) and HEAD and OPTIONS, nor one of those with a body: such a body would stream
/// to a backend unread, past the scopes and the tool quotas that a POST's body is judged by.
fn judge_method(method: &Method, body: &Incoming, snap: &Snapshot) -> Result<(), RouterError> {
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
fn unreadable(e: Unreadable) -> RouterError {
    match e {
        Unreadable::NotJson(_) => RouterError::Parse,
        Unreadable::Ambiguous(a) => RouterError::AmbiguousBody {
            key: a.key,
            why: match a.how {
                Reading::Twice => "it stands twice",
                Reading::Spelled => "it stands in another spelling",
                Reading::Shape => "its value is not of its shape",
            },
        },
    }
}

/// A copy of a request whose body was read whole (`None` for a streamed one).
fn copy_of(request: &Request<UpstreamBody>) -> Option<Box<Request<UpstreamBody>>> {
    let Either::Left(body) = request.body() else {
        return None;
    };
    let mut copy = Request::new(Either::Left(body.clone()));
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(Box::new(copy))
}
