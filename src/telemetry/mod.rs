//! Seeing every call: the access log (`access`), OpenTelemetry traces (`trace`), and the
//! bounded non-blocking writer both logs go through (`writer`). [`Observation`] is what the
//! proxy records of one request for them; it is written out once, when the answer's body has
//! gone to the client (or the request was given up), so a streamed answer's line carries its
//! whole size and duration.

pub mod access;
pub mod trace;
pub mod writer;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::HeaderValue;
use http::request::Parts;
use opentelemetry::KeyValue;

use crate::config::LogFormat;
use crate::metrics::PIN_KINDS;
use access::{cut, AccessLine};
pub use trace::{RequestTrace, Tracing};

/// The header clients name their MCP protocol version in.
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
/// Longest protocol version kept.
const MAX_PROTOCOL_VERSION: usize = 32;

/// The status logged for a request whose client went away before it was answered (nginx's).
pub const CLIENT_CLOSED: u16 = 499;

/// One request, as the access log and the trace see it. Filled in by the proxy's phases; on
/// drop, it ends the spans and writes the access line.
pub struct Observation {
    started: Instant,
    ts: SystemTime,
    /// The access log's format, when it is on.
    access: Option<LogFormat>,
    /// The request's spans, when tracing is on.
    pub trace: Option<RequestTrace>,
    client: HeaderValue,
    http_method: http::Method,
    path: String,
    mcp_method: Option<String>,
    mcp_name: Option<String>,
    route: Option<&'static str>,
    backend: Option<Arc<str>>,
    pin_used: Option<&'static str>,
    /// Kinds of the pins the answer created, one bit per `PinKind` (shared with the call).
    pub pins_created: Arc<AtomicU8>,
    /// The answer's status; [`CLIENT_CLOSED`] until there is one.
    pub status: u16,
    pub error: Option<&'static str>,
    pub bytes_out: u64,
    /// A client-sent trace id, when tracing is off.
    client_trace_id: Option<String>,
    /// The verified caller's subject and client id, when `[auth]` is on.
    subject: Option<String>,
    client_id: Option<String>,
    /// The caller `[quotas]` counted the request against, as the log shows it.
    quota_caller: Option<String>,
    /// The client IP `[quotas]` counted (through trusted proxies), when it is not the peer.
    client_ip: Option<String>,
    /// The `quota` and `scope` of the quota that refused the request.
    pub quota: Option<(&'static str, &'static str)>,
}

