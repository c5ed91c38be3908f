//! The handles a request carries: every handle in its headers and body that can choose a backend
//! (docs/src/dialects.md, docs/src/routing.md), read once and borrowed from the request.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};

use super::{parse_request, text, Envelopes, RequestEnvelope, Unreadable, NAME_HEADER, SESSION_HEADER};
use crate::pins::{PinKey, PinKind};
use crate::token::CallTag;

/// Every handle in a request that can choose a backend, and what its body asks for.
#[derive(Debug, Default, Clone)]
pub struct RequestHandles<'a> {
    /// JSON-RPC method (absent for GET/DELETE).
    pub method: Option<Cow<'a, str>>,
    /// The request's raw JSON-RPC id, for error answers.
    pub id: Option<&'a str>,
    /// The routing header value (2a).
    pub header_key: Option<&'a str>,
    /// The body key field value (2a).
    pub message_id: Option<Cow<'a, str>>,
    /// `params.requestState` (2b).
    pub request_state: Option<Cow<'a, str>>,
    /// Task id: `Mcp-Name` on `tasks/*`, else `params.taskId` (2b).
    pub task_id: Option<Cow<'a, str>>,

    /// `Mcp-Session-Id` (2c).
    pub session_id: Option<&'a str>,
    /// What the method acts on: `params.uri` of a `resources/read`, else `params.name` (the
    /// tool or prompt called).
    pub name: Option<Cow<'a, str>>,
    /// The body the handles were read from (the catalog reads a drifted tool's arguments).
    pub body: Option<&'a [u8]>,

    /// `Mcp-Name` disagrees with the body.
    names_disagree: bool,
    /// What few requests carry (a listener's task ids, a batch): boxed, so that the handles every
    /// request moves around stay small.
    rare: Option<Box<Rare<'a>>>,
}

/// The handles of the few requests that carry more than one message or handle of a kind.
#[derive(Debug, Default, Clone)]
struct Rare<'a> {
    /// `params.notifications.taskIds` of `subscriptions/listen`: tasks the request follows.
    task_ids: Box<[Cow<'a, str>]>,
    /// A batch's elements after the first (the first is the fields of [`RequestHandles`]).
    rest: Box<[RequestEnvelope<'a>]>,
    /// The body is a JSON-RPC batch (of one element, perhaps).
    batch: bool,
    /// Why a batch cannot be routed or judged as one request.
    batch_refused: Option<&'static str>,
}

/// The first protocol version without JSON-RPC batches (2025-06-18 removed them).
const NO_BATCHES_SINCE: &[u8] = b"2025-06-18";
const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// The JSON-RPC method of the body, as SEP-2243 repeats it in a header.
const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");

/// An `Mcp-Name` value as text: as it is, or decoded from `=?base64?<b64>?=`; `None` when it
/// is neither text nor a decodable form.
fn decode_name(raw: &[u8]) -> Option<Cow<'_, str>> {
    use base64::Engine;
    let Some(b64) = raw.strip_prefix(b"=?base64?").and_then(|r| r.strip_suffix(b"?=")) else {
        return text(raw).map(Cow::Borrowed);
    };
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(b64).ok()?;
    String::from_utf8(bytes).ok().map(Cow::Owned)
}

/// A header's first value as text, if it has one.
fn header_text(v: &http::HeaderValue) -> Option<&str> {
    text(v.as_bytes()).filter(|s| !s.is_empty())
}

impl<'a> RequestHandles<'a> {
    /// The handles of a request with these headers and, when there is one to read, this JSON-RPC
    /// body (`None`: a GET or DELETE; a body that is not JSON, or reads two ways, is an error).
    /// The one way handles are read: by the proxy, `/debug/route` and `mrtr-router route` alike.
    pub fn read(
        headers: &'a HeaderMap,
        routing_header: &HeaderName,
        body_field: &str,
        body: Option<&'a [u8]>,
    ) -> Result<Self, Unreadable> {
        let envelopes = match body {
            Some(body) => parse_request(body, body_field)?,
            None => Envelopes::default(),
        };
        let mut handles = RequestHandles::new(headers, routing_header, envelopes);
        handles.body = body;
        Ok(handles)
    }

