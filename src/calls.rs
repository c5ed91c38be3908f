//! The call lifecycle (docs/src/pins.md): what a backend's answer does to the pins of the call its
//! request belongs to, per dialect — create, refresh, finish, re-pin under a new
//! `requestState` — and which handles in it are sealed for the client. The proxy hands it the
//! answer's head and each JSON-RPC message; pins are in place before those bytes go out.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use http::header::{HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use memchr::memmem;

use crate::auth::Caller;
use crate::catalog::ClientList;
use crate::dialect::{self, Message, Outcome, RequestHandles, TaskState, SESSION_HEADER};
use crate::pins::{PinKey, PinKind};
use crate::quotas::OpenCall;
use crate::route::{Decision, Matched};
use crate::sealing::{Replacement, Unsealed};
use crate::state::{Shared, Snapshot};
use crate::token::{CallTag, PrincipalTag};
use crate::upstream::Incarnation;

/// What the answer needs to know about the call its request belongs to. Owned by the
/// request (JSON answers) or moved into the SSE body's event sink.
pub struct Call {
    shared: Arc<Shared>,
    snap: Arc<Snapshot>,
    /// The backend the request went to, as it was then.
    target: Incarnation,
    /// Client keys the request carried (routing id, messageId).
    client_keys: [Option<PinKey>; 2],
    /// The pin that routed this request, if any.
    matched: Option<Matched>,
    /// The rounds the call had before this request, by its pin or its tokens.
    rounds_before: u32,
    /// When the request was sent (taken only when tokens are on): the tokens its answer
    /// hands out are issued as of then, so that one made by an instance ejected meanwhile
    /// never names its successor.
    sent: SystemTime,
    session: Option<PinKey>,
    is_delete: bool,
    /// `tasks/cancel`: a successful answer ends the task.
    is_task_cancel: bool,
    /// Whether the body may carry an outcome (a POST of a JSON-RPC request).
    observes_body: bool,
    may_create_pin: bool,
    /// The session id exactly as the client sent it (maybe sealed), echoed back in answers.
    client_session: Option<HeaderValue>,
    /// The task id the request named, as the backend knows it and as the client sent it
    /// (sealed): answers about that task give the client back its own string.
    client_task: Option<(String, String)>,
    /// Where the kinds of the pins this call creates are noted (one bit per `PinKind`), when
    /// the request is observed (access log, tracing).
    pins_seen: Option<Arc<AtomicU8>>,
    /// The caller `[auth]` verified: every handle sealed for this call is bound to it.
    caller: Option<PrincipalTag>,
    /// With `[tokens]`, what the handles sealed for this call name: the call (its routing
    /// token's) and its method and tool (its `requestState`'s).
    tags: Option<(Option<CallTag>, CallTag)>,
    /// The caller's open-call slot (`[quotas] max_open_calls`), kept by the call's pins.
    open_call: Option<OpenCall>,
    /// With `[catalog]` on, what its answer may tell of the backend's tools: `Some(true)` for
    /// a `tools/list`, whose tools it may list.
    tells_tools: Option<bool>,
    /// With `filter_list_by_scope`, the caller whose scopes a `tools/list` answer is cut to.
    list_for: Option<Arc<Caller>>,
}

/// What observing one message did.
#[derive(Default)]
pub struct Observed {
    /// A new pin was made for this call.
    pub created: bool,
    /// The answer continues the call (it pinned, or kept pinned, a handle of it): it carries a
    /// fresh routing token, whose round count is this answer's.
    pub continues: bool,
    /// A string in the message to seal for the client.
    pub replacement: Option<Replacement>,
}

