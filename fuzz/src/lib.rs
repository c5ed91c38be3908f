//! The properties of the router's parsers, each a `check_*` function that panics when it fails.
//! The fuzz targets (`fuzz/fuzz_targets/`, `cargo +nightly fuzz run <target>`) feed them
//! libFuzzer's inputs; `tests/it/properties.rs` compiles this same file and feeds them proptest's,
//! in the normal `cargo test`. Uses only crates the router itself depends on (the JWT checks
//! sign their tokens with `ring`, by `tests/fixtures/jwt/signer.rs`).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mrtr_router::internals::{
    parse_outcome, parse_request, request_state_at, split_sse, AlgorithmSet, AuthFailure, AuthPolicy, KeySet,
    LegacySealingKeys, Outcome, Reading, RequestEnvelope, SealingKeys, TokenKind, Unreadable, AUTH_RESULTS,
    MAX_BEARER_BYTES, MAX_KEYS,
};
use mrtr_router::Config;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

// ---- 1. The envelope scanner, differential against serde_json ---------------------------------

/// The key field the envelope checks read (the default `routing.body_field`).
pub const BODY_FIELD: &str = "messageId";

/// One request's envelope fields as the router reads them, owned for comparison.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fields {
    pub id: Option<String>,
    pub method: Option<String>,
    pub message_id: Option<String>,
    pub request_state: Option<String>,
    pub task_id: Option<String>,
    pub task_ids: Vec<String>,
    pub name: Option<String>,
    pub uri: Option<String>,
}

impl Fields {
    /// The scanner reads one `name`: what the method acts on, `params.uri` of a
    /// `resources/read`, else `params.name`. These checks count it as `uri` or `name` by the
    /// method, so that each is seen.
    pub fn acting_on(mut self, target: Option<String>) -> Fields {
        let reads = self.method.as_deref() == Some("resources/read");
        (self.name, self.uri) = if reads { (None, target) } else { (target, None) };
        self
    }
}

/// What a request body reads as.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not JSON (where it stops being JSON is not compared).
    NotJson,
    /// JSON, but a key the router reads stands twice, or in another spelling, or with a value
    /// not of its shape: the first such key in the body, named as the router names it
    /// (`params.name`, `the key field`, `a batch element`), and how it reads two ways.
    Ambiguous(String, Reading),
    /// Read: the request's fields, or a batch's (its first element's, then the others').
    Read {
        batch: bool,
        first: Fields,
        rest: Vec<Fields>,
    },
}

impl Verdict {
    /// Every request read (a batch's elements, a request alone; none unless read).
    pub fn requests(&self) -> impl Iterator<Item = &Fields> {
        let (first, rest) = match self {
            Verdict::Read { first, rest, .. } => (Some(first), &rest[..]),
            _ => (None, &[][..]),
        };
        first.into_iter().chain(rest)
    }
}

/// `parse_request` gives the verdict the serde_json reading below gives: not JSON, ambiguous
/// (by the same key), or every request's fields the same; where it says the first request's
/// `params.requestState` stands, the literal there decodes to that state. Returns the verdict.
pub fn check_envelope(body: &[u8]) -> Verdict {
    let scanned = scanned(body);
    let expected = reference(body);
    assert_eq!(scanned, expected, "body: b\"{}\"", body.escape_ascii());
    expected
}

/// What the router's scan reads.
pub fn scanned(body: &[u8]) -> Verdict {
    let at = request_state_at(body, BODY_FIELD);
    let e = match parse_request(body, BODY_FIELD) {
        Ok(e) => e,
        Err(unreadable) => {
            assert_eq!(at, None, "requestState of a body refused: b\"{}\"", body.escape_ascii());
            return match unreadable {
                Unreadable::NotJson(e) => {
                    assert!(e.at <= body.len(), "not JSON at {} of {} bytes", e.at, body.len());
                    Verdict::NotJson
                }
                Unreadable::Ambiguous(a) => Verdict::Ambiguous(a.key.to_owned(), a.how),
            };
        }
    };
    let literal = at.map(|at| {
        assert!(at.start < at.end && at.end <= body.len(), "requestState at {at:?}");
        serde_json::from_slice::<String>(&body[at]).expect("the requestState literal decodes")
    });
    assert_eq!(
        literal.as_deref(),
        e.first.request_state.as_deref(),
        "requestState's place, body: b\"{}\"",
        body.escape_ascii()
    );
    let owned = |e: RequestEnvelope| {
        Fields {
            id: e.id.map(str::to_owned),
            method: e.method.map(|m| m.into_owned()),
            message_id: e.message_id.map(|m| m.into_owned()),
            request_state: e.request_state.map(|s| s.into_owned()),
            task_id: e.task_id.map(|t| t.into_owned()),
            task_ids: e.task_ids.iter().map(|t| t.clone().into_owned()).collect(),
            name: None,
            uri: None,
        }
        .acting_on(e.name.map(|n| n.into_owned()))
    };
    Verdict::Read {
        batch: e.batch,
        first: owned(e.first),
        rest: e.rest.into_vec().into_iter().map(owned).collect(),
    }
}