    pub fn new(headers: &'a HeaderMap, routing_header: &HeaderName, envelopes: Envelopes<'a>) -> Self {
        let Envelopes {
            first: envelope,
            rest,
            batch,
            read,
        } = envelopes;
        // One pass over the headers (a handful) instead of a hashed lookup per name. A header
        // the router reads must stand once: readers that take the first value and those that
        // take the last (or the first that is not empty) would otherwise route, or run, two
        // different things.
        let (mut header_key, mut session_id, mut name, mut method, mut version) = (None, None, None, None, None);
        let (mut twice, mut versions) = (false, 0);
        let mut once = |slot: &mut Option<&'a http::HeaderValue>, v: &'a http::HeaderValue| {
            twice |= slot.replace(v).is_some();
        };
        for (n, v) in headers {
            if n == routing_header {
                once(&mut header_key, v);
            } else if n == SESSION_HEADER {
                once(&mut session_id, v);
            } else if n == NAME_HEADER {
                once(&mut name, v);
            } else if n == METHOD_HEADER {
                once(&mut method, v);
            } else if batch && n == PROTOCOL_VERSION {
                // Read for batches only, where the version decides whether a batch may be.
                versions += 1;
                version.get_or_insert(v);
            }
        }
        // `Mcp-Method` and `Mcp-Name` describe the body (SEP-2243): `Mcp-Method` its method,
        // `Mcp-Name` what the method acts on (the task on `tasks/*`, the tool or prompt, the
        // resource), in the `=?base64?…?=` form when it is not safe ASCII. The body stays the
        // source of truth: a header that disagrees with it (or cannot be decoded, or names
        // what the body's method does not act on) is refused, and a missing one is fine. A
        // request without a body (a GET) has nothing for them to disagree with.
        let body_method = envelope.method.as_deref();
        let is_task_method = body_method.is_some_and(|m| m.starts_with("tasks/"));
        let named = name.map(|v| decode_name(v.as_bytes()));
        let name_disagrees = match (&named, body_method) {
            (None, _) => false,
            (Some(_), _) if !read => false,
            (Some(header), _) if is_task_method => header
                .as_ref()
                .is_none_or(|h| envelope.task_id.as_deref().is_some_and(|t| t != h)),
            (Some(header), Some("tools/call" | "prompts/get" | "resources/read")) => {
                header.is_none() || envelope.name.as_deref() != header.as_deref()
            }
            (Some(_), _) => true,
        };
        let method_disagrees =
            method.is_some_and(|m| read && (batch || Some(m.as_bytes()) != body_method.map(str::as_bytes)));
        let names_disagree = twice || name_disagrees || method_disagrees;
        let header_task = named.flatten().filter(|_| is_task_method);
        let batch_refused = batch
            .then(|| batch_refusal(&envelope, &rest, version, versions))
            .flatten();
        // A batch's elements share their handles (or it was refused): any element's key field is
        // the batch's.
        let message_id = envelope
            .message_id
            .or_else(|| rest.iter().find_map(|e| e.message_id.clone()));
        RequestHandles {
            method: envelope.method,
            id: envelope.id,
            header_key: header_key.and_then(header_text),
            message_id,
            request_state: envelope.request_state,
            task_id: header_task.or(envelope.task_id),

            // An empty one stands as a value of its own: no session the router pinned or sealed.
            session_id: session_id.map(|v| text(v.as_bytes()).unwrap_or("\u{fffd}")),
            name: envelope.name,
            body: None,
            names_disagree,
            rare: (batch || !envelope.task_ids.is_empty()).then(|| {
                Box::new(Rare {
                    task_ids: envelope.task_ids,
                    rest,
                    batch,
                    batch_refused,
                })
            }),
        }
    }

    /// Whether the body is a JSON-RPC batch.
    pub fn is_batch(&self) -> bool {
        self.rare.as_ref().is_some_and(|r| r.batch)
    }

