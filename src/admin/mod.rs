//! The admin listener: `/metrics`, `/healthz`, `/readyz` and `/debug/route`, the status page
//! (`status`, `ui`, `history`), and who may use which (`admin.token`, `admin.protect_reads`).

mod history;
mod status;
mod ui;

pub use status::{sample, Status};

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::auth::Resource;
use crate::body::ProxyBody;
use crate::dialect::{RequestHandles, Unreadable};
use crate::route;
use crate::state::Shared;
use crate::token::PrincipalTag;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// The body of an admin answer: a whole one, or the status page's event stream.
pub type AdminBody = Either<ProxyBody, status::Events>;

/// Answers one admin request: the status page's paths (`/`, `/ui/*`, `/api/*`), else
/// [`serve`]'s. `loopback`: the admin listener's address is a loopback one.
pub async fn answer(
    shared: &std::sync::Arc<Shared>,
    status: &std::sync::Arc<Status>,
    req: Request<Incoming>,
    loopback: bool,
) -> Response<AdminBody> {
    if loopback && !addressed_to_this_machine(&req) {
        // A page on a name whose DNS answer turns into 127.0.0.1 is same-origin with
        // whatever it reaches there: the browser's own rules cannot stop it, the name can.
        return reply(
            StatusCode::FORBIDDEN,
            "text/plain",
            "a loopback admin listener answers requests addressed to an IP address or localhost only\n",
        )
        .map(Either::Left);
    }
    match status::route(shared, status, &req, loopback).await {
        Some(answer) => answer,
        None => serve(shared, req, loopback).await.map(Either::Left),
    }
}

/// Sets the gauges `/metrics` sets before it renders (pins, the key set's age, the quotas'
/// tables), so the status document reads the same numbers.
fn refresh_gauges(shared: &Shared) {
    shared.update_pin_gauges();
    let age = shared.issuer_keys.age().map_or(0, |a| a.as_secs());
    shared.metrics.jwks_age.set(i64::try_from(age).unwrap_or(i64::MAX));
    let stats = shared.snapshot().quotas.as_ref().map(|q| q.stats()).unwrap_or_default();
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    shared.metrics.quota_callers.set(gauge(stats.tracked));
    shared.metrics.quota_tables_full.set(gauge(stats.full_tables));
}

/// Who may use an endpoint.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Anyone who reaches the listener: `/metrics`, `/healthz`, `/readyz` (Prometheus and
    /// probes carry no credential).
    Nothing,
    /// `/backends`, `/debug/route`: `admin.token` when `admin.protect_reads` is on.
    Read,
    /// `GET /catalog` (tool descriptions, as the status page's sensitive members): the rule
    /// of changes without the page-origin check (another site's page cannot read an answer).
    Sensitive,
    /// `POST /backends/*`: `admin.token`; with none configured, a loopback listener.
    Change,
}

/// Whether a request names this machine as its host (an IP address, `localhost` or a name
/// under `.localhost`), or names none: a browser always names the host of the page's URL.
fn addressed_to_this_machine<B>(req: &Request<B>) -> bool {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let (host, another) = (hosts.next(), hosts.next());
    if another.is_some() {
        return false;
    }
    // An absolute-form target's authority is the one that counts (RFC 9112, 3.2.2).
    let named = req
        .uri()
        .authority()
        .map(|a| a.as_str().as_bytes())
        .or(host.map(HeaderValue::as_bytes));
    let Some(authority) = named else { return true };
    let Ok(authority) = std::str::from_utf8(authority) else {
        return false;
    };
    let host = match authority.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let under_localhost = host
        .len()
        .checked_sub(".localhost".len())
        .filter(|&start| start > 0)
        .is_some_and(|start| host.as_bytes()[start..].eq_ignore_ascii_case(b".localhost"));
    host.parse::<std::net::Ipv4Addr>().is_ok() || host.eq_ignore_ascii_case("localhost") || under_localhost
}

/// Whether a browser sent the request from a page of another origin than this listener's: its
/// `Origin` (or, without one, `Sec-Fetch-Site`) names another host than the request's `Host`.
fn from_another_site(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).map(HeaderValue::as_bytes);
    match headers.get(header::ORIGIN).map(HeaderValue::as_bytes) {
        // `null` (a sandboxed or file page) is another site too.
        Some(origin) => {
            let authority = origin.split(|&b| b == b'/').nth(2);
            authority.is_none() || authority != host
        }
        None => headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() != b"same-origin"),
    }
}