impl Call {
    pub fn new(
        shared: &Arc<Shared>,
        snap: &Arc<Snapshot>,
        handles: &RequestHandles,
        decision: &Decision,
        target: Incarnation,
        method: &Method,
        unsealed: Option<&Unsealed>,
    ) -> Call {
        let mut client_keys = [None, None];
        for (slot, key) in client_keys.iter_mut().zip(handles.client_pin_keys()) {
            *slot = Some(key);
        }
        // A call known only by the routing token it echoes: its pin here is under the key
        // the token names, so that its rounds count on this replica too, however old the
        // token it echoes.
        if client_keys[0].is_none() {
            client_keys[0] = unsealed.and_then(|u| u.token_call_key(handles));
        }
        let token_call = unsealed.and_then(|u| u.routing_call);
        let tags = snap
            .sealing
            .as_ref()
            .map(|_| (handles.call_tag().or(token_call), handles.tool_tag()));
        Call {
            shared: shared.clone(),
            snap: snap.clone(),
            target,
            client_keys,
            matched: decision.matched.filter(|_| !decision.pin_lost),
            rounds_before: decision.rounds,
            sent: match snap.sealing {
                Some(_) => SystemTime::now(),
                None => SystemTime::UNIX_EPOCH,
            },
            session: handles.session_id.map(|s| PinKey::new(PinKind::Session, s.as_bytes())),
            is_delete: *method == Method::DELETE,
            is_task_cancel: handles.method.as_deref() == Some("tasks/cancel"),
            observes_body: *method == Method::POST && handles.method.is_some() && handles.id.is_some(),
            may_create_pin: handles.may_create_pin(),
            client_session: handles.session_id.and_then(|s| HeaderValue::from_str(s).ok()),
            client_task: unsealed
                .and_then(|u| u.task_id.clone())
                .zip(handles.task_id.as_deref().map(str::to_string)),
            pins_seen: None,
            caller: None,
            tags,
            open_call: None,
            tells_tools: snap
                .config
                .catalog
                .as_ref()
                .map(|_| handles.method.as_deref() == Some("tools/list")),
            list_for: None,
        }
    }

    /// With `filter_list_by_scope` on and a `tools/list` from a caller `[auth]` verified: its
    /// answer's tools are cut to what the caller's scopes reach.
    pub fn filter_list_for(&mut self, caller: Option<&Arc<Caller>>) {
        let on = self
            .snap
            .config
            .catalog
            .as_ref()
            .is_some_and(|c| c.filter_list_by_scope);
        if on && self.tells_tools == Some(true) {
            self.list_for = caller.cloned();
        }
    }

    /// The request goes to another backend (a retry): what its answer pins names that one.
    pub fn retarget(&mut self, target: Incarnation) {
        self.target = target;
    }

    /// Whether the answer is a `tools/list`'s that the catalog reads (it asks for it unencoded).
    pub fn reads_tools_list(&self) -> bool {
        self.tells_tools == Some(true)
    }

    /// Whether answers are cut to the caller's scopes (their bodies change length).
    pub fn filters_list(&self) -> bool {
        self.list_for.is_some()
    }

    /// The edit that cuts a `tools/list` answer's tools to the caller's scopes, if it drops any.
    #[inline]
    pub fn filter_list(&self, msg: &[u8]) -> Option<Replacement> {
        let caller = self.list_for.as_ref()?;
        crate::catalog::drop_unscoped(msg, self.snap.auth.as_deref()?, caller)
    }

    /// With `[catalog]` on, what one message from the backend tells of its tools: a
    /// `notifications/tools/list_changed`, or a `tools/list` answer naming a tool the catalog
    /// does not know of it in that definition, has the backend asked again; a definition told
    /// otherwise than to the catalog is noted (docs/src/catalog.md).
    /// A forwarded list is never taken as the backend's whole catalog: it may be one page, or
    /// filtered for its caller.
    #[inline]
    pub fn tell_catalog(&self, msg: &[u8]) {
        if let Some(listed) = self.tells_tools {
            self.tell_catalog_of(listed, msg);
        }
    }

    /// [`Call::tell_catalog`] with the catalog on; `listed`: the answer is a `tools/list`'s.
    fn tell_catalog_of(&self, listed: bool, msg: &[u8]) {
        let backend = &self.target.backend.name;
        if LIST_CHANGED.find(msg).is_some() {
            let changed = serde_json::from_slice::<serde_json::Value>(msg).is_ok_and(|v| {
                matches!(
                    v["method"].as_str(),
                    Some(
                        "notifications/tools/list_changed"
                            | "notifications/prompts/list_changed"
                            | "notifications/resources/list_changed"
                    )
                )
            });
            if changed {
                self.shared.catalog.ask_again(backend);
            }
        } else if listed {
            match self.shared.catalog.client_saw(backend, msg, self.catalog_max_bytes()) {
                ClientList::Read { changed: true } => self.shared.rebuild(),
                // A large list is read on a thread of its own, one at a time (claimed before
                // the thread is taken): reading it never holds up the threads that serve requests.
                ClientList::Claimed => {
                    let (shared, backend, msg) = (self.shared.clone(), backend.to_string(), msg.to_vec());
                    tokio::task::spawn_blocking(move || {
                        if shared.catalog.read_claimed(&backend, &msg) {
                            shared.rebuild();
                        }
                    });
                }
                ClientList::Read { changed: false } | ClientList::Declined => {}
            }
        }
    }