/// The same reading done by serde_json, by the rules of docs/src/dialects.md, "What the router
/// reads of a request" and "One reading of the body":
/// - the grammar is serde_json's when it skips a value (`IgnoredAny`): strings that are only
///   skipped are not checked for UTF-8, escapes only for their syntax;
/// - a request object (the body, or each object element of a batch: other elements read as
///   nothing), each of its `params` (if an object) and each `notifications` of those (if an
///   object) are read as lists of members: every key is decoded and must be UTF-8 (serde_json's
///   `String`); the last occurrence of a key counts, and a later `params` replaces an earlier one
///   whole;
/// - `id` is every time taken raw (serde_json's `RawValue`: UTF-8); `method`, the key field,
///   `params.requestState`, `params.taskId`, `params.name`, `params.uri` and the elements of
///   `params.notifications.taskIds` (if an array) count only as strings (a numeric key field by
///   its text), the occurrence that counts decoded as serde_json decodes a `String` (`name` and
///   `uri` leniently: one that does not decode is none); an occurrence that is not a string is
///   taken raw (UTF-8), one that is a string but does not count is skipped like any string (the
///   scanner's documented choice, see docs/src/design/testing.md, "Fuzzing and properties": a
///   plain `RawValue` per occurrence would also check it for UTF-8);
/// - a body read so far is ambiguous where, in one of those objects, a key read stands twice
///   (`Twice`), another spelling of one stands (`Spelled`: equal ignoring ASCII case, `ſ` taken
///   for `s` and the Kelvin sign for `k`), or an occurrence of a key read is of the wrong shape
///   (`Shape`, `null` standing for absence): `method` and the strings read in `params` not a
///   string, the key field neither a string nor a number, `params` and `notifications` not an
///   object, `taskIds` not an array or an element of it not a string; so is a batch element
///   that is not an object (or `null`). The first such fault in the body is the one said; a
///   second occurrence of the wrong shape is said to stand twice.
pub fn reference(body: &[u8]) -> Verdict {
    faulted(body).0
}

/// An element of a `params.notifications.taskIds` array, as the place of a fault.
pub const TASK_ID: &str = "params.notifications.taskIds[]";

/// [`reference`], and for an ambiguous body the place of its first fault, finer than the key
/// said: [`TASK_ID`] for an element of a `taskIds` array, else the key.
pub fn faulted(body: &[u8]) -> (Verdict, Option<&'static str>) {
    // The router refuses a string that is not UTF-8 even where it only skips it, as serde_json
    // does when it reads a value (not when it skips one as `IgnoredAny`): in grammatical JSON,
    // such bytes can only be inside strings.
    if serde_json::from_slice::<IgnoredAny>(body).is_err() || std::str::from_utf8(body).is_err() {
        return (Verdict::NotJson, None);
    }
    // In grammatical JSON, bytes that are not UTF-8 can only be inside strings: each becomes
    // `?` (same length, so every place stays put) and is remembered, for the places read.
    let mut text = String::with_capacity(body.len());
    let mut bad = vec![false; body.len()];
    for chunk in body.utf8_chunks() {
        text.push_str(chunk.valid());
        for _ in chunk.invalid() {
            bad[text.len()] = true;
            text.push('?');
        }
    }
    let r = Reference { text: &text, bad: &bad };
    let top = text.trim_start_matches(WS);
    let batch = top.starts_with('[');
    // The top-level values read, in order: the body, or each element of a batch.
    let values: Vec<&str> = match top.as_bytes().first() {
        Some(b'[') => serde_json::from_str::<Vec<&RawValue>>(top)
            .expect("a grammatical UTF-8 array")
            .into_iter()
            .map(RawValue::get)
            .collect(),
        _ => vec![top],
    };
    // The request objects, in order (`None`: an element of a batch, or a body, that is none).
    let objects: Vec<Option<&str>> = values.iter().map(|v| Some(*v).filter(|v| v.starts_with('{'))).collect();
    // Every request is read first: a body that is not JSON is said so even when ambiguous.
    let mut read = Vec::with_capacity(objects.len());
    for object in &objects {
        match object.map_or(Some(Fields::default()), |o| r.object(o)) {
            Some(fields) => read.push(fields),
            None => return (Verdict::NotJson, None),
        }
    }
    // A batch's elements in order: a request's first fault, or an element that is no request.
    let fault = |v: &&str| match v.starts_with('{') {
        true => r.ambiguity(v, Level::Request),
        false => (batch && !shaped(v, OBJECT)).then_some(("a batch element", Reading::Shape)),
    };
    if let Some((place, how)) = values.iter().find_map(fault) {
        let key = match place {
            TASK_ID => "params.notifications.taskIds",
            key => key,
        };
        return (Verdict::Ambiguous(key.to_owned(), how), Some(place));
    }
    let mut read = read.into_iter();
    let read = Verdict::Read {
        batch,
        first: read.next().unwrap_or_default(),
        rest: read.collect(),
    };
    (read, None)
}

const WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Whether `key` is another spelling of `name` (an ASCII key the router reads): not it, but it
/// once ASCII letters are taken without case, `ſ` for `s` and the Kelvin sign for `k`.
pub fn spelled_like(key: &str, name: &str) -> bool {
    let folded: String = key
        .chars()
        .map(|c| match c {
            '\u{17f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    key != name && folded == name.to_ascii_lowercase()
}

/// The objects whose keys the router reads.
#[derive(Debug, Clone, Copy)]
enum Level {
    Request,
    Params,
    Notifications,
}

/// The first characters a value of a shape may start with (besides `n`, of `null`): any value,
/// a string, a string or a number, an object, an array.
const ANY: &str = "\"-0123456789tf{[";
const STRING: &str = "\"";
const STRING_OR_NUMBER: &str = "\"-0123456789";
const OBJECT: &str = "{";
const ARRAY: &str = "[";

/// Whether the value `v` (a grammatical JSON text) is of the shape that starts with one of
/// `starts`, or `null`.
fn shaped(v: &str, starts: &str) -> bool {
    v == "null" || v.starts_with(|c| starts.contains(c))
}

impl Level {
    /// The keys read there, each as written, as an ambiguity names it and the shape of its value,
    /// in the order a key is tried against them.
    fn keys(self) -> &'static [(&'static str, &'static str, &'static str)] {
        match self {
            Level::Request => &[
                ("id", "id", ANY),
                ("method", "method", STRING),
                ("params", "params", OBJECT),
                (BODY_FIELD, "the key field", STRING_OR_NUMBER),
            ],
            Level::Params => &[
                ("requestState", "params.requestState", STRING),
                ("taskId", "params.taskId", STRING),
                ("name", "params.name", STRING),
                ("uri", "params.uri", STRING),
                ("notifications", "params.notifications", OBJECT),
            ],
            Level::Notifications => &[("taskIds", "params.notifications.taskIds", ARRAY)],
        }
    }

    /// The level read inside `key`'s value, when that is an object.
    fn inner(self, key: &str) -> Option<Level> {
        match (self, key) {
            (Level::Request, "params") => Some(Level::Params),
            (Level::Params, "notifications") => Some(Level::Notifications),
            _ => None,
        }
    }
}

struct Reference<'t> {
    text: &'t str,
    /// Which bytes of the body were not UTF-8.
    bad: &'t [bool],
}

/// An object's members in order, duplicates kept: decoded key, raw value.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(member);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The values of `members` under `name`, in order.
fn named<'t>(members: &[(String, &'t RawValue)], name: &str) -> Vec<&'t RawValue> {
    members.iter().filter(|(k, _)| k == name).map(|(_, v)| *v).collect()
}

fn is_string(v: &RawValue) -> bool {
    v.get().starts_with('"')
}

impl<'t> Reference<'t> {
    fn at(&self, part: &str) -> usize {
        part.as_ptr() as usize - self.text.as_ptr() as usize
    }

    /// `from..to` of the body is UTF-8.
    fn clean(&self, from: usize, to: usize) -> Option<()> {
        (!self.bad[from..to].contains(&true)).then_some(())
    }

    fn raw(&self, v: &RawValue) -> Option<()> {
        let at = self.at(v.get());
        self.clean(at, at + v.get().len())
    }

    /// The members of `object`, each key decoded and UTF-8 (between one value's end and the
    /// next value there is nothing but the key, white space, `,` and `:`).
    fn members(&self, object: &'t str) -> Option<Vec<(String, &'t RawValue)>> {
        let Members(members) = serde_json::from_str(object).ok()?;
        let mut from = self.at(object);
        for (_, v) in &members {
            let at = self.at(v.get());
            self.clean(from, at)?;
            from = at + v.get().len();
        }
        Some(members)
    }

    /// Every occurrence that is not a string must be UTF-8 (its text is taken raw).
    fn raw_unless_strings(&self, occurrences: &[&RawValue]) -> Option<()> {
        occurrences
            .iter()
            .filter(|v| !is_string(v))
            .try_for_each(|v| self.raw(v))
    }

