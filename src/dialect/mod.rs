//! Reading the three MCP dialects (DESIGN §2): the keys a request carries and the outcome an
//! answer reports. Only the envelope fields the router uses are parsed; everything else is
//! skipped without allocating.

mod keys;
mod scan;

use std::borrow::Cow;
use std::ops::Range;

use http::HeaderName;
use serde::de::{Deserializer, IgnoredAny};
use serde::Deserialize;
use serde_json::value::RawValue;

pub use keys::RequestKeys;
pub use scan::NotJson;

/// Header that carries a legacy session id. (Names, not strings: a lookup by string parses
/// the name first.)
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
/// Header that carries the tool/prompt/resource name or, on `tasks/*`, the task id.
pub const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");

/// What the router needs from a JSON-RPC request body.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestEnvelope<'a> {
    /// The raw JSON `id`, echoed verbatim in router errors.
    pub id: Option<&'a str>,
    pub method: Option<Cow<'a, str>>,
    /// The body key field (`messageId` by default), as a string.
    pub message_id: Option<Cow<'a, str>>,
    /// `params.requestState` (2026-07-28 multi-round retry).
    pub request_state: Option<Cow<'a, str>>,
    /// `params.taskId` (tasks extension).
    pub task_id: Option<Cow<'a, str>>,
}

/// Parses a request body. Returns `Err` when it is not JSON. A batch (array) yields its first
/// element's envelope. Each field is read by its last occurrence; `params` other than an object
/// carries none.
pub fn parse_request<'a>(body: &'a [u8], body_field: &str) -> Result<RequestEnvelope<'a>, NotJson> {
    scan::request(body, body_field)
}

/// [`parse_request`], and `params.name` (the tool or prompt called) from the same scan: for
/// the access log and traces.
pub fn parse_request_named<'a>(
    body: &'a [u8],
    body_field: &str,
) -> Result<(RequestEnvelope<'a>, Option<Cow<'a, str>>), NotJson> {
    scan::request_named(body, body_field)
}

/// Where `params.requestState`'s literal (quotes included) sits in a request body, as the
/// client wrote it: a wrapped state is put back there, whatever escapes the client's encoder
/// chose. (A second scan, for the rare request that carries a wrapped state.)
pub fn request_state_at(body: &[u8], body_field: &str) -> Option<Range<usize>> {
    scan::request_state_at(body, body_field)
}

/// Where `params.taskId`'s literal sits, as [`request_state_at`] finds the state's: a wrapped
/// task id is put back there.
pub fn task_id_at(body: &[u8], body_field: &str) -> Option<Range<usize>> {
    scan::task_id_at(body, body_field)
}

/// Where `part`, a slice borrowed from `whole`, sits in it.
fn span_in(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    debug_assert!(start + part.len() <= whole.len(), "not a slice of it");
    start..start + part.len()
}

/// The value of a JSON string literal (`raw` includes the quotes), borrowed unless escaped.
fn json_string(raw: &str) -> Result<Cow<'_, str>, serde_json::Error> {
    match raw.as_bytes().contains(&b'\\') {
        false if raw.len() >= 2 => Ok(Cow::Borrowed(&raw[1..raw.len() - 1])),
        _ => serde_json::from_str::<String>(raw).map(Cow::Owned),
    }
}

fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    let raw = <&'de RawValue>::deserialize(d)?;
    match raw.get().as_bytes().first() {
        Some(b'"') => json_string(raw.get()).map(Some).map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

/// What a backend's answer says about the call it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2a: `"pending": true` — the call continues on this backend.
    Pending,
    /// 2b: `resultType: "input_required"` with the state the client will echo, and where its
    /// literal (quotes included) sits in the message, written as the backend wrote it.
    InputRequired { request_state: String, at: Range<usize> },
    /// 2b tasks: the call became (or still is) a task (a `resultType: "task"` result, or a
    /// `tasks/*` answer with the task's status).
    Task(TaskSeen),
    /// A `tasks/list` answer: the tasks it names.
    TaskList(Vec<TaskSeen>),
    /// A task status notification (`notifications/tasks`, or `notifications/tasks/status`).
    TaskNotice(TaskSeen),
    /// A final result, or a JSON-RPC error: the call is over.
    Final,
    /// Not a JSON-RPC response (a request or notification from the server, or not JSON).
    NotAResponse,
}

/// A task id in an answer, where its literal (quotes included) sits, and whether the task is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSeen {
    pub task_id: String,
    pub at: Range<usize>,
    pub terminal: bool,
}

#[derive(serde::Deserialize)]
struct ResponseEnvelope<'a> {
    #[serde(borrow, default)]
    result: Option<ResultEnvelope<'a>>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<TaskEnvelope<'a>>,
}

