//! Built-in example MCP worker speaking the routing-id dialect (docs/src/dialects.md), with real
//! per-instance call state. Used by `demo` and by the integration tests.
//!
//! Methods: `tools/list` (the tools below); `tools/call` of `transfer-funds` (or any tool with `arguments.rounds` > 1) answers
//! `pending`, each `confirm` moves the call one round on (`params.round` makes a repeated
//! confirm idempotent) and the last one executes it once; `whoami` answers the worker's name;
//! `stream` answers over SSE (progress events, optionally held until [`WorkerState::release`]);
//! `sleep` answers after `arguments.ms`. Debug paths: `/echo` (request headers as JSON) and
//! `/status/<code>` (that status). Every answer carries `x-worker: <name>`. Each request's
//! W3C trace context (`traceparent`, `tracestate`) is kept in [`WorkerState::trace_headers`].

mod tasks;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, Semaphore};

type WorkerBody = http_body_util::Either<Full<Bytes>, StreamBody<tokio_stream_shim::Receiver>>;

/// Per-instance state of one worker.
pub struct WorkerState {
    pub name: String,
    calls: Mutex<HashMap<String, Call>>,
    /// Calls executed (each exactly once when routing is right).
    pub executions: AtomicU64,
    /// Follow-ups for calls this worker never saw: a misroute.
    pub unknown_followups: AtomicU64,
    /// Requests served.
    pub requests: AtomicU64,
    /// Permits that let held `stream` answers continue.
    gate: Semaphore,
    /// `stream` answers that ended (finished, or their client went away).
    pub streams_closed: AtomicU64,
    /// Connections accepted (a TCP health check is one).
    pub connections: AtomicU64,
    /// `traceparent` and `tracestate` of each request, in order (empty when absent); the
    /// latest 1024 or so.
    pub trace_headers: Mutex<Vec<(String, String)>>,
    /// The tasks this instance holds (`tasks`).
    tasks: Mutex<tasks::Tasks>,
}

struct Call {
    rounds_needed: u32,
    /// Answers given per round (index 0 = round 1), replayed to duplicates.
    answers: Vec<Value>,
}

impl WorkerState {
    /// Lets one held `stream` answer continue.
    pub fn release(&self) {
        self.gate.add_permits(1);
    }

    /// Calls this worker holds in flight (not yet executed).
    pub fn pending_calls(&self) -> usize {
        self.calls
            .lock()
            .values()
            .filter(|c| (c.answers.len() as u32) < c.rounds_needed)
            .count()
    }

    /// Whether this worker holds the task `id` (one it issued, finished or not).
    pub fn holds_task(&self, id: &str) -> bool {
        self.tasks.lock().holds(id)
    }

    /// Whether this worker holds (or finished) the call with this `messageId`.
    pub fn knows(&self, message_id: &str) -> bool {
        self.calls.lock().contains_key(message_id)
    }
}

