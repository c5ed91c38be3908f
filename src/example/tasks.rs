//! Tasks in the example worker (extension `io.modelcontextprotocol/tasks`, SEP-2663): a
//! `tools/call` of the `task` tool answers `resultType: "task"` with a task held in this
//! instance's memory; `tasks/get` polls it (it works for `steps` polls, may then ask for input),
//! `tasks/update` answers its input requests, `tasks/cancel` ends it, `tasks/list` lists this
//! instance's tasks. Like a real server, the worker checks `Mcp-Name` against `params.taskId`,
//! and a task id it never issued is a misroute (`unknown_followups`).

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
    let task = Task {
        steps_left: args.get("steps").and_then(Value::as_u64).unwrap_or(1) as u32,
        asks_input: args.get("input").and_then(Value::as_bool).unwrap_or(false),
        input_given: false,
        status: "working",
        request_state: format!("task-state-{}", tasks.issued),
    };
    let result = json!({
        "resultType": "task",
        "taskId": id,
        "status": task.status,
        "ttlMs": 600_000,
        "pollIntervalMs": 10,
        "requestState": task.request_state,
    });
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
            task.status = "completed";
            st.executions.fetch_add(1, Ordering::Relaxed);
        }
    }
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
            v["inputRequests"] = json!({format!("confirm-{id}"): {"method": "elicitation/create",
                "params": {"message": "Proceed?", "requestedSchema": {"type": "object"}}}});
        }
        "completed" => {
            v["result"] = json!({"content": [{"type": "text", "text": format!("task done by {}", st.name)}]});
        }
        _ => {}
    }
    v
}

/// The status notification of a task (`notifications/tasks`), as a server pushes it.
pub(super) fn notice(id: &str, status: &str) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/tasks", "params": {"taskId": id, "status": status}})
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
