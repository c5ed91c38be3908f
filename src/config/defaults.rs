//! Every default and every fixed limit in one place, so the docs, `check` and the code agree.

use std::time::Duration;

pub const LISTEN: &str = "127.0.0.1:8080";
pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(300);
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// MCP streams idle between events: a shorter stream idle limit would cut live streams.
pub const MIN_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub const MAX_HEADERS: usize = 100;
/// Client connections open at once (and never more than the open-file limit allows, see
/// `server::limits`).
pub const MAX_CONNECTIONS: usize = 10_000;
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Request-body bytes held at once across all connections while POST bodies are read: 256
/// bodies of the default `max_body_bytes`.
pub const MAX_BODY_BUFFER_BYTES: usize = 256 * 1024 * 1024;
/// A connection's share of the body budget without `[quotas] max_body_bytes_per_connection`:
/// a sixteenth of it (16 MiB of the default), and never less than one whole body.
pub fn connection_body_share(max_body_bytes: usize, max_body_buffer_bytes: usize) -> usize {
    (max_body_buffer_bytes / 16)
        .max(max_body_bytes)
        .min(max_body_buffer_bytes)
}
pub const ERRORS_NAME_BACKENDS: bool = false;
/// The admin listener's own limits: Prometheus, probes and operators need few connections.
pub const ADMIN_PROTECT_READS: bool = false;
pub const ADMIN_MAX_CONNECTIONS: usize = 64;
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
pub const ADMIN_BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
pub const ROUTING_HEADER: &str = "Mcp-Routing-Id";
pub const BODY_FIELD: &str = "messageId";
pub const VIRTUAL_NODES: usize = 160;
pub const LOAD_FACTOR: f64 = 0.0;
pub const PIN_IDLE_TTL: Duration = Duration::from_secs(600);
pub const SESSION_IDLE_TTL: Duration = Duration::from_secs(3600);
pub const TASK_IDLE_TTL: Duration = Duration::from_secs(3600);
pub const REPLAY_WINDOW: Duration = Duration::from_secs(60);
pub const MAX_ROUNDS: u32 = 32;
pub const MAX_PINS: usize = 1_000_000;
pub const ON_PIN_LOST: &str = "strict";
/// `upstream.retry`: retries of what cannot have changed state.
pub const UPSTREAM_RETRY: &str = "idempotent";
/// `upstream.retry_budget`: retries at most this share of requests over the last 10 s.
pub const RETRY_BUDGET: f64 = 0.2;
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
pub const RETRY_AFTER_SECS: u64 = 1;
pub const WEIGHT: u32 = 1;
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
pub const HEALTH_PATH: &str = "";
pub const UNHEALTHY_AFTER: u32 = 3;
pub const HEALTHY_AFTER: u32 = 2;
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(5);
pub const DISCOVERY_SCHEME: &str = "http";
pub const TOKEN_TTL: Duration = Duration::from_secs(3600);
/// Wrapped session ids live as long as a session may: clients keep them from `initialize` on.
pub const SESSION_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// `[tokens] accept_clear_handles`: with `[auth]` on, a handle of a sealed kind must come sealed.
pub const ACCEPT_CLEAR_HANDLES: bool = false;
pub const UPSTREAM_HTTP2: bool = false;
/// Opening a TCP connection to a backend (also bounded by `upstream_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `[upstream] max_connections_per_backend`: HTTP/1.1 connections open to one backend; a
/// request beyond waits for one. As many as the client connections the router takes
/// (`MAX_CONNECTIONS`): each open SSE stream holds one upstream connection for its whole life,
/// and a fleet of thousands of held streams on a few backends is what MCP looks like (Envoy's
/// 1024 made 10,000 streams over three backends fail, found by the streams bench row).
pub const MAX_CONNECTIONS_PER_BACKEND: usize = MAX_CONNECTIONS;
/// `[upstream] queue_timeout`: how long a request waits for a connection of a backend at its
/// cap before it is answered `upstream_busy`.
pub const UPSTREAM_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);
/// `[upstream] idle_timeout`: below the 5 s keep-alive of uvicorn and Node, so the router closes
/// an idle connection before the backend does (and never sends on one the backend is closing).
pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Session tickets kept per `https://` backend for TLS resumption.
pub const TLS_SESSIONS_PER_BACKEND: usize = 64;
/// HTTP/2 streams a new upstream connection is assumed to take until the backend's SETTINGS say
/// otherwise (hyper's initial limit, and RFC 9113's recommended minimum).
pub const H2_INITIAL_MAX_STREAMS: u32 = 100;
/// The longest duration any key accepts: 3650 days (ten years). Deadlines are computed as
/// `now + duration`, which a longer value (up to `u64::MAX` seconds) would overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(MAX_DURATION_DAYS * 24 * 3600);
pub const MAX_DURATION_DAYS: u64 = 3650;
pub const LOG_FORMAT: &str = "text";
pub const LOG_ACCESS: bool = false;
pub const SERVICE_NAME: &str = "mrtr-router";
pub const SAMPLE_RATIO: f64 = 1.0;
pub const AUTH_LEEWAY: Duration = Duration::from_secs(30);
pub const JWKS_REFRESH_MIN: Duration = Duration::from_secs(60);
pub const JWKS_REFRESH_MAX: Duration = Duration::from_secs(3600);
pub const JWKS_KID_REFETCH: Duration = Duration::from_secs(5);
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(5);
/// Verified access tokens remembered (`auth.token_cache`): ~1 KiB each.
pub const AUTH_TOKEN_CACHE: i64 = 10_000;
pub const PROXY_PROTOCOL: bool = false;
/// `[quotas] max_tracked_callers`: per table (the caller rate, each tool's rate, in flight, open
/// calls); a few MB each at this count (the per-caller figure is in `quotas::rate`).
pub const QUOTA_MAX_TRACKED_CALLERS: usize = 100_000;
pub const QUOTA_STORE: &str = "local";
/// A Redis round trip on the same network takes well under a millisecond; 50 ms is the point
/// past which waiting costs more than the quota is worth.
pub const QUOTA_STORE_TIMEOUT: Duration = Duration::from_millis(50);
pub const QUOTA_STORE_FAILURE: &str = "open";
/// `[catalog]`: each backend asked for its tools every 30 s, an ask within 5 s, at most 1,000
/// tools and 4 MiB of answers a backend.
pub const CATALOG_INTERVAL: Duration = Duration::from_secs(30);
pub const CATALOG_TIMEOUT: Duration = Duration::from_secs(5);
pub const CATALOG_MAX_TOOLS: usize = 1000;
pub const CATALOG_MAX_BYTES: &str = "4MiB";
pub const CATALOG_PATH: &str = "/mcp";
