//! Observing a backend's answer: its head and each JSON-RPC message go to the call's lifecycle
//! (pins, sealing) before the client can read them; JSON answers are read whole for that, SSE
//! streams are split into events, anything else streams through untouched.

use std::pin::Pin;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::Response;
use http_body::Body;
use tokio::time::Sleep;

use super::forward::{passive_failure, upstream_error_hook, Forward};
use super::headers::{set_content_length, starts_with_ignore_case, strip_hop_by_hop};
use super::read::{collect_json, CollectError, Collected};
use crate::body::{MessageSink, ProxyBody};
use crate::calls::Call;
use crate::error::RouterError;
use crate::upstream::{Backend, DrivenBody, InflightGuard};

/// The client's answer from the backend's `resp` to a request of `call`: `guard` keeps the
/// request in flight until a streamed body ends; `timer` is the request's upstream deadline.
pub(super) async fn observe(
    forward: &Forward<'_>,
    call: Call,
    resp: Response<DrivenBody>,
    backend: &Arc<Backend>,
    guard: InflightGuard,
    mut timer: Pin<&mut Sleep>,
) -> Result<Response<ProxyBody>, RouterError> {
    let (shared, snap) = (forward.shared, forward.snap);
    let status = resp.status();
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
            Some(upstream_error_hook(shared, backend)),
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
                Some(upstream_error_hook(shared, backend)),
            ),
            Err(CollectError::Timeout) => return Err(forward.timed_out(backend)),
            Err(CollectError::Upstream) => {
                passive_failure(shared, snap, backend, "reset");
                return Err(RouterError::upstream_unavailable(&backend.name));
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
            Some(upstream_error_hook(shared, backend)),
        )
    };
    if let (true, Some(s)) = (pinned, &snap.sealing) {
        // Any replica routes a client that echoes this straight to this backend.
        if let Ok(v) = HeaderValue::from_str(&s.routing_token(&backend.name)) {
            resp_parts.headers.insert(snap.config.routing.header.clone(), v);
        }
    }
    Ok(Response::from_parts(resp_parts, body))
}