/// The answer refusing a request that lacks what `need` asks, or `None` to serve it.
/// `loopback`: the admin listener's address is a loopback one.
fn refuse(shared: &Shared, headers: &HeaderMap, need: Need, loopback: bool) -> Option<Response<ProxyBody>> {
    if need == Need::Nothing {
        return None;
    }
    if need == Need::Change && from_another_site(headers) {
        // A page elsewhere can make a visiting browser send a POST here (to a loopback
        // listener without `admin.token`, nothing else would stop it): the browser says where
        // the page came from, and a change comes only from the admin listener's own page.
        return Some(reply(
            StatusCode::FORBIDDEN,
            "text/plain",
            "a change to the backends comes from the admin listener's own page, or from no page\n",
        ));
    }
    let snap = shared.snapshot();
    let admin = &snap.config.admin;
    let Some(secret) = &admin.token else {
        return match need {
            Need::Change if !loopback => Some(reply(
                StatusCode::FORBIDDEN,
                "text/plain",
                "set admin.token to change backends through an admin listener that is not on loopback\n",
            )),
            Need::Sensitive if !loopback => Some(reply(
                StatusCode::FORBIDDEN,
                "text/plain",
                "set admin.token to read the catalog through an admin listener that is not on loopback\n",
            )),
            _ => None,
        };
    };
    if need == Need::Read && !admin.protect_reads {
        return None;
    }
    let presented = headers.get(header::AUTHORIZATION).and_then(|v| bearer(v.as_bytes()));
    let challenge = match presented {
        Some(p) if secret.matches(p) => return None,
        Some(_) => "Bearer realm=\"mrtr-router admin\", error=\"invalid_token\"",
        None => "Bearer realm=\"mrtr-router admin\"",
    };
    let mut resp = reply(
        StatusCode::UNAUTHORIZED,
        "text/plain",
        "admin.token required: Authorization: Bearer <token>\n",
    );
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    Some(resp)
}

/// The secret of an `Authorization: Bearer <secret>` value (the scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Serves one admin request; `loopback`: the admin listener's address is a loopback one.
pub async fn serve(shared: &Shared, req: Request<Incoming>, loopback: bool) -> Response<ProxyBody> {
    let need = match (req.method(), req.uri().path()) {
        (&Method::POST, path) if path.starts_with("/backends/") => Need::Change,
        (_, "/backends" | "/debug/route") => Need::Read,
        (_, "/catalog") => Need::Sensitive,
        _ => Need::Nothing,
    };
    if let Some(refused) = refuse(shared, req.headers(), need, loopback) {
        return refused;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            refresh_gauges(shared);
            reply(StatusCode::OK, "text/plain; version=0.0.4", shared.metrics.render())
        }
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/readyz") => {
            let snap = shared.snapshot();
            if shared.shutting_down.load(Ordering::SeqCst) {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "shutting down\n")
            } else if snap.ring.is_empty() {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no backend available\n")
            } else if snap.auth.is_some() && shared.issuer_keys.current().is_none() {
                // Every request would be 503 auth_unavailable: no traffic until the keys are in.
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "the issuer's keys are not loaded yet\n",
                )
            } else {
                reply(StatusCode::OK, "text/plain", "ready\n")
            }
        }
        (&Method::GET | &Method::POST, "/debug/route") => debug_route(shared, req).await,
        (&Method::GET, "/backends") => backends(shared),
        (&Method::GET, "/catalog") => catalog(shared),
        (&Method::POST, path) if path.starts_with("/backends/") => {
            let rest = &path["/backends/".len()..];
            let (name, drained) = match rest.rsplit_once('/') {
                Some((name, "drain")) => (name, true),
                Some((name, "undrain")) => (name, false),
                _ => {
                    return reply(
                        StatusCode::NOT_FOUND,
                        "text/plain",
                        "use POST /backends/<name>/drain or /undrain\n",
                    )
                }
            };
            let name = percent_decode(name);
            if shared.set_admin_drained(&name, drained) {
                backends(shared)
            } else {
                reply(
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    format!("no serving backend named {name:?}\n"),
                )
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try / (the status page) /api/status /metrics /healthz /readyz /backends /catalog /debug/route?key=\n",
        ),
    }
}

