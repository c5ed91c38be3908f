//! Reading the three MCP dialects (docs/src/dialects.md): the handles a request carries and the
//! outcome an answer reports. Only the envelope fields the router uses are parsed; everything else
//! is skipped without allocating.

mod handles;
mod outcome;
mod scan;

use std::borrow::Cow;
use std::ops::Range;

use http::HeaderName;
use serde::de::Deserializer;
use serde::Deserialize;
use serde_json::value::RawValue;

pub use handles::RequestHandles;
pub use outcome::{parse_message, Message, Outcome, TaskState};
pub use scan::{Ambiguity, Envelopes, HandlesAt, NotJson, Reading, Unreadable};

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
    /// `params.notifications.taskIds` (`subscriptions/listen`): the tasks a listener follows.
    pub task_ids: Box<[Cow<'a, str>]>,
    /// What the method acts on: `params.uri` of a `resources/read`, else `params.name` (the
    /// tool or prompt called).
    pub name: Option<Cow<'a, str>>,
}

/// Parses a request body: `Err` when it is not JSON, or when a key the router reads stands
/// twice or is spelled otherwise (docs/src/dialects.md, "One reading of the body"). A batch
/// (array) yields every element's envelope; `params` other than an object carries none.
pub fn parse_request<'a>(body: &'a [u8], body_field: &str) -> Result<Envelopes<'a>, Unreadable> {
    scan::request(body, body_field)
}

/// Where `params.requestState`'s literal (quotes included) sits in a request body, as the
/// client wrote it: a wrapped state is put back there, whatever escapes the client's encoder
/// chose. (A second scan, for the rare request that carries a wrapped state.)
pub fn request_state_at(body: &[u8], body_field: &str) -> Option<Range<usize>> {
    scan::request_state_at(body, body_field)
}

/// Where the handles' literals sit, as [`request_state_at`] finds the state's: wrapped
/// handles are put back there.
pub fn handles_at(body: &[u8], body_field: &str) -> HandlesAt {
    scan::handles_at(body, body_field)
}