impl Observation {
    /// Starts observing a request from `client` (its IP), whose head is `parts`, that came in at
    /// `started`, for the access log (in its format) and/or tracing. Kept out of line: the
    /// request path with both off does not carry it.
    #[inline(never)]
    pub fn begin(
        parts: &Parts,
        client: &HeaderValue,
        started: Instant,
        access: Option<LogFormat>,
        tracing: Option<&Arc<Tracing>>,
    ) -> Box<Observation> {
        let ts = SystemTime::now() - started.elapsed();
        let path = cut(parts.uri.path(), access::MAX_PATH);
        let trace = tracing.map(|t| {
            let trace = t.server_span(&parts.headers, &parts.method, ts);
            let version = parts
                .headers
                .get(PROTOCOL_VERSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(|v| KeyValue::new("mcp.protocol.version", cut(v, MAX_PROTOCOL_VERSION)));
            trace.describe(
                None,
                version.into_iter().chain([KeyValue::new("url.path", path.clone())]),
            );
            trace
        });
        let client_trace_id = match (&trace, access) {
            (None, Some(_)) => trace::client_trace_id(&parts.headers),
            _ => None,
        };
        Box::new(Observation {
            started,
            ts,
            access,
            trace,
            client: client.clone(),
            http_method: parts.method.clone(),
            path,
            mcp_method: None,
            mcp_name: None,
            route: None,
            backend: None,
            pin_used: None,
            pins_created: Arc::default(),
            status: CLIENT_CLOSED,
            error: None,
            bytes_out: 0,
            client_trace_id,
            subject: None,
            client_id: None,
            quota_caller: None,
            client_ip: None,
            quota: None,
        })
    }

    /// The caller `[quotas]` counts the request against, and the client IP it sees (the
    /// `X-Forwarded-For` hop a trusted proxy added, or the peer).
    pub fn quota_caller(&mut self, caller: String, client_ip: std::net::IpAddr) {
        self.quota_caller = Some(caller);
        let ip = client_ip.to_string();
        self.client_ip = (self.client.as_bytes() != ip.as_bytes()).then_some(ip);
    }

    /// The caller `[auth]` verified.
    pub fn caller(&mut self, subject: &str, client_id: Option<&str>) {
        self.subject = Some(cut(subject, access::MAX_SUBJECT));
        self.client_id = client_id.map(|c| cut(c, access::MAX_SUBJECT));
    }

    /// The MCP method and what it acts on (`params.name`, a `resources/read`'s `params.uri`), as
    /// the body scan found them.
    pub fn mcp(&mut self, method: Option<&str>, name: Option<&str>) {
        self.mcp_method = method.map(|m| cut(m, access::MAX_MCP_METHOD));
        self.mcp_name = name.map(|n| cut(n, access::MAX_MCP_NAME));
        let Some(trace) = &self.trace else { return };
        let Some(method) = &self.mcp_method else { return };
        // The MCP semantic conventions' span name: `{mcp.method.name} {target}`.
        let span_name = match &self.mcp_name {
            Some(name) => format!("{method} {name}"),
            None => method.clone(),
        };
        let mut attributes = vec![KeyValue::new("mcp.method.name", method.clone())];
        if let (Some(name), "tools/call") = (&self.mcp_name, method.as_str()) {
            attributes.push(KeyValue::new("gen_ai.tool.name", name.clone()));
        }
        trace.describe(Some(span_name), attributes);
    }

    /// The routing decision: its source label, the backend, and the kind of pin it used.
    pub fn routed(&mut self, source: &'static str, backend: &Arc<str>, pin_used: Option<&'static str>) {
        self.route = Some(source);
        self.backend = Some(backend.clone());
        self.pin_used = pin_used;
    }

    /// The backend the request went to (after a connect retry, another than the decision's).
    pub fn sent_to(&mut self, backend: &Arc<str>) {
        self.backend = Some(backend.clone());
    }

    /// `request_state used`, `client created`, or both, comma-separated; `None` without pins.
    fn pin_note(&self) -> Option<String> {
        let created = self.pins_created.load(Ordering::Relaxed);
        let mut parts: Vec<String> = self.pin_used.map(|k| format!("{k} used")).into_iter().collect();
        for (i, kind) in PIN_KINDS.iter().enumerate() {
            if created & (1 << i) != 0 {
                parts.push(format!("{kind} created"));
            }
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    fn finish(&mut self) {
        let duration = self.started.elapsed();
        let pin = self.pin_note();
        let mut trace_id = self.client_trace_id.take();
        if let Some(trace) = self.trace.take() {
            trace_id = Some(trace.trace_id());
            let mut attributes = Vec::with_capacity(3);
            if let Some(route) = self.route {
                attributes.push(KeyValue::new("mrtr.route.source", route));
            }
            if let Some(backend) = &self.backend {
                attributes.push(KeyValue::new("mrtr.backend", backend.to_string()));
            }
            if let Some(pin) = &pin {
                attributes.push(KeyValue::new("mrtr.pin.kind", pin.clone()));
            }
            if let Some(subject) = &self.subject {
                attributes.push(KeyValue::new("enduser.id", subject.clone()));
            }
            if let Some(client) = &self.client_id {
                attributes.push(KeyValue::new("oauth.client.id", client.clone()));
            }
            trace.finish(self.status, self.error, attributes);
        }
        let Some(format) = self.access else { return };
        let quota = self.quota.map(|(quota, scope)| format!("{quota}/{scope}"));
        let line = AccessLine {
            ts: self.ts,
            client: self.client.to_str().unwrap_or("-"),
            http_method: self.http_method.as_str(),
            path: &self.path,
            mcp_method: self.mcp_method.as_deref(),
            mcp_name: self.mcp_name.as_deref(),
            status: self.status,
            backend: self.backend.as_deref(),
            route: self.route,
            pin: pin.as_deref(),
            duration,
            bytes_out: self.bytes_out,
            error: self.error,
            trace_id: trace_id.as_deref(),
            subject: self.subject.as_deref(),
            client_id: self.client_id.as_deref(),
            caller: self.quota_caller.as_deref(),
            client_ip: self.client_ip.as_deref(),
            quota: quota.as_deref(),
        };
        writer::stdout().write_line(line.render(format));
    }
}

impl Drop for Observation {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Sets up the router's own logs (stderr, through the non-blocking writer): `text` or one
/// JSON object per line; `RUST_LOG` filters (default `info`). Once per process.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer::StderrLines);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Waits (at most `limit`) until the log lines queued so far are written: before the process exits.
pub fn flush_logs(limit: Duration) {
    writer::flush_all(limit);
}
