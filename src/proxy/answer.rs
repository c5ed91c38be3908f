//! Observing a backend's answer: its head and each JSON-RPC message go to the call's lifecycle
//! (pins, sealing) before the client can read them; JSON answers are read whole for that, SSE
//! streams are split into events, anything else streams through untouched. Plain functions
//! over the caller's values: the one body to wait for (a JSON answer) is read by the caller,
//! so the answer's head and the call are never moved into a future of their own.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::response::Parts;
use http_body::Body;

use super::forward::{passive_failure, upstream_error_hook, Forward};
use super::headers::{scan_head, set_content_length, starts_with_ignore_case, strip_found, ContentLength, Stripped};
use super::read::{CollectError, Collected};
use crate::body::{MessageSink, ProxyBody};
use crate::calls::Call;
use crate::dialect::SESSION_HEADER;
use crate::error::RouterError;
use crate::sealing::Replacement;
use crate::upstream::{Backend, DrivenBody, InflightGuard};

/// What kind of body an answer has, as far as observing it goes.
pub(super) enum Kind {
    /// `text/event-stream`: observed event by event as it streams.
    Sse,
    /// A JSON answer to a JSON-RPC request: read whole before the client may have it.
    Json,
    /// Anything else: passed through.
    Other,
}

/// What the answer's head told.
pub(super) struct Head {
    pub kind: Kind,
    /// The head made a pin (a session).
    pub pinned: bool,
    /// What its `Content-Length` says (a JSON answer's is corrected if its body changes).
    length: ContentLength,
}

/// Observes the answer's head (session pins, hop-by-hop headers) and tells what its body is.
/// The headers it reads are found in the one pass `scan_head` makes.
pub(super) fn head(call: &Call, status: http::StatusCode, parts: &mut Parts) -> Head {
    let (mut content_type, mut session) = (None, None);
    let scan = scan_head(&parts.headers, |name, value| {
        // The first of each, as `HeaderMap::get` would find.
        if *name == header::CONTENT_TYPE && content_type.is_none() {
            content_type = Some(kind_of(value.as_bytes()));
        } else if *name == SESSION_HEADER && session.is_none() {
            session = Some(value.clone());
        }
    });
    let pinned = call.observe_head(status, &mut parts.headers, session);
    let Stripped { length, named } = strip_found(&mut parts.headers, scan);
    if named.contains(&header::CONTENT_TYPE) {
        // `Connection` made it hop-by-hop: the answer has no type, as if it came without one.
        content_type = None;
    }
    let kind = match content_type {
        Some(Kind::Sse) => Kind::Sse,
        Some(Kind::Json) if call.observes_body() => Kind::Json,
        _ => Kind::Other,
    };
    Head { kind, pinned, length }
}

/// The kind of body a `Content-Type` announces, before the call has a say.
fn kind_of(content_type: &[u8]) -> Kind {
    if starts_with_ignore_case(content_type, b"text/event-stream") {
        Kind::Sse
    } else if starts_with_ignore_case(content_type, b"application/json") {
        Kind::Json
    } else {
        Kind::Other
    }
}

/// An SSE answer's body: each event goes to the call before it goes out. Pins made mid-stream
/// cannot add headers any more, so the routing token is announced up front.
pub(super) fn sse(
    forward: &Forward<'_>,
    call: Call,
    parts: &mut Parts,
    pinned: bool,
    body: DrivenBody,
    backend: &Arc<Backend>,
    guard: InflightGuard,
) -> ProxyBody {
    if pinned || call.may_create_pin() {
        set_routing_token(&mut parts.headers, &call);
    }
    if forward.snap.sealing.is_some() || call.filters_list() {
        // Sealing, and cutting a list to the caller's scopes, change the length of events.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let sink: MessageSink = Box::new(move |msg: &[u8]| {
        call.keep_session_alive();
        call.tell_catalog(msg);
        let sealed = call.observe_message(msg).replacement;
        merge(sealed, call.filter_list(msg))
    });
    stream(forward, body, None, Some(sink), backend, guard)
}

/// A JSON answer's body once read whole (`collected`): pins made or finished by the message,
/// sealed handles in it, the routing token.
pub(super) fn json(
    forward: &Forward<'_>,
    call: &Call,
    parts: &mut Parts,
    head: Head,
    collected: Result<Collected, CollectError>,
    backend: &Arc<Backend>,
    guard: InflightGuard,
) -> Result<ProxyBody, RouterError> {
    let mut pinned = head.pinned;
    let body = match collected {
        Ok(Collected::Whole(bytes)) => {
            call.tell_catalog(&bytes);
            let seen = call.observe_message(&bytes);
            pinned |= seen.created || seen.continues;
            let bytes = match merge(seen.replacement, call.filter_list(&bytes)) {
                Some(r) => r.apply(&bytes).unwrap_or(bytes),
                None => bytes,
            };
            set_content_length(&mut parts.headers, head.length, bytes.len());
            ProxyBody::full(bytes)
        }
        Ok(Collected::Prefix(prefix, rest)) => stream(forward, rest, Some(prefix), None, backend, guard),
        Err(CollectError::Timeout) => return Err(forward.timed_out(backend)),
        Err(CollectError::Upstream) => {
            passive_failure(forward.shared, forward.snap, backend, "reset");
            return Err(RouterError::upstream_unavailable(&backend.name));
        }
    };
    if pinned {
        set_routing_token(&mut parts.headers, call);
    }
    Ok(body)
}

/// Any other answer's body, passed through.
pub(super) fn other(
    forward: &Forward<'_>,
    call: &Call,
    parts: &mut Parts,
    pinned: bool,
    body: DrivenBody,
    backend: &Arc<Backend>,
    guard: InflightGuard,
) -> ProxyBody {
    if pinned {
        set_routing_token(&mut parts.headers, call);
    }
    match body.is_end_stream() {
        true => ProxyBody::empty(),
        false => stream(forward, body, None, None, backend, guard),
    }
}

fn stream(
    forward: &Forward<'_>,
    body: DrivenBody,
    prefix: Option<bytes::Bytes>,
    sink: Option<MessageSink>,
    backend: &Arc<Backend>,
    guard: InflightGuard,
) -> ProxyBody {
    let idle = forward.snap.config.server.stream_idle_timeout;
    let on_error = Some(upstream_error_hook(forward.shared, backend));
    ProxyBody::stream(body, prefix, sink, idle, Some(guard), on_error)
}

/// The call's routing token in the answer's routing header, when tokens are on.
fn set_routing_token(headers: &mut HeaderMap, call: &Call) {
    let Some(token) = call.routing_token() else { return };
    if let Ok(v) = HeaderValue::from_str(&token) {
        headers.insert(call.routing_header().clone(), v);
    }
}

/// Both edits of one message (a handle sealed, a list cut), either, or none.
fn merge(a: Option<Replacement>, b: Option<Replacement>) -> Option<Replacement> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.merged(b)),
        (a, b) => a.or(b),
    }
}
