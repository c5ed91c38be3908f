//! The training backend: one MCP server instance that speaks every dialect the router routes
//! (docs/src/dialects.md) and keeps its calls in its own memory, as real servers do, so a
//! follow-up that reaches another instance is caught (`misroutes`). It serves HTTP/1.1 and h2c
//! (prior knowledge) on one port, so the router reaches it either way (`[upstream] http2`).
//!
//! Tools: `transfer` answers `pending` (routing-id dialect; `confirm` ends it), `ask` answers
//! `input_required` with a `requestState` (a retry echoing it ends the call), `longjob` answers
//! `resultType: "task"` (`tasks/get` completes it), `progress` answers over SSE, `fail` answers
//! 500; anything else answers a text result. `initialize` opens a legacy session
//! (`Mcp-Session-Id`); a GET with that session is a held SSE stream with an event every 200 ms,
//! `DELETE` ends the session.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::TcpListener;

type Body = UnsyncBoxBody<Bytes, Infallible>;

pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    name: String,
    issued: AtomicU64,
    pending_calls: Mutex<HashSet<String>>,
    request_states: Mutex<HashSet<String>>,
    tasks: Mutex<HashSet<String>>,
    sessions: Mutex<HashSet<String>>,
    /// Follow-ups naming a call, state, task or session this instance never issued.
    misroutes: AtomicU64,
}

impl Backend {
    pub async fn start(name: &str) -> std::io::Result<Backend> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            name: name.to_string(),
            ..State::default()
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                let conn = builder
                    .serve_connection(
                        TokioIo::new(stream),
                        service_fn(move |req| {
                            let st = st.clone();
                            async move { Ok::<_, Infallible>(serve(&st, req).await) }
                        }),
                    )
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(Backend {
            name: name.to_string(),
            addr,
            state,
            task,
        })
    }

    pub fn misroutes(&self) -> u64 {
        self.state.misroutes.load(Ordering::Relaxed)
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

fn json_answer(status: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed_unsync())
        .expect("valid response")
}

fn empty(status: StatusCode) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()).boxed_unsync())
        .expect("valid response")
}

fn sse(frames: impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(BodyExt::boxed_unsync(StreamBody::new(frames)))
        .expect("valid response")
}

fn event(v: &Value) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(Bytes::from(format!("event: message\ndata: {v}\n\n"))))
}

async fn serve(st: &State, req: Request<Incoming>) -> Response<Body> {
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(s) = &session {
        if !st.sessions.lock().contains(s) {
            st.misroutes.fetch_add(1, Ordering::Relaxed);
            return json_answer(StatusCode::NOT_FOUND, &json!({"error": "Session not found"}));
        }
    }
    match (req.method(), &session) {
        (&Method::GET, Some(_)) => return held_stream(),
        (&Method::DELETE, Some(s)) => {
            st.sessions.lock().remove(s);
            return empty(StatusCode::OK);
        }
        (&Method::POST, _) => {}
        _ => return empty(StatusCode::METHOD_NOT_ALLOWED),
    }
    let Ok(body) = req.into_body().collect().await else {
        return empty(StatusCode::BAD_REQUEST);
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return empty(StatusCode::BAD_REQUEST);
    };
    let id = msg["id"].clone();
    let method = msg["method"].as_str().unwrap_or("");
    let params = &msg["params"];
    let tool = params["name"].as_str().unwrap_or("");
    let n = st.issued.fetch_add(1, Ordering::Relaxed);
    let result = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    let text = |t: &str| result(json!({"content": [{"type": "text", "text": t}]}));
    let rpc_error = |status, code: i32, message: &str| {
        json_answer(
            status,
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        )
    };
    let misroute = |what: &str| {
        st.misroutes.fetch_add(1, Ordering::Relaxed);
        rpc_error(StatusCode::BAD_REQUEST, -32602, &format!("unknown {what}"))
    };
    match (method, tool) {
        ("initialize", _) => {
            let sid = format!("s-{}-{n}", st.name);
            st.sessions.lock().insert(sid.clone());
            let mut answer = json_answer(
                StatusCode::OK,
                &result(json!({"protocolVersion": "2025-06-18", "serverInfo": {"name": st.name}, "capabilities": {}})),
            );
            answer
                .headers_mut()
                .insert("mcp-session-id", sid.parse().expect("ascii"));
            answer
        }
        ("tools/call", "transfer") => {
            let mid = msg["messageId"].as_str().unwrap_or_default().to_string();
            st.pending_calls.lock().insert(mid.clone());
            json_answer(
                StatusCode::OK,
                &json!({"jsonrpc": "2.0", "id": id, "messageId": mid, "result": {"pending": true, "requested": "confirmation"}}),
            )
        }
        ("confirm", _) => match st
            .pending_calls
            .lock()
            .remove(msg["messageId"].as_str().unwrap_or_default())
        {
            true => json_answer(StatusCode::OK, &text("done")),
            false => misroute("call"),
        },
        ("tools/call", "ask") => match params["requestState"].as_str() {
            Some(state) if st.request_states.lock().remove(state) => json_answer(StatusCode::OK, &text("confirmed")),
            Some(state) if state.starts_with("forged") => {
                rpc_error(StatusCode::BAD_REQUEST, -32602, "Invalid or expired requestState")
            }
            Some(_) => misroute("requestState"),
            None => {
                let state = format!("{}/{n}", st.name);
                st.request_states.lock().insert(state.clone());
                json_answer(
                    StatusCode::OK,
                    &result(
                        json!({"content": [{"type": "text", "text": "confirm?"}], "resultType": "input_required",
                        "inputRequests": {"confirm": {"method": "elicitation/create", "params": {"message": "Proceed?"}}},
                        "requestState": state}),
                    ),
                )
            }
        },
        ("tools/call", "longjob") => {
            let task = format!("t-{}-{n}", st.name);
            st.tasks.lock().insert(task.clone());
            json_answer(
                StatusCode::OK,
                &result(json!({"resultType": "task", "taskId": task, "status": "working", "ttlMs": 60000})),
            )
        }
        ("tasks/get", _) => {
            let task = params["taskId"].as_str().unwrap_or_default();
            match st.tasks.lock().remove(task) {
                true => json_answer(StatusCode::OK, &result(json!({"taskId": task, "status": "completed"}))),
                false => misroute("task"),
            }
        }
        ("tools/call", "progress") => {
            let events: Vec<_> = (1..=2)
                .map(|i| json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": i, "total": 2}}))
                .chain([text("finished")])
                .map(|v| event(&v))
                .collect();
            sse(futures_util::stream::iter(events))
        }
        ("tools/call", "fail") => rpc_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "tool failed"),
        _ => json_answer(StatusCode::OK, &text(&format!("ok from {}", st.name))),
    }
}

/// A GET stream of a session: an event every 200 ms until the client goes away.
fn held_stream() -> Response<Body> {
    let ticks = futures_util::stream::unfold(0u64, |i| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": i}});
        Some((event(&note), i + 1))
    });
    sse(ticks)
}