/// The fleet's tools as the catalog knows them (docs/src/catalog.md).
fn catalog(shared: &Shared) -> Response<ProxyBody> {
    let snap = shared.snapshot();
    let Some(cfg) = &snap.config.catalog else {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "the catalog is off: [catalog] enabled = true turns it on\n",
        );
    };
    let doc = shared.catalog.document(cfg.lock.as_ref().map(|l| &l.lock));
    reply(StatusCode::OK, "application/json", format!("{doc:#}\n"))
}

/// Every backend with its state, for operators (and deploy scripts waiting for a drain).
fn backends(shared: &Shared) -> Response<ProxyBody> {
    let snap = shared.snapshot();
    let list: Vec<_> = shared
        .backend_states()
        .into_iter()
        .map(|(b, removed)| {
            json!({
                "name": &*b.name,
                "url": b.url(),
                "weight": b.weight(),
                "healthy": b.is_healthy(),
                "draining": removed || b.admin_drained.load(Ordering::Relaxed),
                "removed": removed,
                "on_ring": snap.ring.members().iter().any(|m| m.key == b.key),
                "inflight": b.inflight(),
                "pins": b.pins.load(Ordering::Relaxed),
            })
        })
        .collect();
    reply(
        StatusCode::OK,
        "application/json",
        format!("{:#}\n", json!({ "backends": list })),
    )
}

/// Explains how a request would be routed, without changing any pin. `?key=K` explains a
/// client key; a POST explains its own JSON body and MCP headers.
async fn debug_route(shared: &Shared, req: Request<Incoming>) -> Response<ProxyBody> {
    let snap = shared.snapshot();
    let (limit, timeout) = (snap.config.server.max_body_bytes, snap.config.admin.body_read_timeout);
    drop(snap);
    let query_key = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("key=")).map(percent_decode));
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return reply(StatusCode::PAYLOAD_TOO_LARGE, "text/plain", "body too large\n"),
        Err(_) => {
            return reply(
                StatusCode::REQUEST_TIMEOUT,
                "text/plain",
                "body not received within admin.body_read_timeout\n",
            )
        }
    };
    let bearer = parts.headers.get(EXPLAIN_BEARER_HEADER).and_then(|v| v.to_str().ok());
    let bearer = bearer.map(|t| t.strip_prefix("Bearer ").unwrap_or(t));
    match explain(shared, &parts.headers, query_key.as_deref(), bearer, &body) {
        Ok(out) => reply(StatusCode::OK, "application/json", format!("{out:#}\n")),
        Err(e) => reply(
            StatusCode::BAD_REQUEST,
            "text/plain",
            format!("body is not JSON: {e}\n"),
        ),
    }
}

/// The header of a `/debug/route` request that carries the access token to explain (the
/// request's own `Authorization` is the admin's).
pub const EXPLAIN_BEARER_HEADER: &str = "x-explain-bearer";

/// The JSON explanation of how a request with these headers and this JSON-RPC body (may be
/// empty) would be routed; `key`, when given, stands in the routing header. With `[auth]` on,
/// also what it would need and what `bearer` (if any) grants. Also printed by `mrtr-router route`.
pub fn explain(
    shared: &Shared,
    headers: &HeaderMap,
    key: Option<&str>,
    bearer: Option<&str>,
    body: &[u8],
) -> Result<Value, Unreadable> {
    let snap = shared.snapshot();
    let routing = &snap.config.routing;
    let body = Some(body).filter(|b| !b.is_empty());
    let mut handles = RequestHandles::read(headers, &routing.header, &routing.body_field, body)?;
    if let Some(k) = key {
        handles.set_header_key(k);
    }
    let found = json!({
        "method": handles.method,
        "client_key": handles.client_key(),
        "header_key": handles.header_key,
        "message_id": handles.message_id,
        "request_state": handles.request_state.as_ref().map(|s| format!("<{} bytes>", s.len())),
        "task_id": handles.task_id,
        "session_id": handles.session_id,
    });
    let (auth, tag) = match &snap.auth {
        Some(resource) => {
            let (auth, tag) = explain_auth(shared, resource, &handles, bearer);
            (Some(auth), tag)
        }
        None => (None, None),
    };
    let mut explained = match route::resolve(&snap, &shared.pins, &handles, tag.as_ref(), route::Lookup::Peek) {
        Ok((d, _)) => json!({
            "backend": &*d.backend.name,
            "url": d.backend.url(),
            "source": d.source.label(),
            "pin": d.matched.map(|m| json!({"kind": m.pin.kind.label(), "rounds": m.pin.rounds, "finished": m.pin.finished})),
            "pin_lost": d.pin_lost,
            "explanation": d.to_string(),
            "keys": found,
        }),
        Err(crate::error::RouterError::InvalidToken { reason }) => {
            json!({"error": "invalid_routing_token", "message": reason, "keys": found})
        }
        Err(e) => json!({"error": e.reason(), "message": e.to_string(), "keys": found}),
    };
    if let Some(auth) = auth {
        explained["auth"] = auth;
    }
    Ok(explained)
}

