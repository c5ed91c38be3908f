//! One pass over a request body: checks that it is JSON and picks out the envelope fields,
//! borrowed, without building any value. serde_json's generic skipping was most of a small
//! request's cost; here a skipped value is walked with a byte table and nothing else.
//!
//! What counts as JSON is what serde_json accepts: RFC 8259 grammar, no control characters in
//! strings, valid escapes. Like serde_json when it skips a value, strings that are only skipped
//! are not checked for UTF-8 and skipped values may nest without limit (the walk keeps its own
//! stack, so depth costs no recursion); keys and the fields the router reads are checked.

use std::borrow::Cow;
use std::ops::Range;

use super::RequestEnvelope;

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

/// A string that does not decode; where it sits is for its reader to say.
#[derive(Debug)]
struct Invalid;

type Scan<T> = Result<T, Invalid>;

/// Bytes that end a run of plain string content: the quote, the backslash, control characters.
static STRING_STOP: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        table[c] = true;
        c += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Where the first quote, backslash or control character in `bytes` is, and whether every
/// byte before it is ASCII (then the string needs no UTF-8 check). Sixteen bytes at a time:
/// long strings (uploads, documents) are most of a large body, and a short one is one step.
#[cfg(target_arch = "x86_64")]
#[inline]
fn plain_run(bytes: &[u8]) -> Option<(usize, bool)> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let mut at = 0;
    // High bits seen so far: a byte over 0x7f.
    let mut high = 0;
    while at + 16 <= bytes.len() {
        // SAFETY: SSE2 is part of every x86_64 CPU; the load is unaligned and reads
        // `bytes[at..at + 16]`, which the loop condition keeps in bounds.
        let (stops, highs) = unsafe {
            let x = _mm_loadu_si128(bytes.as_ptr().add(at).cast::<__m128i>());
            let control = _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x1f)), x);
            let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
            let stop = _mm_or_si128(control, _mm_or_si128(quote, backslash));
            (_mm_movemask_epi8(stop) as u32, _mm_movemask_epi8(x) as u32)
        };
        if stops != 0 {
            let n = stops.trailing_zeros();
            high |= highs & ((1 << n) - 1);
            return Some((at + n as usize, high == 0));
        }
        high |= highs;
        at += 16;
    }
    plain_tail(&bytes[at..], high == 0).map(|(n, ascii)| (at + n, ascii))
}

/// [`plain_run`] elsewhere: eight bytes at a time in a `u64`.
#[cfg(not(target_arch = "x86_64"))]
use plain_run_swar as plain_run;

/// [`plain_run`] without SIMD instructions (tested on every target).
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline]
fn plain_run_swar(bytes: &[u8]) -> Option<(usize, bool)> {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES * 0x80;
    // A byte of `x` is zero, or below `n`: the lowest flagged byte is exact (Bit Twiddling
    // Hacks, "determine if a word has a byte less than n").
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH;
    let mut at = 0;
    let mut high = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let stop = below(w, 0x20) | below(w ^ (ONES * u64::from(b'"')), 1) | below(w ^ (ONES * u64::from(b'\\')), 1);
        if stop != 0 {
            let n = stop.trailing_zeros() / 8;
            high |= w & HIGH & ((1 << (8 * n)) - 1);
            return Some((at + n as usize, high == 0));
        }
        high |= w & HIGH;
        at += 8;
    }
    plain_tail(&bytes[at..], high == 0).map(|(n, ascii)| (at + n, ascii))
}

/// The end of [`plain_run`], a byte at a time; `ascii` says whether what came before was.
#[inline]
fn plain_tail(bytes: &[u8], mut ascii: bool) -> Option<(usize, bool)> {
    for (n, &c) in bytes.iter().enumerate() {
        if STRING_STOP[c as usize] {
            return Some((n, ascii));
        }
        ascii &= c.is_ascii();
    }
    None
}

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
    let scan = |ambiguous: &mut Option<Ambiguity>| {
        let (end, scanned) = envelope(body, ws(body, 0), body_field.as_bytes(), ambiguous)?;
        match ws(body, end) {
            end if end == body.len() => Ok(scanned),
            end => Err(end),
        }
    };
    let scanned = scan(&mut ambiguous).map_err(|at| NotJson { at })?;
    match ambiguous {
        Some(a) => Err(Unreadable::Ambiguous(a)),
        None => Ok(scanned),
    }
}

