//! The keys a request carries: every handle in its headers and body that can choose a backend
//! (docs/src/dialects.md, docs/src/routing.md), read once and borrowed from the request.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};

use super::{parse_request, NotJson, RequestEnvelope, NAME_HEADER, SESSION_HEADER};
use crate::pins::{PinKey, PinKind};

/// Every handle in a request that can choose a backend.
#[derive(Debug, Default, Clone)]
pub struct RequestKeys<'a> {
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
    /// `Mcp-Name` (decoded) and `params.taskId` name different tasks.
    names_disagree: bool,
}

/// An `Mcp-Name` value as text: as it is, or decoded from `=?base64?<b64>?=`; `None` when it
/// is neither text nor a decodable form.
fn decode_name(raw: &[u8]) -> Option<Cow<'_, str>> {
    use base64::Engine;
    let Some(b64) = raw.strip_prefix(b"=?base64?").and_then(|r| r.strip_suffix(b"?=")) else {
        return std::str::from_utf8(raw).ok().map(Cow::Borrowed);
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
    std::str::from_utf8(v.as_bytes()).ok().filter(|s| !s.is_empty())
}

impl<'a> RequestKeys<'a> {
    /// The keys of a request with these headers and, when there is one to read, this JSON-RPC
    /// body (`None`: a GET or DELETE; a body that is not JSON is an error). The one way keys are
    /// read: by the proxy, `/debug/route` and `mrtr-router route` alike. With `name`, the
    /// same scan puts the body's `params.name` there (for a request that is logged or traced).
    pub fn read(
        headers: &'a HeaderMap,
        routing_header: &HeaderName,
        body_field: &str,
        body: Option<&'a [u8]>,
        name: Option<&mut Option<Cow<'a, str>>>,
    ) -> Result<Self, NotJson> {
        let envelope = match (body, name) {
            (Some(body), None) => parse_request(body, body_field)?,
            (Some(body), Some(name)) => {
                let (envelope, found) = super::parse_request_named(body, body_field)?;
                *name = found;
                envelope
            }
            (None, _) => RequestEnvelope::default(),
        };
        Ok(RequestKeys::new(headers, routing_header, envelope))
    }

    pub fn new(headers: &'a HeaderMap, routing_header: &HeaderName, envelope: RequestEnvelope<'a>) -> Self {
        let is_task_method = envelope.method.as_deref().is_some_and(|m| m.starts_with("tasks/"));
        // One pass over the headers (a handful) instead of a hashed lookup per name; the first
        // value of each counts, as with `HeaderMap::get`.
        let (mut header_key, mut session_id, mut name) = (None, None, None);
        for (n, v) in headers {
            if n == routing_header {
                header_key.get_or_insert(v);
            }
            if n == SESSION_HEADER {
                session_id.get_or_insert(v);
            }
            if is_task_method && n == NAME_HEADER {
                name.get_or_insert(v);
            }
        }
        // `Mcp-Name` on `tasks/*` is the task id, in the `=?base64?…?=` form when it is not safe
        // ASCII (SEP-2243); the body stays the source of truth, so a header that disagrees
        // with `params.taskId` (or cannot be decoded) is refused, and a missing one is fine.
        let named = name.map(|v| decode_name(v.as_bytes()));
        let names_disagree = match (&named, &envelope.task_id) {
            (Some(None), _) => true,
            (Some(Some(header)), Some(body)) => header != body,
            _ => false,
        };
        RequestKeys {
            method: envelope.method,
            id: envelope.id,
            header_key: header_key.and_then(header_text),
            message_id: envelope.message_id,
            request_state: envelope.request_state,
            task_id: named.flatten().or(envelope.task_id),
            session_id: session_id.and_then(header_text),
            names_disagree,
        }
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
        let client = self.client_handles().map(|h| h.map(|s| (PinKind::Client, s)));
        learned
            .into_iter()
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

    /// Whether this request may start a call that needs a pin (refused when the table is full).
    pub fn may_create_pin(&self) -> bool {
        self.client_key().is_some()
            || matches!(
                self.method.as_deref(),
                Some("tools/call" | "prompts/get" | "resources/read" | "initialize")
            )
    }
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
        let keys = RequestKeys::new(&headers, &routing, env);
        assert_eq!(keys.pin_candidates().map(|(_, s)| s).collect::<Vec<_>>(), ["k-1"]);
        let other = br#"{"id":1,"method":"tools/call","messageId":"k-2"}"#;
        let env = parse_request(other, "messageId").unwrap();
        let keys = RequestKeys::new(&headers, &routing, env);
        assert_eq!(
            keys.pin_candidates().map(|(_, s)| s).collect::<Vec<_>>(),
            ["k-1", "k-2"]
        );
    }

    #[test]
    fn headers_are_read_by_their_first_value_and_mcp_name_only_on_tasks() {
        let routing = HeaderName::from_static("mcp-routing-id");
        let mut headers = HeaderMap::new();
        headers.append(SESSION_HEADER, HeaderValue::from_static("s-1"));
        headers.append(SESSION_HEADER, HeaderValue::from_static("s-2"));
        headers.append(NAME_HEADER, HeaderValue::from_static("t-header"));
        headers.append(routing.clone(), HeaderValue::from_static(""));
        let keys_of = |body: &'static [u8]| {
            let env = parse_request(body, "messageId").unwrap();
            let k = RequestKeys::new(&headers, &routing, env);
            (k.session_id, k.header_key, k.task_id.map(|t| t.into_owned()))
        };
        let call = keys_of(br#"{"id":1,"method":"tools/call","params":{"taskId":"t-body"}}"#);
        assert_eq!(call, (Some("s-1"), None, Some("t-body".to_string())));
        let task = keys_of(br#"{"id":1,"method":"tasks/get","params":{"taskId":"t-body"}}"#);
        assert_eq!(task, (Some("s-1"), None, Some("t-header".to_string())));
    }
}
