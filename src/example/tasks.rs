//! Tasks in the example worker (extension `io.modelcontextprotocol/tasks`, SEP-2663): a
//! `tools/call` of the `task` tool answers `resultType: "task"` with a task held in this
//! instance's memory; `tasks/get` polls it (it works for `steps` polls, may then ask for input),
//! `tasks/update` answers its input requests, `tasks/cancel` ends it, `tasks/list` lists this
//! instance's tasks. A task started with `"fail": true` fails instead of completing; one
//! started with `"sse": true` has every answer about it sent over SSE, after a status
//! notification carrying the whole task as the specification shapes it (status, and its
//! `inputRequests`, `result` or `error` inlined). A GET stream sends one such notification per
//! task held. One started with `"background": true` completes on its own at once, so that
//! only a poll or a notification tells. Like a real server, the worker checks `Mcp-Name` against `params.taskId`, and a
//! task id it never issued is a misroute (`unknown_followups`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::WorkerState;

/// One task this instance holds.
pub(super) struct Task {
    /// `tasks/get` polls left before the task is done working.
    steps_left: u32,
    /// It asks for input once its steps are done (answered by `tasks/update`).
    asks_input: bool,
    input_given: bool,
    status: &'static str,
    /// The opaque state the task hands the client, echoed back on its follow-ups.
    request_state: String,
    /// It fails (a JSON-RPC error inlined) where it would complete.
    fails: bool,
    /// Answers about it go over SSE, each after a status notification.
    pub(super) over_sse: bool,
    /// The method of its status notifications: `notifications/tasks` (2026-07-28) or
    /// `notifications/tasks/status` (2025-11-25).
    notice_method: String,
}

/// The tasks of one instance, and the counter its ids come from.
pub(super) struct Tasks {
    held: HashMap<String, Task>,
    issued: u64,
    /// Random per instance: a restarted worker issues other ids.
    instance: u32,
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks {
            held: HashMap::new(),
            issued: 0,
            instance: rand::random(),
        }
    }
}

/// What a task request answers: a result, or a JSON-RPC error (code, message).
pub(super) type TaskAnswer = Result<Value, (i32, String)>;

/// `tools/call` of the `task` tool: a new task (`arguments`: `steps`, `input`).
pub(super) fn start(st: &WorkerState, args: &Value) -> Value {
    let mut tasks = st.tasks.lock();
    tasks.issued += 1;
    // Opaque, as a real server's: nothing in it names the instance (but it is unique to it).
    let id = format!("task-{:08x}-{}", tasks.instance, tasks.issued);
    let mut task = Task {
        steps_left: args.get("steps").and_then(Value::as_u64).unwrap_or(1) as u32,
        asks_input: args.get("input").and_then(Value::as_bool).unwrap_or(false),
        input_given: false,
        status: "working",
        request_state: format!("task-state-{}", tasks.issued),
        fails: args.get("fail").and_then(Value::as_bool).unwrap_or(false),
        over_sse: args.get("sse").and_then(Value::as_bool).unwrap_or(false),
        notice_method: args
            .get("notice")
            .and_then(Value::as_str)
            .unwrap_or("notifications/tasks")
            .to_string(),
    };
    let result = json!({
        "resultType": "task",
        "taskId": id,
        "status": task.status,
        "ttlMs": 600_000,
        "pollIntervalMs": 10,
        "requestState": task.request_state,
    });
    if args.get("background").and_then(Value::as_bool).unwrap_or(false) {
        // Done on its own at once: a client learns it from a notification, or a poll.
        task.status = "completed";
        st.executions.fetch_add(1, Ordering::Relaxed);
    }
    tasks.held.insert(id, task);
    result
}

