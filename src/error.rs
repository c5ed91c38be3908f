//! The errors the router answers itself, and the one place that renders them (docs/src/errors.md).

use std::fmt::Write;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

/// Response header naming why the router answered itself.
pub const ROUTER_ERROR_HEADER: &str = "mcp-router-error";

/// The methods MCP's Streamable HTTP uses, named by the `Allow` of a 405.
pub const ALLOWED_METHODS: &str = "GET, HEAD, POST, DELETE, OPTIONS";

/// A request the router answers itself instead of forwarding. Its message (`Display`) is what
/// the client reads, so it never names a backend: the backend a variant carries goes to the
/// log, the access log, traces and metrics, and into the message only when the operator asks
/// (`server.errors_name_backends`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    #[error("request body is not valid JSON")]
    Parse,
    #[error("request body broke off before its end")]
    BodyBroken,
    #[error("request body is larger than max_body_bytes ({limit} bytes)")]
    BodyTooLarge { limit: usize },
    #[error("request body was not received within body_read_timeout")]
    BodyTimeout,
    #[error("request headers were not received within header_read_timeout")]
    HeaderTimeout,
    #[error("invalid routing token: {reason}")]
    InvalidToken { reason: &'static str },
    #[error("call {key:?} exceeded max_rounds ({max})")]
    TooManyRounds { key: String, max: u32 },
    #[error("pin table is full (max_pins = {max}); retry later")]
    PinCapacity { max: usize },
    #[error("the backend holding call {key:?} is unavailable; restart the call")]
    PinnedBackendUnavailable { key: String, backend: String },
    #[error("a routing header disagrees with the request body")]
    HeaderMismatch,
    /// A key the router reads stands twice in the body, or in another spelling: readers would
    /// disagree on the call it makes.
    #[error("the body reads two ways at `{key}` ({why}); refused so that every reader sees one call")]
    AmbiguousBody { key: &'static str, why: &'static str },
    #[error("this batch is refused: {why}")]
    BatchRefused { why: &'static str },
    #[error("the request path has a dot segment, an empty segment or an encoded separator; send it normalised")]
    InvalidPath,
    #[error("no healthy backend")]
    NoBackend,
    /// With `[catalog]` on: every backend known to expose the tool called is down or draining.
    #[error("no backend that serves tool {tool:?} is up; retry later")]
    ToolUnavailable { tool: String },
    /// With `[catalog] lock`: the tool's served definition is not the approved one.
    #[error("tool {tool:?} is served with a definition the lock does not approve; re-approve it with `mrtr-router catalog lock`")]
    ToolDefinitionChanged { tool: String },
    #[error("the router is out of local resources (file descriptors, memory); retry later")]
    Overloaded,
    /// A connection's or a caller's share of the body budget (`[quotas]
    /// max_body_bytes_per_connection`, `max_body_bytes_per_caller`) is full; `scope` says whose
    /// (`overflow`: the share callers past `max_tracked_callers` have together).
    #[error("the request bodies being read hold the whole {scope} share of the router's memory ({limit} bytes); retry later")]
    BodyShareFull { scope: &'static str, limit: usize },
    #[error("the backend has max_connections_per_backend requests in flight and none ended within queue_timeout; retry later")]
    UpstreamBusy { backend: String },
    #[error("the router does not forward {method} requests")]
    MethodNotAllowed { method: http::Method },
    /// With `[auth]` or `[quotas]` on, a GET, DELETE, HEAD or OPTIONS with a body.
    #[error("a {method} request carries no body here: only a POST's body is read and judged")]
    BodyNotAllowed { method: http::Method },
    #[error("the backend is unavailable")]
    UpstreamUnavailable { backend: String },
    #[error("the backend did not answer within upstream_timeout")]
    UpstreamTimeout { backend: String },
    #[error("TLS with the backend failed (handshake or certificate)")]
    UpstreamTls { backend: String },
    #[error("{}", .0.description.unwrap_or("a bearer access token is required"))]
    Unauthorized(Box<Challenge>),
    #[error("the access token lacks a scope this request needs")]
    InsufficientScope(Box<Challenge>),
    #[error("requests from this Origin are not accepted")]
    OriginNotAllowed,
    #[error("this handle was issued to another caller")]
    HandlePrincipalMismatch,
    /// With `[auth]` and `[tokens]` on, a handle of a kind the router seals came in the clear.
    #[error("this {kind} is not one the router issued: echo it as it was received")]
    HandleNotSealed { kind: &'static str },
    #[error("the authorization server's keys cannot be loaded; retry later")]
    AuthUnavailable,
    #[error("{}", .0.message())]
    QuotaExceeded(Box<QuotaRefusal>),
    #[error("the shared quota store cannot be reached; retry later")]
    QuotaStoreUnavailable,
}

/// The `quota` label of a body share's refusal (`mrtr_quota_refusals_total`), and its scopes.
pub const BODY_BYTES: &str = "body_bytes";
pub const BODY_SHARE_SCOPES: [&str; 3] = ["connection", "caller", "overflow"];

/// A request refused by a quota of its caller (docs/src/quotas.md): 429, never 401 or 403 (an
/// OAuth client re-authorizes on those).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRefusal {
    /// `rate_limited`, `too_many_in_flight` or `too_many_open_calls`.
    pub reason: &'static str,
    /// The `quota` and `scope` labels of `mrtr_quota_refusals_total`.
    pub quota: &'static str,
    pub scope: &'static str,
    pub retry_after_secs: u64,
    /// `RateLimit-Policy` and `RateLimit`, for a rate.
    pub rate_limit: Option<(String, String)>,
}

impl QuotaRefusal {
    fn code(&self) -> i32 {
        match self.reason {
            "rate_limited" => -32015,
            "too_many_in_flight" => -32016,
            _ => -32017,
        }
    }

    fn message(&self) -> &'static str {
        match self.reason {
            "rate_limited" => "this caller is over its rate of new calls; retry later",
            "too_many_in_flight" => "this caller has its quota of requests in flight; retry when one ends",
            _ => "this caller has its quota of open calls; finish one, or retry later",
        }
    }
}

/// What a 401 or a 403 `insufficient_scope` tells an OAuth client, in its `WWW-Authenticate`
/// (RFC 6750 §3, RFC 9728 §5.1): where the resource's metadata is, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// `invalid_token`, `invalid_request` or `insufficient_scope`; none when no bearer was sent.
    pub error: Option<&'static str>,
    pub description: Option<&'static str>,
    /// The scopes the request needs, space-separated (all of them, so one re-authorization is
    /// enough).
    pub scope: Option<String>,
    pub resource_metadata: Arc<str>,
    /// The `result` label of `mrtr_auth_total`.
    pub result: &'static str,
}

