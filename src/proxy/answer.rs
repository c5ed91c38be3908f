//! Observing a backend's answer: its head and each JSON-RPC message go to the call's lifecycle
//! (pins, sealing) before the client can read them; JSON answers are read whole for that, SSE
//! streams are split into events, anything else streams through untouched.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::Response;
use http_body::Body;

use super::forward::{passive_failure, upstream_error_hook, Forward};
use super::headers::{set_content_length, starts_with_ignore_case, strip_hop_by_hop};
use super::read::{CollectError, Collected};
use crate::body::{MessageSink, ProxyBody};
use crate::calls::Call;
use crate::error::RouterError;
use crate::upstream::{Backend, DrivenBody, InflightGuard};

/// What observing an answer's head decided.
pub(super) enum Observed {
    /// The client's answer, ready (streamed or empty).
    Ready(Response<ProxyBody>),
    /// A JSON answer to read whole before the client may have it (it holds the outcome).
    Json(JsonAnswer),
}

/// A JSON answer whose head is observed and whose body is still to read.
pub(super) struct JsonAnswer {
    parts: http::response::Parts,
    /// Taken by the caller to read it (`read::collect_json`).
    pub body: Option<DrivenBody>,
    call: Call,
    pinned: bool,
    guard: InflightGuard,
}

/// Observes the head of the backend's `resp` to a request of `call`: session pins, the routing
/// token of a stream, which kind of body it is. `guard` keeps the request in flight until a
/// streamed body ends. Not `async`: the one body to wait for (a JSON answer) is read by the
/// caller, so no second future of this size sits inside the request's.
pub(super) fn observe(
    forward: &Forward<'_>,
    call: Call,
    resp: Response<DrivenBody>,
    backend: &Arc<Backend>,
    guard: InflightGuard,
) -> Observed {
    let (shared, snap) = (forward.shared, forward.snap);
    let status = resp.status();
    let (mut parts, body) = resp.into_parts();
    let pinned = call.observe_head(status, &mut parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .map_or(&b""[..], |v| v.as_bytes());
    let is_sse = starts_with_ignore_case(content_type, b"text/event-stream");
    let is_json = starts_with_ignore_case(content_type, b"application/json");
    let idle = snap.config.server.stream_idle_timeout;
    let stream = |body, prefix, sink, guard| {
        let on_error = Some(upstream_error_hook(shared, backend));
        ProxyBody::stream(body, prefix, sink, idle, Some(guard), on_error)
    };
    if is_sse {
        // Pins made mid-stream cannot add headers any more: announce the token up front.
        if pinned || call.may_create_pin() {
            set_routing_token(&mut parts.headers, &call);
        }
        if snap.sealing.is_some() {
            // Sealing changes the length of events.
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        let sink: MessageSink = Box::new(move |msg: &[u8]| {
            call.keep_session_alive();
            call.observe_message(msg).replacement
        });
        return Observed::Ready(Response::from_parts(parts, stream(body, None, Some(sink), guard)));
    }
    if is_json && call.observes_body() {
        return Observed::Json(JsonAnswer {
            parts,
            body: Some(body),
            call,
            pinned,
            guard,
        });
    }
    let body = match body.is_end_stream() {
        true => ProxyBody::empty(),
        false => stream(body, None, None, guard),
    };
    if pinned {
        set_routing_token(&mut parts.headers, &call);
    }
    Observed::Ready(Response::from_parts(parts, body))
}

impl JsonAnswer {
    /// The client's answer once the body was read (`collected`): pins made or finished by the
    /// message, sealed handles in it, the routing token.
    pub(super) fn finish(
        mut self,
        collected: Result<Collected, CollectError>,
        forward: &Forward<'_>,
        backend: &Arc<Backend>,
    ) -> Result<Response<ProxyBody>, RouterError> {
        let body = match collected {
            Ok(Collected::Whole(bytes)) => {
                let seen = self.call.observe_message(&bytes);
                self.pinned |= seen.created;
                let bytes = match seen.replacement {
                    Some(r) => r.apply(&bytes).unwrap_or(bytes),
                    None => bytes,
                };
                set_content_length(&mut self.parts.headers, bytes.len());
                ProxyBody::full(bytes)
            }
            Ok(Collected::Prefix(prefix, rest)) => {
                let idle = forward.snap.config.server.stream_idle_timeout;
                let on_error = Some(upstream_error_hook(forward.shared, backend));
                ProxyBody::stream(rest, Some(prefix), None, idle, Some(self.guard), on_error)
            }
            Err(CollectError::Timeout) => return Err(forward.timed_out(backend)),
            Err(CollectError::Upstream) => {
                passive_failure(forward.shared, forward.snap, backend, "reset");
                return Err(RouterError::upstream_unavailable(&backend.name));
            }
        };
        if self.pinned {
            set_routing_token(&mut self.parts.headers, &self.call);
        }
        Ok(Response::from_parts(self.parts, body))
    }
}

/// The call's routing token in the answer's routing header, when tokens are on.
fn set_routing_token(headers: &mut HeaderMap, call: &Call) {
    let Some(token) = call.routing_token() else { return };
    if let Ok(v) = HeaderValue::from_str(&token) {
        headers.insert(call.routing_header().clone(), v);
    }
}