    /// The most a catalog ask may read (`catalog.max_bytes`): a list a client got is read no
    /// further either.
    fn catalog_max_bytes(&self) -> usize {
        self.snap.config.catalog.as_ref().map_or(0, |c| c.max_bytes)
    }

    /// Binds every handle sealed for this call to the caller `[auth]` verified.
    pub fn issue_to(&mut self, caller: Option<PrincipalTag>) {
        self.caller = caller;
    }

    /// The open-call slot the call's pins hold (until they finish or expire).
    pub fn hold(&mut self, open_call: Option<OpenCall>) {
        self.open_call = open_call;
    }

    /// The round this request's answer is, if it continues the call.
    pub fn round(&self) -> u32 {
        let prior = self.matched.filter(|m| m.pin.kind != PinKind::Session);
        prior.map_or(0, |m| m.pin.rounds).max(self.rounds_before) + 1
    }

    /// The routing token an answer that pins this call carries, when tokens are on: any replica
    /// routes a client that echoes it straight to this backend.
    pub fn routing_token(&self) -> Option<String> {
        let s = self.snap.sealing.as_ref()?;
        let call = self.tags.and_then(|(call, _)| call);
        Some(s.routing_token(
            self.caller.as_ref(),
            call,
            &self.target.backend.name,
            self.round(),
            self.sent,
        ))
    }

    /// The header a routing token travels in.
    pub fn routing_header(&self) -> &http::HeaderName {
        &self.snap.config.routing.header
    }

    /// Notes the kind of each pin this call creates in `seen` (bit `PinKind as usize`).
    pub fn note_pins_in(&mut self, seen: Arc<AtomicU8>) {
        self.pins_seen = Some(seen);
    }

    /// Whether the answer's body may carry an outcome (a POST of a JSON-RPC request).
    pub fn observes_body(&self) -> bool {
        self.observes_body
    }

    /// Whether the request may start a call that needs a pin.
    pub fn may_create_pin(&self) -> bool {
        self.may_create_pin
    }

    /// A stream in a session (the GET stream a client listens on for hours, or a long tool
    /// call) keeps the session's pin alive: each event, `: ping` comments included, counts as
    /// activity, so the pin never idles out under a client that is still listening. (An idle
    /// stream is closed after `stream_idle_timeout`, so a live one always has events.)
    pub fn keep_session_alive(&self) {
        if let Some(key) = self.session {
            self.shared.pins.lookup(key, &self.snap.ttls);
        }
    }

    /// Pins `key` to the backend the request went to; true when the pin is new.
    fn pin(&self, key: PinKey, rounds: u32) -> bool {
        let (c, target) = (self, &self.target);
        let hold = c.open_call.clone();
        let created = c
            .shared
            .pins
            .pin_holding(key, target.backend.key, target.epoch, rounds, &c.snap.ttls, hold);
        if created {
            key.kind().count_created(&c.shared.metrics);
            if let Some(seen) = &c.pins_seen {
                seen.fetch_or(1 << key.kind() as u8, Ordering::Relaxed);
            }
        }
        created
    }

    fn finish(&self, key: PinKey) -> Option<u32> {
        let c = self;
        let pin = c.shared.pins.finish(key, &c.snap.ttls)?;
        pin.kind.count_finished(&c.shared.metrics);
        Some(pin.rounds)
    }

