//! One pass over a request body: checks that it is JSON and picks out the envelope fields,
//! borrowed, without building any value. serde_json's generic skipping was most of a small
//! request's cost; here a skipped value is walked with a byte table and nothing else (`walk`).
//!
//! This file reads the envelope: which keys of a request object (and of its `params`) the
//! router reads, each allowed once and in one spelling, and what a batch's elements hold. The
//! byte-level walk it stands on, which knows JSON and nothing of MCP, is `walk`.
//!
//! What counts as JSON is what serde_json accepts: RFC 8259 grammar, no control characters in
//! strings, valid escapes, every string UTF-8 (skipped ones too: a body a backend could decode
//! another way is refused whole, as serde_json refuses it). Skipped values may nest without
//! limit (the walk keeps its own stack, so depth costs no recursion).

mod walk;

use std::borrow::Cow;
use std::ops::Range;

use super::RequestEnvelope;
use walk::{array, key_field, object, raw_text, skip, string_field, ws, At, Invalid, KeyText, RawStr, Text};

/// The body is not JSON: the scan stopped at byte `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotJson {
    pub at: usize,
}

impl std::fmt::Display for NotJson {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "not JSON at byte {}", self.at)
    }
}

impl std::error::Error for NotJson {}

/// Reads `body` as a JSON-RPC request (or batch: its first element, the others in `rest`) and
/// returns its envelope.
pub fn request<'a>(body: &'a [u8], body_field: &str) -> Result<Envelopes<'a>, Unreadable> {
    let scan = scan_request(body, body_field)?;
    Ok(Envelopes {
        first: scan.envelope,
        rest: scan.rest,
        batch: scan.batch,
        read: true,
    })
}

/// Where the envelope's `params.requestState` literal (quotes included) sits in `body`.
pub fn request_state_at(body: &[u8], body_field: &str) -> Option<Range<usize>> {
    scan_request(body, body_field).ok()?.state_at
}

/// Where the envelope's handles' literals sit in `body`.
pub fn handles_at(body: &[u8], body_field: &str) -> HandlesAt {
    match scan_request(body, body_field) {
        Ok(scan) => HandlesAt {
            request_state: scan.state_at,
            task_id: scan.task_at,
            task_ids: scan.task_ids_at,
        },
        Err(_) => HandlesAt::default(),
    }
}

/// Where a request's handles' literals (quotes included) sit in its body.
#[derive(Debug, Default)]
pub struct HandlesAt {
    /// `params.requestState`.
    pub request_state: Option<Range<usize>>,
    /// `params.taskId`.
    pub task_id: Option<Range<usize>>,
    /// Each string of `params.notifications.taskIds`, in order.
    pub task_ids: Vec<Range<usize>>,
}

/// A request's envelope, and a batch's other elements' (none for a single request).
#[derive(Debug, Default)]
pub struct Envelopes<'a> {
    pub first: RequestEnvelope<'a>,
    pub rest: Box<[RequestEnvelope<'a>]>,
    /// The body is a batch (a JSON array), even of one element.
    pub batch: bool,
    /// There was a body to read (else every field is none).
    pub read: bool,
}

/// Why a request body is refused before anything reads it further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// Not JSON.
    NotJson(NotJson),
    /// A key the router reads stands twice, or in another spelling (`Method`, `requeſtState`):
    /// JSON readers disagree on which occurrence counts, so the router and a backend could
    /// read two different calls from one body (docs/src/dialects.md, "One reading of the body").
    Ambiguous(Ambiguity),
}

/// The key of an ambiguous body, and how it reads two ways, for the error's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ambiguity {
    /// The key as the router reads it (`params.name`; `the key field` for `routing.body_field`).
    pub key: &'static str,
    pub how: Reading,
}

/// How a key the router reads makes a body read two ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// It stands twice in its object.
    Twice,
    /// It stands in another spelling (by case).
    Spelled,
    /// Its value is not of its shape (a string, an object; `null` is absence): a reader that
    /// coerces (an array's first element, a number's text) could find what the router did not.
    Shape,
}

impl From<NotJson> for Unreadable {
    fn from(e: NotJson) -> Unreadable {
        Unreadable::NotJson(e)
    }
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Unreadable::NotJson(e) => e.fmt(f),
            Unreadable::Ambiguous(a) => match a.how {
                Reading::Twice => write!(f, "`{}` twice", a.key),
                Reading::Spelled => write!(f, "a key spelled like `{}` but not as it", a.key),
                Reading::Shape => write!(f, "`{}` not of its shape", a.key),
            },
        }
    }
}

impl std::error::Error for Unreadable {}