/// What a string's literal holds, as far as reading its value goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Text {
    /// ASCII only, no escapes: the literal is the value.
    Ascii,
    /// Bytes over 0x7f, no escapes: the value once checked as UTF-8.
    Unchecked,
    /// Escapes to decode.
    Escaped,
}

/// A string token: its literal (quotes included), and what it holds.
#[derive(Clone, Copy)]
struct RawStr<'a> {
    quoted: &'a [u8],
    text: Text,
}

impl<'a> RawStr<'a> {
    fn inner(self) -> &'a [u8] {
        &self.quoted[1..self.quoted.len() - 1]
    }

    /// The string's value: borrowed unless it has escapes.
    fn value(self) -> Scan<Cow<'a, str>> {
        match self.text {
            // SAFETY: ASCII is UTF-8; the scan saw every byte of the literal.
            Text::Ascii => Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(self.inner()) })),
            Text::Unchecked => std::str::from_utf8(self.inner())
                .map(Cow::Borrowed)
                .map_err(|_| Invalid),
            // Rare: serde_json decodes the escapes and checks surrogate pairs.
            Text::Escaped => serde_json::from_slice::<String>(self.quoted)
                .map(Cow::Owned)
                .map_err(|_| Invalid),
        }
    }

    /// The string as a key to compare: escapes decoded, UTF-8 checked (serde_json checks the
    /// keys of the objects it reads). Plain ASCII, the usual key, needs neither.
    fn key(self) -> Scan<Cow<'a, [u8]>> {
        match self.text {
            Text::Ascii => Ok(Cow::Borrowed(self.inner())),
            Text::Unchecked => std::str::from_utf8(self.inner())
                .map(|_| Cow::Borrowed(self.inner()))
                .map_err(|_| Invalid),
            Text::Escaped => self.value().map(|k| Cow::Owned(k.into_owned().into_bytes())),
        }
    }
}

/// A key field as found: a number's text, or a string still to decode.
enum KeyText<'a> {
    Number(&'a str),
    String(RawStr<'a>),
}

// The walk. Every step takes the body and the index it starts at, and returns the index just
// past what it read, or the index where the body stopped being JSON. Free functions over a
// plain index, not methods on a scanner: the index can live in a register rather than behind
// `&mut self` (11% fewer instructions for a 300-byte `tools/call`).

/// Where a step failed, or where it ended.
type At<T> = Result<T, usize>;

/// The first index at or after `i` that is not whitespace.
#[inline(always)]
fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// `i`, if the byte there is `c`.
#[inline(always)]
fn expect(b: &[u8], i: usize, c: u8) -> At<usize> {
    match b.get(i) == Some(&c) {
        true => Ok(i),
        false => Err(i),
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
    // called. Only logged, traced and matched against `Mcp-Name`: one that will not decode is none.
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
        name: target.and_then(|n| n.value().ok()),
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

/// Walks an object from its `{` at `i`; `member` gets each key and the index of its value,
/// and returns the index past the value.
#[inline(always)]
fn object<'a>(b: &'a [u8], i: usize, mut member: impl FnMut(RawStr<'a>, usize) -> At<usize>) -> At<usize> {
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Ok(i + 1);
    }
    loop {
        let (end, text) = string_end(b, expect(b, i, b'"')?)?;
        let key = RawStr {
            quoted: &b[i..end],
            text,
        };
        let colon = expect(b, ws(b, end), b':')?;
        i = ws(b, member(key, ws(b, colon + 1))?);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => return Ok(i + 1),
            _ => return Err(i),
        }
    }
}

/// Walks an array from its `[` at `i`; `element` gets the index of each element and returns
/// the index past it.
fn array(b: &[u8], i: usize, mut element: impl FnMut(usize) -> At<usize>) -> At<usize> {
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Ok(i + 1);
    }
    loop {
        i = ws(b, element(i)?);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b']') => return Ok(i + 1),
            _ => return Err(i),
        }
    }
}

