//! The `[auth]` phases of a request (docs/src/authorization.md): who calls, from the head alone
//! and before any body is read (`authenticate`: the `Origin`, the public paths, the bearer, as
//! the access token is called here), and whether the call may do what its body asks
//! (`authorize`: the scopes of its method and tool). Then what backends receive instead of the
//! bearer (`forward_identity`).
//! Without `[auth]` none of it runs.

use std::sync::Arc;
use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;

use crate::auth::{AuthFailure, Caller, Resource};
use crate::config::{AuthConfig, Forward};
use crate::dialect::RequestHandles;
use crate::error::{Challenge, RouterError};
use crate::state::Shared;

/// What every identity header's name starts with: any such header a client sent is removed.
const IDENTITY_PREFIX: &str = "x-mcp-auth-";

/// Authenticates a request from its head: `Ok(None)` for a public path (no bearer checked).
pub async fn authenticate(
    shared: &Shared,
    cfg: &AuthConfig,
    resource: &Resource,
    parts: &Parts,
) -> Result<Option<Arc<Caller>>, RouterError> {
    // Every `Origin` a request carries is judged: a reader may take any one of them.
    for origin in parts.headers.get_all(header::ORIGIN) {
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
    if names_a_bearer(&parts.uri) {
        return Err(refuse(
            Some("invalid_request"),
            Some("the access token goes in the Authorization header, never in the URL"),
            "invalid",
        ));
    }
    let mut values = parts.headers.get_all(header::AUTHORIZATION).iter();
    let bearer = match (values.next().map(bearer_of), values.next()) {
        (None, _) => return Err(refuse(None, None, "missing")),
        (Some(_), Some(_)) => {
            return Err(refuse(
                Some("invalid_request"),
                Some("more than one Authorization header"),
                "invalid",
            ))
        }
        (Some(None), None) => return Err(refuse(None, None, "missing")),
        (Some(Some(bearer)), None) => bearer,
    };
    let Some(keys) = shared.issuer_keys.current() else {
        return Err(RouterError::AuthUnavailable);
    };
    let now = SystemTime::now();
    if let Some(caller) = resource.bearers.get(bearer, &keys, now) {
        return Ok(Some(caller));
    }
    let (verified, keys) = match resource.policy.verify(bearer, &keys, now) {
        Err(AuthFailure::UnknownKey { .. }) => match shared.issuer_keys.refetch(cfg, &keys).await {
            // The issuer may have rotated its keys: once more with the set fetched now.
            Some(fresh) => (resource.policy.verify(bearer, &fresh, now), fresh),
            None => (resource.policy.verify(bearer, &keys, now), keys),
        },
        verified => (verified, keys),
    };
    let verified =
        verified.map_err(|failure| refuse(Some("invalid_token"), Some(failure.description()), failure.result()))?;
    let expires_at = verified.expires_at;
    let caller = Arc::new(Caller::new(verified));
    resource.bearers.put(bearer, &keys, caller.clone(), expires_at, now);
    Ok(Some(caller))
}

/// Checks that `caller`'s scopes cover what the request needs: for each of its messages (a
/// batch's every element), the JSON-RPC method's and, for `tools/call`, the tool's (read from
/// the verified body, never from `Mcp-Name` alone). A refusal names every scope the whole
/// request needs, so one re-authorization is enough.
pub fn authorize(resource: &Resource, caller: &Caller, handles: &RequestHandles) -> Result<(), RouterError> {
    let needed = resource.needed(handles.messages());
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
        let claimed: Vec<HeaderName> = headers.keys().filter(|n| claims_identity(n)).cloned().collect();
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

/// Whether a client's header could be taken for an identity header: `X-Mcp-Auth-*` in any case,
/// and spelled with `_` or `.` for `-` (CGI and WSGI servers, and some proxies, map `_` to `-`).
fn claims_identity(name: &HeaderName) -> bool {
    let name = name.as_str().as_bytes();
    name.len() >= IDENTITY_PREFIX.len()
        && name
            .iter()
            .zip(IDENTITY_PREFIX.as_bytes())
            .all(|(&c, &p)| c == p || (p == b'-' && matches!(c, b'_' | b'.')))
}

/// The metadata document's answer.
pub fn metadata(resource: &Arc<Resource>) -> http::Response<bytes::Bytes> {
    let mut resp = http::Response::new(resource.metadata.clone());
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    resp
}

/// `Bearer <access token>` → the bearer; the scheme is case-insensitive (RFC 7235 §2.1).
fn bearer_of(value: &HeaderValue) -> Option<&str> {
    let text = value.to_str().ok()?;
    let (scheme, bearer) = text.split_once(' ')?;
    let bearer = bearer.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !bearer.is_empty()).then_some(bearer)
}

/// Whether a URI carries an access token (RFC 6750 §2.3's `access_token`): a parameter of the
/// query (split at `&` or `;`) or of a path segment (after its `;`), named `access_token` in any
/// case, percent-encoded or not, or `access_token[…]` as some frameworks read arrays.
fn names_a_bearer(uri: &http::Uri) -> bool {
    let query = uri.query().into_iter().flat_map(|q| q.split(['&', ';']));
    let path_params = uri.path().split('/').flat_map(|segment| segment.split(';').skip(1));
    query.chain(path_params).any(|pair| {
        let key = percent_decoded(pair.split('=').next().unwrap_or(""));
        let key = key.as_bytes();
        let name = b"access_token";
        key.len() >= name.len()
            && key[..name.len()].eq_ignore_ascii_case(name)
            && matches!(key.get(name.len()), None | Some(b'['))
    })
}

/// `text` with its `%XX` escapes decoded (a malformed one kept as it is); bytes that are not
/// UTF-8 become U+FFFD.
fn percent_decoded(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('%') {
        return std::borrow::Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
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
    fn bearers_are_read_from_the_header_form_only() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(bearer_of(&v("Bearer abc.def.ghi")), Some("abc.def.ghi"));
        assert_eq!(bearer_of(&v("bearer  abc")), Some("abc"));
        assert_eq!(bearer_of(&v("Basic dXNlcjpw")), None);
        assert_eq!(bearer_of(&v("Bearer")), None);
        assert_eq!(bearer_of(&v("Bearer ")), None);
        let uri = |u: &'static str| http::Uri::from_static(u);
        for carries in [
            "/mcp?a=1&access_token=x",
            "/mcp?ACCESS_TOKEN",
            "/mcp?%61ccess_token=x",
            "/mcp?access%5Ftoken=x",
            "/mcp?access_token[]=x",
            "/mcp?x=1;access_token=x",
            "/mcp;access_token=x",
            "/a;b=1;Access_Token=x/mcp",
        ] {
            assert!(names_a_bearer(&uri(carries)), "{carries}");
        }
        for not in [
            "/mcp?access_token_hint=1&x=access_token",
            "/mcp",
            "/mcp?a=%zz",
            "/access_token",
        ] {
            assert!(!names_a_bearer(&uri(not)), "{not}");
        }
        assert!(is_under("/health/live", "/health/*"));
        assert!(is_under("/status", "/status"));
        assert!(!is_under("/status/x", "/status"));
    }
}
