//! Asking one backend for its tools, as an MCP client would (docs/src/catalog.md): on the
//! 2026-07-28 protocol when the backend speaks it (`server/discover`, then stateless
//! `tools/list` pages), else in a 2025 session opened for the purpose (`initialize`, the
//! `notifications/initialized` notice, `tools/list` pages, then the session deleted; a
//! stateless server that gives no session is asked without one). After the tools, the
//! `prompts/list` and `resources/list` pages of a backend whose capabilities declare them
//! (names and URIs only). Over the same endpoint, TLS and pool as the requests the backend
//! serves. Bounded: one ask takes at most the configured timeout (the caller's), and reads at
//! most `max_bytes` of answers and `max_tools` tools (and as many prompts, and resources).

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Either, Full, Limited};
use serde_json::{json, Value};

use super::definition::{within_value_bounds, Definition};
use crate::body::split_sse;
use crate::upstream::{Backend, Connection};

/// The newest protocol version the catalog asks in, and the session protocol it falls back to.
const MODERN: &str = "2026-07-28";
const SESSION_PROTOCOL: &str = "2025-06-18";
/// How the router names itself to a backend it asks.
const CLIENT_INFO: &str = r#"{"name":"mrtr-router catalog","version":"1"}"#;

/// How far one ask may go.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_tools: usize,
    pub max_bytes: usize,
}

/// Why an ask failed (the `result` label of `mrtr_catalog_refreshes_total`, and a log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskFailed {
    /// No connection, or it broke.
    Unreachable(String),
    /// An answer that is no tools list: an HTTP or JSON-RPC error, or not JSON.
    Refused(String),
    /// Past `max_tools` or `max_bytes`.
    TooLarge,
    /// Not done within `timeout`.
    Timeout,
}

impl AskFailed {
    pub fn label(&self) -> &'static str {
        match self {
            AskFailed::Unreachable(_) => "unreachable",
            AskFailed::Refused(_) => "refused",
            AskFailed::TooLarge => "too_large",
            AskFailed::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for AskFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskFailed::Unreachable(why) => write!(f, "unreachable: {why}"),
            AskFailed::Refused(why) => write!(f, "refused: {why}"),
            AskFailed::TooLarge => f.write_str(
                "more tools or bytes than max_tools or max_bytes, or JSON objects, arrays or values than the catalog reads",
            ),
            AskFailed::Timeout => f.write_str("no whole answer within the catalog's timeout"),
        }
    }
}

/// What one ask learned of a backend.
#[derive(Debug, Clone, Default)]
pub struct Lists {
    pub tools: Vec<Definition>,
    /// The names its `prompts/list` gives; none when it declares no prompts, or that list
    /// failed (its prompts are then unknown).
    pub prompts: Vec<String>,
    /// The URIs its `resources/list` gives (resource templates are not learned); none when it
    /// declares no resources, or that list failed.
    pub resources: Vec<String>,
}

/// What a backend's `capabilities` (of its `server/discover` or `initialize` result) declare
/// beyond tools: the lists worth asking for.
#[derive(Debug, Clone, Copy, Default)]
struct Declared {
    prompts: bool,
    resources: bool,
}

impl Declared {
    fn of(result: &Value) -> Declared {
        let declares = |what: &str| result["capabilities"].get(what).is_some_and(|v| !v.is_null());
        Declared {
            prompts: declares("prompts"),
            resources: declares("resources"),
        }
    }
}

/// One list method: its name, the member of its result that holds a page's items, and how an
/// item is read.
struct List<T> {
    method: &'static str,
    items: &'static str,
    read: fn(&Value) -> Option<T>,
}

const TOOLS: List<Definition> = List {
    method: "tools/list",
    items: "tools",
    read: Definition::read,
};
const PROMPTS: List<String> = List {
    method: "prompts/list",
    items: "prompts",
    read: |p| Some(p.get("name")?.as_str()?.to_string()),
};
const RESOURCES: List<String> = List {
    method: "resources/list",
    items: "resources",
    read: |r| Some(r.get("uri")?.as_str()?.to_string()),
};