/// Skips the value at `i` and returns its text, which must be UTF-8 (serde_json's `RawValue`).
fn raw_text(b: &[u8], i: usize) -> At<(usize, &str)> {
    let end = skip(b, i)?;
    match std::str::from_utf8(&b[i..end]) {
        Ok(text) => Ok((end, text)),
        Err(_) => Err(end),
    }
}

/// A field read only when it is a string (decoded later): `into` is set to it, or to none.
#[inline(always)]
fn string_field<'a>(b: &'a [u8], i: usize, into: &mut Option<RawStr<'a>>) -> At<usize> {
    match b.get(i) {
        Some(b'"') => {
            let (end, text) = string_end(b, i)?;
            *into = Some(RawStr {
                quoted: &b[i..end],
                text,
            });
            Ok(end)
        }
        _ => {
            *into = None;
            raw_text(b, i).map(|(end, _)| end)
        }
    }
}

/// A key field: a string as is, a number by its JSON text; anything else is no key.
fn key_field(b: &[u8], i: usize) -> At<(usize, Option<KeyText<'_>>)> {
    match b.get(i) {
        Some(b'-' | b'0'..=b'9') => raw_text(b, i).map(|(end, text)| (end, Some(KeyText::Number(text)))),
        _ => {
            let mut found = None;
            let end = string_field(b, i, &mut found)?;
            Ok((end, found.map(KeyText::String)))
        }
    }
}

/// Skips the value at `i`, however deeply nested, keeping the open containers on its own
/// stack; returns the index past it.
fn skip(b: &[u8], mut i: usize) -> At<usize> {
    let mut open = Containers::default();
    // Whether the innermost open container is an object (none open: the value is done).
    let mut top = None;
    loop {
        // A value starts at `i`.
        match *b.get(i).ok_or(i)? {
            b'"' => i = string_end(b, i)?.0,
            opening @ (b'{' | b'[') => {
                let object = opening == b'{';
                i = ws(b, i + 1);
                // `}` and `]` are two past `{` and `[`.
                if b.get(i) != Some(&(opening + 2)) {
                    open.push(object);
                    top = Some(object);
                    if object {
                        i = member_key(b, i)?;
                    }
                    continue;
                }
                i += 1;
            }
            b't' => i = literal_end(b, i, b"true")?,
            b'f' => i = literal_end(b, i, b"false")?,
            b'n' => i = literal_end(b, i, b"null")?,
            b'-' | b'0'..=b'9' => i = number_end(b, i)?,
            _ => return Err(i),
        }
        // A value ended: close containers until one has a next member.
        loop {
            let Some(in_object) = top else {
                return Ok(i);
            };
            i = ws(b, i);
            match b.get(i) {
                Some(b',') => {
                    i = ws(b, i + 1);
                    if in_object {
                        i = member_key(b, i)?;
                    }
                    break;
                }
                Some(b'}') if in_object => {
                    i += 1;
                    top = open.pop();
                }
                Some(b']') if !in_object => {
                    i += 1;
                    top = open.pop();
                }
                _ => return Err(i),
            }
        }
    }
}

/// A member's key and colon, from the key's quote at `i`; returns the index of its value.
#[inline(always)]
fn member_key(b: &[u8], i: usize) -> At<usize> {
    let (end, _) = string_end(b, expect(b, i, b'"')?)?;
    let colon = expect(b, ws(b, end), b':')?;
    Ok(ws(b, colon + 1))
}

