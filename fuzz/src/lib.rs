//! The properties of the router's parsers, each a `check_*` function that panics when it fails.
//! The fuzz targets (`fuzz/fuzz_targets/`, `cargo +nightly fuzz run <target>`) feed them
//! libFuzzer's inputs; `tests/properties.rs` compiles this same file and feeds them proptest's,
//! in the normal `cargo test`. Uses only crates the router itself depends on.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mrtr_router::internals::{
    parse_outcome, parse_request, request_state_at, split_sse, LegacyTokenKeys, Outcome, TokenKeys, TokenKind,
};
use mrtr_router::Config;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

// ---- 1. The envelope scanner, differential against serde_json ---------------------------------

/// The key field the envelope checks read (the default `routing.body_field`).
pub const BODY_FIELD: &str = "messageId";

/// The envelope fields as the router reads them, owned for comparison.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fields {
    pub id: Option<String>,
    pub method: Option<String>,
    pub message_id: Option<String>,
    pub request_state: Option<String>,
    pub task_id: Option<String>,
}

/// `parse_request` accepts exactly the bodies the serde_json reading below accepts, and reads
/// the same fields from them; where it says `params.requestState` stands, the literal there
/// decodes to that state. Returns the fields read (`None`: not JSON).
pub fn check_envelope(body: &[u8]) -> Option<Fields> {
    let scanned = scanned(body);
    let expected = reference(body);
    assert_eq!(scanned, expected, "body: b\"{}\"", body.escape_ascii());
    expected
}

/// What the router's scan reads.
pub fn scanned(body: &[u8]) -> Option<Fields> {
    let e = parse_request(body, BODY_FIELD).ok()?;
    let at = request_state_at(body, BODY_FIELD);
    let literal = at.map(|at| {
        assert!(at.start < at.end && at.end <= body.len(), "requestState at {at:?}");
        serde_json::from_slice::<String>(&body[at]).expect("the requestState literal decodes")
    });
    assert_eq!(
        literal.as_deref(),
        e.request_state.as_deref(),
        "requestState's place, body: b\"{}\"",
        body.escape_ascii()
    );
    Some(Fields {
        id: e.id.map(str::to_owned),
        method: e.method.map(|m| m.into_owned()),
        message_id: e.message_id.map(|m| m.into_owned()),
        request_state: e.request_state.map(|s| s.into_owned()),
        task_id: e.task_id.map(|t| t.into_owned()),
    })
}

/// The same reading done by serde_json, by the rules of docs/src/dialects.md, "What the router reads of a request":
/// - the grammar is serde_json's when it skips a value (`IgnoredAny`): strings that are only
///   skipped are not checked for UTF-8, escapes only for their syntax;
/// - the request object (or a batch's first element, if an object) and its `params` (if an
///   object) are read as maps: every key is decoded and must be UTF-8 (serde_json's `String`);
///   the last occurrence of a key counts;
/// - `id` is every time taken raw (serde_json's `RawValue`: UTF-8); `method`, the key field,
///   `params.requestState` and `params.taskId` count only as strings (a numeric key field by its
///   text), the occurrence that counts decoded as serde_json decodes a `String`; an occurrence
///   that is not a string is taken raw (UTF-8), one that is a string but does not count is
///   skipped like any string (the scanner's documented choice, see docs/src/design/testing.md,
///   "Fuzzing and properties": a plain `RawValue` per occurrence would also check it for UTF-8).
pub fn reference(body: &[u8]) -> Option<Fields> {
    serde_json::from_slice::<IgnoredAny>(body).ok()?;
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
    match top.as_bytes().first() {
        Some(b'{') => r.object(top),
        Some(b'[') => {
            let batch: Vec<&RawValue> = serde_json::from_str(top).expect("a grammatical UTF-8 array");
            match batch.first().map(|v| v.get()) {
                Some(first) if first.starts_with('{') => r.object(first),
                _ => Some(Fields::default()),
            }
        }
        _ => Some(Fields::default()),
    }
}

const WS: [char; 4] = [' ', '\t', '\n', '\r'];

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

    /// A string field: the occurrence that counts, decoded if a string; every occurrence not
    /// a string must be UTF-8 (its text is taken raw).
    fn string_field(&self, occurrences: &[&RawValue], counts: bool) -> Option<Option<String>> {
        for v in occurrences {
            if !v.get().starts_with('"') {
                self.raw(v)?;
            }
        }
        match occurrences.last() {
            Some(v) if counts && v.get().starts_with('"') => {
                self.raw(v)?;
                serde_json::from_str::<String>(v.get()).ok().map(Some)
            }
            _ => Some(None),
        }
    }

    fn object(&self, object: &'t str) -> Option<Fields> {
        let members = self.members(object)?;
        let named =
            |name: &str| -> Vec<&'t RawValue> { members.iter().filter(|(k, _)| k == name).map(|(_, v)| *v).collect() };
        let mut fields = Fields::default();
        let ids = named("id");
        for id in &ids {
            self.raw(id)?;
        }
        fields.id = ids.last().map(|v| v.get().to_owned());
        fields.method = self.string_field(&named("method"), true)?;
        let keys = named(BODY_FIELD);
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
        let params = named("params");
        for (n, p) in params.iter().enumerate() {
            if !p.get().starts_with('{') {
                continue;
            }
            let last = n + 1 == params.len();
            let inner = self.members(p.get())?;
            let named = |name: &str| -> Vec<&'t RawValue> {
                inner.iter().filter(|(k, _)| k == name).map(|(_, v)| *v).collect()
            };
            let request_state = self.string_field(&named("requestState"), last)?;
            let task_id = self.string_field(&named("taskId"), last)?;
            if last {
                (fields.request_state, fields.task_id) = (request_state, task_id);
            }
        }
        Some(fields)
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
pub fn token_keys() -> &'static (TokenKeys, LegacyTokenKeys) {
    static KEYS: OnceLock<(TokenKeys, LegacyTokenKeys)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let keys = vec![
            b"fuzz-key-one-0123456789abcdef0123".to_vec(),
            b"fuzz-key-two-0123456789abcdef0123".to_vec(),
        ];
        let ttl = Duration::from_secs(3600);
        (
            TokenKeys::new(keys.clone(), ttl).expect("valid keys"),
            LegacyTokenKeys::new(keys, ttl).expect("valid keys"),
        )
    })
}

/// Any text, as a token or a wrapped value of every kind: never a panic, never both a token and
/// a wrapped value, and what one kind accepts no other kind does (tokens of the previous
/// format, which named no kind, excepted). Returns whether some kind accepted it.
pub fn check_token_text(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let (keys, legacy) = token_keys();
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
    let (keys, legacy) = token_keys();
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
