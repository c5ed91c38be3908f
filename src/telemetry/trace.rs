//! OpenTelemetry traces (docs/src/observability.md): a server span per request and a client span per upstream
//! attempt, continuing the client's W3C `traceparent`/`tracestate` or starting a trace (head
//! sampling by `sample_ratio`, by trace id; a client's decision is followed), and the context
//! the backend gets in its own `traceparent`.
//!
//! Export never touches the request path: an ended span goes into a bounded queue (a full queue
//! drops it); a thread of its own takes batches off the queue and POSTs them to the collector
//! (OTLP/HTTP protobuf, `opentelemetry-otlp` on hyper, its own small runtime). A span that never
//! reaches the collector (queue full, collector down, slow, or refusing) is counted in
//! `mrtr_spans_dropped_total`.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanBuilder, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use prometheus::IntCounter;
use tokio::sync::{mpsc, oneshot};

use crate::config::TracingConfig;

/// Ended spans waiting for export; more are dropped (and counted).
pub const QUEUE_SPANS: usize = 2048;
/// Most spans in one export request.
const MAX_BATCH: usize = 512;
/// How long a batch waits for more spans once its first is in.
const BATCH_DELAY: Duration = Duration::from_millis(200);
/// One export's deadline, retries included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Tracing as one `[tracing]` configures it: the tracer, and the queue to its export thread.
pub struct Tracing {
    config: TracingConfig,
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Tracing {
    /// Starts the export thread for `config`; spans that never reach the collector count in `dropped`.
    pub fn start(config: &TracingConfig, dropped: IntCounter) -> Tracing {
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .build();
        let (tx, rx) = mpsc::channel(QUEUE_SPANS);
        let (stop, stopped) = oneshot::channel();
        let exporter = Exporter {
            url: config.traces_url.to_string(),
            resource: resource.clone(),
            dropped: dropped.clone(),
        };
        if let Err(e) = exporter.start(rx, stopped) {
            // The queue's receiver is gone with it: every span counts as dropped.
            tracing::error!(error = %e, "cannot start the span export thread; spans are dropped");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Queue {
                tx,
                dropped,
                stop: Mutex::new(Some(stop)),
            })
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        Tracing {
            config: config.clone(),
            tracer: provider.tracer("mrtr-router"),
            provider,
            propagator: TraceContextPropagator::new(),
        }
    }

    pub fn config(&self) -> &TracingConfig {
        &self.config
    }

    /// The server span of a request with these headers, started at `start`: a child of the
    /// client's `traceparent` when it sent a valid one, else the root of a new trace.
    pub fn server_span(self: &Arc<Self>, headers: &HeaderMap, method: &Method, start: SystemTime) -> RequestTrace {
        let parent = self.propagator.extract(&Headers(headers));
        let builder = SpanBuilder::from_name(method.as_str().to_string())
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes([KeyValue::new("http.request.method", method.as_str().to_string())]);
        let span = self.tracer.build_with_context(builder, &parent);
        RequestTrace {
            tracing: self.clone(),
            server: parent.with_span(span),
            client: None,
            method: method.clone(),
        }
    }

    /// Sends what is queued and stops the export thread, waiting at most `limit`.
    pub fn shutdown(&self, limit: Duration) {
        let _ = self.provider.shutdown_with_timeout(limit);
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        // Without waiting: the export thread sends what is queued and ends by itself.
        let _ = self.provider.shutdown_with_timeout(Duration::ZERO);
    }
}

/// One request's spans: its server span, and the client span of its upstream attempt.
pub struct RequestTrace {
    tracing: Arc<Tracing>,
    /// Holds the server span.
    server: Context,
    /// Holds the current attempt's client span.
    client: Option<Context>,
    method: Method,
}

impl RequestTrace {
    /// The trace id, as 32 hex digits (sampled or not).
    pub fn trace_id(&self) -> String {
        self.server.span().span_context().trace_id().to_string()
    }

    /// Names the server span and sets attributes on it (nothing when it is not sampled).
    pub fn describe(&self, name: Option<String>, attributes: impl IntoIterator<Item = KeyValue>) {
        let span = self.server.span();
        if !span.is_recording() {
            return;
        }
        if let Some(name) = name {
            span.update_name(name);
        }
        span.set_attributes(attributes);
    }

