//! What a backend's message says: the outcome for the call it answers, and every task id it
//! names. A message is classified by its structure (docs/src/dialects.md): one with a
//! `method` is a request or a notification from the server, whatever its `params` hold; one
//! without is a response, read by its top-level `result` or `error`. Nothing inside a result or
//! in a notification's `params` (a tool's text, a task's inlined `result` or `error`) changes
//! what kind of message it is.

use std::borrow::Cow;
use std::ops::Range;

use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{json_string, opt_string, span_in};

/// What a backend's answer says about the call it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Routing-id dialect: `"pending": true`, the call continues on this backend.
    Pending,
    /// `resultType: "input_required"` with the state the client will echo, and where its
    /// literal (quotes included) sits in the message, written as the backend wrote it.
    InputRequired { request_state: String, at: Range<usize> },
    /// The call became (or still is) a task: a `resultType: "task"` result, or a `tasks/*`
    /// answer with the task's status. The task is among the message's [`Message::tasks`],
    /// with its status.
    Task,
    /// A `tasks/list` answer: the tasks it lists are the message's tasks, named only.
    TaskList,
    /// A final result, or a JSON-RPC error: the call is over.
    Final,
    /// Not a JSON-RPC response: a request or notification from the server (a task's status
    /// notification among them: its task is among the message's tasks), or not JSON.
    NotAResponse,
}

/// A backend's message as the call lifecycle reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub outcome: Outcome,
    /// Every task id the message names where the protocol puts one: a task result's and a
    /// `tasks/*` answer's task, `tasks/list` entries, a status notification's task, the task a
    /// message relates to (`_meta` `io.modelcontextprotocol/related-task`), and the tasks a
    /// subscription acknowledges. Each is sealed for the client when tokens are on.
    pub tasks: Vec<TaskSeen>,
}

/// A task id in a message, where its literal (quotes included) sits, and the status the
/// message reports for that task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSeen {
    pub task_id: String,
    pub at: Range<usize>,
    /// Set when the message is about this task and gives its status (a task result, a
    /// `tasks/*` answer, a status notification); `None` where it only names it (a list entry,
    /// related-task metadata, a subscription).
    pub status: Option<TaskState>,
}

/// Whether a task still needs its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Live,
    /// Completed, failed or cancelled.
    Over,
}

impl TaskState {
    fn of(status: Option<&str>) -> TaskState {
        match status.is_some_and(is_terminal_task_status) {
            true => TaskState::Over,
            false => TaskState::Live,
        }
    }
}

/// Task statuses after which a task no longer needs its instance.
fn is_terminal_task_status(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled" | "canceled")
}

/// The methods of a task's status notification.
fn is_task_notice(method: &str) -> bool {
    matches!(method, "notifications/tasks" | "notifications/tasks/status")
}

#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    result: Option<ResultEnvelope<'a>>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<ParamsEnvelope<'a>>,
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
    /// Kept raw: where it sits in the message matters too (sealed task ids replace it).
    #[serde(rename = "taskId", borrow, default)]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    status: Option<Cow<'a, str>>,
    /// The 2025-11-25 form of a created task: `{"task": {"taskId": …}}`.
    #[serde(rename = "task", borrow, default)]
    nested_task: Option<TaskEnvelope<'a>>,
    #[serde(borrow, default)]
    tasks: Option<Vec<TaskEnvelope<'a>>>,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<MetaEnvelope<'a>>,
}

/// A notification's or a server request's `params`.
#[derive(serde::Deserialize, Default)]
struct ParamsEnvelope<'a> {
    #[serde(rename = "taskId", borrow, default)]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    status: Option<Cow<'a, str>>,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<MetaEnvelope<'a>>,
    /// `notifications/subscriptions/acknowledged`: `{"notifications": {"taskIds": [...]}}`.
    #[serde(borrow, default)]
    notifications: Option<SubscriptionEnvelope<'a>>,
}

#[derive(serde::Deserialize, Default)]
struct TaskEnvelope<'a> {
    /// Kept raw: where it sits in the message matters too (sealed task ids replace it).
    #[serde(rename = "taskId", borrow, default)]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "opt_string")]
    status: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize, Default)]
struct MetaEnvelope<'a> {
    #[serde(rename = "io.modelcontextprotocol/related-task", borrow, default)]
    related: Option<TaskEnvelope<'a>>,
}

#[derive(serde::Deserialize, Default)]
struct SubscriptionEnvelope<'a> {
    #[serde(rename = "taskIds", borrow, default)]
    task_ids: Option<Vec<&'a RawValue>>,
}

