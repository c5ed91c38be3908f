//! The `[quotas]` phase of a request (docs/src/quotas.md): who the caller is, and whether its
//! share of the router lets the request in. A call is admitted once, at its first request:
//! a follow-up (a handle the router verified, or a pin it holds) is never refused by a rate,
//! so no limiter strands a call half-way on its worker; it does count in flight. Without
//! `[quotas]` none of it runs.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue};

use crate::dialect::RequestKeys;
use crate::error::{QuotaRefusal, RouterError};
use crate::quotas::{Admission, CallerKey, NotAdmitted, Quotas, Request};
use crate::token::PrincipalTag;

/// What the request asks of its caller's quotas.
pub struct Ask<'a> {
    pub keys: &'a RequestKeys<'a>,
    /// The request continues a call the router knows (a verified handle, or a pin).
    pub follow_up: bool,
    /// `params.name` of a `tools/call`, when a tool has quotas of its own.
    pub tool: Option<&'a str>,
}

/// The request's caller: `peer` is the connection's client address (the PROXY header's source
/// when there was one), `principal` the tag of the principal `[auth]` verified.
pub fn caller(quotas: &Quotas, headers: &HeaderMap, peer: &HeaderValue, principal: Option<&PrincipalTag>) -> CallerKey {
    let peer = peer
        .to_str()
        .ok()
        .and_then(|p| p.parse::<IpAddr>().ok())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    quotas.caller(principal, headers, peer)
}

/// Admits the request, or refuses it 429 with when to retry.
pub async fn admit(quotas: &Quotas, caller: CallerKey, ask: Ask<'_>) -> Result<Admission, RouterError> {
    let request = Request {
        tool: ask.tool.filter(|_| ask.keys.method.as_deref() == Some("tools/call")),
        new_call: !ask.follow_up,
        may_open_call: ask.keys.may_create_pin(),
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
