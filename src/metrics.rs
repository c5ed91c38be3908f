//! Prometheus metrics (docs/src/observability.md): one registry per router, so routers started side by side in
//! one process (tests, `demo`) keep separate counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The `kind` label values of the pin metrics, indexed by `PinKind as usize`.
pub const PIN_KINDS: [&str; 4] = ["client", "request_state", "task", "session"];
/// The `source` label values of `mrtr_route_decisions_total`, indexed by `route::Source as usize`.
pub const ROUTE_SOURCES: [&str; 4] = ["token", "pin", "ring", "keyless"];
/// The `kind` label values of `mrtr_upstream_errors_total`.
pub const UPSTREAM_ERROR_KINDS: [&str; 5] = ["connect", "tls", "reset", "timeout", "stream_idle"];
/// The `reason` label values of `mrtr_tokens_rejected_total`: why a token does not verify, and
/// `conflict` (two that verify name different backends).
pub const TOKEN_REJECTIONS: [&str; 5] = ["malformed", "unknown_key", "bad_signature", "expired", "conflict"];
/// The `reason` label values of `mrtr_connections_refused_total`.
pub const CONNECTION_REFUSALS: [&str; 3] = ["cap", "fds", "admin_cap"];
/// The `protocol` label values of `mrtr_connections`.
pub const PROTOCOLS: [&str; 3] = ["pending", "http1", "http2"];
/// The `result` label values of `mrtr_config_reloads_total` and
/// `mrtr_discovery_resolutions_total`.
pub const RESULTS: [&str; 2] = ["ok", "error"];
/// The `quota` and `scope` labels of `mrtr_quota_refusals_total`.
pub const QUOTAS: [&str; 3] = ["rate", "in_flight", "open_calls"];
pub const QUOTA_SCOPES: [&str; 3] = ["caller", "tool", "overflow"];
/// The series of the body shares: `quota="body_bytes"`, `scope="connection"` or `"caller"`.
pub use crate::error::{BODY_BYTES, BODY_SHARE_SCOPES};

/// Log lines (access log and the router's own) dropped because their output (stdout, stderr)
/// was not being read fast enough: counted per process, as the outputs are the process's, and
/// shown by every router's registry.
pub static LOG_LINES_DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new(
        "mrtr_log_lines_dropped_total",
        "Log lines (access log and the router's own) dropped because stdout or stderr was not read fast enough",
    )
    .expect("valid metric")
});

/// Request-body bytes the router holds now across all connections (POST bodies being read, or
/// read and waiting for their answer), checked against `server.max_body_buffer_bytes` as each
/// frame is read; shown as `mrtr_body_buffer_bytes`.
#[derive(Default)]
pub struct BodyBuffer {
    held: AtomicUsize,
}