    /// Why the request, a batch, is refused (docs/src/dialects.md, "Batches"), if it is.
    pub fn batch_refused(&self) -> Option<&'static str> {
        self.rare.as_ref().and_then(|r| r.batch_refused)
    }

    /// `params.notifications.taskIds` of `subscriptions/listen`: the tasks the request follows.
    pub fn task_ids(&self) -> &[Cow<'a, str>] {
        self.rare.as_ref().map_or(&[], |r| &r.task_ids)
    }

    /// A batch's elements after the first (the first is the fields above).
    fn rest(&self) -> &[RequestEnvelope<'a>] {
        self.rare.as_ref().map_or(&[], |r| &r.rest)
    }

    /// Each message of the request: its JSON-RPC method and `params.name`, a batch's every
    /// element (a request with no body: none).
    pub fn messages(&self) -> impl Iterator<Item = (Option<&str>, Option<&str>)> + '_ {
        let first = (self.method.as_deref(), self.name.as_deref());
        let rest = self.rest().iter().map(|e| (e.method.as_deref(), e.name.as_deref()));
        std::iter::once(first).chain(rest)
    }

    /// Whether the body is a JSON-RPC response (a method-less message with an id: the client's
    /// answer to a server's request, such as an elicitation), or a batch of nothing else.
    pub fn is_response(&self) -> bool {
        self.id.is_some() && self.method.is_none() && self.rest().iter().all(|e| e.id.is_some() && e.method.is_none())
    }

    /// Whether a routing header the router reads disagrees with the body (SEP-2243): then the
    /// request is refused (400 `header_mismatch`), as an intermediary that routes on it must.
    pub fn names_disagree(&self) -> bool {
        self.names_disagree
    }

    /// Takes `key` as if it came in the routing header (for explanations): an empty value is
    /// no key, as an empty header is.
    pub fn set_header_key(&mut self, key: &'a str) {
        self.header_key = Some(key).filter(|k| !k.is_empty());
    }

    /// The routing header when it names a call, not when it is one of the router's sealed
    /// tokens (those name a backend, and are alike for every call sealed in the same second).
    fn call_header(&self) -> Option<&str> {
        self.header_key.filter(|h| !crate::token::is_token(h))
    }

    /// The key hashed on the ring: the routing header, else the body key (docs/src/dialects.md).
    pub fn client_key(&self) -> Option<&str> {
        self.call_header().or(self.message_id.as_deref())
    }

    /// Pin keys to look up, in the order of docs/src/routing.md: learned handles first, then client keys.
    pub fn pin_candidates(&self) -> impl Iterator<Item = (PinKey, &str)> + '_ {
        let learned = [
            self.request_state.as_deref().map(|s| (PinKind::RequestState, s)),
            self.task_id.as_deref().map(|s| (PinKind::Task, s)),
            self.session_id.map(|s| (PinKind::Session, s)),
        ];
        let listened = self.task_ids().iter().map(|t| Some((PinKind::Task, &**t)));
        let client = self.client_handles().map(|h| h.map(|s| (PinKind::Client, s)));
        learned
            .into_iter()
            .chain(listened)
            .chain(client)
            .flatten()
            .map(|(kind, s)| (PinKey::new(kind, s.as_bytes()), s))
    }

    /// Client pin keys a `pending` answer is recorded under (routing id and messageId).
    pub fn client_pin_keys(&self) -> impl Iterator<Item = PinKey> + '_ {
        self.client_handles()
            .into_iter()
            .flatten()
            .map(|s| PinKey::new(PinKind::Client, s.as_bytes()))
    }

    /// The call's routing header and its body key; the same string in both is one handle.
    fn client_handles(&self) -> [Option<&str>; 2] {
        let header = self.call_header();
        [header, self.message_id.as_deref().filter(|m| Some(*m) != header)]
    }

    /// The call this request is, as a routing token names it (`token::CallTag`): by its
    /// `messageId` when it has one, else by the routing id it came with (its own, not a token).
    pub fn call_tag(&self) -> Option<CallTag> {
        match (self.message_id.as_deref(), self.call_header()) {
            (Some(m), _) => Some(CallTag {
                digest: PinKey::new(PinKind::Client, m.as_bytes()).digest(),
                by_routing_id: false,
            }),
            (None, Some(h)) => Some(CallTag {
                digest: PinKey::new(PinKind::Client, h.as_bytes()).digest(),
                by_routing_id: true,
            }),
            (None, None) => None,
        }
    }

    /// What a `requestState` given with this request must have been issued for: the same
    /// method and tool (or prompt, or resource), as a multi round-trip retry repeats them.
    pub fn tool_tag(&self) -> CallTag {
        let method = self.method.as_deref().unwrap_or("");
        let name = self.name.as_deref().unwrap_or("");
        let mut bytes = Vec::with_capacity(method.len() + 1 + name.len());
        bytes.extend_from_slice(method.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(name.as_bytes());
        CallTag {
            digest: PinKey::new(PinKind::RequestState, &bytes).digest(),
            by_routing_id: false,
        }
    }

    /// Whether its method is one of the task methods a task id continues (`tasks/*`, and
    /// `subscriptions/listen`, which follows tasks).
    pub fn follows_tasks(&self) -> bool {
        self.method
            .as_deref()
            .is_some_and(|m| m.starts_with("tasks/") || m == "subscriptions/listen")
    }

    /// Whether its method is one a `requestState` is retried with.
    pub fn takes_request_state(&self) -> bool {
        matches!(
            self.method.as_deref(),
            Some("tools/call" | "prompts/get" | "resources/read")
        )
    }

    /// Whether this request may start a call that needs a pin (refused when the table is full).
    pub fn may_create_pin(&self) -> bool {
        self.client_key().is_some() || self.starts_a_call()
    }

    /// Whether a message of the request is one that starts a call whose answer may pin (a
    /// `tools/call`, `prompts/get`, `resources/read` or `initialize`).
    pub fn starts_a_call(&self) -> bool {
        let starts = |method: Option<&str>| {
            matches!(
                method,
                Some("tools/call" | "prompts/get" | "resources/read" | "initialize")
            )
        };
        starts(self.method.as_deref()) || self.rest().iter().any(|e| starts(e.method.as_deref()))
    }
}