/// One exchange's worth of headers beyond the body's.
struct Headers<'a> {
    version: &'a str,
    method: &'a str,
    session: Option<&'a str>,
}

/// A backend being asked: where, and what is left of the byte budget.
struct Asking<'a> {
    backend: &'a Backend,
    path: &'a str,
    limits: Limits,
    bytes_left: usize,
    /// The objects and arrays, and the values, the ask's answers held so far (bounded by
    /// `definition::within_value_bounds`).
    values_spent: (usize, usize),
    next_id: u64,
}

/// The backend's tools, every page of them (what the lock approves: nothing else is asked).
pub async fn tools(backend: &Backend, path: &str, limits: Limits) -> Result<Vec<Definition>, AskFailed> {
    Ok(ask(backend, path, limits, false).await?.tools)
}

/// The backend's tools, and its prompts and resources when it declares them: every page of each.
pub async fn lists(backend: &Backend, path: &str, limits: Limits) -> Result<Lists, AskFailed> {
    ask(backend, path, limits, true).await
}

/// One ask: the tools, and with `beyond_tools` the prompts and resources the backend declares.
async fn ask(backend: &Backend, path: &str, limits: Limits, beyond_tools: bool) -> Result<Lists, AskFailed> {
    let mut asking = Asking {
        backend,
        path,
        limits,
        bytes_left: limits.max_bytes,
        values_spent: (0, 0),
        next_id: 0,
    };
    let wanted = |declared: Declared| match beyond_tools {
        true => declared,
        false => Declared::default(),
    };
    if let Some(declared) = asking.discover().await? {
        return asking.lists(MODERN, None, wanted(declared)).await;
    }
    // A stateless 2025 server gives no session: its lists are asked without one.
    let (session, declared) = asking.open_session().await?;
    let listed = asking
        .lists(SESSION_PROTOCOL, session.as_deref(), wanted(declared))
        .await;
    if let Some(session) = &session {
        asking.close_session(session).await;
    }
    listed
}

/// A list beyond tools that the backend refused (an HTTP or JSON-RPC error, no such list in
/// its answer) is unknown, counted as none: it never fails the ask. Too large, unreachable
/// or late still does.
fn none_when_refused(listed: Result<Vec<String>, AskFailed>) -> Result<Vec<String>, AskFailed> {
    match listed {
        Err(AskFailed::Refused(_)) => Ok(Vec::new()),
        other => other,
    }
}