#[derive(serde::Deserialize, Default)]
struct ResultEnvelope<'a> {
    #[serde(default)]
    pending: Option<serde_json::Value>,
    #[serde(rename = "resultType", borrow, default, deserialize_with = "opt_string")]
    result_type: Option<Cow<'a, str>>,
    /// Kept raw: where it sits in the message matters too (see [`Outcome::InputRequired`]).
    #[serde(rename = "requestState", borrow, default)]
    request_state: Option<&'a RawValue>,
    #[serde(rename = "taskId", borrow, default)]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    task: Option<TaskEnvelope<'a>>,
    #[serde(borrow, default)]
    tasks: Option<Vec<TaskEnvelope<'a>>>,
}

#[derive(serde::Deserialize, Default)]
struct TaskEnvelope<'a> {
    /// Kept raw: where it sits in the message matters too (sealed task ids replace it).
    #[serde(rename = "taskId", borrow, default)]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    status: Option<Cow<'a, str>>,
}

/// Task statuses after which a task no longer needs its instance.
pub fn is_terminal_task_status(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled" | "canceled")
}

/// A string literal borrowed from `message`, decoded, with where it sits there.
fn literal_in(message: &[u8], raw: Option<&RawValue>) -> Option<(String, Range<usize>)> {
    let literal = raw.map(RawValue::get).filter(|l| l.starts_with('"'))?;
    let value = json_string(literal).ok()?;
    Some((value.into_owned(), span_in(message, literal.as_bytes())))
}

fn task_seen(message: &[u8], raw: Option<&RawValue>, status: Option<&str>) -> Option<TaskSeen> {
    let (task_id, at) = literal_in(message, raw)?;
    Some(TaskSeen {
        task_id,
        at,
        terminal: status.is_some_and(is_terminal_task_status),
    })
}