    /// Session pins come from response headers: in place before any body byte is sent.
    /// With sealing, the client gets the session id sealed (and its own sealed id echoed back).
    /// `issued` is the answer's `Mcp-Session-Id`, found by the caller. Returns true when a
    /// pin was made.
    pub fn observe_head(&self, status: StatusCode, headers: &mut HeaderMap, issued: Option<HeaderValue>) -> bool {
        let c = self;
        match c.session {
            // A backend issues a session only in a successful answer to a request without one
            // (the SDK attaches a fresh id even to its 4xx answers: those create nothing).
            None if status.is_success() => {
                let Some(id) = issued.filter(|v| !v.is_empty()) else {
                    return false;
                };
                let visible = match (&c.snap.sealing, id.to_str()) {
                    (Some(s), Ok(raw)) => {
                        HeaderValue::from_str(&s.wrap_session(c.caller.as_ref(), raw, &c.target.backend.name, c.sent))
                            .unwrap_or(id)
                    }
                    _ => id,
                };
                let created = self.pin(PinKey::new(PinKind::Session, visible.as_bytes()), 0);
                headers.insert(SESSION_HEADER, visible);
                created
            }
            Some(session) => {
                // "Session not found", or the session was deleted: the session is over.
                if status == StatusCode::NOT_FOUND || (c.is_delete && status.is_success()) {
                    self.finish(session);
                }
                if let (Some(_), Some(sent), true) = (&c.snap.sealing, &c.client_session, issued.is_some()) {
                    headers.insert(SESSION_HEADER, sent.clone());
                }
                false
            }
            None => false,
        }
    }

    /// Acts on one JSON-RPC message from the backend (a JSON body or one SSE event).
    pub fn observe_message(&self, msg: &[u8]) -> Observed {
        let c = self;
        let mut seen = Observed::default();
        let prior = c.matched.filter(|m| m.pin.kind != PinKind::Session);
        if !may_matter(msg, prior.is_some()) {
            return seen;
        }
        let Message { outcome, tasks } = dialect::parse_message(msg);
        let rounds = self.round();
        let is_task = outcome == Outcome::Task;
        match outcome {
            Outcome::NotAResponse => {}
            // The call goes on as a task (pinned below): its earlier handles are done with.
            Outcome::Task => self.finish_call(prior, None),
            Outcome::Pending => {
                for key in c.client_keys.iter().flatten() {
                    seen.created |= self.pin(*key, rounds);
                }
                seen.continues = true;
            }
            Outcome::InputRequired { request_state, at } => {
                // The client echoes the sealed state when sealing is on: pin what it will send.
                let wrapped = c.snap.sealing.as_ref().map(|s| {
                    s.wrap_request_state(
                        c.caller.as_ref(),
                        c.tags.map(|(_, tool)| tool),
                        &request_state,
                        &c.target.backend.name,
                        rounds,
                        c.sent,
                    )
                });
                let visible = wrapped.as_deref().unwrap_or(&request_state);
                seen.replacement = wrapped.as_deref().map(|w| Replacement::new(msg, at, w));
                let key = PinKey::new(PinKind::RequestState, visible.as_bytes());
                seen.created = self.pin(key, rounds);
                seen.continues = true;
                // The previous round's state is done with, unless the server asked again with
                // the same one: then the pin just made is that state's, and it goes on.
                if let Some(m) = prior.filter(|m| m.pin.kind == PinKind::RequestState && m.key != key) {
                    self.finish(m.key);
                }
            }
            Outcome::TaskList => self.finish_call(prior, Some(rounds)),
            Outcome::Final => {
                if let Some(m) = c.matched.filter(|m| m.pin.kind == PinKind::Task && c.is_task_cancel) {
                    self.finish(m.key);
                }
                self.finish_call(prior, Some(rounds))
            }
        }
        // Every task id the message names, whatever shape carries it: sealed for the client,
        // and the task's pin made or finished by the status the message reports.
        for task in &tasks {
            let (key, sealed) = self.task_handle(&task.task_id);
            match task.status {
                Some(TaskState::Over) => {
                    self.finish(key);
                }
                // A live task is pinned by an answer about it; a notification or a list only
                // names it.
                Some(TaskState::Live) if is_task => seen.created |= self.pin(key, rounds),
                _ => {}
            }
            if let Some(sealed) = sealed {
                seen.replacement = Some(match seen.replacement.take() {
                    Some(r) => r.and(msg, task.at.clone(), &sealed),
                    None => Replacement::new(msg, task.at.clone(), &sealed),
                });
            }
        }
        seen
    }

