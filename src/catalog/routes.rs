//! What routing reads of the catalog (one part of the snapshot): for each tool, the backends
//! that serve it in the definition the lock approves; for each prompt and resource, the
//! backends listing it ([`ServedRoutes`]). Built when the catalog or the fleet changes, never
//! on the request path.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::arguments::{arguments, ArgumentChecks, Counted, Schema};
use super::fleet::FleetTools;
use super::served::ServedRoutes;
use crate::config::Lock;
use crate::dialect::RequestHandles;
use crate::error::RouterError;
use crate::upstream::BackendKey;

/// The backends serving one tool.
#[derive(Debug, Default)]
struct Serving {
    /// Those that list the tool in the definition the lock approves (every one that lists it,
    /// without a lock): where a new call of the tool may go.
    approved: Box<[BackendKey]>,
    /// Every definition of it says a call changes nothing (`readOnlyHint`) or may run twice
    /// (`idempotentHint`): a first round that failed after it was sent may go elsewhere.
    repeatable: bool,
    /// When the approved backends serve it with more than one `inputSchema`: each schema and
    /// the backends serving it. A new call goes to those whose schema accepts its arguments.
    schemas: Option<Box<[BySchema]>>,
    /// Every backend of the snapshot is approved for it: the ring decides alone, as for any
    /// request (the cheap path of the common case, a tool the whole fleet serves alike).
    everywhere: bool,
}

/// One `inputSchema` of a drifted tool and the backends serving it.
type BySchema = (Arc<Schema>, Box<[BackendKey]>);

/// Tool name → the backends serving it.
#[derive(Debug, Default)]
pub struct ToolRoutes {
    /// Hashed with foldhash (seeded per process): one lookup per new call, of a name the client
    /// chose, among names backends chose.
    tools: HashMap<Box<str>, Serving, foldhash::fast::RandomState>,
    /// `route_by_tool`: a new call goes only to the backends serving its tool.
    by_tool: bool,
    /// A lock is read: a tool the catalog or the lock names is called only where the lock
    /// approves what is served.
    locked: bool,
    /// Under a lock, the backends that told clients of too many tools it does not know of them
    /// ([`super::fleet::TOLD_MAX`]): no tool call is approved on them.
    told_too_much: Vec<BackendKey>,
    /// `mrtr_tool_argument_checks_total{result}`.
    counted: Option<Counted>,
    /// The backends listing each prompt and resource (`route_by_tool` routes those too).
    served: ServedRoutes,
}

/// Where a new call of a tool the catalog knows may go (or a new `prompts/get` or
/// `resources/read` of a prompt or resource it knows).
#[derive(Debug)]
pub struct Candidates<'r> {
    /// `None`: every backend of the snapshot may take it (the ring decides alone).
    pub backends: Option<Cow<'r, [BackendKey]>>,
    /// What checking its arguments against the tool's schemas found.
    pub arguments: ArgumentCheck,
    /// What to do when none of `backends` can take it (down, draining, out of the ring).
    pub when_all_out: WhenAllOut<'r>,
}

/// What a request routed among candidates does when every one of them is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenAllOut<'r> {
    /// A tool call is refused before any backend sees it (503 `tool_unavailable`).
    Refuse,
    /// A call its arguments sent to some of the backends serving its tool goes among all of
    /// them (as a call no schema accepts does): the backend's own answer judges its arguments.
    /// Refused only when those are out too.
    AmongServing(&'r [BackendKey]),
    /// A `prompts/get` or `resources/read` goes as any request: the ring decides, and the
    /// backend's own error is the answer.
    AnyBackend,
}

/// The outcome of checking a call's arguments against a drifted tool's schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgumentCheck {
    /// The backends agree on the tool's schema: nothing to check.
    NotNeeded,
    /// The call goes among the backends whose schema accepts its arguments.
    Matched,
    /// No schema accepts them (or they could not be read): the call goes among all.
    Unmatched,
}