/// What one scan finds: the envelope, and beside it (kept out of the envelope, which every
/// request moves around) where its handles' literals sit, for the rare request that needs
/// them, and a batch's other elements.
#[derive(Default)]
struct Scanned<'a> {
    envelope: RequestEnvelope<'a>,
    state_at: Option<Range<usize>>,
    task_at: Option<Range<usize>>,
    task_ids_at: Vec<Range<usize>>,
    rest: Box<[RequestEnvelope<'a>]>,
    batch: bool,
}

fn scan_request<'a>(body: &'a [u8], body_field: &str) -> Result<Scanned<'a>, Unreadable> {
    let mut ambiguous = None;
    let (end, scanned) =
        envelope(body, ws(body, 0), body_field.as_bytes(), &mut ambiguous).map_err(|at| NotJson { at })?;
    match (ws(body, end), ambiguous) {
        (end, _) if end != body.len() => Err(Unreadable::NotJson(NotJson { at: end })),
        (_, Some(a)) => Err(Unreadable::Ambiguous(a)),
        (_, None) => Ok(scanned),
    }
}

/// The top-level value: an object's envelope, a batch's first element's (the others' in
/// `rest`), else none.
fn envelope<'a>(b: &'a [u8], i: usize, field: &[u8], ambiguous: &mut Option<Ambiguity>) -> At<(usize, Scanned<'a>)> {
    match b.get(i) {
        Some(b'{') => envelope_object(b, i, field, ambiguous),
        Some(b'[') => {
            // Rare (2025-03-26 only): every element read, each by the rules of one request.
            let mut elements: Vec<Scanned<'a>> = Vec::new();
            let end = array(b, i, |at| match b.get(at) {
                Some(b'{') => {
                    let (end, scanned) = envelope_object(b, at, field, ambiguous)?;
                    elements.push(scanned);
                    Ok(end)
                }
                _ => {
                    // An element that is no request: a reader that unwraps it (a nested batch)
                    // would find what the router did not judge.
                    shaped(b, at, b"{", "a batch element", ambiguous);
                    elements.push(Scanned::default());
                    skip(b, at)
                }
            })?;
            let mut elements = elements.into_iter();
            let mut first = elements.next().unwrap_or_default();
            first.batch = true;
            first.rest = elements.map(|e| e.envelope).collect();
            Ok((end, first))
        }
        _ => skip(b, i).map(|end| (end, Scanned::default())),
    }
}

/// The keys of a request object the router reads, and of its `params`: each may stand once,
/// and only in this spelling.
const TOP_KEYS: [(&[u8], &str); 3] = [(b"id", "id"), (b"method", "method"), (b"params", "params")];
const PARAMS_KEYS: [(&[u8], &str); 5] = [
    (b"requestState", "params.requestState"),
    (b"taskId", "params.taskId"),
    (b"name", "params.name"),
    (b"uri", "params.uri"),
    (b"notifications", "params.notifications"),
];

/// Notes `key` (one of `names`, by its index `which`) as seen in `seen`: a second time makes
/// the body ambiguous.
fn once(seen: &mut u8, which: usize, key: &'static str, ambiguous: &mut Option<Ambiguity>) {
    if *seen & (1 << which) != 0 {
        ambiguous.get_or_insert(Ambiguity {
            key,
            how: Reading::Twice,
        });
    }
    *seen |= 1 << which;
}

/// Notes `key` when its value at `at` does not start as its shape does (`starts`); `null` stands
/// for its absence.
#[inline(always)]
fn shaped(b: &[u8], at: usize, starts: &[u8], key: &'static str, ambiguous: &mut Option<Ambiguity>) {
    if !b.get(at).is_some_and(|c| *c == b'n' || starts.contains(c)) {
        ambiguous.get_or_insert(Ambiguity {
            key,
            how: Reading::Shape,
        });
    }
}

/// Whether `key` is another spelling of `name` for a reader that matches keys without regard
/// to case: ASCII case, and the two non-ASCII letters whose simple case folding is an ASCII one
/// (`ſ` U+017F folds to `s`, the Kelvin sign U+212A to `k`), as Go's `encoding/json` matches.
/// `ascii`: the key's literal is plain ASCII (no escapes), as almost every key is.
fn spelled_like(key: &[u8], name: &[u8], ascii: bool) -> bool {
    // Of the same length, only ASCII case can make them alike (a non-ASCII byte equals no byte
    // of an ASCII name); the two letters fold from two and three bytes, so a key spelled with
    // them is longer than the name, and has their lead bytes. A plain ASCII key stops at the
    // lengths.
    if key.len() == name.len() {
        return key != name && key.eq_ignore_ascii_case(name);
    }
    if ascii || key.len() < name.len() || key.len() > 3 * name.len() || !key.iter().any(|&b| b == 0xc5 || b == 0xe2) {
        return false;
    }
    let Ok(key) = std::str::from_utf8(key) else {
        return false;
    };
    let mut folded = key.chars().map(|c| match c {
        '\u{17f}' => Some(b's'),
        '\u{212a}' => Some(b'k'),
        c if c.is_ascii() => Some(c.to_ascii_lowercase() as u8),
        _ => None,
    });
    let mut name = name.iter().map(u8::to_ascii_lowercase);
    loop {
        match (folded.next(), name.next()) {
            (None, None) => return true,
            (Some(Some(k)), Some(n)) if k == n => {}
            _ => return false,
        }
    }
}

