//! The `[quotas]` phase of a request (docs/src/quotas.md): who the caller is, and whether its
//! share of the router lets the request in. A call is admitted once, at its first request:
//! a follow-up (a handle the router verified, or a pin it holds) is never refused by a rate,
//! so no limiter strands a call half-way on its worker; it does count in flight. Without
//! `[quotas]` none of it runs.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue};

use crate::dialect::RequestHandles;
use crate::error::{QuotaRefusal, RouterError};
use crate::quotas::{Admission, CallerKey, NotAdmitted, Quotas, Request};
use crate::token::PrincipalTag;

/// What the request asks of its caller's quotas.
pub struct Ask<'a> {
    pub handles: &'a RequestHandles<'a>,
    /// The request continues a call under way (`route::is_follow_up`).
    pub follow_up: bool,
    /// A `DELETE` that ends a session: it starts nothing, and frees what the quotas guard.
    pub ends_a_session: bool,
}

/// The request's caller: `peer` is the connection's client address (the PROXY header's source
/// when there was one), `principal` the tag of the principal `[auth]` verified.
pub fn caller(quotas: &Quotas, headers: &HeaderMap, peer: &HeaderValue, principal: Option<&PrincipalTag>) -> CallerKey {
    quotas.caller(principal, headers, peer_ip(peer))
}

/// The client IP the quotas see (for the access log): the peer, or the `X-Forwarded-For` hop a
/// trusted proxy added.
pub fn client_ip(quotas: &Quotas, headers: &HeaderMap, peer: &HeaderValue) -> IpAddr {
    quotas.client_ip(headers, peer_ip(peer))
}

fn peer_ip(peer: &HeaderValue) -> IpAddr {
    peer.to_str()
        .ok()
        .and_then(|p| p.parse::<IpAddr>().ok())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Admits the request, or refuses it 429 with when to retry.
pub async fn admit(quotas: &Quotas, caller: CallerKey, ask: Ask<'_>) -> Result<Admission, RouterError> {
    // Each `tools/call`'s tool, when a tool has quotas of its own (a batch may call several).
    let tools: Vec<&str> = match quotas.names_tools() {
        true => ask
            .handles
            .messages()
            .filter(|(method, _)| *method == Some("tools/call"))
            .filter_map(|(_, tool)| tool)
            .collect(),
        false => Vec::new(),
    };
    let request = Request {
        tools: &tools,
        new_calls: match ask.follow_up || ask.ends_a_session {
            true => 0,
            false => ask.handles.messages().count() as u32,
        },
        may_open_call: ask.handles.may_create_pin(),
    };
    quotas
        .admit(caller, &request, Instant::now())
        .await
        .map_err(|e| match e {
            NotAdmitted::StoreUnavailable => RouterError::QuotaStoreUnavailable,
            NotAdmitted::Refused(refused) => RouterError::QuotaExceeded(Box::new(QuotaRefusal {
                reason: refused.quota.reason(),
                quota: refused.quota.label(),
                scope: refused.scope.label(),
                retry_after_secs: refused.retry_after_secs(),
                rate_limit: refused.rate_limit_headers(),
            })),
        })
}