    /// Starts the client span of an attempt to reach `backend` at `address` (host:port).
    pub fn start_attempt(&mut self, backend: &str, address: &str) {
        let method = &self.method;
        let builder = SpanBuilder::from_name(method.as_str().to_string())
            .with_kind(SpanKind::Client)
            .with_attributes(match self.server.span().is_recording() {
                true => {
                    let (host, port) = split_host_port(address);
                    let mut attrs = vec![
                        KeyValue::new("http.request.method", method.as_str().to_string()),
                        KeyValue::new("mrtr.backend", backend.to_string()),
                        KeyValue::new("server.address", host.to_string()),
                    ];
                    if let Some(port) = port {
                        attrs.push(KeyValue::new("server.port", port));
                    }
                    attrs
                }
                false => Vec::new(),
            });
        let span = self.tracing.tracer.build_with_context(builder, &self.server);
        self.client = Some(self.server.with_span(span));
    }

    /// Ends the current attempt's span as failed, with `error.type` = `kind` (`connect`, ...).
    pub fn attempt_failed(&mut self, kind: &'static str) {
        if let Some(client) = self.client.take() {
            let span = client.span();
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_status(Status::error(kind));
            span.end();
        }
    }

    /// Puts the context the backend continues (the attempt's client span) into `headers`,
    /// replacing the client's own `traceparent` and `tracestate`.
    pub fn inject(&self, headers: &mut HeaderMap) {
        headers.remove(TRACEPARENT);
        headers.remove(TRACESTATE);
        let cx = self.client.as_ref().unwrap_or(&self.server);
        self.tracing.propagator.inject_context(cx, &mut HeadersMut(headers));
    }

    /// Ends the spans: the attempt's (if one is open), then the request's. `error` is the
    /// `Mcp-Router-Error` reason when the router answered itself.
    pub fn finish(self, status: u16, error: Option<&'static str>, attributes: impl IntoIterator<Item = KeyValue>) {
        let failed: Option<Cow<'static, str>> = match (error, status) {
            (Some(reason), _) => Some(Cow::Borrowed(reason)),
            (None, 500..) => Some(Cow::Owned(status.to_string())),
            _ => None,
        };
        let end = |span: opentelemetry::trace::SpanRef<'_>, extra: &mut dyn Iterator<Item = KeyValue>| {
            if span.is_recording() {
                span.set_attribute(KeyValue::new("http.response.status_code", status as i64));
                span.set_attributes(extra);
                if let Some(kind) = &failed {
                    span.set_attribute(KeyValue::new("error.type", kind.clone()));
                    span.set_status(Status::error(kind.clone()));
                }
            }
            span.end();
        };
        if let Some(client) = &self.client {
            end(client.span(), &mut std::iter::empty());
        }
        end(self.server.span(), &mut attributes.into_iter());
    }
}

/// `host:port` split for `server.address` and `server.port`.
fn split_host_port(address: &str) -> (&str, Option<i64>) {
    match address.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') => match port.parse() {
            Ok(p) => (host.trim_start_matches('[').trim_end_matches(']'), Some(p)),
            Err(_) => (address, None),
        },
        _ => (address, None),
    }
}

/// The request's headers as the propagator reads them (only `traceparent` and `tracestate`).
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value)) {
            self.0.insert(name, value);
        }
    }
}

/// The trace id of a client's `traceparent` (version 00 form), when tracing is off: the access
/// log names the trace the client started.
pub fn client_trace_id(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(TRACEPARENT)?.as_bytes();
    // 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let id = &v[3..35];
    let hex = id.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (hex && id.iter().any(|b| *b != b'0')).then(|| String::from_utf8_lossy(id).into_owned())
}

/// The span processor: ended spans into the bounded queue, never waiting.
#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: IntCounter,
    /// Tells the export thread to send what is queued and stop; it answers on the channel given.
    stop: Mutex<Option<oneshot::Sender<std::sync::mpsc::SyncSender<()>>>>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let Some(stop) = self.stop.lock().take() else {
            return Ok(());
        };
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        if stop.send(done).is_err() || timeout.is_zero() {
            return Ok(());
        }
        finished
            .recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