    /// A string field: the occurrence that counts (the last, when `counts`), decoded if a string.
    fn string_field(&self, occurrences: &[&RawValue], counts: bool) -> Option<Option<String>> {
        self.raw_unless_strings(occurrences)?;
        match occurrences.last() {
            Some(v) if counts && is_string(v) => {
                self.raw(v)?;
                serde_json::from_str::<String>(v.get()).ok().map(Some)
            }
            _ => Some(None),
        }
    }

    /// `params.notifications.taskIds` from a `params`' occurrences of `notifications`: each
    /// object's keys decoded, the elements of each `taskIds` array that are no strings taken raw;
    /// the strings of the one that counts (the last `taskIds` of the last `notifications`, when
    /// `counts`, if an object and an array) decoded. Others are skipped unread.
    fn task_ids(&self, notifications: &[&'t RawValue], counts: bool) -> Option<Vec<String>> {
        let mut ids = Vec::new();
        for (n, object) in notifications.iter().enumerate() {
            if !object.get().starts_with('{') {
                continue;
            }
            let lists = named(&self.members(object.get())?, "taskIds");
            for (m, list) in lists.iter().enumerate() {
                if !list.get().starts_with('[') {
                    continue;
                }
                let elements: Vec<&RawValue> = serde_json::from_str(list.get()).expect("a grammatical UTF-8 array");
                self.raw_unless_strings(&elements)?;
                let counted = counts && n + 1 == notifications.len() && m + 1 == lists.len();
                if counted {
                    ids = elements
                        .iter()
                        .filter(|v| is_string(v))
                        .map(|v| self.raw(v).and_then(|()| serde_json::from_str(v.get()).ok()))
                        .collect::<Option<_>>()?;
                }
            }
        }
        Some(ids)
    }

    /// A request object's fields (`None`: not JSON).
    fn object(&self, object: &'t str) -> Option<Fields> {
        let members = self.members(object)?;
        let mut fields = Fields::default();
        let ids = named(&members, "id");
        for id in &ids {
            self.raw(id)?;
        }
        fields.id = ids.last().map(|v| v.get().to_owned());
        fields.method = self.string_field(&named(&members, "method"), true)?;
        let keys = named(&members, BODY_FIELD);
        fields.message_id = match keys.last() {
            Some(v)
                if v.get()
                    .starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']) =>
            {
                self.string_field(&keys, false)?;
                self.raw(v)?;
                Some(v.get().to_owned())
            }
            _ => self.string_field(&keys, true)?,
        };
        let params = named(&members, "params");
        for (n, p) in params.iter().enumerate() {
            if !p.get().starts_with('{') {
                continue;
            }
            let last = n + 1 == params.len();
            let inner = self.members(p.get())?;
            let request_state = self.string_field(&named(&inner, "requestState"), last)?;
            let task_id = self.string_field(&named(&inner, "taskId"), last)?;
            let name = self.string_field(&named(&inner, "name"), last)?;
            let uri = self.string_field(&named(&inner, "uri"), last)?;
            let task_ids = self.task_ids(&named(&inner, "notifications"), last)?;
            if last {
                (fields.request_state, fields.task_id, fields.name, fields.uri) = (request_state, task_id, name, uri);
                fields.task_ids = task_ids;
            }
        }
        let target = match fields.method.as_deref() {
            Some("resources/read") => fields.uri.take(),
            _ => fields.name.take(),
        };
        Some(fields.acting_on(target))
    }

    /// The first fault in `object` (read at `level`), or in the objects read inside it, in the
    /// body's order: a key read that stands there a second time, another spelling of one, an
    /// occurrence of one (each, first or not) of the wrong shape or, in a `taskIds` array, an
    /// element that is no string. The key as an ambiguity names it (an element: [`TASK_ID`]),
    /// and how it reads two ways.
    fn ambiguity(&self, object: &'t str, level: Level) -> Option<(&'static str, Reading)> {
        let keys = level.keys();
        let mut seen: Vec<&str> = Vec::new();
        for (key, value) in self.members(object).expect("read before") {
            let value = value.get();
            match keys.iter().find(|(name, ..)| *name == key) {
                Some(&(name, said, shape)) => {
                    // A second occurrence is said to stand twice, whatever its shape.
                    if seen.contains(&name) {
                        return Some((said, Reading::Twice));
                    }
                    seen.push(name);
                    if !shaped(value, shape) {
                        return Some((said, Reading::Shape));
                    }
                    if shape == ARRAY && value.starts_with('[') {
                        let elements: Vec<&RawValue> = serde_json::from_str(value).expect("a grammatical UTF-8 array");
                        if elements.iter().any(|e| !shaped(e.get(), STRING)) {
                            return Some((TASK_ID, Reading::Shape));
                        }
                    }
                    let inner = level.inner(name).filter(|_| value.starts_with('{'));
                    if let Some(found) = inner.and_then(|inner| self.ambiguity(value, inner)) {
                        return Some(found);
                    }
                }
                None => {
                    if let Some(&(_, said, _)) = keys.iter().find(|(name, ..)| spelled_like(&key, name)) {
                        return Some((said, Reading::Spelled));
                    }
                }
            }
        }
        None
    }
}

// ---- 2. The token codec --------------------------------------------------------------------------

/// Every kind of handle a token seals.
pub const KINDS: [TokenKind; 4] = [
    TokenKind::RoutingId,
    TokenKind::RequestState,
    TokenKind::Session,
    TokenKind::Task,
];

/// The moment every token check happens at (tokens sealed then are valid then).
pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// The keys of the token checks: two (the first seals), in both formats.
pub fn sealing_keys() -> &'static (SealingKeys, LegacySealingKeys) {
    static KEYS: OnceLock<(SealingKeys, LegacySealingKeys)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let keys = vec![
            b"fuzz-key-one-0123456789abcdef0123".to_vec(),
            b"fuzz-key-two-0123456789abcdef0123".to_vec(),
        ];
        let ttl = Duration::from_secs(3600);
        (
            SealingKeys::new(keys.clone(), ttl).expect("valid keys"),
            LegacySealingKeys::new(keys, ttl).expect("valid keys"),
        )
    })
}