/// A `tasks/*` request: `name_header` is the request's `Mcp-Name` as received.
pub(super) fn follow_up(st: &WorkerState, method: &str, params: &Value, name_header: Option<&str>) -> TaskAnswer {
    if method == "tasks/list" {
        let tasks = st.tasks.lock();
        let mut list: Vec<Value> = tasks
            .held
            .iter()
            .map(|(id, t)| json!({"taskId": id, "status": t.status}))
            .collect();
        list.sort_by(|a, b| a["taskId"].as_str().cmp(&b["taskId"].as_str()));
        return Ok(json!({"resultType": "complete", "tasks": list}));
    }
    let Some(id) = params.get("taskId").and_then(Value::as_str) else {
        return Err((-32602, "taskId required".into()));
    };
    // The header names the task as the body does (SEP-2243), as it left the client's hands.
    if let Some(header) = name_header {
        if decode_name(header).as_deref() != Some(id) {
            return Err((
                -32020,
                format!("Mcp-Name {header:?} does not match params.taskId {id:?}"),
            ));
        }
    }
    let mut tasks = st.tasks.lock();
    let Some(task) = tasks.held.get_mut(id) else {
        st.unknown_followups.fetch_add(1, Ordering::Relaxed);
        return Err((-32602, format!("unknown task {id:?}")));
    };
    if let Some(state) = params.get("requestState").and_then(Value::as_str) {
        if state != task.request_state {
            return Err((-32602, "requestState does not belong to this task".into()));
        }
    }
    match method {
        "tasks/get" => Ok(poll(id, task, st)),
        "tasks/update" => {
            if params.get("inputResponses").is_some_and(Value::is_object) {
                task.input_given = true;
            }
            Ok(json!({"resultType": "complete"}))
        }
        "tasks/cancel" => {
            if !matches!(task.status, "completed" | "failed") {
                task.status = "cancelled";
            }
            Ok(json!({"resultType": "complete"}))
        }
        other => Err((-32601, format!("no method {other:?}"))),
    }
}

/// A `tasks/get`: the task's state now (each poll is a step of its work).
fn poll(id: &str, task: &mut Task, st: &WorkerState) -> Value {
    if task.status == "working" || task.status == "input_required" {
        if task.steps_left > 0 {
            task.steps_left -= 1;
        } else if task.asks_input && !task.input_given {
            task.status = "input_required";
        } else {
            task.status = if task.fails { "failed" } else { "completed" };
            st.executions.fetch_add(1, Ordering::Relaxed);
        }
    }
    detailed(id, task, st)
}

/// The task as `tasks/get` and status notifications show it: its status-specific fields
/// inlined.
fn detailed(id: &str, task: &Task, st: &WorkerState) -> Value {
    let mut v = json!({
        "resultType": "complete",
        "taskId": id,
        "status": task.status,
        "ttlMs": 600_000,
        "pollIntervalMs": 10,
        "requestState": task.request_state,
    });
    match task.status {
        "input_required" => {
            v["inputRequests"] = json!({"confirm": {"method": "elicitation/create",
                "params": {"message": "Proceed?", "requestedSchema": {"type": "object"}}}});
        }
        "completed" => {
            v["result"] = json!({"content": [{"type": "text", "text": format!("task done by {}", st.name)}]});
        }
        "failed" => {
            v["error"] = json!({"code": -32603, "message": format!("task failed on {}", st.name)});
        }
        _ => {}
    }
    v
}

/// The status notification of a task, as a server pushes it: the whole task, and the task it
/// relates to in `_meta` (the same id, as the 2025-11-25 revision has every task message carry).
fn notice(id: &str, task: &Task, st: &WorkerState) -> Value {
    let mut params = detailed(id, task, st);
    params.as_object_mut().map(|p| p.remove("resultType"));
    params["_meta"] = json!({"io.modelcontextprotocol/related-task": {"taskId": id}});
    json!({"jsonrpc": "2.0", "method": task.notice_method, "params": params})
}

/// The status notification of task `id`, if this instance holds it.
pub(super) fn notice_of(st: &WorkerState, id: &str) -> Option<Value> {
    let tasks = st.tasks.lock();
    tasks.held.get(id).map(|t| notice(id, t, st))
}

/// Whether the answers about task `id` go over SSE.
pub(super) fn over_sse(st: &WorkerState, id: &str) -> bool {
    st.tasks.lock().held.get(id).is_some_and(|t| t.over_sse)
}

/// A status notification for every task this instance holds (a GET stream's events), in the
/// order of their ids.
pub(super) fn notices(st: &WorkerState) -> Vec<Value> {
    let tasks = st.tasks.lock();
    let mut ids: Vec<&String> = tasks.held.keys().collect();
    ids.sort();
    ids.into_iter().map(|id| notice(id, &tasks.held[id], st)).collect()
}

/// `Mcp-Name` as text: `=?base64?…?=` decoded.
fn decode_name(raw: &str) -> Option<String> {
    use base64::Engine;
    match raw.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(b64) => {
            let padded = format!("{b64}{}", "=".repeat((4 - b64.len() % 4) % 4));
            let bytes = base64::engine::general_purpose::STANDARD.decode(padded).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(raw.to_string()),
    }
}

impl Tasks {
    /// Whether this instance holds the task `id`.
    pub(super) fn holds(&self, id: &str) -> bool {
        self.held.contains_key(id)
    }
}