/// `approved` grouped by schema, each compiled by `compile`, when there is more than one.
fn by_schema(
    approved: &[(BackendKey, &Value)],
    compile: &mut impl FnMut(&Value) -> Arc<Schema>,
) -> Option<Box<[BySchema]>> {
    let mut groups: Vec<(&Value, Vec<BackendKey>)> = Vec::new();
    for &(key, schema) in approved {
        match groups.iter_mut().find(|(s, _)| *s == schema) {
            Some((_, keys)) => keys.push(key),
            None => groups.push((schema, vec![key])),
        }
    }
    if groups.len() < 2 {
        return None;
    }
    Some(groups.into_iter().map(|(s, keys)| (compile(s), keys.into())).collect())
}

/// The backends whose schema accepts the arguments of the request's call; `None` when no
/// schema does, the request is a batch, or its arguments cannot be read.
#[cold]
fn accepting<'r>(serving: &'r Serving, schemas: &[BySchema], handles: &RequestHandles) -> Option<Candidates<'r>> {
    if handles.is_batch() {
        return None;
    }
    let arguments = arguments(handles.body?)?;
    let backends: Vec<BackendKey> = schemas
        .iter()
        .filter(|(schema, _)| schema.accepts(&arguments))
        .flat_map(|(_, keys)| keys.iter().copied())
        .collect();
    (!backends.is_empty()).then_some(Candidates {
        backends: Some(Cow::Owned(backends)),
        arguments: ArgumentCheck::Matched,
        when_all_out: WhenAllOut::AmongServing(&serving.approved),
    })
}

/// A tool name in an error answer: the client's own bytes, bounded.
const TOOL_IN_ERROR: usize = 128;

/// A tool name as an error answer shows it: its first [`TOOL_IN_ERROR`] bytes.
pub fn shown(tool: &str) -> String {
    let mut end = tool.len().min(TOOL_IN_ERROR);
    while !tool.is_char_boundary(end) {
        end -= 1;
    }
    tool[..end].to_string()
}

impl ToolRoutes {
    /// The routes of `fleet`'s tools, for the backends `key_of` knows (a backend the snapshot
    /// no longer has is left out), checked against `lock` when there is one. Under a lock, a
    /// backend is approved for a tool only when what it told the catalog last is approved, its
    /// last ask did not fail (`failing`: what it serves now is not known), and it told no
    /// client another definition since.
    pub fn build(
        fleet: &FleetTools,
        key_of: impl Fn(&str) -> Option<BackendKey>,
        lock: Option<&Lock>,
        by_tool: bool,
        failing: impl Fn(&str) -> bool,
        checks: &mut ArgumentChecks,
        snapshot_backends: usize,
    ) -> ToolRoutes {
        // Tool → each backend serving it, whether in the approved definition, and its schema.
        let mut tools: HashMap<Box<str>, Vec<(BackendKey, bool, &Value)>> = HashMap::new();
        let mut unrepeatable: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut told_too_much = Vec::new();
        for (backend, catalog) in fleet.backends() {
            let Some(key) = key_of(backend) else { continue };
            let known_now = !failing(backend) && !catalog.told_too_much;
            for (name, definition) in &catalog.tools {
                let approved = lock.is_none_or(|l| {
                    known_now
                        && !catalog.seen_otherwise.contains_key(name)
                        && l.approves(name, &definition.fingerprint.0)
                });
                let entry = (key, approved, &definition.input_schema);
                tools.entry(name.as_str().into()).or_default().push(entry);
                let hints = definition.hints;
                if !(hints.read_only || hints.idempotent) || catalog.twice.contains(name) {
                    unrepeatable.insert(name);
                }
            }
            // A tool it told a client of and never the catalog: before its first ask, all that
            // is known of it, and routed to it (unapproved under a lock); after, a claim its
            // ask did not make, routed by nothing and, under a lock, never approved.
            let told_only = catalog
                .seen_otherwise
                .iter()
                .filter(|(n, _)| !catalog.tools.contains_key(*n));
            for (name, told) in told_only.filter(|_| catalog.unasked || lock.is_some()) {
                let entry = (key, catalog.unasked && lock.is_none(), &told.input_schema);
                tools.entry(name.as_str().into()).or_default().push(entry);
                unrepeatable.insert(name);
            }
            if catalog.told_too_much && lock.is_some() {
                told_too_much.push(key);
            }
        }
        // A tool the lock names and no backend is known to serve is served by no approved
        // definition: a backend that serves it anyway serves one nobody checked.
        for name in lock.iter().flat_map(|l| l.tools.keys()) {
            tools.entry(name.as_str().into()).or_default();
        }
        let served = ServedRoutes::build(fleet, &key_of);
        let mut schemas = checks.build();
        let tools = tools
            .into_iter()
            .map(|(name, backends)| {
                let repeatable = !backends.is_empty() && !unrepeatable.contains(&*name);
                let approved: Vec<(BackendKey, &Value)> = backends
                    .iter()
                    .filter(|(_, a, _)| *a)
                    .map(|(k, _, s)| (*k, *s))
                    .collect();
                let serving = Serving {
                    schemas: by_schema(&approved, &mut |s| schemas.get(s)),
                    // One entry per backend serving it: all of them, when as many.
                    everywhere: approved.len() == snapshot_backends,
                    approved: approved.iter().map(|(k, _)| *k).collect(),
                    repeatable,
                };
                (name, serving)
            })
            .collect();
        ToolRoutes {
            tools,
            by_tool,
            locked: lock.is_some(),
            told_too_much,
            counted: schemas.counted(),
            served,
        }
    }