/// Any text, as a token or a wrapped value of every kind: never a panic, never both a token and
/// a wrapped value, and what one kind accepts no other kind does (tokens of the previous
/// format, which named no kind, excepted). Returns whether some kind accepted it.
pub fn check_token_text(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let (keys, legacy) = sealing_keys();
    let kind_bound = !text.starts_with("mrt1.");
    let mut accepted = false;
    for kind in KINDS {
        let token = keys.verify(kind, &text, now());
        let wrapped = keys.open_value(kind, &text, now());
        assert!(token.is_err() || wrapped.is_err(), "{text:?} is both");
        accepted |= token.is_ok() || wrapped.is_ok();
        for other in KINDS.into_iter().filter(|&o| o != kind && kind_bound) {
            if token.is_ok() {
                assert!(
                    keys.verify(other, &text, now()).is_err(),
                    "{text:?}: {kind:?} and {other:?}"
                );
            }
            if wrapped.is_ok() {
                assert!(
                    keys.open_value(other, &text, now()).is_err(),
                    "{text:?}: {kind:?} and {other:?}"
                );
            }
        }
    }
    let _ = legacy.verify(&text, now());
    let _ = legacy.open_value(&text, now());
    accepted
}

/// A token sealed for `kind` (wrapping `value` when given; in the previous format when
/// `previous`) opens to what was sealed, and no change of one bit of it is accepted: of every
/// bit, or (`bits`, taken modulo the token's length in bits) of those.
pub fn check_token_bit_flips(
    kind: TokenKind,
    backend: &str,
    value: Option<&str>,
    rounds: u32,
    previous: bool,
    bits: Option<&[usize]>,
) {
    let (keys, legacy) = sealing_keys();
    let token = match (previous, value) {
        (false, None) => keys.seal(kind, backend, rounds, now()),
        (false, Some(v)) => keys.seal_value(kind, v, backend, rounds, now()),
        (true, None) => legacy.seal(backend, now()),
        (true, Some(v)) => legacy.seal_value(v, backend, now()),
    };
    let opens = |t: &str| match value {
        None => keys.verify(kind, t, now()).map(|c| (None, c)),
        Some(_) => keys.open_value(kind, t, now()).map(|(v, c)| (Some(v.into_owned()), c)),
    };
    let (opened, claims) = opens(&token).unwrap_or_else(|e| panic!("{token:?} does not open: {e}"));
    assert_eq!(
        (opened.as_deref(), claims.backend.as_str()),
        (value, backend),
        "{token:?}"
    );
    assert_eq!(claims.rounds, (!previous).then_some(rounds), "{token:?}");
    if !previous {
        for other in KINDS.into_iter().filter(|&o| o != kind) {
            let as_other = match value {
                None => keys.verify(other, &token, now()).map(drop),
                Some(_) => keys.open_value(other, &token, now()).map(drop),
            };
            assert!(as_other.is_err(), "{token:?} sealed for {kind:?} opens as {other:?}");
        }
    }
    let mut bytes = token.clone().into_bytes();
    let every: Vec<usize> = (0..bytes.len() * 8).collect();
    for bit in bits.unwrap_or(&every).iter().map(|b| b % every.len()) {
        bytes[bit / 8] ^= 1 << (bit % 8);
        if let Ok(changed) = std::str::from_utf8(&bytes) {
            assert!(
                opens(changed).is_err(),
                "bit {bit} of {token:?} changed: {changed:?} accepted"
            );
        }
        bytes[bit / 8] ^= 1 << (bit % 8);
    }
}

// ---- 3. The config parser --------------------------------------------------------------------------