/// A running example worker.
pub struct Worker {
    pub addr: SocketAddr,
    pub state: Arc<WorkerState>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// Starts a worker on an already-bound listener.
    pub fn start(name: &str, listener: TcpListener) -> Worker {
        let addr = listener.local_addr().expect("bound listener");
        let state = Arc::new(WorkerState {
            name: name.to_string(),
            calls: Mutex::new(HashMap::new()),
            executions: AtomicU64::new(0),
            unknown_followups: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            gate: Semaphore::new(0),
            streams_closed: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            trace_headers: Mutex::new(Vec::new()),
            tasks: Mutex::new(tasks::Tasks::default()),
        });
        let (stop, mut stopped) = oneshot::channel();
        let st = state.clone();
        let task = tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    _ = &mut stopped => break,
                };
                st.connections.fetch_add(1, Ordering::Relaxed);
                let st = st.clone();
                let svc = service_fn(move |req| {
                    let st = st.clone();
                    async move { Ok::<_, Infallible>(serve(st, req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                conns.spawn(async move {
                    let _ = conn.await;
                });
            }
            // Stopping kills every open connection, as a crashed instance would.
            conns.abort_all();
        });
        Worker {
            addr,
            state,
            stop: Some(stop),
            task,
        }
    }

    /// Binds `addr` (port 0 for any) and starts a worker there.
    pub async fn bind(name: &str, addr: SocketAddr) -> std::io::Result<Worker> {
        Ok(Worker::start(name, TcpListener::bind(addr).await?))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and drops every connection, like a killed process.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// An SSE answer of these messages, one event each, whole.
fn sse_response(st: &WorkerState, messages: &[Value]) -> Response<WorkerBody> {
    let events: String = messages.iter().map(|m| format!("data: {m}\n\n")).collect();
    let mut r = json_response(st, StatusCode::OK, &Value::Null);
    *r.body_mut() = http_body_util::Either::Left(Full::new(Bytes::from(events)));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r
}

fn json_response(st: &WorkerState, status: StatusCode, v: &Value) -> Response<WorkerBody> {
    let mut r = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(v.to_string()))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(
        "x-worker",
        HeaderValue::from_str(&st.name).unwrap_or(HeaderValue::from_static("?")),
    );
    r
}

async fn serve(st: Arc<WorkerState>, req: Request<Incoming>) -> Response<WorkerBody> {
    st.requests.fetch_add(1, Ordering::Relaxed);
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    let traced = (header("traceparent"), header("tracestate"));
    let name_header = req
        .headers()
        .get("mcp-name")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    {
        let mut seen = st.trace_headers.lock();
        if seen.len() >= 1024 {
            seen.drain(..512);
        }
        seen.push(traced);
    }
    let path = req.uri().path().to_string();
    if path == "/echo" {
        let headers: Vec<Value> = req
            .headers()
            .iter()
            .map(|(k, v)| json!([k.as_str(), String::from_utf8_lossy(v.as_bytes())]))
            .collect();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let v = json!({"headers": headers, "body": String::from_utf8_lossy(&body), "path": path});
        return json_response(&st, StatusCode::OK, &v);
    }
    if let Some(code) = path.strip_prefix("/status/").and_then(|c| c.parse::<u16>().ok()) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::IM_A_TEAPOT);
        let mut r = json_response(&st, status, &json!({"status": code, "from": st.name}));
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
            *r.body_mut() = http_body_util::Either::Left(Full::new(Bytes::new()));
            r.headers_mut().remove(header::CONTENT_TYPE);
        }
        return r;
    }
    if req.method() == http::Method::GET {
        // The GET stream a client listens on: a status notification for each task held.
        return sse_response(&st, &tasks::notices(&st));
    }
    let body = match Limited::new(req.into_body(), 16 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return json_response(&st, StatusCode::BAD_REQUEST, &json!({"error": "unreadable body"})),
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return json_response(
            &st,
            StatusCode::BAD_REQUEST,
            &rpc_error(&Value::Null, None, -32700, "parse error", &st.name),
        );
    };
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let mid = msg.get("messageId").and_then(Value::as_str).map(str::to_string);
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let tool = params.get("name").and_then(Value::as_str).unwrap_or("");
    let args = params.get("arguments").cloned().unwrap_or(Value::Null);
    let answer = |result: Value| {
        let mut v = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if let Some(m) = &mid {
            v["messageId"] = json!(m);
        }
        v
    };
    match (method, tool) {
        ("tools/list", _) => json_response(&st, StatusCode::OK, &answer(json!({"tools": tools()}))),
        ("tools/call", "whoami") => json_response(&st, StatusCode::OK, &answer(text_result(&st.name))),
        ("tools/call", "sleep") => {
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            json_response(&st, StatusCode::OK, &answer(text_result(&st.name)))
        }
        ("tools/call", "stream") => stream_answer(st.clone(), answer, &args),
        ("tools/call", "task") => {
            let created = answer(tasks::start(&st, &args));
            let id = created["result"]["taskId"].as_str().unwrap_or_default();
            match tasks::notice_of(&st, id).filter(|_| tasks::over_sse(&st, id)) {
                Some(notice) => sse_response(&st, &[notice, created]),
                None => json_response(&st, StatusCode::OK, &created),
            }
        }
        (m, _) if m.starts_with("tasks/") => {
            let answered = match tasks::follow_up(&st, m, &params, name_header.as_deref()) {
                Ok(result) => answer(result),
                Err((code, message)) => rpc_error(&id, mid.as_deref(), code, &message, &st.name),
            };
            let task = params.get("taskId").and_then(Value::as_str).unwrap_or_default();
            match tasks::notice_of(&st, task).filter(|_| tasks::over_sse(&st, task)) {
                Some(notice) => sse_response(&st, &[notice, answered]),
                None => json_response(&st, StatusCode::OK, &answered),
            }
        }
        ("tools/call", _) | ("confirm", _) => {
            let Some(m) = mid.clone() else {
                return json_response(
                    &st,
                    StatusCode::OK,
                    &rpc_error(&id, None, -32602, "messageId required", &st.name),
                );
            };
            match advance(&st, &m, method == "tools/call", &args, &params) {
                Some(result) => json_response(&st, StatusCode::OK, &answer(result)),
                None => {
                    st.unknown_followups.fetch_add(1, Ordering::Relaxed);
                    json_response(
                        &st,
                        StatusCode::OK,
                        &rpc_error(&id, mid.as_deref(), -32602, "unknown messageId", &st.name),
                    )
                }
            }
        }
        _ => json_response(&st, StatusCode::OK, &answer(json!({"worker": st.name}))),
    }
}

