//! Reading the three MCP dialects (docs/src/dialects.md): the keys a request carries and the outcome an
//! answer reports. Only the envelope fields the router uses are parsed; everything else is
//! skipped without allocating.

mod keys;
mod outcome;
mod scan;

use std::borrow::Cow;
use std::ops::Range;

use http::HeaderName;
use serde::de::Deserializer;
use serde::Deserialize;
use serde_json::value::RawValue;

pub use keys::RequestKeys;
pub use outcome::{parse_message, Message, Outcome, TaskState};
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

/// The outcome of one message sent by a backend (see [`parse_message`]).
pub fn parse_outcome(message: &[u8]) -> Outcome {
    parse_message(message).outcome
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
}