/// Any text: never a panic; a config that parses prints (`to_toml`) a text that parses back to
/// an equal config. Token keys print redacted, so the printed text gets the file's own back.
/// Returns whether the text was a config.
pub fn check_config(text: &str) -> bool {
    let path = Path::new("fuzz.toml");
    let Ok(config) = Config::parse(path, text) else {
        return false;
    };
    let mut printed = config.to_toml();
    if config.tokens.is_some() {
        printed = with_token_keys(&printed, text);
    }
    let again = Config::parse(path, &printed)
        .unwrap_or_else(|e| panic!("the printed config does not parse: {e}\n--- read\n{text}\n--- printed\n{printed}"));
    assert_eq!(again, config, "\n--- read\n{text}\n--- printed\n{printed}");
    true
}

/// `printed` with its redacted `tokens.keys` line replaced by the keys as `text` wrote them.
fn with_token_keys(printed: &str, text: &str) -> String {
    let doc: toml::Table = text.parse().expect("a config that parsed is TOML");
    let keys: Vec<String> = doc["tokens"]["keys"]
        .as_array()
        .expect("tokens.keys is an array")
        .iter()
        .map(|k| toml::Value::String(k.as_str().expect("a string").to_owned()).to_string())
        .collect();
    let mut out = String::new();
    for line in printed.lines() {
        match line.starts_with("keys = [") {
            true => out.push_str(&format!("keys = [{}]", keys.join(", "))),
            false => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

// ---- 4. The SSE splitter ------------------------------------------------------------------------

/// The stream whole, cut at `cuts` (positions taken modulo its length + 1, empty chunks
/// included) and a byte at a time: the same events reach the sink, and the bytes sent on are the
/// stream's. Returns the number of events.
pub fn check_sse(stream: &[u8], cuts: &[usize]) -> usize {
    let whole = split_sse(&[stream]);
    assert_eq!(whole.1, stream, "bytes sent on");
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    at.sort_unstable();
    let mut chunks = Vec::with_capacity(at.len() + 1);
    let mut from = 0;
    for &to in &at {
        chunks.push(&stream[from..to]);
        from = to;
    }
    chunks.push(&stream[from..]);
    let show = |r: &(Vec<Vec<u8>>, Vec<u8>)| r.0.iter().map(|e| e.escape_ascii().to_string()).collect::<Vec<_>>();
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    for (how, got) in [("cut at", split_sse(&chunks)), ("a byte at a time", split_sse(&bytes))] {
        // (The message is built only on failure.)
        if got != whole {
            panic!(
                "{how} {at:?}: events {:?}, bytes b\"{}\"; whole: events {:?}; stream b\"{}\"",
                show(&got),
                got.1.escape_ascii(),
                show(&whole),
                stream.escape_ascii()
            );
        }
    }
    whole.0.len()
}

// ---- 5. The answer-outcome parser ------------------------------------------------------------

/// Any message: never a panic; an `input_required` outcome's place is inside the message and
/// the literal there decodes to its `requestState`. Returns whether it was `input_required`.
pub fn check_outcome(message: &[u8]) -> bool {
    let outcome = parse_outcome(message);
    if let Outcome::InputRequired { request_state, at } = &outcome {
        assert!(
            at.start < at.end && at.end <= message.len(),
            "{at:?} in {} bytes",
            message.len()
        );
        let literal = serde_json::from_slice::<String>(&message[at.clone()]);
        assert_eq!(
            literal.ok().as_deref(),
            Some(request_state.as_str()),
            "at {at:?}: b\"{}\"",
            message.escape_ascii()
        );
    }
    matches!(outcome, Outcome::InputRequired { .. })
}

// ---- 6. Access tokens (JWT) and key sets ------------------------------------------------------

#[path = "../../tests/fixtures/jwt/signer.rs"]
pub mod signer;

/// The issuer and the audience of the JWT checks' policy.
pub const JWT_ISSUER: &str = "https://issuer.example";
pub const JWT_AUDIENCE: &str = "https://mcp.example.com/mcp";
/// The leeway of the checks on any text.
pub const JWT_LEEWAY: u64 = 60;

/// The keys of the JWT checks: the RSA test key (`rsa`), a P-256 key made per process (`ec`),
/// an Ed25519 key of a fixed seed (`ed`), and the set of the three. The RSA and Ed25519 keys
/// are the same in every run, so the corpus (`fuzz/corpus/jwt/`) holds tokens that verify.
pub struct JwtKeys {
    pub signers: [signer::Signer; 3],
    pub set: KeySet,
}

pub fn jwt_keys() -> &'static JwtKeys {
    static KEYS: OnceLock<JwtKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let signers = [
            signer::Signer::rsa(Some("rsa")),
            signer::Signer::p256(Some("ec")),
            signer::Signer::ed25519([42; 32], Some("ed")),
        ];
        let doc = signer::jwks(&signers.each_ref().map(|s| s.jwk()));
        let parsed = KeySet::parse(doc.as_bytes()).expect("the checks' key set");
        assert!(parsed.skipped.is_empty(), "{:?}", parsed.skipped);
        JwtKeys {
            signers,
            set: parsed.keys,
        }
    })
}