/// The end of the string whose opening quote is at `i` (the index past its closing quote), and
/// what it holds. Most strings end at the first stop byte.
#[inline(always)]
fn string_end(b: &[u8], i: usize) -> At<(usize, Text)> {
    let (run, ascii) = plain_run(&b[i + 1..]).ok_or(i)?;
    let end = i + 1 + run;
    match b[end] {
        b'"' => Ok((end + 1, if ascii { Text::Ascii } else { Text::Unchecked })),
        _ => escaped_string_end(b, end).map(|end| (end, Text::Escaped)),
    }
}

/// The rest of a string from its first backslash (or control character, refused) at `i`.
#[cold]
fn escaped_string_end(b: &[u8], mut i: usize) -> At<usize> {
    loop {
        match b[i] {
            b'"' => return Ok(i + 1),
            b'\\' => i = escape_end(b, i + 1)?,
            _ => return Err(i),
        }
        i += plain_run(&b[i..]).ok_or(i)?.0;
    }
}

/// The rest of an escape, after its backslash at `i - 1`. Like serde_json when skipping, a
/// `\u` needs four hex digits; surrogates are checked only where the value is decoded.
fn escape_end(b: &[u8], i: usize) -> At<usize> {
    match b.get(i) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
        Some(b'u') => match b.get(i + 1..i + 5) {
            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
            _ => Err(i),
        },
        _ => Err(i),
    }
}

fn literal_end(b: &[u8], i: usize, word: &[u8]) -> At<usize> {
    match b[i..].starts_with(word) {
        true => Ok(i + word.len()),
        false => Err(i),
    }
}

/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, from `i`.
fn number_end(b: &[u8], mut i: usize) -> At<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits_end(b, i + 1),
        _ => return Err(i),
    }
    if b.get(i) == Some(&b'.') {
        i = some_digits_end(b, i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = some_digits_end(b, i)?;
    }
    Ok(i)
}

fn digits_end(b: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

/// At least one digit from `i`.
fn some_digits_end(b: &[u8], i: usize) -> At<usize> {
    match digits_end(b, i) {
        end if end > i => Ok(end),
        _ => Err(i),
    }
}

/// The containers a skipped value has open: `true` for an object. The first 64 levels live
/// in a bit set; deeper ones (rare, bounded by the body size) spill to the heap.
#[derive(Default)]
struct Containers {
    bits: u64,
    depth: usize,
    deeper: Vec<bool>,
}

impl Containers {
    fn push(&mut self, object: bool) {
        match self.depth < 64 {
            true => self.bits = (self.bits & !(1 << self.depth)) | (u64::from(object) << self.depth),
            false => self.deeper.push(object),
        }
        self.depth += 1;
    }

    /// Closes the innermost container; says what the one around it is, if any.
    fn pop(&mut self) -> Option<bool> {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deeper.pop();
        }
        match self.depth {
            0 => None,
            d if d <= 64 => Some(self.bits >> (d - 1) & 1 == 1),
            _ => self.deeper.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_run_finds_the_first_stop_byte_at_every_offset() {
        let naive = |b: &[u8]| {
            let stop = b.iter().position(|&c| STRING_STOP[c as usize])?;
            Some((stop, b[..stop].is_ascii()))
        };
        // Filler with bytes just above and below each stop value, and UTF-8 above 0x7f.
        let filler = [b'a', b'!', b'#', b'[', b']', 0x20, 0x7f, 0x80, 0xc3, 0xff];
        for len in 0..70 {
            for (n, fill) in filler.iter().enumerate() {
                let mut bytes: Vec<u8> = (0..len).map(|i| filler[(i + n) % filler.len()].max(*fill)).collect();
                assert_eq!(plain_run(&bytes), naive(&bytes), "{bytes:?}");
                assert_eq!(plain_run_swar(&bytes), naive(&bytes), "{bytes:?}");
                for at in 0..len {
                    for stop in [b'"', b'\\', 0x00, 0x01, 0x1f] {
                        let keep = bytes[at];
                        bytes[at] = stop;
                        assert_eq!(plain_run(&bytes), naive(&bytes), "{bytes:?}");
                        assert_eq!(plain_run_swar(&bytes), naive(&bytes), "{bytes:?}");
                        bytes[at] = keep;
                    }
                }
            }
        }
    }
}