/// Why a batch cannot be taken as one request, if it cannot: a protocol version without
/// batches (or one that is no single protocol version: it stands twice, or is not a date), a
/// handle of such a protocol (a `requestState` or task id) in it, or a key field on an element
/// beside others (a batch is no round of a call: each element would be a round no count sees).
fn batch_refusal(
    first: &RequestEnvelope,
    rest: &[RequestEnvelope],
    version: Option<&http::HeaderValue>,
    versions: usize,
) -> Option<&'static str> {
    let a_date = |v: &[u8]| {
        v.len() == 10
            && v.iter().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    *b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            })
    };
    if versions > 1 || version.is_some_and(|v| !a_date(v.as_bytes()) || v.as_bytes() >= NO_BATCHES_SINCE) {
        return Some("this protocol version has no JSON-RPC batches");
    }
    let elements = || std::iter::once(first).chain(rest);
    if elements().any(|e| e.request_state.is_some() || e.task_id.is_some() || !e.task_ids.is_empty()) {
        return Some("a batch carries no requestState or task id: the protocols that have them have no batches");
    }
    let keyed = elements().filter(|e| e.message_id.is_some()).count();
    if keyed > 0 && !rest.is_empty() {
        return Some("a key field stands on one message alone: a batch of several carries none");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_key_in_both_header_and_body_is_one_candidate() {
        let mut headers = HeaderMap::new();
        let routing = HeaderName::from_static("mcp-routing-id");
        headers.insert(routing.clone(), HeaderValue::from_static("k-1"));
        let body = br#"{"id":1,"method":"tools/call","messageId":"k-1"}"#;
        let env = parse_request(body, "messageId").unwrap();
        let handles = RequestHandles::new(&headers, &routing, env);
        assert_eq!(handles.pin_candidates().map(|(_, s)| s).collect::<Vec<_>>(), ["k-1"]);
        let other = br#"{"id":1,"method":"tools/call","messageId":"k-2"}"#;
        let env = parse_request(other, "messageId").unwrap();
        let handles = RequestHandles::new(&headers, &routing, env);
        assert_eq!(
            handles.pin_candidates().map(|(_, s)| s).collect::<Vec<_>>(),
            ["k-1", "k-2"]
        );
    }

    #[test]
    fn headers_read_stand_once_and_describe_the_body() {
        let routing = HeaderName::from_static("mcp-routing-id");
        let keys_of = |headers: &[(&'static str, &'static str)], body: &'static [u8]| {
            let mut map = HeaderMap::new();
            for (n, v) in headers {
                map.append(HeaderName::from_static(n), HeaderValue::from_static(v));
            }
            let env = parse_request(body, "messageId").unwrap();
            let k = RequestHandles::new(&map, &routing, env);
            (
                k.names_disagree(),
                k.session_id.map(str::to_owned),
                k.task_id.map(|t| t.into_owned()),
            )
        };
        let call = br#"{"id":1,"method":"tools/call","params":{"name":"pay","taskId":"t-body"}}"#;
        let task = br#"{"id":1,"method":"tasks/get","params":{"taskId":"t-body"}}"#;
        // `Mcp-Name` is the task id on `tasks/*` only.
        assert_eq!(
            keys_of(&[("mcp-name", "pay"), ("mcp-session-id", "s-1")], call),
            (false, Some("s-1".into()), Some("t-body".into()))
        );
        assert_eq!(
            keys_of(&[("mcp-name", "t-body")], task),
            (false, None, Some("t-body".into()))
        );
        assert!(keys_of(&[("mcp-name", "t-other")], task).0);
        // A header read twice (an empty value too), or one that says another method or names
        // what the method does not act on, disagrees.
        for headers in [
            &[("mcp-session-id", ""), ("mcp-session-id", "s-2")][..],
            &[("mcp-routing-id", "r-1"), ("mcp-routing-id", "r-2")],
            &[("mcp-name", "pay"), ("mcp-name", "pay")],
            &[("mcp-method", "tools/call"), ("mcp-method", "tools/call")],
            &[("mcp-method", "tools/list")],
            &[("mcp-name", "other")],
        ] {
            assert!(keys_of(headers, call).0, "{headers:?}");
        }
        assert!(!keys_of(&[("mcp-method", "tools/call"), ("mcp-name", "pay")], call).0);
        let ping = br#"{"id":1,"method":"ping"}"#;
        assert!(keys_of(&[("mcp-name", "pay")], ping).0, "ping names nothing");
        // Without a body (a GET), there is nothing for them to disagree with.
        let mut get = HeaderMap::new();
        get.insert(METHOD_HEADER, HeaderValue::from_static("GET"));
        get.insert(NAME_HEADER, HeaderValue::from_static("x"));
        assert!(!RequestHandles::new(&get, &routing, Envelopes::default()).names_disagree());
    }
}