impl Asking<'_> {
    /// Whether the backend answers `server/discover` naming the modern version; if it does,
    /// what its capabilities declare.
    async fn discover(&mut self) -> Result<Option<Declared>, AskFailed> {
        let headers = Headers {
            version: MODERN,
            method: "server/discover",
            session: None,
        };
        let answer = match self.call("server/discover", json!({"_meta": meta()}), headers).await {
            Ok(answer) => answer,
            // Anything but a connection that failed is no evidence of the modern protocol.
            Err(AskFailed::Refused(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let versions = answer.0.get("supportedVersions").and_then(Value::as_array);
        let modern = versions.is_some_and(|v| v.iter().any(|v| v == MODERN));
        Ok(modern.then(|| Declared::of(&answer.0)))
    }

    /// A 2025 session: `initialize`, then the `notifications/initialized` notice; the
    /// session's id, if the server keeps sessions, and what its capabilities declare.
    async fn open_session(&mut self) -> Result<(Option<String>, Declared), AskFailed> {
        let params = json!({
            "protocolVersion": SESSION_PROTOCOL,
            "capabilities": {},
            "clientInfo": serde_json::from_str::<Value>(CLIENT_INFO).expect("a JSON literal"),
        });
        let headers = Headers {
            version: SESSION_PROTOCOL,
            method: "initialize",
            session: None,
        };
        let (result, session) = self.call("initialize", params, headers).await?;
        let notice = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let headers = Headers {
            version: SESSION_PROTOCOL,
            method: "notifications/initialized",
            session: session.as_deref(),
        };
        self.exchange(&notice, headers).await?;
        Ok((session, Declared::of(&result)))
    }

    /// Ends the session asked in (its answer does not matter).
    async fn close_session(&mut self, session: &str) {
        let Ok(request) = self.request(
            Method::DELETE,
            Bytes::new(),
            &Headers {
                version: SESSION_PROTOCOL,
                method: "",
                session: Some(session),
            },
        ) else {
            return;
        };
        if let Ok(conn) = self.connection().await {
            if let Ok(answer) = conn.send(request).await {
                let _ = answer.into_body().collect().await;
            }
        }
    }

    /// The tools, then the prompts and the resources `declared` names, within one budget.
    async fn lists(&mut self, version: &str, session: Option<&str>, declared: Declared) -> Result<Lists, AskFailed> {
        let tools = self.list(&TOOLS, version, session).await?;
        let mut lists = Lists {
            tools,
            ..Lists::default()
        };
        if declared.prompts {
            lists.prompts = none_when_refused(self.list(&PROMPTS, version, session).await)?;
        }
        if declared.resources {
            lists.resources = none_when_refused(self.list(&RESOURCES, version, session).await)?;
        }
        Ok(lists)
    }

    /// Every page of one list, following `nextCursor`; at most `max_tools` items.
    async fn list<T: Send + 'static>(
        &mut self,
        list: &List<T>,
        version: &str,
        session: Option<&str>,
    ) -> Result<Vec<T>, AskFailed> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut params = json!({});
            if version == MODERN {
                params["_meta"] = meta();
            }
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let headers = Headers {
                version,
                method: list.method,
                session,
            };
            let (result, _) = self.call(list.method, params, headers).await?;
            let (key, read) = (list.items, list.read);
            let (page, next) = off_the_runtime(move || {
                let page = result.get(key).and_then(Value::as_array);
                let page = page.map(|p| p.iter().filter_map(read).collect::<Vec<T>>());
                (
                    page,
                    result.get("nextCursor").and_then(Value::as_str).map(str::to_string),
                )
            })
            .await?;
            let page = page.ok_or_else(|| AskFailed::Refused(format!("a {} result without {}", list.method, key)))?;
            items.extend(page);
            if items.len() > self.limits.max_tools {
                return Err(AskFailed::TooLarge);
            }
            match next {
                Some(next) if cursor.as_deref() != Some(next.as_str()) => cursor = Some(next),
                _ => return Ok(items),
            }
        }
    }

    /// One JSON-RPC request: its result, and the answer's `Mcp-Session-Id` if it set one.
    async fn call(
        &mut self,
        method: &str,
        params: Value,
        headers: Headers<'_>,
    ) -> Result<(Value, Option<String>), AskFailed> {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let (status, session, body) = self.exchange(&request, headers).await?;
        if !status.is_success() {
            return Err(AskFailed::Refused(format!("{method}: HTTP {status}")));
        }
        let answer = off_the_runtime(move || answer_to(&body, id)).await?;
        let mut message = answer.ok_or_else(|| AskFailed::Refused(format!("{method}: no answer to it")))?;
        match (message.get("result").is_some(), message.get("error")) {
            (true, None) => Ok((message["result"].take(), session)),
            (_, Some(error)) => Err(AskFailed::Refused(format!("{method}: {error}"))),
            _ => Err(AskFailed::Refused(format!("{method}: neither result nor error"))),
        }
    }

    /// One POST and its whole answer (within what is left of `max_bytes`).
    async fn exchange(
        &mut self,
        message: &Value,
        headers: Headers<'_>,
    ) -> Result<(http::StatusCode, Option<String>, Bytes), AskFailed> {
        let body = Bytes::from(message.to_string());
        let request = self
            .request(Method::POST, body, &headers)
            .map_err(|e| AskFailed::Refused(e.to_string()))?;
        let conn = self.connection().await?;
        let answer = conn
            .send(request)
            .await
            .map_err(|e| AskFailed::Unreachable(e.error().to_string()))?;
        let status = answer.status();
        let session = answer
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let limited = Limited::new(answer.into_body(), self.bytes_left);
        let bytes = match limited.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(AskFailed::TooLarge),
            Err(e) => return Err(AskFailed::Unreachable(e.to_string())),
        };
        self.bytes_left -= bytes.len();
        if !within_value_bounds(&bytes, &mut self.values_spent) {
            return Err(AskFailed::TooLarge);
        }
        Ok((status, session, bytes))
    }

    fn request(
        &self,
        method: Method,
        body: Bytes,
        headers: &Headers<'_>,
    ) -> Result<Request<crate::upstream::UpstreamBody>, http::Error> {
        let target = self.backend.target_for(Some(&self.path.parse()?))?;
        let mut request = Request::builder()
            .method(method)
            .uri(target)
            .header(header::HOST, self.backend.host())
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", headers.version);
        if !body.is_empty() {
            request = request
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::CONTENT_LENGTH, body.len());
        }
        if !headers.method.is_empty() {
            request = request.header("mcp-method", headers.method);
        }
        if let Some(session) = headers.session {
            request = request.header("mcp-session-id", HeaderValue::from_str(session)?);
        }
        request.body(Either::Left(Full::new(body)))
    }

    async fn connection(&self) -> Result<crate::upstream::PooledConn, AskFailed> {
        match self.backend.check_connection() {
            Connection::Ready(conn) => Ok(conn),
            Connection::Opening(opening) => opening.await.map_err(|e| AskFailed::Unreachable(e.to_string())),
        }
    }
}