/// Where `part`, a slice borrowed from `whole`, sits in it.
/// `bytes` as text, when they are UTF-8. What the router reads as text (a header value, a raw
/// JSON value) is almost always ASCII, which a word-at-a-time check says for a fraction of
/// `str::from_utf8`'s cost on short values (146 instructions for an 18-byte routing key,
/// callgrind); other bytes take the full check.
#[inline]
fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).ok()
}

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

    fn first(body: &[u8]) -> RequestEnvelope<'_> {
        parse_request(body, "messageId").unwrap().first
    }

    fn refused(body: &[u8]) -> Option<Ambiguity> {
        match parse_request(body, "messageId") {
            Err(Unreadable::Ambiguous(a)) => Some(a),
            _ => None,
        }
    }

    /// Every string is UTF-8, read or skipped (serde_json refuses such a body whole): bytes a
    /// backend could decode another way never pass. UTF-8 beyond ASCII passes as it is.
    #[test]
    fn a_string_that_is_not_utf8_is_no_json_wherever_it_stands() {
        let call = |name: &[u8], argument: &[u8]| {
            let mut body = br#"{"id":1,"method":"tools/call","params":{"name":""#.to_vec();
            body.extend_from_slice(name);
            body.extend_from_slice(br#"","arguments":{"x":""#);
            body.extend_from_slice(argument);
            body.extend_from_slice(br#"","y":["#);
            body.extend_from_slice(b"\"\\n");
            body.extend_from_slice(br#""]}}}"#);
            body
        };
        let fine = call("r\u{e9}sum\u{e9}".as_bytes(), "caf\u{e9} \u{1f600}".as_bytes());
        assert_eq!(first(&fine).name.as_deref(), Some("r\u{e9}sum\u{e9}"));
        // A lone byte, a cut sequence, an overlong `/`, a surrogate, a byte never in UTF-8.
        for bad in [&b"\xff"[..], b"r\xc3o", b"\xc0\xaf", b"\xed\xa0\x80", b"a\xfeb"] {
            for body in [call(bad, b"x"), call(b"n", bad)] {
                assert!(
                    matches!(parse_request(&body, "messageId"), Err(Unreadable::NotJson(_))),
                    "{}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
        // In an escaped string too, and in a key.
        let escaped = b"{\"method\":\"x\",\"params\":{\"a\":\"\\n\xff\"}}";
        assert!(matches!(
            parse_request(escaped, "messageId"),
            Err(Unreadable::NotJson(_))
        ));
        let key = b"{\"method\":\"x\",\"params\":{\"\xff\":1}}";
        assert!(matches!(parse_request(key, "messageId"), Err(Unreadable::NotJson(_))));
    }

    /// A name or URI the router judges (scopes, tool quotas, the catalog) must decode: with a
    /// lone surrogate escape it is no JSON, as for serde_json reading it, never "no name" (a
    /// lenient backend could read it as the scoped tool's). Unread strings are only skipped.
    #[test]
    fn a_name_or_uri_that_does_not_decode_is_no_json() {
        for body in [
            &br#"{"id":1,"method":"tools/call","params":{"name":"transfer-funds\ud800"}}"#[..],
            br#"{"id":1,"method":"resources/read","params":{"uri":"file:///a\udc00"}}"#,
            br#"{"id":1,"method":"tools/call","params":{"name":"t","uri":"\ud800"}}"#,
        ] {
            assert!(
                matches!(parse_request(body, "messageId"), Err(Unreadable::NotJson(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let skipped = br#"{"id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":"\ud800"}}}"#;
        assert_eq!(first(skipped).name.as_deref(), Some("t"));
    }

    #[test]
    fn params_name_and_uri_are_read() {
        let body = br#"{"id":1,"method":"tools/call","params":{"name":"get-\u0077eather","arguments":{"name":"no"}}}"#;
        let e = first(body);
        assert_eq!(
            (e.method.as_deref(), e.name.as_deref()),
            (Some("tools/call"), Some("get-weather"))
        );
        let e = first(br#"{"method":"resources/read","params":{"uri":"file:///a","name":"x"}}"#);
        assert_eq!(e.name.as_deref(), Some("file:///a"));
        // A name that does not decode is none; `null` is no name.
        assert_eq!(first(br#"{"method":"x","params":{"name":null}}"#).name, None);
    }

    #[test]
    fn request_envelope_fields() {
        let body = br#"{"jsonrpc":"2.0","id":3,"messageId":"transfer-1","method":"tools/call",
            "params":{"name":"transfer-funds","arguments":{"to":"1","nested":[1,{"messageId":"no"}]},"requestState":"s\u0041"}}"#;
        let e = first(body);
        assert_eq!(e.id, Some("3"));
        assert_eq!(e.method.as_deref(), Some("tools/call"));
        assert_eq!(e.message_id.as_deref(), Some("transfer-1"));
        assert_eq!(e.request_state.as_deref(), Some("sA"));
        // Plain strings are borrowed from the body; escaped ones (keys too) are decoded.
        assert!(matches!(
            (&e.method, &e.message_id),
            (Some(Cow::Borrowed(_)), Some(Cow::Borrowed(_)))
        ));
        let e = first(br#"{"m\u0065thod":"a\nb","messageId":"x\"y"}"#);
        assert_eq!(
            (e.method.as_deref(), e.message_id.as_deref()),
            (Some("a\nb"), Some("x\"y"))
        );
        for bad in [&b"{not json"[..], b"{} trailing", b""] {
            assert!(matches!(parse_request(bad, "messageId"), Err(Unreadable::NotJson(_))));
        }
        let e = parse_request(br#"{"id":"a\"b","callId":42}"#, "callId").unwrap().first;
        assert_eq!((e.id, e.message_id.as_deref()), (Some(r#""a\"b""#), Some("42")));
        let e = first(br#"{"id":1,"messageId":null,"params":{"taskId":"t-1"}}"#);
        assert_eq!((e.message_id, e.task_id.as_deref()), (None, Some("t-1")));
        let e = first(br#"{"method":"subscriptions/listen","params":{"notifications":{"taskIds":["a",null,"b"]}}}"#);
        assert_eq!(&*e.task_ids, ["a", "b"]);
    }

    #[test]
    fn a_batch_yields_every_element() {
        let e = parse_request(
            br#"[{"id":1,"messageId":"m","method":"tools/list"},{"id":2,"method":"tools/call","params":{"name":"pay"}},null]"#,
            "messageId",
        )
        .unwrap();
        assert!(e.batch);
        assert_eq!(e.first.message_id.as_deref(), Some("m"));
        let rest: Vec<_> = e
            .rest
            .iter()
            .map(|r| (r.method.as_deref(), r.name.as_deref()))
            .collect();
        assert_eq!(rest, [(Some("tools/call"), Some("pay")), (None, None)]);
        assert!(!parse_request(br#"{"id":1}"#, "messageId").unwrap().batch);
    }

    #[test]
    fn keys_read_twice_or_spelled_otherwise_are_refused() {
        let twice = [
            (&br#"{"method":"tools/list","method":"tools/call"}"#[..], "method"),
            (br#"{"id":1,"id":2}"#, "id"),
            (br#"{"messageId":"a","messageId":"b"}"#, "the key field"),
            (br#"{"params":{},"params":{}}"#, "params"),
            (br#"{"params":{"name":"a","name":"b"}}"#, "params.name"),
            (
                br#"{"params":{"requestState":"a","requestState":"b"}}"#,
                "params.requestState",
            ),
            (br#"{"params":{"taskId":"a","taskId":"b"}}"#, "params.taskId"),
            (br#"{"params":{"uri":"a","uri":"b"}}"#, "params.uri"),
            (br#"{"m\u0065thod":"a","method":"b"}"#, "method"),
            (br#"[{"id":1},{"method":"a","method":"b"}]"#, "method"),
        ];
        for (body, key) in twice {
            assert_eq!(
                refused(body),
                Some(Ambiguity {
                    key,
                    how: Reading::Twice
                }),
                "{}",
                body.escape_ascii()
            );
        }
        let variants = [
            (&br#"{"Method":"tools/call"}"#[..], "method"),
            (br#"{"method":"tools/list","METHOD":"tools/call"}"#, "method"),
            (br#"{"ID":1}"#, "id"),
            (br#"{"MessageID":"x"}"#, "the key field"),
            (br#"{"params":{"Name":"pay"}}"#, "params.name"),
            (
                "{\"params\":{\"requeſtState\":\"s\"}}".as_bytes(),
                "params.requestState",
            ),
            ("{\"params\":{\"tas\u{212a}Id\":\"t\"}}".as_bytes(), "params.taskId"),
            (br#"{"params":{"TaskId":"t"}}"#, "params.taskId"),
            (
                br#"{"params":{"notifications":{"taskids":[]}}}"#,
                "params.notifications.taskIds",
            ),
        ];
        for (body, key) in variants {
            assert_eq!(
                refused(body),
                Some(Ambiguity {
                    key,
                    how: Reading::Spelled
                }),
                "{}",
                body.escape_ascii()
            );
        }
        let shapes = [
            (&br#"{"method":["tools/call"]}"#[..], "method"),
            (br#"{"method":"tools/call","params":["transfer"]}"#, "params"),
            (br#"{"params":{"name":["transfer"]}}"#, "params.name"),
            (br#"{"params":{"requestState":["rs-1"]}}"#, "params.requestState"),
            (br#"{"params":{"taskId":7}}"#, "params.taskId"),
            (br#"{"params":{"uri":{"u":1}}}"#, "params.uri"),
            (br#"{"messageId":{"x":1}}"#, "the key field"),
            (br#"{"params":{"notifications":["t"]}}"#, "params.notifications"),
            (
                br#"{"params":{"notifications":{"taskIds":"t"}}}"#,
                "params.notifications.taskIds",
            ),
            (
                br#"{"params":{"notifications":{"taskIds":[["t"]]}}}"#,
                "params.notifications.taskIds",
            ),
            (
                br#"[[{"method":"tools/call","params":{"name":"transfer"}}]]"#,
                "a batch element",
            ),
        ];
        for (body, key) in shapes {
            assert_eq!(
                refused(body),
                Some(Ambiguity {
                    key,
                    how: Reading::Shape
                }),
                "{}",
                body.escape_ascii()
            );
        }
        // Keys the router does not read may repeat; nested ones are not the envelope's.
        for fine in [
            &br#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"a"}"#[..],
            br#"{"method":"a","params":{"arguments":{"name":1,"name":2,"Name":3}}}"#,
            br#"{"method":"a","params":{"_meta":{},"_meta":{}}}"#,
            "{\"méthod\":1,\"method\":\"a\"}".as_bytes(),
        ] {
            assert!(parse_request(fine, "messageId").is_ok(), "{}", fine.escape_ascii());
        }
        // Not JSON is said first, even when a key stands twice.
        assert!(matches!(
            parse_request(br#"{"method":"a","method":"b""#, "messageId"),
            Err(Unreadable::NotJson(_))
        ));
    }
}