    /// A task id as the client sees it (sealed when tokens are on: the client's own string for
    /// the task its request named, else the id's stable seal) and the pin key of that handle;
    /// the sealed form when it differs from the backend's.
    fn task_handle(&self, task_id: &str) -> (PinKey, Option<String>) {
        let sealed = self.snap.sealing.as_ref().map(|s| match &self.client_task {
            Some((original, sent)) if original == task_id => sent.clone(),
            _ => s.wrap_task(self.caller.as_ref(), task_id, &self.target.backend.name),
        });
        let visible = sealed.as_deref().unwrap_or(task_id);
        (PinKey::new(PinKind::Task, visible.as_bytes()), sealed)
    }

    /// A final answer ends the call under every key it was pinned by.
    fn finish_call(&self, prior: Option<Matched>, rounds: Option<u32>) {
        let mut finished = false;
        if let Some(m) = prior.filter(|m| m.pin.kind != PinKind::Task) {
            finished |= self.finish(m.key).is_some();
        }
        for key in self.client_keys.iter().flatten() {
            finished |= self.finish(*key).is_some();
        }
        if let (true, Some(rounds)) = (finished, rounds) {
            self.shared.metrics.rounds_per_call.observe(rounds as f64);
        }
    }
}

// These markers are searched with searchers built once (`memmem::find` builds one per call).

/// Fields one of which every response carries.
static RESPONSE_MARKERS: LazyLock<[memmem::Finder<'static>; 2]> =
    LazyLock::new(|| [b"\"result\"".as_slice(), b"\"error\""].map(memmem::Finder::new));

/// What every notice that a backend's tools, prompts or resources changed holds.
static LIST_CHANGED: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new("/list_changed\""));

/// Field names one of which every message that continues a call or names a task carries
/// (`"taskId` covers `taskIds` too).
static CONTINUATION_MARKERS: LazyLock<[memmem::Finder<'static>; 3]> =
    LazyLock::new(|| [b"\"pending\"".as_slice(), b"\"resultType\"", b"\"taskId"].map(memmem::Finder::new));

/// Whether `msg` may change a pin or carry a handle to seal, so that it is worth parsing: it
/// names a field that continues a call or names a task, or it may be the final answer of a
/// call that is pinned (`pinned`). A filter, never a verdict: what a message is, the parse
/// says by its structure. (A search per field beats one pass over every quote: the searchers
/// are vectorised, and a per-quote check pays a search's start-up at each quote.)
fn may_matter(msg: &[u8], pinned: bool) -> bool {
    CONTINUATION_MARKERS.iter().any(|m| m.find(msg).is_some())
        || (pinned && RESPONSE_MARKERS.iter().any(|m| m.find(msg).is_some()))
}

#[cfg(test)]
mod tests {
    use super::may_matter;

    #[test]
    fn the_pre_check_finds_each_field_and_no_look_alike() {
        for msg in [
            &br#"{"id":1,"result":{"pending":true}}"#[..],
            br#"{"id":1,"result":{"resultType":"input_required","requestState":"s"}}"#,
            br#"{"id":1,"result":{"task":{"taskId":"t-1","status":"working"}}}"#,
            br#"{"method":"notifications/tasks","params":{"taskId":"t","result":{}}}"#,
            br#"{"method":"notifications/subscriptions/acknowledged","params":{"notifications":{"taskIds":[]}}}"#,
        ] {
            assert!(may_matter(msg, false), "{}", String::from_utf8_lossy(msg));
        }
        for msg in [
            &br#"{"id":1,"result":{"content":[{"type":"text","text":"done"}]}}"#[..],
            br#"{"id":1,"result":{"pendingX":true,"resultTypes":1,"taskI":[]}}"#,
            br#"{"id":1,"result":{"p":"r","t":""}}"#,
            b"",
            b"\"",
        ] {
            assert!(!may_matter(msg, false), "{}", String::from_utf8_lossy(msg));
        }
        // A pinned call's final answer or error matters; a notification without those fields
        // does not.
        assert!(may_matter(br#"{"id":1,"result":{}}"#, true));
        assert!(may_matter(br#"{"id":1,"error":{"code":1}}"#, true));
        assert!(!may_matter(br#"{"method":"notifications/progress","params":{}}"#, true));
    }
}