/// The `_meta` a stateless 2026-07-28 request carries: the version, the client, its capabilities.
fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": serde_json::from_str::<Value>(CLIENT_INFO).expect("a JSON literal"),
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

/// `work` (parsing and reading an answer, up to `max_bytes` of JSON: a third of a second of CPU
/// for a hostile one) on a thread of its own, so that an ask never holds up the threads that
/// serve requests.
async fn off_the_runtime<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> Result<R, AskFailed> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| AskFailed::Refused(format!("reading the answer failed: {e}")))
}

/// The JSON-RPC answer with `id` in an answer's body: the body itself, or one of its SSE events.
fn answer_to(body: &[u8], id: u64) -> Option<Value> {
    let is_ours = |v: &Value| v.get("id").and_then(Value::as_u64) == Some(id);
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return is_ours(&v).then_some(v);
    }
    let (events, _) = split_sse(&[body]);
    events
        .iter()
        .filter_map(|e| serde_json::from_slice::<Value>(e).ok())
        .find(is_ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_and_resources_are_asked_for_when_declared() {
        let declared = Declared::of(&json!({"capabilities": {"tools": {}, "prompts": {"listChanged": true}}}));
        assert!(declared.prompts && !declared.resources);
        let declared = Declared::of(&json!({"capabilities": {"resources": {}, "prompts": null}}));
        assert!(!declared.prompts && declared.resources);
        let declared = Declared::of(&json!({"supportedVersions": ["2026-07-28"]}));
        assert!(!declared.prompts && !declared.resources);
        assert_eq!(
            (PROMPTS.read)(&json!({"name": "greet", "arguments": []})),
            Some("greet".into())
        );
        assert_eq!((PROMPTS.read)(&json!({"title": "no name"})), None);
        assert_eq!(
            (RESOURCES.read)(&json!({"uri": "file:///a", "name": "a"})),
            Some("file:///a".into())
        );
        // A list refused is none; a list too large still fails the ask.
        assert_eq!(none_when_refused(Err(AskFailed::Refused("x".into()))), Ok(Vec::new()));
        assert_eq!(none_when_refused(Err(AskFailed::TooLarge)), Err(AskFailed::TooLarge));
    }

    #[test]
    fn the_answer_is_found_in_json_or_in_an_event() {
        let json = br#"{"jsonrpc":"2.0","id":3,"result":{"tools":[]}}"#;
        assert!(answer_to(json, 3).is_some());
        assert!(answer_to(json, 4).is_none());
        let sse = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                    event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"tools\":[]}}\n\n";
        assert_eq!(answer_to(sse, 3).unwrap()["result"]["tools"], json!([]));
    }
}