impl Challenge {
    fn header(&self) -> Option<HeaderValue> {
        let mut out = String::from("Bearer ");
        let mut attribute = |name: &str, value: &str| {
            if !out.ends_with(' ') {
                out.push_str(", ");
            }
            // The values are the router's own words and scopes (RFC 6749 §3.3): no `"`
            // or `\` to escape.
            let _ = write!(out, "{name}=\"{value}\"");
        };
        if let Some(e) = self.error {
            attribute("error", e);
        }
        if let Some(d) = self.description {
            attribute("error_description", d);
        }
        if let Some(s) = &self.scope {
            attribute("scope", s);
        }
        attribute("resource_metadata", &self.resource_metadata);
        HeaderValue::from_str(&out).ok()
    }
}

impl RouterError {
    pub fn upstream_unavailable(backend: &str) -> RouterError {
        RouterError::UpstreamUnavailable {
            backend: backend.to_string(),
        }
    }

    pub fn upstream_tls(backend: &str) -> RouterError {
        RouterError::UpstreamTls {
            backend: backend.to_string(),
        }
    }

    pub fn upstream_timeout(backend: &str) -> RouterError {
        RouterError::UpstreamTimeout {
            backend: backend.to_string(),
        }
    }

    /// `(HTTP status, JSON-RPC code, Mcp-Router-Error reason)` — the table of docs/src/errors.md.
    pub fn parts(&self) -> (StatusCode, i32, &'static str) {
        use RouterError::*;
        match self {
            // A body the client broke off or framed wrongly never becomes JSON either.
            Parse | BodyBroken => (StatusCode::BAD_REQUEST, -32700, "parse_error"),
            BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, -32600, "body_too_large"),
            BodyTimeout => (StatusCode::REQUEST_TIMEOUT, -32600, "body_timeout"),
            HeaderTimeout => (StatusCode::REQUEST_TIMEOUT, -32600, "header_timeout"),
            InvalidToken { .. } => (StatusCode::BAD_REQUEST, -32600, "invalid_routing_token"),
            TooManyRounds { .. } => (StatusCode::TOO_MANY_REQUESTS, -32000, "too_many_rounds"),
            PinCapacity { .. } => (StatusCode::TOO_MANY_REQUESTS, -32000, "pin_capacity"),
            PinnedBackendUnavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, -32001, "pinned_backend_unavailable"),
            HeaderMismatch => (StatusCode::BAD_REQUEST, -32020, "header_mismatch"),
            AmbiguousBody { .. } => (StatusCode::BAD_REQUEST, -32600, "ambiguous_body"),
            BatchRefused { .. } => (StatusCode::BAD_REQUEST, -32600, "batch_refused"),
            InvalidPath => (StatusCode::BAD_REQUEST, -32600, "invalid_path"),
            NoBackend => (StatusCode::SERVICE_UNAVAILABLE, -32002, "no_backend"),
            ToolUnavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, -32007, "tool_unavailable"),
            ToolDefinitionChanged { .. } => (StatusCode::CONFLICT, -32008, "tool_definition_changed"),
            Overloaded | BodyShareFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, -32005, "router_overloaded"),
            UpstreamBusy { .. } => (StatusCode::SERVICE_UNAVAILABLE, -32006, "upstream_busy"),
            MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, -32600, "method_not_allowed"),
            BodyNotAllowed { .. } => (StatusCode::BAD_REQUEST, -32600, "body_not_allowed"),
            UpstreamUnavailable { .. } => (StatusCode::BAD_GATEWAY, -32003, "upstream_unavailable"),
            UpstreamTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, -32004, "upstream_timeout"),
            UpstreamTls { .. } => (StatusCode::BAD_GATEWAY, -32003, "upstream_tls"),
            Unauthorized(_) => (StatusCode::UNAUTHORIZED, -32010, "unauthorized"),
            InsufficientScope(_) => (StatusCode::FORBIDDEN, -32011, "insufficient_scope"),
            OriginNotAllowed => (StatusCode::FORBIDDEN, -32012, "origin_not_allowed"),
            HandlePrincipalMismatch => (StatusCode::FORBIDDEN, -32013, "handle_principal_mismatch"),
            HandleNotSealed { .. } => (StatusCode::FORBIDDEN, -32019, "handle_not_sealed"),
            AuthUnavailable => (StatusCode::SERVICE_UNAVAILABLE, -32014, "auth_unavailable"),
            QuotaExceeded(q) => (StatusCode::TOO_MANY_REQUESTS, q.code(), q.reason),
            QuotaStoreUnavailable => (StatusCode::SERVICE_UNAVAILABLE, -32018, "quota_store_unavailable"),
        }
    }

    pub fn reason(&self) -> &'static str {
        self.parts().2
    }

    /// The `quota` and `scope` labels of a quota's refusal (`mrtr_quota_refusals_total`, the
    /// access log's `quota`); `None` for every other error.
    pub fn quota_labels(&self) -> Option<(&'static str, &'static str)> {
        match self {
            RouterError::QuotaExceeded(q) => Some((q.quota, q.scope)),
            RouterError::BodyShareFull { scope, .. } => Some((BODY_BYTES, scope)),
            _ => None,
        }
    }

    /// Every `Mcp-Router-Error` reason, e.g. to show each label value of
    /// `mrtr_router_errors_total` from the start.
    pub const REASONS: [&'static str; 32] = [
        "parse_error",
        "body_too_large",
        "body_timeout",
        "header_timeout",
        "invalid_routing_token",
        "too_many_rounds",
        "pin_capacity",
        "pinned_backend_unavailable",
        "header_mismatch",
        "ambiguous_body",
        "batch_refused",
        "invalid_path",
        "no_backend",
        "tool_unavailable",
        "tool_definition_changed",
        "router_overloaded",
        "upstream_busy",
        "method_not_allowed",
        "body_not_allowed",
        "upstream_unavailable",
        "upstream_timeout",
        "upstream_tls",
        "unauthorized",
        "insufficient_scope",
        "origin_not_allowed",
        "handle_principal_mismatch",
        "handle_not_sealed",
        "auth_unavailable",
        "rate_limited",
        "too_many_in_flight",
        "too_many_open_calls",
        "quota_store_unavailable",
    ];

    /// The `result` label of `mrtr_auth_total` for a refusal by `[auth]`.
    pub fn auth_result(&self) -> Option<&'static str> {
        use RouterError::*;
        match self {
            Unauthorized(c) | InsufficientScope(c) => Some(c.result),
            OriginNotAllowed => Some("origin"),
            HandlePrincipalMismatch | HandleNotSealed { .. } => Some("principal"),
            AuthUnavailable => Some("jwks_unavailable"),
            _ => None,
        }
    }

    /// The backend the error is about, if any.
    pub fn backend(&self) -> Option<&str> {
        use RouterError::*;
        match self {
            PinnedBackendUnavailable { backend, .. }
            | UpstreamBusy { backend }
            | UpstreamUnavailable { backend }
            | UpstreamTimeout { backend }
            | UpstreamTls { backend } => Some(backend),
            _ => None,
        }
    }

    /// Renders the JSON-RPC error answer, naming no backend. `id` is the request's raw JSON id,
    /// if known.
    pub fn to_response<B: From<Bytes>>(&self, id: Option<&str>, retry_after_secs: u64) -> Response<B> {
        self.render(id, retry_after_secs, false)
    }

    /// [`RouterError::to_response`], with the backend named in the message when `name_backend`.
    pub fn render<B: From<Bytes>>(&self, id: Option<&str>, retry_after_secs: u64, name_backend: bool) -> Response<B> {
        let (status, code, reason) = self.parts();
        let data = match self {
            RouterError::PinnedBackendUnavailable { key, .. } | RouterError::TooManyRounds { key, .. } => {
                format!(
                    ",\"data\":{{\"reason\":\"{reason}\",\"key\":{}}}",
                    serde_json::Value::from(key.as_str())
                )
            }
            RouterError::ToolUnavailable { tool } | RouterError::ToolDefinitionChanged { tool } => {
                format!(
                    ",\"data\":{{\"reason\":\"{reason}\",\"tool\":{}}}",
                    serde_json::Value::from(tool.as_str())
                )
            }
            RouterError::QuotaExceeded(q) => format!(
                ",\"data\":{{\"reason\":\"{reason}\",\"quota\":\"{}\",\"scope\":\"{}\",\"retry_after\":{}}}",
                q.quota, q.scope, q.retry_after_secs
            ),
            _ => format!(",\"data\":{{\"reason\":\"{reason}\"}}"),
        };
        let message = match self.backend().filter(|_| name_backend) {
            Some(backend) => format!("{self} (backend {backend})"),
            None => self.to_string(),
        };
        let message = serde_json::Value::from(message);
        let body = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{{\"code\":{code},\"message\":{message}{data}}}}}",
            id.unwrap_or("null")
        );
        let mut resp = Response::new(B::from(Bytes::from(body)));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(ROUTER_ERROR_HEADER, HeaderValue::from_static(reason));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        if status == StatusCode::METHOD_NOT_ALLOWED {
            h.insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
        }
        if let RouterError::QuotaExceeded(q) = self {
            h.insert(header::RETRY_AFTER, HeaderValue::from(q.retry_after_secs));
            if let Some((policy, state)) = &q.rate_limit {
                for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
                    if let Ok(v) = HeaderValue::from_str(value) {
                        h.insert(name, v);
                    }
                }
            }
        }
        if let RouterError::Unauthorized(c) | RouterError::InsufficientScope(c) = self {
            if let Some(v) = c.header() {
                h.insert(header::WWW_AUTHENTICATE, v);
            }
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn quota(reason: &'static str) -> QuotaRefusal {
        QuotaRefusal {
            reason,
            quota: "rate",
            scope: "caller",
            retry_after_secs: 2,
            rate_limit: Some(("\"caller\";q=10;w=1".into(), "\"caller\";r=0;t=2".into())),
        }
    }

    #[test]
    fn a_quota_is_429_with_when_to_retry() {
        let resp: Response<Full<Bytes>> =
            RouterError::QuotaExceeded(Box::new(quota("rate_limited"))).to_response(Some("7"), 1);
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = resp.headers();
        assert_eq!(
            (&h["retry-after"], &h["ratelimit-policy"], &h["ratelimit"]),
            (
                &"2".parse::<HeaderValue>().unwrap(),
                &"\"caller\";q=10;w=1".parse::<HeaderValue>().unwrap(),
                &"\"caller\";r=0;t=2".parse::<HeaderValue>().unwrap()
            )
        );
        assert!(!h.contains_key(header::WWW_AUTHENTICATE));
    }

    fn challenge() -> Challenge {
        Challenge {
            error: Some("insufficient_scope"),
            description: None,
            scope: Some("files:read files:write".into()),
            resource_metadata: "https://m.example/.well-known/oauth-protected-resource/mcp".into(),
            result: "scope",
        }
    }

    #[test]
    fn challenges_name_what_the_client_needs() {
        let resp: Response<Full<Bytes>> = RouterError::InsufficientScope(Box::new(challenge())).to_response(None, 1);
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            resp.headers()[header::WWW_AUTHENTICATE],
            "Bearer error=\"insufficient_scope\", scope=\"files:read files:write\", \
             resource_metadata=\"https://m.example/.well-known/oauth-protected-resource/mcp\""
        );
        let missing = Challenge {
            error: None,
            scope: None,
            result: "missing",
            ..challenge()
        };
        let resp: Response<Full<Bytes>> = RouterError::Unauthorized(Box::new(missing)).to_response(None, 1);
        assert_eq!(
            resp.headers()[header::WWW_AUTHENTICATE],
            "Bearer resource_metadata=\"https://m.example/.well-known/oauth-protected-resource/mcp\""
        );
        assert_eq!(
            RouterError::AuthUnavailable
                .to_response::<Full<Bytes>>(None, 3)
                .headers()[header::RETRY_AFTER],
            "3"
        );
    }

    /// One of each variant; the match has no wildcard, so a new variant fails to compile here
    /// until it is listed, and then `REASONS` must have its reason.
    fn one_of_each() -> Vec<RouterError> {
        use RouterError::*;
        let b = || "b".to_string();
        let all = vec![
            Parse,
            BodyBroken,
            BodyTooLarge { limit: 1 },
            BodyTimeout,
            HeaderTimeout,
            InvalidToken { reason: "x" },
            TooManyRounds { key: b(), max: 1 },
            PinCapacity { max: 1 },
            PinnedBackendUnavailable { key: b(), backend: b() },
            HeaderMismatch,
            AmbiguousBody {
                key: "method",
                why: "it stands twice",
            },
            BatchRefused { why: "x" },
            InvalidPath,
            NoBackend,
            ToolUnavailable { tool: b() },
            ToolDefinitionChanged { tool: b() },
            Overloaded,
            BodyShareFull {
                scope: "connection",
                limit: 1,
            },
            UpstreamBusy { backend: b() },
            MethodNotAllowed {
                method: http::Method::TRACE,
            },
            BodyNotAllowed {
                method: http::Method::GET,
            },
            UpstreamUnavailable { backend: b() },
            UpstreamTimeout { backend: b() },
            UpstreamTls { backend: b() },
            Unauthorized(Box::new(challenge())),
            InsufficientScope(Box::new(challenge())),
            OriginNotAllowed,
            HandlePrincipalMismatch,
            HandleNotSealed { kind: "session id" },
            AuthUnavailable,
            QuotaExceeded(Box::new(quota("rate_limited"))),
            QuotaExceeded(Box::new(quota("too_many_in_flight"))),
            QuotaExceeded(Box::new(quota("too_many_open_calls"))),
            QuotaStoreUnavailable,
        ];
        for e in &all {
            match e {
                Parse | BodyBroken | BodyTooLarge { .. } | BodyTimeout | HeaderTimeout | InvalidToken { .. } => {}
                TooManyRounds { .. } | PinCapacity { .. } | PinnedBackendUnavailable { .. } | HeaderMismatch => {}
                AmbiguousBody { .. } | BatchRefused { .. } | HandleNotSealed { .. } | InvalidPath => {}
                BodyNotAllowed { .. } | ToolUnavailable { .. } | ToolDefinitionChanged { .. } => {}
                NoBackend | Overloaded | BodyShareFull { .. } | UpstreamBusy { .. } | MethodNotAllowed { .. } => {}
                UpstreamUnavailable { .. } | UpstreamTimeout { .. } | UpstreamTls { .. } => {}
                Unauthorized(_) | InsufficientScope(_) | OriginNotAllowed | HandlePrincipalMismatch => {}
                AuthUnavailable | QuotaExceeded(_) | QuotaStoreUnavailable => {}
            }
        }
        all
    }

    #[test]
    fn reasons_lists_every_reason_once() {
        let mut seen: Vec<&str> = one_of_each().iter().map(RouterError::reason).collect();
        seen.sort();
        seen.dedup();
        let mut listed = RouterError::REASONS.to_vec();
        listed.sort();
        assert_eq!(seen, listed);
    }

    #[tokio::test]
    async fn renders_json_rpc_error_with_id() {
        let e = RouterError::PinnedBackendUnavailable {
            key: "k\"1".into(),
            backend: "b".into(),
        };
        let resp: Response<Full<Bytes>> = e.to_response(Some("7"), 2);
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "2");
        assert_eq!(resp.headers()[ROUTER_ERROR_HEADER], "pinned_backend_unavailable");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["code"], -32001);
        assert_eq!(v["error"]["data"]["key"], "k\"1");
    }
}
