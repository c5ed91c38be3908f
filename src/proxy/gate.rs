//! The `[auth]` phases of a request (docs/src/authorization.md): who calls, from the head alone
//! and before any body is read (`authenticate`: the `Origin`, the public paths, the bearer
//! token), and whether the call may do what its body asks (`authorize`: the scopes of its
//! method and tool). Then what backends receive instead of the token (`forward_identity`).
//! Without `[auth]` none of it runs.

use std::sync::Arc;
use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;

use crate::auth::{AuthFailure, Caller, Resource};
use crate::config::{AuthConfig, Forward};
use crate::dialect::RequestKeys;
use crate::error::{Challenge, RouterError};
use crate::state::Shared;

/// What every identity header's name starts with: any such header a client sent is removed.
const IDENTITY_PREFIX: &str = "x-mcp-auth-";

/// Authenticates a request from its head: `Ok(None)` for a public path (no token checked).
pub async fn authenticate(
    shared: &Shared,
    cfg: &AuthConfig,
    resource: &Resource,
    parts: &Parts,
) -> Result<Option<Arc<Caller>>, RouterError> {
    if let Some(origin) = parts.headers.get(header::ORIGIN) {
        if !cfg.allowed_origins.iter().any(|o| o.as_bytes() == origin.as_bytes()) {
            return Err(RouterError::OriginNotAllowed);
        }
    }
    let path = parts.uri.path();
    if cfg.public_paths.iter().any(|p| is_under(path, p)) {
        return Ok(None);
    }
    let refuse = |error, description, result| {
        RouterError::Unauthorized(Box::new(Challenge {
            error,
            description,
            scope: resource.required(),
            resource_metadata: resource.metadata_url.clone(),
            result,
        }))
    };
    if parts.uri.query().is_some_and(names_a_token) {
        return Err(refuse(
            Some("invalid_request"),
            Some("the access token goes in the Authorization header, never in the URL"),
            "invalid",
        ));
    }
    let mut values = parts.headers.get_all(header::AUTHORIZATION).iter();
    let token = match (values.next().map(bearer), values.next()) {
        (None, _) => return Err(refuse(None, None, "missing")),
        (Some(_), Some(_)) => {
            return Err(refuse(
                Some("invalid_request"),
                Some("more than one Authorization header"),
                "invalid",
            ))
        }
        (Some(None), None) => return Err(refuse(None, None, "missing")),
        (Some(Some(token)), None) => token,
    };
    let Some(keys) = shared.auth_keys.current() else {
        return Err(RouterError::AuthUnavailable);
    };
    let now = SystemTime::now();
    if let Some(caller) = resource.tokens.get(token, &keys, now) {
        return Ok(Some(caller));
    }
    let (verified, keys) = match resource.policy.verify(token, &keys, now) {
        Err(AuthFailure::UnknownKey { .. }) => match shared.auth_keys.refetch(cfg, &keys).await {
            // The issuer may have rotated its keys: once more with the set fetched now.
            Some(fresh) => (resource.policy.verify(token, &fresh, now), fresh),
            None => (resource.policy.verify(token, &keys, now), keys),
        },
        verified => (verified, keys),
    };
    let verified =
        verified.map_err(|failure| refuse(Some("invalid_token"), Some(failure.description()), failure.result()))?;
    let expires_at = verified.expires_at;
    let caller = Arc::new(Caller::new(verified));
    resource.tokens.put(token, &keys, caller.clone(), expires_at, now);
    Ok(Some(caller))
}

/// Checks that `caller`'s scopes cover what the request needs: for each of its messages (a
/// batch's every element), the JSON-RPC method's and, for `tools/call`, the tool's (read from
/// the verified body, never from `Mcp-Name` alone). A refusal names every scope the whole
/// request needs, so one re-authorization is enough.
pub fn authorize(resource: &Resource, caller: &Caller, keys: &RequestKeys) -> Result<(), RouterError> {
    let needed = resource.needed(keys.messages());
    if needed.iter().all(|s| caller.verified.scopes.satisfies(s)) {
        return Ok(());
    }
    Err(RouterError::InsufficientScope(Box::new(Challenge {
        error: Some("insufficient_scope"),
        description: Some("the access token lacks a scope this request needs"),
        scope: Some(needed.join(" ")),
        resource_metadata: resource.metadata_url.clone(),
        result: "scope",
    })))
}

/// What goes to the backend instead of the client's credentials: the `Authorization` header
/// removed (unless `forward = "passthrough"`), identity headers only as the router sets them.
/// Written by the phase that builds the upstream request, after the hop-by-hop removal.
#[derive(Clone, Copy)]
pub struct Identity<'a> {
    pub cfg: &'a AuthConfig,
    /// `None` on a public path.
    pub caller: Option<&'a Caller>,
}

impl Identity<'_> {
    pub fn write(self, headers: &mut HeaderMap) {
        let Identity { cfg, caller } = self;
        if cfg.forward == Forward::Strip {
            headers.remove(header::AUTHORIZATION);
        }
        let claimed: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().starts_with(IDENTITY_PREFIX))
            .cloned()
            .collect();
        for name in claimed {
            headers.remove(name);
        }
        let Some(caller) = caller.filter(|_| cfg.identity_headers) else {
            return;
        };
        for (name, value) in &caller.identity {
            if let Some(value) = value {
                headers.insert(HeaderName::from_static(name), value.clone());
            }
        }
    }
}

/// The metadata document's answer.
pub fn metadata(resource: &Arc<Resource>) -> http::Response<bytes::Bytes> {
    let mut resp = http::Response::new(resource.metadata.clone());
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    resp
}

/// `Bearer <token>` → the token; the scheme is case-insensitive (RFC 7235 §2.1).
fn bearer(value: &HeaderValue) -> Option<&str> {
    let text = value.to_str().ok()?;
    let (scheme, token) = text.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether a query string carries an access token (RFC 6750 §2.3's `access_token`).
fn names_a_token(query: &str) -> bool {
    query.split('&').any(|pair| {
        pair.split('=')
            .next()
            .is_some_and(|k| k.eq_ignore_ascii_case("access_token"))
    })
}

/// A public path: exact, or a prefix when it ends in `*`.
fn is_under(path: &str, public: &str) -> bool {
    match public.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == public,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header_form_only() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(bearer(&v("Bearer abc.def.ghi")), Some("abc.def.ghi"));
        assert_eq!(bearer(&v("bearer  abc")), Some("abc"));
        assert_eq!(bearer(&v("Basic dXNlcjpw")), None);
        assert_eq!(bearer(&v("Bearer")), None);
        assert_eq!(bearer(&v("Bearer ")), None);
        assert!(names_a_token("a=1&access_token=x"));
        assert!(names_a_token("ACCESS_TOKEN"));
        assert!(!names_a_token("access_token_hint=1&x=access_token"));
        assert!(is_under("/health/live", "/health/*"));
        assert!(is_under("/status", "/status"));
        assert!(!is_under("/status/x", "/status"));
    }
}