/// Reads the outcome of one JSON-RPC message sent by a backend (a JSON body or an SSE event's data).
pub fn parse_outcome(message: &[u8]) -> Outcome {
    let Ok(env) = serde_json::from_slice::<ResponseEnvelope>(message) else {
        return Outcome::NotAResponse;
    };
    let Some(result) = env.result else {
        if env.error.is_some() {
            return Outcome::Final;
        }
        let notice = matches!(
            env.method.as_deref(),
            Some("notifications/tasks" | "notifications/tasks/status")
        );
        let params = env.params.unwrap_or_default();
        return match notice.then(|| task_seen(message, params.task_id, params.status.as_deref())) {
            Some(Some(seen)) => Outcome::TaskNotice(seen),
            _ => Outcome::NotAResponse,
        };
    };
    if matches!(result.pending, Some(serde_json::Value::Bool(true))) {
        return Outcome::Pending;
    }
    if result.result_type.as_deref() == Some("input_required") {
        return match literal_in(message, result.request_state) {
            Some((request_state, at)) => Outcome::InputRequired { request_state, at },
            None => Outcome::Final,
        };
    }
    if let Some(tasks) = result.tasks {
        let seen = tasks
            .iter()
            .filter_map(|t| task_seen(message, t.task_id, t.status.as_deref()));
        return Outcome::TaskList(seen.collect());
    }
    let task = result.task.unwrap_or_default();
    let is_task = result.result_type.as_deref() == Some("task");
    let (raw_id, status) = match result.task_id {
        Some(id) => (Some(id), result.status),
        None => (task.task_id, task.status.or(result.status)),
    };
    match (is_task || status.is_some()).then(|| task_seen(message, raw_id, status.as_deref())) {
        Some(Some(seen)) => Outcome::Task(seen),
        _ => Outcome::Final,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_name_is_read_when_asked_for() {
        let body = br#"{"id":1,"method":"tools/call","params":{"name":"get-\u0077eather","arguments":{"name":"no"}}}"#;
        let (e, name) = parse_request_named(body, "messageId").unwrap();
        assert_eq!(
            (e.method.as_deref(), name.as_deref()),
            (Some("tools/call"), Some("get-weather"))
        );
        // A later `params` replaces an earlier one whole; a name that is no string is none.
        let body = br#"{"params":{"name":"a"},"method":"x","params":{"name":7}}"#;
        assert_eq!(parse_request_named(body, "messageId").unwrap().1, None);
    }

    #[test]
    fn request_envelope_fields() {
        let body = br#"{"jsonrpc":"2.0","id":3,"messageId":"transfer-1","method":"tools/call",
            "params":{"name":"transfer-funds","arguments":{"to":"1","nested":[1,{"messageId":"no"}]},"requestState":"s\u0041"}}"#;
        let e = parse_request(body, "messageId").unwrap();
        assert_eq!(e.id, Some("3"));
        assert_eq!(e.method.as_deref(), Some("tools/call"));
        assert_eq!(e.message_id.as_deref(), Some("transfer-1"));
        assert_eq!(e.request_state.as_deref(), Some("sA"));
        // Plain strings are borrowed from the body; escaped ones (keys too) are decoded.
        assert!(matches!(
            (&e.method, &e.message_id),
            (Some(Cow::Borrowed(_)), Some(Cow::Borrowed(_)))
        ));
        let e = parse_request(br#"{"m\u0065thod":"a\nb","messageId":"x\"y"}"#, "messageId").unwrap();
        assert_eq!(
            (e.method.as_deref(), e.message_id.as_deref()),
            (Some("a\nb"), Some("x\"y"))
        );
        assert!(parse_request(b"{not json", "messageId").is_err());
        assert!(parse_request(b"{} trailing", "messageId").is_err());
        assert!(parse_request(b"", "messageId").is_err());
        let e = parse_request(br#"{"id":"a\"b","callId":42}"#, "callId").unwrap();
        assert_eq!((e.id, e.message_id.as_deref()), (Some(r#""a\"b""#), Some("42")));
        let e = parse_request(br#"[{"id":1,"messageId":"m"},{"id":2}]"#, "messageId").unwrap();
        assert_eq!(e.message_id.as_deref(), Some("m"));
        let e = parse_request(
            br#"{"id":1,"messageId":{"x":1},"params":{"taskId":"t-1"}}"#,
            "messageId",
        )
        .unwrap();
        assert_eq!((e.message_id, e.task_id.as_deref()), (None, Some("t-1")));
    }

    #[test]
    fn outcomes() {
        assert_eq!(
            parse_outcome(br#"{"id":1,"result":{"pending":true,"requested":"confirmation"}}"#),
            Outcome::Pending
        );
        assert_eq!(parse_outcome(br#"{"id":1,"result":{"content":[]}}"#), Outcome::Final);
        assert_eq!(parse_outcome(br#"{"id":1,"result":{"pending":false}}"#), Outcome::Final);
        assert_eq!(
            parse_outcome(br#"{"id":1,"error":{"code":-1,"message":"x"}}"#),
            Outcome::Final
        );
        assert_eq!(
            parse_outcome(
                br#"{"id":1,"result":{"resultType":"input_required","inputRequests":{},"requestState":"abc"}}"#
            ),
            Outcome::InputRequired {
                request_state: "abc".into(),
                at: 82..87
            }
        );
        // Escaped as the backend chose; the place is the literal's, escapes and all.
        let escaped = br#"{"result":{"resultType":"input_required", "requestState" : "a\/b\u00e9","x":1}}"#;
        let Outcome::InputRequired { request_state, at } = parse_outcome(escaped) else {
            panic!("not input_required")
        };
        assert_eq!(request_state, "a/b\u{e9}");
        assert_eq!(&escaped[at], br#""a\/b\u00e9""#);
        let task = |task_id: &str, at: Range<usize>, terminal| TaskSeen {
            task_id: task_id.into(),
            at,
            terminal,
        };
        let nested = br#"{"id":1,"result":{"resultType":"task","task":{"taskId":"t1","status":"working"}}}"#;
        assert_eq!(parse_outcome(nested), Outcome::Task(task("t1", 55..59, false)));
        assert_eq!(&nested[55..59], br#""t1""#);
        let flat = br#"{"id":1,"result":{"resultType":"task","taskId":"t-2","status":"working","ttlMs":60000}}"#;
        assert_eq!(parse_outcome(flat), Outcome::Task(task("t-2", 47..52, false)));
        assert_eq!(
            parse_outcome(br#"{"id":1,"result":{"taskId":"t1","status":"completed"}}"#),
            Outcome::Task(task("t1", 27..31, true))
        );
        let list =
            br#"{"id":1,"result":{"tasks":[{"taskId":"a","status":"working"},{"taskId":"b","status":"failed"}]}}"#;
        let Outcome::TaskList(seen) = parse_outcome(list) else {
            panic!("a task list")
        };
        let got: Vec<_> = seen
            .iter()
            .map(|t| (&list[t.at.clone()], t.task_id.as_str(), t.terminal))
            .collect();
        assert_eq!(got, [(&br#""a""#[..], "a", false), (&br#""b""#[..], "b", true)]);
        let notice =
            br#"{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"t9","status":"cancelled"}}"#;
        assert_eq!(parse_outcome(notice), Outcome::TaskNotice(task("t9", 67..71, true)));
        assert_eq!(&notice[67..71], br#""t9""#);
        assert_eq!(
            parse_outcome(br#"{"method":"notifications/progress","params":{}}"#),
            Outcome::NotAResponse
        );
        assert_eq!(parse_outcome(b"garbage"), Outcome::NotAResponse);
    }
}