impl BodyBuffer {
    /// Takes `n` more bytes if the total stays within `limit`; else takes nothing.
    pub fn try_reserve(&self, n: usize, limit: usize) -> bool {
        // Relaxed: a budget, not a lock; two readers racing at the limit may both be refused.
        let before = self.held.fetch_add(n, Ordering::Relaxed);
        if before + n > limit {
            self.held.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    pub fn release(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Every metric the router exports.
pub struct Metrics {
    registry: Registry,
    pub(crate) requests_total: IntCounterVec,
    pub(crate) request_duration: HistogramVec,
    pub(crate) pins: IntGaugeVec,
    pub(crate) pins_expired: IntCounterVec,
    pub(crate) pins_lost: IntCounter,
    pub(crate) rounds_per_call: Histogram,
    pub(crate) backend_up: IntGaugeVec,
    pub(crate) backend_inflight: IntGaugeVec,
    /// `mrtr_upstream_connections{backend}`: HTTP/1.1 connections open (idle or busy).
    pub(crate) upstream_open: IntGaugeVec,
    /// `mrtr_upstream_queued{backend}`: requests waiting for a connection of a full backend.
    pub(crate) upstream_queued: IntGaugeVec,
    pub(crate) backend_draining: IntGaugeVec,
    /// `mrtr_backend_pins{backend,kind}`: pins naming the backend at the last sweep.
    pub(crate) backend_pins: IntGaugeVec,
    pub(crate) ring_members: IntGauge,
    pub(crate) upstream_errors: IntCounterVec,
    pub(crate) upstream_connections: IntCounterVec,
    pub(crate) upstream_resends: IntCounterVec,
    /// `mrtr_retries_total{reason}`: `connect` (the backend never saw the request) and `reset`
    /// (it failed before any byte of its answer, and the request may run twice).
    pub(crate) retries_connect: IntCounter,
    pub(crate) retries_reset: IntCounter,
    pub(crate) retries_budget_exhausted: IntCounter,
    pub(crate) router_errors: IntCounterVec,
    /// HTTP/1 connections closed because their client left while a request was in flight, or
    /// took nothing of its answer for `stream_idle_timeout`.
    pub(crate) client_aborts: IntCounter,
    pub(crate) config_reloads: IntCounterVec,
    /// Open client connections by protocol (`pending` until it is known).
    pub(crate) connections: IntGaugeVec,
    /// HTTP/1 client connections waiting between requests with only their socket held.
    pub(crate) connections_parked: IntGauge,
    /// Times the proxy listener could not take a connection: `cap` (max_connections open: it
    /// waits until one closes), `fds` (accept failed for lack of descriptors or memory).
    pub(crate) connections_refused: IntCounterVec,
    /// The request-body budget's bytes in use, and the gauge that shows them when rendered.
    pub(crate) body_buffer: BodyBuffer,
    body_buffer_bytes: IntGauge,
    pub(crate) tokens_rejected: IntCounterVec,
    pub(crate) discovery_resolutions: IntCounterVec,
    /// Ended spans that never reached the collector: the export queue was full, or the export
    /// failed (collector down, slow past the export timeout, or refusing).
    pub(crate) spans_dropped: IntCounter,
    /// Hot-path children resolved once, by their label's place: decisions in [`ROUTE_SOURCES`],
    /// pins created and finished in [`PIN_KINDS`] (counted by `route::Source::count` and
    /// `pins::PinKind::count_created`/`count_finished`).
    pub(crate) decisions_by_source: [IntCounter; 4],
    pub(crate) pins_created_by_kind: [IntCounter; 4],
    pub(crate) pins_finished_by_kind: [IntCounter; 4],
    /// `mrtr_auth_total{result}` by [`crate::auth::AUTH_RESULTS`] place ([`Metrics::count_auth`]).
    pub(crate) auth_by_result: [IntCounter; 9],
    pub(crate) jwks_refreshes: IntCounterVec,
    /// Seconds since the key set in use was loaded; set when `/metrics` is rendered.
    pub(crate) jwks_age: IntGauge,
    pub(crate) quota_refusals: IntCounterVec,
    /// Callers the quotas track; set when `/metrics` is rendered.
    pub(crate) quota_callers: IntGauge,
    /// Quota tables full; set when `/metrics` is rendered.
    pub(crate) quota_tables_full: IntGauge,
    /// `mrtr_quota_store_seconds` and `mrtr_quota_store_errors_total`, handed to each
    /// `[quotas]` with a shared store.
    pub(crate) quota_store: crate::quotas::StoreMetrics,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let m = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(m.clone())).expect("unique metric");
    m
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let m = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(m.clone())).expect("unique metric");
    m
}

impl Metrics {
    /// Counts one `[auth]` outcome, by its `result` label (one of `crate::auth::AUTH_RESULTS`).
    pub fn count_auth(&self, result: &str) {
        if let Some(i) = crate::auth::AUTH_RESULTS.iter().position(|r| *r == result) {
            self.auth_by_result[i].inc();
        }
    }

    pub fn new() -> Metrics {
        let r = Registry::new();
        let route_decisions = counter(
            &r,
            "mrtr_route_decisions_total",
            "Routing decisions by source",
            &["source"],
        );
        let pins_created = counter(&r, "mrtr_pins_created_total", "Pins created by kind", &["kind"]);
        let pins_finished = counter(
            &r,
            "mrtr_pins_finished_total",
            "Pins finished by a final answer, by kind",
            &["kind"],
        );
        let by = |vec: &IntCounterVec, labels: [&str; 4]| labels.map(|l| vec.with_label_values(&[l]));
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "mrtr_request_duration_seconds",
                "Time from request head to response head, by backend",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["backend"],
        )
        .expect("valid metric");
        r.register(Box::new(request_duration.clone())).expect("unique metric");
        let rounds_per_call = Histogram::with_opts(
            HistogramOpts::new(
                "mrtr_rounds_per_call",
                "Rounds of a multi-round call, observed when it finishes",
            )
            .buckets(vec![1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 16.0, 32.0, 64.0]),
        )
        .expect("valid metric");
        r.register(Box::new(rounds_per_call.clone())).expect("unique metric");
        let pins_lost =
            IntCounter::new("mrtr_pins_lost_total", "Follow-ups whose pinned backend was gone").expect("valid metric");
        r.register(Box::new(pins_lost.clone())).expect("unique metric");
        let client_aborts = IntCounter::new(
            "mrtr_client_aborts_total",
            "Requests given up because their HTTP/1 client closed the connection while they were in flight, or their client (HTTP/1 or HTTP/2) took nothing of the answer for stream_idle_timeout",
        )
        .expect("valid metric");
        r.register(Box::new(client_aborts.clone())).expect("unique metric");
        let ring_members = IntGauge::new("mrtr_ring_members", "Backends on the hash ring (healthy, not draining)")
            .expect("valid metric");
        r.register(Box::new(ring_members.clone())).expect("unique metric");
        let spans_dropped = IntCounter::new(
            "mrtr_spans_dropped_total",
            "Spans that never reached the OTLP collector: export queue full, or the export failed",
        )
        .expect("valid metric");
        r.register(Box::new(spans_dropped.clone())).expect("unique metric");
        let retries = counter(
            &r,
            "mrtr_retries_total",
            "Requests tried again on the next backend of the ring, by reason (connect: the backend refused the connection or failed its TLS handshake, so it cannot have seen the request; reset: it failed before any byte of its answer, and the request may run twice)",
            &["reason"],
        );
        let retries_connect = retries.with_label_values(&["connect"]);
        let retries_reset = retries.with_label_values(&["reset"]);
        let retries_budget_exhausted = IntCounter::new(
            "mrtr_retries_budget_exhausted_total",
            "Retries not made because upstream.retry_budget was spent",
        )
        .expect("valid metric");
        r.register(Box::new(retries_budget_exhausted.clone()))
            .expect("unique metric");
        r.register(Box::new(LOG_LINES_DROPPED.clone())).expect("unique metric");
        let body_buffer_bytes = IntGauge::new(
            "mrtr_body_buffer_bytes",
            "Request-body bytes held across all connections (bounded by server.max_body_buffer_bytes)",
        )
        .expect("valid metric");
        r.register(Box::new(body_buffer_bytes.clone())).expect("unique metric");
        let connections_parked = IntGauge::new(
            "mrtr_connections_parked",
            "HTTP/1 client connections waiting for their next request with only their socket held (parked: found idle at a check, every quarter of server.header_read_timeout); counted in mrtr_connections too",
        )
        .expect("valid metric");
        r.register(Box::new(connections_parked.clone())).expect("unique metric");
        let auth = counter(
            &r,
            "mrtr_auth_total",
            "Requests checked by [auth], by result: ok, missing (no bearer token), invalid, expired, audience (a token for another resource), scope (insufficient), jwks_unavailable, origin (not allowed), principal (a sealed handle presented by another principal)",
            &["result"],
        );
        let jwks_age = IntGauge::new(
            "mrtr_jwks_age_seconds",
            "Seconds since the issuer's key set in use was loaded (0 while none is, or [auth] is off)",
        )
        .expect("valid metric");
        r.register(Box::new(jwks_age.clone())).expect("unique metric");
        let quota_callers = IntGauge::new(
            "mrtr_quota_callers",
            "Callers [quotas] tracks, all its tables together (at most max_tracked_callers each)",
        )
        .expect("valid metric");
        r.register(Box::new(quota_callers.clone())).expect("unique metric");
        let quota_tables_full = IntGauge::new(
            "mrtr_quota_tables_full",
            "Quota tables at max_tracked_callers: while above 0, a new caller of one shares its overflow entry (one caller's limits for all of them)",
        )
        .expect("valid metric");
        r.register(Box::new(quota_tables_full.clone())).expect("unique metric");
        let quota_store_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "mrtr_quota_store_seconds",
                "Round trips to the shared quota store (quotas.store): one per new call, every rate it checks together",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            ]),
        )
        .expect("valid metric");
        r.register(Box::new(quota_store_seconds.clone()))
            .expect("unique metric");
        let quota_store_errors = counter(
            &r,
            "mrtr_quota_store_errors_total",
            "Rate checks the shared quota store did not decide, by kind: timeout (no answer within quotas.store_timeout), error (Redis unreachable or failing), down (decided without a round trip, within a second of a failure); quotas.store_failure decided them",
            &["kind"],
        );
        let metrics = Metrics {
            quota_store: crate::quotas::StoreMetrics {
                seconds: quota_store_seconds,
                errors: crate::quotas::StoreMetrics::KINDS.map(|k| quota_store_errors.with_label_values(&[k])),
            },
            quota_refusals: counter(
                &r,
                "mrtr_quota_refusals_total",
                "Requests refused by a quota, by quota and scope: 429 for rate, in_flight and open_calls (scope caller, tool, or overflow: the share of callers past max_tracked_callers); 503 for body_bytes (scope connection or caller: quotas.max_body_bytes_per_connection, max_body_bytes_per_caller; or overflow)",
                &["quota", "scope"],
            ),
            quota_callers,
            quota_tables_full,
            auth_by_result: crate::auth::AUTH_RESULTS.map(|l| auth.with_label_values(&[l])),
            jwks_refreshes: counter(
                &r,
                "mrtr_jwks_refreshes_total",
                "Fetches of the issuer's key set (scheduled, or for a token naming an unknown key), by result",
                &["result"],
            ),
            jwks_age,
            requests_total: counter(
                &r,
                "mrtr_requests_total",
                "Proxied requests by backend, method and status",
                &["backend", "method", "status"],
            ),
            pins: gauge(&r, "mrtr_pins", "Pins in the table by kind", &["kind"]),
            pins_expired: counter(
                &r,
                "mrtr_pins_expired_total",
                "Pins expired without a follow-up, by kind",
                &["kind"],
            ),
            backend_up: gauge(&r, "mrtr_backend_up", "1 when the backend is healthy", &["backend"]),
            backend_inflight: gauge(
                &r,
                "mrtr_backend_inflight",
                "Requests in flight to the backend",
                &["backend"],
            ),
            backend_draining: gauge(&r, "mrtr_backend_draining", "1 while the backend drains", &["backend"]),
            backend_pins: gauge(
                &r,
                "mrtr_backend_pins",
                "Pins naming the backend in this replica's table at the last sweep (once a second), by kind",
                &["backend", "kind"],
            ),
            upstream_open: gauge(
                &r,
                "mrtr_upstream_connections",
                "HTTP/1.1 connections open to the backend, idle or carrying a request (at most upstream.max_connections_per_backend)",
                &["backend"],
            ),
            upstream_queued: gauge(
                &r,
                "mrtr_upstream_queued",
                "Requests waiting for a connection to the backend: it has max_connections_per_backend open and none idle",
                &["backend"],
            ),
            upstream_errors: counter(
                &r,
                "mrtr_upstream_errors_total",
                "Errors talking to backends by kind",
                &["backend", "kind"],
            ),
            upstream_connections: counter(
                &r,
                "mrtr_upstream_connections_opened_total",
                "Keep-alive connections opened to backends",
                &["backend"],
            ),
            upstream_resends: counter(
                &r,
                "mrtr_upstream_resends_total",
                "Requests sent again because the backend cannot have seen them: the pooled connection they were given had been closed, or an HTTP/2 backend refused the stream",
                &["backend"],
            ),
            router_errors: counter(
                &r,
                "mrtr_router_errors_total",
                "Errors the router answered itself, by reason",
                &["reason"],
            ),
            config_reloads: counter(&r, "mrtr_config_reloads_total", "Config reloads by result", &["result"]),
            connections: gauge(
                &r,
                "mrtr_connections",
                "Open client connections by protocol (pending until known)",
                &["protocol"],
            ),
            connections_parked,
            connections_refused: counter(
                &r,
                "mrtr_connections_refused_total",
                "Connections a listener could not take as they came: cap (proxy: each client connection that waited in the kernel's backlog because server.max_connections were open), fds (times accepting failed: no descriptors), admin_cap (admin.max_connections open: the oldest admin connection was closed)",
                &["reason"],
            ),
            discovery_resolutions: counter(
                &r,
                "mrtr_discovery_resolutions_total",
                "DNS discovery lookups by result",
                &["result"],
            ),
            tokens_rejected: counter(
                &r,
                "mrtr_tokens_rejected_total",
                "Routing tokens rejected by reason",
                &["reason"],
            ),
            decisions_by_source: by(&route_decisions, ROUTE_SOURCES),
            pins_created_by_kind: by(&pins_created, PIN_KINDS),
            pins_finished_by_kind: by(&pins_finished, PIN_KINDS),
            request_duration,
            rounds_per_call,
            pins_lost,
            client_aborts,
            ring_members,
            spans_dropped,
            retries_connect,
            retries_reset,
            retries_budget_exhausted,
            body_buffer: BodyBuffer::default(),
            body_buffer_bytes,
            registry: r,
        };
        metrics.show_every_label_value();
        metrics
    }

    /// Creates the series of every label value the router knows, at zero, so that a dashboard
    /// or an alert sees a count that has not moved yet (and the docs can list exactly what is
    /// shown).
    fn show_every_label_value(&self) {
        let each = |vec: &IntCounterVec, values: &[&str]| values.iter().for_each(|v| drop(vec.with_label_values(&[v])));
        each(&self.pins_expired, &PIN_KINDS);
        each(&self.router_errors, &crate::error::RouterError::REASONS);
        each(&self.tokens_rejected, &TOKEN_REJECTIONS);
        each(&self.connections_refused, &CONNECTION_REFUSALS);
        each(&self.config_reloads, &RESULTS);
        each(&self.discovery_resolutions, &RESULTS);
        each(&self.jwks_refreshes, &crate::auth::REFRESH_RESULTS);
        for quota in QUOTAS {
            for scope in QUOTA_SCOPES {
                drop(self.quota_refusals.with_label_values(&[quota, scope]));
            }
        }
        for scope in BODY_SHARE_SCOPES {
            drop(self.quota_refusals.with_label_values(&[BODY_BYTES, scope]));
        }
        for kind in PIN_KINDS {
            drop(self.pins.with_label_values(&[kind]));
        }
        for protocol in PROTOCOLS {
            drop(self.connections.with_label_values(&[protocol]));
        }
    }

    /// Creates a backend's counters at zero (its errors one per kind) when the router learns
    /// of it.
    pub fn know_backend(&self, name: &str) {
        for kind in UPSTREAM_ERROR_KINDS {
            drop(self.upstream_errors.with_label_values(&[name, kind]));
        }
        drop(self.upstream_connections.with_label_values(&[name]));
        drop(self.upstream_resends.with_label_values(&[name]));
    }

    /// Drops the per-backend gauges of a backend the router forgot.
    pub fn forget_backend(&self, name: &str) {
        for gauge in [
            &self.backend_up,
            &self.backend_draining,
            &self.backend_inflight,
            &self.upstream_open,
            &self.upstream_queued,
        ] {
            let _ = gauge.remove_label_values(&[name]);
        }
        for kind in PIN_KINDS {
            let _ = self.backend_pins.remove_label_values(&[name, kind]);
        }
    }

    /// The registry, for the metrics of parts that keep their own (the catalog's).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition format served on `/metrics`.
    pub fn render(&self) -> String {
        self.body_buffer_bytes
            .set(i64::try_from(self.body_buffer.held()).unwrap_or(i64::MAX));
        let mut buf = Vec::with_capacity(8192);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