/// The tools a worker lists (`tools/list`), as the catalog learns them.
fn tools() -> Value {
    let object = json!({"type": "object"});
    let read_only = json!({"readOnlyHint": true});
    json!([
        {"name": "whoami", "description": "The worker's name.", "inputSchema": object, "annotations": read_only},
        {"name": "sleep", "description": "Answers after `ms` milliseconds.", "inputSchema": {"type": "object", "properties": {"ms": {"type": "integer"}}}, "annotations": read_only},
        {"name": "stream", "description": "Answers over SSE with progress events.", "inputSchema": object, "annotations": read_only},
        {"name": "task", "description": "Runs as a task.", "inputSchema": object},
        {"name": "transfer-funds", "description": "Moves money once its rounds are confirmed.", "inputSchema": {"type": "object", "properties": {"rounds": {"type": "integer"}}}, "annotations": {"destructiveHint": true}},
    ])
}

/// Moves a call one round on and returns that round's answer, or `None` for a follow-up of
/// a call this worker does not hold.
fn advance(st: &WorkerState, mid: &str, is_start: bool, args: &Value, params: &Value) -> Option<Value> {
    let mut calls = st.calls.lock();
    if is_start && !calls.contains_key(mid) {
        let rounds_needed = args.get("rounds").and_then(Value::as_u64).unwrap_or(2).clamp(1, 1000) as u32;
        calls.insert(
            mid.to_string(),
            Call {
                rounds_needed,
                answers: Vec::new(),
            },
        );
    }
    let call = calls.get_mut(mid)?;
    // The round this request answers: explicit, else the next one (1 for the start).
    let round = if is_start {
        1
    } else {
        params
            .get("round")
            .and_then(Value::as_u64)
            .map(|r| r as u32)
            .unwrap_or(call.answers.len() as u32 + 1)
    };
    if round == 0 || round > call.answers.len() as u32 + 1 {
        return Some(json!({"error": "round out of order", "worker": st.name}));
    }
    if let Some(prev) = call.answers.get(round as usize - 1) {
        return Some(prev.clone());
    }
    let result = if round < call.rounds_needed {
        json!({"pending": true, "requested": "confirmation", "permission": "transfer-funds.approve", "round": round, "worker": st.name})
    } else {
        let n = st.executions.fetch_add(1, Ordering::Relaxed) + 1;
        json!({"content": [{"type": "text", "text": "done"}], "worker": st.name, "execution": n, "round": round})
    };
    call.answers.push(result.clone());
    Some(result)
}

fn text_result(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

fn rpc_error(id: &Value, mid: Option<&str>, code: i32, message: &str, worker: &str) -> Value {
    let mut v =
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": {"worker": worker}}});
    if let Some(m) = mid {
        v["messageId"] = json!(m);
    }
    v
}

/// `stream`: `arguments.events` progress events, then the result (`pending` when
/// `arguments.pending`), over SSE. With `arguments.gated`, waits for a permit after the
/// first event. A `: ping` comment follows the first event.
fn stream_answer(st: Arc<WorkerState>, answer: impl Fn(Value) -> Value, args: &Value) -> Response<WorkerBody> {
    let events = args.get("events").and_then(Value::as_u64).unwrap_or(1);
    let gated = args.get("gated").and_then(Value::as_bool).unwrap_or(false);
    let pending = args.get("pending").and_then(Value::as_bool).unwrap_or(false);
    let result = if pending {
        json!({"pending": true, "worker": st.name})
    } else {
        json!({"content": [{"type": "text", "text": st.name}], "worker": st.name})
    };
    let last = answer(result);
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let st2 = st.clone();
    tokio::spawn(async move {
        let send = |tx: &mpsc::Sender<Bytes>, s: String| {
            let tx = tx.clone();
            async move { tx.send(Bytes::from(s)).await.is_ok() }
        };
        for i in 0..events {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": i + 1, "total": events}});
            if !send(&tx, format!("event: message\ndata: {note}\n\n")).await {
                break;
            }
            if i == 0 {
                let _ = send(&tx, ": ping\n\n".to_string()).await;
                if gated {
                    tokio::select! {
                        p = st2.gate.acquire() => if let Ok(p) = p { p.forget() },
                        _ = tx.closed() => { st2.streams_closed.fetch_add(1, Ordering::Relaxed); return; }
                    }
                }
            }
        }
        let _ = send(&tx, format!("event: message\ndata: {last}\n\n")).await;
        drop(tx);
        st2.streams_closed.fetch_add(1, Ordering::Relaxed);
    });
    let mut r = Response::new(http_body_util::Either::Right(StreamBody::new(
        tokio_stream_shim::Receiver(rx),
    )));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r.headers_mut().insert(
        "x-worker",
        HeaderValue::from_str(&st.name).unwrap_or(HeaderValue::from_static("?")),
    );
    r
}

/// An mpsc receiver as a stream of body frames (avoids a tokio-stream dependency).
mod tokio_stream_shim {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct Receiver(pub mpsc::Receiver<Bytes>);

    impl futures_util::Stream for Receiver {
        type Item = Result<Frame<Bytes>, Infallible>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
        }
    }
}