/// The export thread's side: batches off the queue, POSTed to the collector.
struct Exporter {
    url: String,
    resource: Resource,
    dropped: IntCounter,
}

impl Exporter {
    /// Runs the export loop on a runtime of its own: one worker thread, `mrtr-otlp`. (A
    /// multi-thread runtime, driven without `block_on`: a second `block_on` of the current-thread
    /// scheduler the router may serve on would cost every request instructions, by keeping the
    /// compiler from inlining that scheduler's task loop.) The runtime is dropped on a plain
    /// thread once the loop has ended.
    fn start(
        self,
        rx: mpsc::Receiver<SpanData>,
        stopped: oneshot::Receiver<std::sync::mpsc::SyncSender<()>>,
    ) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mrtr-otlp")
            .enable_all()
            .build()?;
        let (ended, wait) = std::sync::mpsc::channel::<()>();
        runtime.spawn(async move {
            self.export(rx, stopped).await;
            let _ = ended.send(());
        });
        std::thread::Builder::new()
            .name("mrtr-otlp-keeper".to_string())
            .spawn(move || {
                let _ = wait.recv();
                drop(runtime);
            })?;
        Ok(())
    }

    async fn export(
        self,
        mut rx: mpsc::Receiver<SpanData>,
        mut stopped: oneshot::Receiver<std::sync::mpsc::SyncSender<()>>,
    ) {
        let built = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(self.url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build();
        let mut otlp = match built {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, url = %self.url, "cannot build the OTLP exporter; spans are dropped");
                return;
            }
        };
        otlp.set_resource(&self.resource);
        let mut failing = false;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                biased;
                span = rx.recv() => span,
                done = &mut stopped => {
                    // Stopping (or the tracer is gone): what is queued goes out, then the thread ends.
                    rx.close();
                    while let Ok(span) = rx.try_recv() {
                        batch.push(span);
                        if batch.len() == MAX_BATCH {
                            self.send(&otlp, &mut batch, &mut failing).await;
                        }
                    }
                    self.send(&otlp, &mut batch, &mut failing).await;
                    if let Ok(done) = done {
                        let _ = done.send(());
                    }
                    return;
                }
            };
            let Some(first) = first else { return };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + BATCH_DELAY;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    _ => break,
                }
            }
            self.send(&otlp, &mut batch, &mut failing).await;
        }
    }

    /// Exports `batch` (emptied); a failed export counts its spans as dropped. The first failure
    /// after a success is logged as a warning, the rest at debug level.
    async fn send(&self, otlp: &opentelemetry_otlp::SpanExporter, batch: &mut Vec<SpanData>, failing: &mut bool) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let spans = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
        let result = tokio::time::timeout(EXPORT_TIMEOUT * 2, otlp.export(spans)).await;
        let error = match result {
            Ok(Ok(())) => {
                if std::mem::take(failing) {
                    tracing::info!(url = %self.url, "span export works again");
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        self.dropped.inc_by(n);
        match std::mem::replace(failing, true) {
            false => tracing::warn!(url = %self.url, %error, spans = n, "span export failed; spans dropped"),
            true => tracing::debug!(url = %self.url, %error, spans = n, "span export failed; spans dropped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_trace_ids_are_read_only_from_well_formed_traceparents() {
        let id = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(TRACEPARENT, HeaderValue::from_static(v));
            client_trace_id(&h)
        };
        assert_eq!(
            id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(id("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
        assert_eq!(id("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), None);
        assert_eq!(id("00-4bf92f3577b34da6a3ce929d0e0e4736"), None);
        assert_eq!(client_trace_id(&HeaderMap::new()), None);
    }

    #[test]
    fn host_and_port() {
        assert_eq!(split_host_port("127.0.0.1:9001"), ("127.0.0.1", Some(9001)));
        assert_eq!(split_host_port("[::1]:9001"), ("::1", Some(9001)));
        assert_eq!(split_host_port("mcp.internal"), ("mcp.internal", None));
    }
}