    /// Where a new call of the request's tool may go: the backends serving its approved
    /// definition; when they disagree on its `inputSchema`, those whose schema accepts the
    /// call's arguments (all of them when none does). A `prompts/get` or `resources/read`
    /// goes among the backends listing its prompt or URI. `None`: the request calls no tool,
    /// prompt or resource the catalog knows (routed as any request). Refused when every
    /// backend that serves the tool serves a definition the lock does not approve. A batch
    /// goes by its first message.
    pub fn for_new_call(&self, handles: &RequestHandles) -> Option<Result<Candidates<'_>, RouterError>> {
        if !self.by_tool {
            return None;
        }
        let method = handles.method.as_deref()?;
        if method != "tools/call" {
            // Most requests name nothing: one branch more for them.
            let backends = self.served.serving(method, handles.name.as_deref()?)?;
            return Some(Ok(Candidates {
                backends: Some(Cow::Borrowed(backends)),
                arguments: ArgumentCheck::NotNeeded,
                when_all_out: WhenAllOut::AnyBackend,
            }));
        }
        let tool = handles.name.as_deref()?;
        let serving = self.tools.get(tool)?;
        if serving.approved.is_empty() {
            return Some(Err(RouterError::ToolDefinitionChanged { tool: shown(tool) }));
        }
        let Some(schemas) = &serving.schemas else {
            let backends = (!serving.everywhere).then_some(Cow::Borrowed(&serving.approved[..]));
            return Some(Ok(Candidates {
                backends,
                arguments: ArgumentCheck::NotNeeded,
                when_all_out: WhenAllOut::Refuse,
            }));
        };
        Some(Ok(accepting(serving, schemas, handles).unwrap_or(Candidates {
            backends: Some(Cow::Borrowed(&serving.approved[..])),
            arguments: ArgumentCheck::Unmatched,
            when_all_out: WhenAllOut::Refuse,
        })))
    }

    /// The backends a request may move to when its first backend fails (a refused connection,
    /// a reset of a first round that may run twice): for a new call of a tool, prompt or
    /// resource the catalog routes, those serving it (under a lock, in the approved
    /// definition); `None`: any backend (a request the catalog does not route).
    #[cold]
    /// Its arguments are not checked again (the backend judges them): no second parse.
    pub fn fallback_among(&self, handles: &RequestHandles) -> Option<Vec<BackendKey>> {
        if !self.by_tool {
            return None;
        }
        let (method, name) = (handles.method.as_deref()?, handles.name.as_deref()?);
        if method != "tools/call" {
            return self.served.serving(method, name).map(<[BackendKey]>::to_vec);
        }
        // None approved (refused at the first choice already): nowhere else either.
        let serving = self.tools.get(name)?;
        (!serving.everywhere).then(|| serving.approved.to_vec())
    }

    /// Counts a check of a new call's arguments (`mrtr_tool_argument_checks_total`).
    pub fn count(&self, check: ArgumentCheck) {
        let Some(counted) = &self.counted else { return };
        match check {
            ArgumentCheck::NotNeeded => {}
            ArgumentCheck::Matched => counted.matched.inc(),
            ArgumentCheck::Unmatched => counted.unmatched.inc(),
        }
    }

    /// Whether every known definition of `tool` says a call of it may run twice.
    pub fn repeatable(&self, tool: &str) -> bool {
        self.tools.get(tool).is_some_and(|s| s.repeatable)
    }

    /// Every tool call of a request that starts calls (a batch's each) checked against the
    /// lock for the backend it goes to: a tool the catalog or the lock knows is refused unless
    /// that backend serves it in the approved definition (a backend that does not list it
    /// may serve it all the same, in a definition nobody approved). A tool nobody knows is
    /// the backend's to answer.
    pub fn approve(&self, handles: &RequestHandles, backend: BackendKey) -> Result<(), RouterError> {
        if !self.locked {
            return Ok(());
        }
        for (method, name) in handles.messages() {
            let (Some("tools/call"), Some(tool)) = (method, name) else {
                continue;
            };
            // A backend that told clients of too many tools nobody checked may serve any.
            let approved = match self.tools.get(tool) {
                _ if self.told_too_much.contains(&backend) => false,
                Some(serving) => serving.approved.contains(&backend),
                None => continue,
            };
            if !approved {
                return Err(RouterError::ToolDefinitionChanged { tool: shown(tool) });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::definition::Definition;
    use crate::catalog::BackendTools;
    use serde_json::json;

    fn key(name: &str) -> Option<BackendKey> {
        Some(BackendKey::of(name))
    }

    fn handles_of<'a>(headers: &'a http::HeaderMap, body: &'a [u8]) -> RequestHandles<'a> {
        let routing = http::HeaderName::from_static("mcp-routing-id");
        RequestHandles::read(headers, &routing, "messageId", Some(body)).unwrap()
    }

    #[test]
    fn a_prompt_or_resource_goes_among_the_backends_listing_it() {
        let mut fleet = FleetTools::default();
        let greet = |prompts: &[&str], resources: &[&str]| {
            BackendTools::of(crate::catalog::Lists {
                tools: vec![Definition::read(&json!({"name": "greet"})).unwrap()],
                prompts: prompts.iter().map(|p| p.to_string()).collect(),
                resources: resources.iter().map(|r| r.to_string()).collect(),
            })
        };
        fleet.learn("w1", greet(&["greet"], &["file:///a"]));
        fleet.learn("w2", greet(&[], &[]));
        let mut lock = Lock::default();
        lock.tools.insert("other".into(), [0; 32]);
        let build = |by_tool: bool, lock: Option<&Lock>| {
            ToolRoutes::build(&fleet, key, lock, by_tool, |_| false, &mut ArgumentChecks::default(), 3)
        };
        let get = br#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"greet"}}"#;
        let read = br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}"#;
        let unknown = br#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"nobody"}}"#;
        let list = br#"{"jsonrpc":"2.0","id":1,"method":"prompts/list"}"#;
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"greet"}},
                        {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"greet"}}]"#;
        let headers = http::HeaderMap::new();
        let handles = |body: &'static [u8]| handles_of(&headers, body);
        // A lock is about tools: it neither narrows nor refuses a prompt or a resource.
        for lock in [None, Some(&lock)] {
            let routes = build(true, lock);
            // A batch goes by its first message.
            for body in [&get[..], &read[..], &batch[..]] {
                let c = routes.for_new_call(&handles(body)).unwrap().unwrap();
                assert_eq!(c.backends.as_deref().unwrap(), [BackendKey::of("w1")]);
                assert_eq!(c.arguments, ArgumentCheck::NotNeeded);
                assert_eq!(c.when_all_out, WhenAllOut::AnyBackend);
            }
            assert!(routes.approve(&handles(get), BackendKey::of("w2")).is_ok());
            assert!(routes.approve(&handles(read), BackendKey::of("w2")).is_ok());
            assert!(routes.for_new_call(&handles(unknown)).is_none());
            assert!(routes.for_new_call(&handles(list)).is_none());
        }
        // The tool of the same name is served by both, and refused when both are out.
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"greet"}}"#;
        let routes = build(true, None);
        let c = routes.for_new_call(&handles(call)).unwrap().unwrap();
        assert_eq!(
            (c.backends.as_ref().unwrap().len(), c.when_all_out),
            (2, WhenAllOut::Refuse)
        );
        // `route_by_tool = false`: the ring decides alone.
        assert!(build(false, None).for_new_call(&handles(get)).is_none());
        assert!(build(false, None).for_new_call(&handles(read)).is_none());
    }

    #[test]
    fn routes_follow_the_lock() {
        let mut fleet = FleetTools::default();
        let v1 = Definition::read(&json!({"name": "a", "description": "v1"})).unwrap();
        let v2 = Definition::read(&json!({"name": "a", "description": "v2"})).unwrap();
        fleet.learn("w1", BackendTools::new([v1.clone()]));
        fleet.learn("w2", BackendTools::new([v2]));
        let headers = http::HeaderMap::new();
        let bodies = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"b"}}"#,
        ];
        let routing = http::HeaderName::from_static("mcp-routing-id");
        let handles = |tool: &str| {
            let body = bodies[usize::from(tool == "b")].as_bytes();
            RequestHandles::read(&headers, &routing, "messageId", Some(body)).unwrap()
        };
        let open = ToolRoutes::build(&fleet, key, None, true, |_| false, &mut ArgumentChecks::default(), 3);
        assert_eq!(
            open.for_new_call(&handles("a"))
                .unwrap()
                .unwrap()
                .backends
                .unwrap()
                .len(),
            2
        );
        // Served by every backend of the snapshot: the ring decides alone.
        let whole = ToolRoutes::build(&fleet, key, None, true, |_| false, &mut ArgumentChecks::default(), 2);
        assert!(whole.for_new_call(&handles("a")).unwrap().unwrap().backends.is_none());
        assert!(open.for_new_call(&handles("b")).is_none());
        let mut lock = Lock::default();
        lock.tools.insert("a".into(), v1.fingerprint.0);
        let locked = ToolRoutes::build(
            &fleet,
            key,
            Some(&lock),
            true,
            |_| false,
            &mut ArgumentChecks::default(),
            3,
        );
        assert_eq!(
            locked.for_new_call(&handles("a")).unwrap().unwrap().backends.unwrap()[..],
            [BackendKey::of("w1")]
        );
        assert!(locked.approve(&handles("a"), BackendKey::of("w1")).is_ok());
        assert!(locked.approve(&handles("a"), BackendKey::of("w2")).is_err());
        // A backend that does not list a tool the catalog knows may serve it unchecked.
        assert!(locked.approve(&handles("a"), BackendKey::of("w3")).is_err());
        // A tool nobody knows is the backend's to answer.
        assert!(locked.approve(&handles("b"), BackendKey::of("w3")).is_ok());
        // A tool the lock names and no backend lists is refused wherever it goes.
        lock.tools.insert("b".into(), v1.fingerprint.0);
        let named = ToolRoutes::build(
            &fleet,
            key,
            Some(&lock),
            true,
            |_| false,
            &mut ArgumentChecks::default(),
            3,
        );
        assert!(named.for_new_call(&handles("b")).unwrap().is_err());
        assert!(named.approve(&handles("b"), BackendKey::of("w1")).is_err());
        lock.tools.remove("b");
        lock.tools.clear();
        let none = ToolRoutes::build(
            &fleet,
            key,
            Some(&lock),
            true,
            |_| false,
            &mut ArgumentChecks::default(),
            3,
        );
        assert!(none.for_new_call(&handles("a")).unwrap().is_err());
    }

    #[test]
    fn what_clients_were_told_routes_only_before_the_first_ask_and_is_bounded() {
        let def = |name: &str| Definition::read(&json!({"name": name})).unwrap();
        let headers = http::HeaderMap::new();
        let call =
            |tool: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}"}}}}"#);
        let (ghost, real) = (call("ghost"), call("real"));
        let build = |fleet: &FleetTools, lock: Option<&Lock>| {
            ToolRoutes::build(fleet, key, lock, true, |_| false, &mut ArgumentChecks::default(), 3)
        };
        let mut fleet = FleetTools::default();
        fleet.learn("w1", BackendTools::new([def("real")]));
        // Not asked yet: what it told is where its calls go.
        fleet.seen_by_client("new", &[def("ghost")]);
        let routes = build(&fleet, None);
        let c = routes
            .for_new_call(&handles_of(&headers, ghost.as_bytes()))
            .unwrap()
            .unwrap();
        assert_eq!(c.backends.as_deref().unwrap(), [BackendKey::of("new")]);
        // Its first ask replaces it: `ghost` is nobody's.
        fleet.learn("new", BackendTools::new([def("real")]));
        assert!(fleet.backend("new").unwrap().seen_otherwise.is_empty());
        assert!(build(&fleet, None)
            .for_new_call(&handles_of(&headers, ghost.as_bytes()))
            .is_none());
        // A learned backend's claim routes nothing; under a lock it is not approved.
        fleet.seen_by_client("w1", &[def("ghost")]);
        assert!(build(&fleet, None)
            .for_new_call(&handles_of(&headers, ghost.as_bytes()))
            .is_none());
        let mut lock = Lock::default();
        lock.tools.insert("real".into(), def("real").fingerprint.0);
        let locked = build(&fleet, Some(&lock));
        assert!(locked
            .approve(&handles_of(&headers, ghost.as_bytes()), BackendKey::of("w1"))
            .is_err());
        assert!(locked
            .approve(&handles_of(&headers, real.as_bytes()), BackendKey::of("w1"))
            .is_ok());
        // Told of more tools than are kept: bounded, and under a lock nothing is approved on it.
        let many: Vec<Definition> = (0..=super::super::fleet::TOLD_MAX)
            .map(|i| def(&format!("t{i}")))
            .collect();
        fleet.seen_by_client("w1", &many);
        let w1 = fleet.backend("w1").unwrap();
        assert!(w1.told_too_much && w1.seen_otherwise.len() == super::super::fleet::TOLD_MAX);
        let locked = build(&fleet, Some(&lock));
        assert!(locked
            .approve(&handles_of(&headers, real.as_bytes()), BackendKey::of("w1"))
            .is_err());
        assert!(locked
            .approve(&handles_of(&headers, real.as_bytes()), BackendKey::of("new"))
            .is_ok());
        // An unasked backend that tells of too many stays unapproved after its first ask.
        fleet.seen_by_client("late", &many);
        fleet.learn("late", BackendTools::new([def("real")]));
        assert!(fleet.backend("late").unwrap().told_too_much);
        assert!(build(&fleet, Some(&lock))
            .approve(&handles_of(&headers, real.as_bytes()), BackendKey::of("late"))
            .is_err());
    }
}