/// Which of `names` `key` is another spelling of, if any: its label. A plain ASCII key (almost
/// every key) is compared only with the names of its length (`lengths` has bit `n` set for
/// each name of `n` bytes), most by that bit alone.
#[inline(always)]
fn variant_of(key: &[u8], ascii: bool, lengths: u64, names: &[(&[u8], &'static str)]) -> Option<&'static str> {
    if ascii && key.len() < 64 && lengths & (1 << key.len()) == 0 {
        return None;
    }
    variant_among(key, ascii, names)
}

#[cold]
fn variant_among(key: &[u8], ascii: bool, names: &[(&[u8], &'static str)]) -> Option<&'static str> {
    names
        .iter()
        .find(|(n, _)| spelled_like(key, n, ascii))
        .map(|(_, label)| *label)
}

/// The lengths of `names`, as [`variant_of`] takes them.
const fn lengths(names: &[(&[u8], &str)]) -> u64 {
    let mut bits = 0;
    let mut i = 0;
    while i < names.len() {
        bits |= 1 << names[i].0.len();
        i += 1;
    }
    bits
}

const TOP_LENGTHS: u64 = lengths(&TOP_KEYS);
const PARAMS_LENGTHS: u64 = lengths(&PARAMS_KEYS);

/// A request object, from its `{` at `i`. Fields are decoded once, at the end. A key the
/// router reads that stands twice, or is spelled otherwise, makes the body ambiguous
/// (`ambiguous`); the scan goes on, so that a body that is not JSON is still said to be so.
fn envelope_object<'a>(
    b: &'a [u8],
    i: usize,
    field: &[u8],
    ambiguous: &mut Option<Ambiguity>,
) -> At<(usize, Scanned<'a>)> {
    let mut id = None;
    let (mut method, mut message_id, mut request_state, mut task_id) = (None, None, None, None);
    let (mut name, mut uri, mut task_ids) = (None, None, Vec::new());
    let mut seen = 0u8;
    let end = object(b, i, |key, at| {
        let ascii = key.text == Text::Ascii;
        let key = key.key().map_err(|Invalid| at)?;
        Ok(match &*key {
            b"id" => {
                once(&mut seen, 0, "id", ambiguous);
                let (end, raw) = raw_text(b, at)?;
                id = Some(raw);
                end
            }
            b"method" => {
                once(&mut seen, 1, "method", ambiguous);
                shaped(b, at, b"\"", "method", ambiguous);
                string_field(b, at, &mut method)?
            }
            b"params" => {
                once(&mut seen, 2, "params", ambiguous);
                shaped(b, at, b"{", "params", ambiguous);
                // A later `params` replaces an earlier one whole (such a body is refused as
                // ambiguous, but is first read to its end as JSON, as serde_json reads it).
                (request_state, task_id, name, uri) = (None, None, None, None);
                task_ids.clear();
                match b.get(at) {
                    Some(b'{') => {
                        let mut seen = 0u8;
                        object(b, at, |key, at| {
                            let ascii = key.text == Text::Ascii;
                            let key = key.key().map_err(|Invalid| at)?;
                            match &*key {
                                b"requestState" => {
                                    once(&mut seen, 0, "params.requestState", ambiguous);
                                    shaped(b, at, b"\"", "params.requestState", ambiguous);
                                    string_field(b, at, &mut request_state)
                                }
                                b"taskId" => {
                                    once(&mut seen, 1, "params.taskId", ambiguous);
                                    shaped(b, at, b"\"", "params.taskId", ambiguous);
                                    string_field(b, at, &mut task_id)
                                }
                                b"name" => {
                                    once(&mut seen, 2, "params.name", ambiguous);
                                    shaped(b, at, b"\"", "params.name", ambiguous);
                                    string_field(b, at, &mut name)
                                }
                                b"uri" => {
                                    once(&mut seen, 3, "params.uri", ambiguous);
                                    shaped(b, at, b"\"", "params.uri", ambiguous);
                                    string_field(b, at, &mut uri)
                                }
                                b"notifications" => {
                                    once(&mut seen, 4, "params.notifications", ambiguous);
                                    shaped(b, at, b"{", "params.notifications", ambiguous);
                                    // The last occurrence counts, as for every field.
                                    task_ids.clear();
                                    notified_task_ids(b, at, &mut task_ids, ambiguous)
                                }
                                other => {
                                    if let Some(key) = variant_of(other, ascii, PARAMS_LENGTHS, &PARAMS_KEYS) {
                                        ambiguous.get_or_insert(Ambiguity {
                                            key,
                                            how: Reading::Spelled,
                                        });
                                    }
                                    skip(b, at)
                                }
                            }
                        })?
                    }
                    _ => skip(b, at)?,
                }
            }
            k if k == field => {
                once(&mut seen, 3, "the key field", ambiguous);
                shaped(b, at, b"\"-0123456789", "the key field", ambiguous);
                let (end, key) = key_field(b, at)?;
                message_id = key;
                end
            }
            other => {
                let field_length = if field.len() < 64 { 1 << field.len() } else { 0 };
                let variant = variant_of(other, ascii, TOP_LENGTHS, &TOP_KEYS)
                    .or_else(|| variant_of(other, ascii, field_length, &[(field, "the key field")]));
                if let Some(key) = variant {
                    ambiguous.get_or_insert(Ambiguity {
                        key,
                        how: Reading::Spelled,
                    });
                }
                skip(b, at)?
            }
        })
    })?;
    let decode = |raw: Option<RawStr<'a>>| raw.map(RawStr::value).transpose().map_err(|Invalid| end);
    let listed: Vec<RawStr<'a>> = task_ids;
    let method = decode(method)?;
    // What the method acts on: the resource a `resources/read` reads, else the tool or prompt
    // called. Scopes, tool quotas and the catalog judge it, so one that will not decode (a lone
    // surrogate) is no JSON, as for serde_json reading it: never a call of no name that a
    // lenient backend reads as a name.
    let (name, uri) = (decode(name)?, decode(uri)?);
    let target = match method.as_deref() {
        Some("resources/read") => uri,
        _ => name,
    };
    let envelope = RequestEnvelope {
        id,
        method,
        message_id: match message_id {
            Some(KeyText::Number(n)) => Some(Cow::Borrowed(n)),
            Some(KeyText::String(s)) => Some(s.value().map_err(|Invalid| end)?),
            None => None,
        },
        request_state: decode(request_state)?,
        task_id: decode(task_id)?,
        task_ids: listed
            .iter()
            .map(|r| r.value())
            .collect::<Result<_, _>>()
            .map_err(|Invalid| end)?,
        name: target,
    };
    Ok((
        end,
        Scanned {
            envelope,
            state_at: request_state.map(|r| super::span_in(b, r.quoted)),
            task_at: task_id.map(|r| super::span_in(b, r.quoted)),
            task_ids_at: listed.iter().map(|r| super::span_in(b, r.quoted)).collect(),
            rest: Box::default(),
            batch: false,
        },
    ))
}

/// `params.notifications` of a `subscriptions/listen` request, from `i`: the strings of its
/// `taskIds` go to `into` (a value that is no string is skipped, as the backend will refuse it).
fn notified_task_ids<'a>(
    b: &'a [u8],
    i: usize,
    into: &mut Vec<RawStr<'a>>,
    ambiguous: &mut Option<Ambiguity>,
) -> At<usize> {
    if b.get(i) != Some(&b'{') {
        return skip(b, i);
    }
    let mut seen = 0u8;
    object(b, i, |key, at| {
        let ascii = key.text == Text::Ascii;
        let key = key.key().map_err(|Invalid| at)?;
        if &*key != b"taskIds" {
            if variant_of(&key, ascii, 1 << 7, &[(b"taskIds", "")]).is_some() {
                ambiguous.get_or_insert(Ambiguity {
                    key: "params.notifications.taskIds",
                    how: Reading::Spelled,
                });
            }
            return skip(b, at);
        }
        once(&mut seen, 0, "params.notifications.taskIds", ambiguous);
        shaped(b, at, b"[", "params.notifications.taskIds", ambiguous);
        into.clear();
        if b.get(at) != Some(&b'[') {
            return skip(b, at);
        }
        array(b, at, |at| {
            shaped(b, at, b"\"", "params.notifications.taskIds", ambiguous);
            let mut found = None;
            let end = string_field(b, at, &mut found)?;
            into.extend(found);
            Ok(end)
        })
    })
}