/// A string literal borrowed from `message`, decoded, with where it sits there.
pub(super) fn literal_in(message: &[u8], raw: Option<&RawValue>) -> Option<(String, Range<usize>)> {
    let literal = raw.map(RawValue::get).filter(|l| l.starts_with('"'))?;
    let value = json_string(literal).ok()?;
    Some((value.into_owned(), span_in(message, literal.as_bytes())))
}

/// The tasks of one message, as they are found.
struct Found<'m> {
    message: &'m [u8],
    tasks: Vec<TaskSeen>,
}

impl Found<'_> {
    /// A task id the message names, with the status it reports, if any; not a string: none.
    fn add(&mut self, raw: Option<&RawValue>, status: Option<TaskState>) -> bool {
        let Some((task_id, at)) = literal_in(self.message, raw) else {
            return false;
        };
        self.tasks.push(TaskSeen { task_id, at, status });
        true
    }

    fn related(&mut self, meta: Option<MetaEnvelope>) {
        if let Some(related) = meta.and_then(|m| m.related) {
            self.add(related.task_id, None);
        }
    }
}

/// Reads one JSON-RPC message sent by a backend (a JSON body or an SSE event's data).
pub fn parse_message(message: &[u8]) -> Message {
    let mut found = Found {
        message,
        tasks: Vec::new(),
    };
    let outcome = match serde_json::from_slice::<Envelope>(message) {
        Err(_) => Outcome::NotAResponse,
        Ok(env) => match env.method {
            Some(method) => {
                let params = env.params.unwrap_or_default();
                if is_task_notice(&method) {
                    let state = TaskState::of(params.status.as_deref());
                    found.add(params.task_id, Some(state));
                }
                found.related(params.meta);
                if method == "notifications/subscriptions/acknowledged" {
                    for id in params.notifications.and_then(|n| n.task_ids).unwrap_or_default() {
                        found.add(Some(id), None);
                    }
                }
                Outcome::NotAResponse
            }
            None => match env.result {
                Some(result) => response(result, &mut found),
                None if env.error.is_some() => Outcome::Final,
                None => Outcome::NotAResponse,
            },
        },
    };
    Message {
        outcome,
        tasks: found.tasks,
    }
}