/// The policy of the JWT checks.
pub fn jwt_policy(audiences: &[String], leeway: u64) -> AuthPolicy {
    AuthPolicy {
        issuer: JWT_ISSUER.to_owned(),
        audiences: audiences.to_vec(),
        algorithms: AlgorithmSet::ALL,
        leeway: Duration::from_secs(leeway),
    }
}

/// Any text as a bearer token, at [`now`]: never a panic; a refusal names a label of
/// `mrtr_auth_total` and a description that quotes as is; a token over the limit is refused
/// for its length; one accepted is from the issuer, unexpired and names a subject. Returns
/// whether it was accepted.
pub fn check_jwt_text(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let policy = jwt_policy(&[JWT_AUDIENCE.to_owned()], JWT_LEEWAY);
    match policy.verify(&text, &jwt_keys().set, now()) {
        Ok(v) => {
            assert!(text.len() <= MAX_BEARER_BYTES, "{text:?}");
            assert_eq!(v.issuer, JWT_ISSUER, "{text:?}");
            assert!(!v.subject.is_empty(), "{text:?}");
            assert!(v.expires_at + Duration::from_secs(JWT_LEEWAY) > now(), "{text:?}");
            true
        }
        Err(failure) => {
            assert!(AUTH_RESULTS.contains(&failure.result()), "{failure:?}");
            let d = failure.description();
            assert!(
                d.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\'),
                "{d:?}"
            );
            if text.len() > MAX_BEARER_BYTES {
                assert_eq!(failure, AuthFailure::TooLong { len: text.len() });
            }
            false
        }
    }
}

/// Any bytes as a JWKS document: never a panic; a document is a key set exactly when it is
/// UTF-8 and serde_json reads it as an object with a `keys` array (members skipped unread, as
/// the set's reader skips what it does not use), and then each of its `keys` is either a key or skipped, the
/// first [`MAX_KEYS`] at most kept. Returns how many keys it kept.
pub fn check_jwks(data: &[u8]) -> usize {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<IgnoredAny>,
    }
    let parsed = KeySet::parse(data);
    let reference = std::str::from_utf8(data).map(|_| serde_json::from_slice::<Document>(data));
    let reference = reference.ok().and_then(Result::ok).ok_or(());
    assert_eq!(
        parsed.is_ok(),
        reference.is_ok(),
        "{parsed:?}: b\"{}\"",
        data.escape_ascii()
    );
    let (Ok(parsed), Ok(doc)) = (parsed, reference) else {
        return 0;
    };
    assert_eq!(
        parsed.keys.len() + parsed.skipped.len(),
        doc.keys.len(),
        "b\"{}\"",
        data.escape_ascii()
    );
    assert!(parsed.keys.len() <= MAX_KEYS);
    assert!(parsed.keys.iter().all(|k| !k.algorithms().is_empty()));
    parsed.keys.len()
}

/// The audience claim of a [`JwtClaims`] case.
#[derive(Debug, Clone)]
pub enum Aud {
    Absent,
    One(String),
    Many(Vec<String>),
}

/// Claims, a policy's audiences and leeway, and a moment: the inputs of the claims checks.
#[derive(Debug, Clone)]
pub struct JwtClaims {
    pub iss: Option<String>,
    pub aud: Aud,
    pub exp: Option<i64>,
    pub nbf: Option<i64>,
    pub iat: Option<i64>,
    pub sub: Option<String>,
    pub client_id: Option<String>,
    /// The policy's audiences and leeway (seconds).
    pub audiences: Vec<String>,
    pub leeway: u64,
    /// Seconds since the epoch.
    pub now: u64,
    /// Which key signs: `jwt_keys().signers[signer % 3]`.
    pub signer: usize,
}

