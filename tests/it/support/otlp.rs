//! A test OpenTelemetry collector: a real HTTP server on port 0 that takes OTLP/HTTP protobuf
//! exports (`POST /v1/traces`), decodes them with `opentelemetry-proto` and keeps the spans.
//! It can be told to refuse exports (answer 500), and stopped (its port then refuses).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::net::TcpListener;

/// One span as the collector received it; ids in lowercase hex ("" for no parent).
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    /// `SPAN_KIND_SERVER` is 2, `SPAN_KIND_CLIENT` 3.
    pub kind: i32,
    pub attributes: BTreeMap<String, String>,
    /// `STATUS_CODE_ERROR` is 2.
    pub status_code: i32,
    pub service_name: String,
}

pub const SERVER: i32 = 2;
pub const CLIENT: i32 = 3;
pub const STATUS_ERROR: i32 = 2;

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    /// The status exports are answered with.
    status: Arc<AtomicU16>,
    /// Export requests received.
    pub requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(200));
        let requests = Arc::new(AtomicU64::new(0));
        let (sp, st, rq) = (spans.clone(), status.clone(), requests.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((sock, _)) = listener.accept().await {
                let (sp, st, rq) = (sp.clone(), st.clone(), rq.clone());
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (sp, st, rq) = (sp.clone(), st.clone(), rq.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        rq.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, hyper::Error>(export(&path, &body, &sp, st.load(Ordering::SeqCst)))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(sock);
                conns.spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        Collector {
            addr,
            spans,
            status,
            requests,
            task,
        }
    }

    /// What `[tracing] otlp_endpoint` names.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect()
    }

    /// Waits (bounded) until the trace `trace_id` has `n` spans, and returns them.
    pub async fn wait_for_trace(&self, trace_id: &str, n: usize) -> Vec<Span> {
        super::eventually(
            Duration::from_secs(20),
            &format!("{n} spans of trace {trace_id}"),
            || self.trace(trace_id).len() >= n,
        )
        .await;
        self.trace(trace_id)
    }

    /// Answers exports with `status` from now on (500: a collector refusing them).
    pub fn answer_with(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Stops listening and drops every connection: the port refuses from then on.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn export(path: &str, body: &Bytes, spans: &Mutex<Vec<Span>>, status: u16) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(http::header::CONTENT_TYPE, "application/x-protobuf".parse().unwrap());
        r
    };
    if path != "/v1/traces" {
        return answer(StatusCode::NOT_FOUND, Vec::new());
    }
    let status = StatusCode::from_u16(status).unwrap();
    if !status.is_success() {
        return answer(status, Vec::new());
    }
    let Ok(request) = ExportTraceServiceRequest::decode(&body[..]) else {
        return answer(StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut got = spans.lock().unwrap();
    for rs in request.resource_spans {
        let service_name = rs
            .resource
            .as_ref()
            .and_then(|r| attributes(&r.attributes).remove("service.name"))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(Span {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    attributes: attributes(&s.attributes),
                    status_code: s.status.map_or(0, |st| st.code),
                    service_name: service_name.clone(),
                });
            }
        }
    }
    answer(StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