/// The outcome of a response's `result`, and the tasks it names.
fn response(result: ResultEnvelope, found: &mut Found) -> Outcome {
    found.related(result.meta);
    if matches!(result.pending, Some(serde_json::Value::Bool(true))) {
        return Outcome::Pending;
    }
    if result.result_type.as_deref() == Some("input_required") {
        return match literal_in(found.message, result.request_state) {
            Some((request_state, at)) => Outcome::InputRequired { request_state, at },
            None => Outcome::Final,
        };
    }
    if let Some(tasks) = result.tasks {
        for t in tasks {
            found.add(t.task_id, None);
        }
        return Outcome::TaskList;
    }
    let is_task = result.result_type.as_deref() == Some("task");
    let nested = result.nested_task.unwrap_or_default();
    let (raw_id, status) = match result.task_id {
        Some(id) => (Some(id), result.status),
        None => (nested.task_id, nested.status.or(result.status)),
    };
    let about_a_task = is_task || status.is_some();
    match about_a_task && found.add(raw_id, Some(TaskState::of(status.as_deref()))) {
        true => Outcome::Task,
        false => Outcome::Final,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(task_id: &str, at: Range<usize>, status: Option<TaskState>) -> TaskSeen {
        TaskSeen {
            task_id: task_id.into(),
            at,
            status,
        }
    }

    fn outcome(message: &[u8]) -> Outcome {
        parse_message(message).outcome
    }

    #[test]
    fn outcomes() {
        assert_eq!(
            outcome(br#"{"id":1,"result":{"pending":true,"requested":"confirmation"}}"#),
            Outcome::Pending
        );
        assert_eq!(outcome(br#"{"id":1,"result":{"content":[]}}"#), Outcome::Final);
        assert_eq!(outcome(br#"{"id":1,"result":{"pending":false}}"#), Outcome::Final);
        assert_eq!(
            outcome(br#"{"id":1,"error":{"code":-1,"message":"x"}}"#),
            Outcome::Final
        );
        assert_eq!(
            outcome(br#"{"id":1,"result":{"resultType":"input_required","inputRequests":{},"requestState":"abc"}}"#),
            Outcome::InputRequired {
                request_state: "abc".into(),
                at: 82..87
            }
        );
        // Escaped as the backend chose; the place is the literal's, escapes and all.
        let escaped = br#"{"result":{"resultType":"input_required", "requestState" : "a\/b\u00e9","x":1}}"#;
        let Outcome::InputRequired { request_state, at } = outcome(escaped) else {
            panic!("not input_required")
        };
        assert_eq!(request_state, "a/b\u{e9}");
        assert_eq!(&escaped[at], br#""a\/b\u00e9""#);
        assert_eq!(
            outcome(br#"{"method":"notifications/progress","params":{}}"#),
            Outcome::NotAResponse
        );
        assert_eq!(outcome(b"garbage"), Outcome::NotAResponse);
    }

    #[test]
    fn the_tasks_a_message_names() {
        let live = Some(TaskState::Live);
        let over = Some(TaskState::Over);
        let cases: [(&[u8], Outcome, Vec<TaskSeen>); 6] = [
            (
                br#"{"id":1,"result":{"resultType":"task","task":{"taskId":"t1","status":"working"}}}"#,
                Outcome::Task,
                vec![task("t1", 55..59, live)],
            ),
            (
                br#"{"id":1,"result":{"resultType":"task","taskId":"t-2","status":"working","ttlMs":60000}}"#,
                Outcome::Task,
                vec![task("t-2", 47..52, live)],
            ),
            (
                br#"{"id":1,"result":{"taskId":"t1","status":"completed"}}"#,
                Outcome::Task,
                vec![task("t1", 27..31, over)],
            ),
            (
                br#"{"id":1,"result":{"tasks":[{"taskId":"a","status":"working"},{"taskId":"b","status":"failed"}]}}"#,
                Outcome::TaskList,
                vec![task("a", 37..40, None), task("b", 71..74, None)],
            ),
            (
                br#"{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"t9","status":"cancelled"}}"#,
                Outcome::NotAResponse,
                vec![task("t9", 67..71, over)],
            ),
            (
                br#"{"method":"notifications/subscriptions/acknowledged","params":{"notifications":{"taskIds":["x","y"]}}}"#,
                Outcome::NotAResponse,
                vec![task("x", 91..94, None), task("y", 95..98, None)],
            ),
        ];
        for (message, want_outcome, want_tasks) in cases {
            let got = parse_message(message);
            assert_eq!(
                (&got.outcome, &got.tasks),
                (&want_outcome, &want_tasks),
                "{}",
                String::from_utf8_lossy(message)
            );
            for t in &got.tasks {
                assert_eq!(&message[t.at.clone()], format!("\"{}\"", t.task_id).as_bytes());
            }
        }
    }

    /// What a message is comes from its structure: a status notification that carries its
    /// task's result or error is a notification, and text or nesting never makes a response.
    #[test]
    fn a_message_is_classified_by_its_structure() {
        let completed = br#"{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"t","status":"completed","result":{"content":[{"type":"text","text":"\"error\": none"}]}}}"#;
        let got = parse_message(completed);
        assert_eq!(got.outcome, Outcome::NotAResponse);
        assert_eq!(got.tasks.len(), 1);
        assert_eq!(got.tasks[0].status, Some(TaskState::Over));
        let failed = br#"{"method":"notifications/tasks/status","params":{"taskId":"t","status":"failed","error":{"code":-1,"message":"x"}}}"#;
        assert_eq!(parse_message(failed).tasks[0].status, Some(TaskState::Over));
        // A server's request with a `result` key in its params is still a request.
        let request = br#"{"id":4,"method":"elicitation/create","params":{"result":{"pending":true},"error":1}}"#;
        assert_eq!(parse_message(request).outcome, Outcome::NotAResponse);
        // A final result whose content names fields of other shapes is final.
        let text = br#"{"id":1,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":{"pending":true,"resultType":"task","taskId":"no"}}}"#;
        assert_eq!(
            parse_message(text),
            Message {
                outcome: Outcome::Final,
                tasks: vec![]
            }
        );
        // The task a message belongs to, in `_meta`, is named wherever the message is.
        let related =
            br#"{"id":2,"result":{"content":[],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"rt"}}}}"#;
        let got = parse_message(related);
        assert_eq!(
            (got.outcome, got.tasks),
            (Outcome::Final, vec![task("rt", 89..93, None)])
        );
        let request = br#"{"id":3,"method":"elicitation/create","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"rt"}}}}"#;
        assert_eq!(parse_message(request).tasks, vec![task("rt", 106..110, None)]);
    }
}