/// What `[auth]` would make of a request of `method` (and `tool`) with `bearer` (an access token),
/// checked against the keys in use now (an unknown key is not fetched for an explanation).
fn explain_auth(
    shared: &Shared,
    resource: &Resource,
    handles: &RequestHandles,
    bearer: Option<&str>,
) -> (Value, Option<PrincipalTag>) {
    let needed = resource.needed(handles.messages());
    let Some(bearer) = bearer else {
        return (json!({"needed_scopes": needed, "result": "missing"}), None);
    };
    let Some(keys) = shared.issuer_keys.current() else {
        return (json!({"needed_scopes": needed, "result": "jwks_unavailable"}), None);
    };
    match resource.policy.verify(bearer, &keys, std::time::SystemTime::now()) {
        Err(failure) => (
            json!({"needed_scopes": needed, "result": failure.result(), "why": failure.description()}),
            None,
        ),
        Ok(v) => {
            let missing: Vec<&str> = needed.iter().copied().filter(|s| !v.scopes.satisfies(s)).collect();
            let tag = v.principal().tag();
            let result = if missing.is_empty() { "ok" } else { "scope" };
            let explained = json!({
                "needed_scopes": needed,
                "result": result,
                "subject": v.subject,
                "client_id": v.client_id,
                "scopes": v.scopes.iter().collect::<Vec<_>>(),
                "missing_scopes": missing,
            });
            (explained, Some(tag))
        }
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addressed(host: &[u8]) -> bool {
        let req = Request::builder()
            .uri("/api/status")
            .header(header::HOST, HeaderValue::from_bytes(host).unwrap())
            .body(())
            .unwrap();
        addressed_to_this_machine(&req)
    }

    #[test]
    fn a_loopback_listener_knows_its_own_names() {
        for ok in [
            &b"127.0.0.1:9090"[..],
            b"127.0.0.1",
            b"[::1]:9090",
            b"localhost:9090",
            b"LOCALHOST.",
            b"ui.localhost:1",
        ] {
            assert!(addressed(ok), "{}", String::from_utf8_lossy(ok));
        }
        for refused in [
            &b"evil.example:9090"[..],
            b"127.0.0.1.nip.io",
            b"[::1",
            b"localhost.evil",
            b".localhost",
            b"\xe9.localhost",
            b"x\xc3\xa9localhost",
        ] {
            assert!(!addressed(refused), "{}", String::from_utf8_lossy(refused));
        }
        let no_host = Request::builder().uri("/metrics").body(()).unwrap();
        assert!(addressed_to_this_machine(&no_host));
        let h2 = Request::builder()
            .uri("http://evil.example:9090/metrics")
            .body(())
            .unwrap();
        assert!(!addressed_to_this_machine(&h2));
        let absolute = Request::builder()
            .uri("http://evil.example/api/status")
            .header(header::HOST, "localhost")
            .body(())
            .unwrap();
        assert!(!addressed_to_this_machine(&absolute));
        let two = Request::builder()
            .uri("/api/status")
            .header(header::HOST, "localhost")
            .header(header::HOST, "evil.example")
            .body(())
            .unwrap();
        assert!(!addressed_to_this_machine(&two));
    }
}