impl JwtClaims {
    pub fn claims(&self) -> serde_json::Value {
        let mut c = serde_json::json!({ "scope": "mcp:tools files:read" });
        let mut set = |k: &str, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                c[k] = v;
            }
        };
        set("iss", self.iss.clone().map(Into::into));
        set(
            "aud",
            match &self.aud {
                Aud::Absent => None,
                Aud::One(a) => Some(a.clone().into()),
                Aud::Many(a) => Some(a.clone().into()),
            },
        );
        set("exp", self.exp.map(Into::into));
        set("nbf", self.nbf.map(Into::into));
        set("iat", self.iat.map(Into::into));
        set("sub", self.sub.clone().map(Into::into));
        set("client_id", self.client_id.clone().map(Into::into));
        c
    }

    /// The verdict by the rules of docs/src/authorization.md, written out plainly.
    pub fn model(&self) -> Result<(), AuthFailure> {
        if self.iss.as_deref() != Some(JWT_ISSUER) {
            return Err(AuthFailure::Issuer);
        }
        let auds: &[String] = match &self.aud {
            Aud::Absent => &[],
            Aud::One(a) => std::slice::from_ref(a),
            Aud::Many(a) => a,
        };
        if !auds.iter().any(|a| self.audiences.contains(a)) {
            return Err(AuthFailure::Audience);
        }
        let (now, leeway) = (self.now as i64, self.leeway as i64);
        match self.exp {
            None => return Err(AuthFailure::MissingExpiry),
            Some(exp) if now >= exp + leeway => return Err(AuthFailure::Expired),
            Some(_) => {}
        }
        if self.nbf.is_some_and(|t| t > now + leeway) || self.iat.is_some_and(|t| t > now + leeway) {
            return Err(AuthFailure::NotYetValid);
        }
        let named = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        if !named(&self.sub) && !named(&self.client_id) {
            return Err(AuthFailure::NoSubject);
        }
        Ok(())
    }

    /// Claims [`check_jwt_changes`]'s policy accepts at [`now`]: subject `sub`, expiring in
    /// `lifetime` seconds (positive), signed by `signer`.
    pub fn accepted(signer: usize, sub: &str, lifetime: i64) -> JwtClaims {
        let now = now().duration_since(UNIX_EPOCH).expect("after the epoch").as_secs();
        JwtClaims {
            iss: Some(JWT_ISSUER.to_owned()),
            aud: Aud::Many(vec![JWT_AUDIENCE.to_owned()]),
            exp: Some(now as i64 + lifetime),
            nbf: None,
            iat: Some(now as i64),
            sub: Some(sub.to_owned()),
            client_id: None,
            audiences: vec![JWT_AUDIENCE.to_owned()],
            leeway: JWT_LEEWAY,
            now,
            signer,
        }
    }

    /// The bearer of these claims, signed by the case's key.
    pub fn bearer(&self) -> String {
        jwt_keys().signers[self.signer % 3].bearer(&self.claims())
    }
}

/// A token of `case`'s claims verifies exactly when [`JwtClaims::model`] says it does, and
/// fails as the model says; an accepted one reads back its subject and expiry. Returns the
/// verdict.
pub fn check_jwt_claims(case: &JwtClaims) -> Result<(), AuthFailure> {
    let token = case.bearer();
    let now = UNIX_EPOCH + Duration::from_secs(case.now);
    let got = jwt_policy(&case.audiences, case.leeway).verify(&token, &jwt_keys().set, now);
    let expected = case.model();
    assert_eq!(got.as_ref().map(drop), expected.as_ref().map(drop), "{case:?}");
    if let Ok(v) = &got {
        let named = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        assert_eq!(Some(&v.subject), named(&case.sub).or(named(&case.client_id)).as_ref());
        let exp = case.exp.expect("accepted with an expiry");
        assert_eq!(v.expires_at, UNIX_EPOCH + Duration::from_secs(exp.max(0) as u64));
    }
    expected
}

/// A signed `token` that verifies at [`now`] under [`jwt_policy`] (audience [`JWT_AUDIENCE`])
/// stops verifying for any one change of one byte: each of its bits flipped in turn and each
/// byte removed, or (`changes`, positions taken modulo its length) those bytes replaced.
pub fn check_jwt_changes(token: &str, changes: Option<&[(usize, u8)]>) {
    let policy = jwt_policy(&[JWT_AUDIENCE.to_owned()], JWT_LEEWAY);
    let verify = |t: &[u8]| match std::str::from_utf8(t) {
        Ok(t) => policy.verify(t, &jwt_keys().set, now()).is_ok(),
        Err(_) => false,
    };
    assert!(verify(token.as_bytes()), "{token} does not verify");
    let mut bytes = token.as_bytes().to_vec();
    let refused = |at: usize, to: u8, bytes: &mut Vec<u8>| {
        let was = std::mem::replace(&mut bytes[at], to);
        if was != to {
            assert!(!verify(bytes), "byte {at} of {token} changed to {to:#04x}: accepted");
        }
        bytes[at] = was;
    };
    match changes {
        Some(changes) => {
            for &(at, to) in changes {
                refused(at % bytes.len(), to, &mut bytes);
            }
        }
        None => {
            for at in 0..bytes.len() {
                for bit in 0..8 {
                    refused(at, bytes[at] ^ (1 << bit), &mut bytes);
                }
                let mut removed = bytes.clone();
                removed.remove(at);
                assert!(!verify(&removed), "byte {at} of {token} removed: accepted");
            }
        }
    }
}
