//! The request envelope scanner (`dialect::parse_request`) against serde_json, on generated
//! JSON-RPC bodies (batches of several requests, keys read twice, spelled otherwise or with values
//! not of their shape among them) and on every kind of damage done to them: both must agree on
//! whether a body is JSON, on whether it is ambiguous (by which key, and how) and, when it is
//! read, on every field the router reads of every request in it.

use std::collections::BTreeMap;

use mrtr_router::internals::{parse_request, request_state_at, Reading, RequestEnvelope, Unreadable};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// One request's fields as the router reads them, owned for comparison.
#[derive(Debug, Default, PartialEq)]
struct Fields {
    id: Option<String>,
    method: Option<String>,
    message_id: Option<String>,
    request_state: Option<String>,
    task_id: Option<String>,
    task_ids: Vec<String>,
    name: Option<String>,
    uri: Option<String>,
}

impl Fields {
    /// The scanner reads one `name`: what the method acts on, `params.uri` of a
    /// `resources/read`, else `params.name`. These checks count it as `uri` or `name` by the
    /// method, so that each is seen.
    fn acting_on(mut self, target: Option<String>) -> Fields {
        let reads = self.method.as_deref() == Some("resources/read");
        (self.name, self.uri) = if reads { (None, target) } else { (target, None) };
        self
    }
}

/// What a body reads as.
#[derive(Debug, PartialEq)]
enum Verdict {
    NotJson,
    /// The first key read twice, spelled otherwise or of the wrong shape, as the router names
    /// it, and which of the three.
    Ambiguous(&'static str, Reading),
    Read {
        batch: bool,
        first: Fields,
        rest: Vec<Fields>,
    },
}

fn scanned(body: &[u8], field: &str) -> Verdict {
    let e = match parse_request(body, field) {
        Ok(e) => {
            assert!(e.read, "{:?}", String::from_utf8_lossy(body));
            e
        }
        Err(Unreadable::NotJson(_)) => return Verdict::NotJson,
        Err(Unreadable::Ambiguous(a)) => return Verdict::Ambiguous(a.key, a.how),
    };
    // Where the router puts a wrapped state back: the literal there is the state's.
    let at_state = request_state_at(body, field).map(|at| serde_json::from_slice::<String>(&body[at]).unwrap());
    assert_eq!(
        at_state.as_deref(),
        e.first.request_state.as_deref(),
        "{:?}",
        String::from_utf8_lossy(body)
    );
    let owned = |e: RequestEnvelope| {
        Fields {
            id: e.id.map(str::to_owned),
            method: e.method.map(|m| m.into_owned()),
            message_id: e.message_id.map(|m| m.into_owned()),
            request_state: e.request_state.map(|m| m.into_owned()),
            task_id: e.task_id.map(|m| m.into_owned()),
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

/// An object's members in order, duplicates kept (a map would keep one of them): decoded key,
/// raw value. A key that does not decode (a bad escape, a lone surrogate) fails.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Collect;
        impl<'de> Visitor<'de> for Collect {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Collect)
    }
}

fn members(object: &str) -> Option<Vec<(String, &RawValue)>> {
    serde_json::from_str::<Members>(object).ok().map(|m| m.0)
}

/// Every value of `key`, in order.
fn all<'a>(members: &[(String, &'a RawValue)], key: &str) -> Vec<&'a RawValue> {
    members.iter().filter(|(k, _)| k == key).map(|(_, v)| *v).collect()
}

/// The value of `key` that counts: its last.
fn last<'a>(members: &[(String, &'a RawValue)], key: &str) -> Option<&'a RawValue> {
    all(members, key).pop()
}

fn object(v: &RawValue) -> bool {
    v.get().starts_with('{')
}

/// A field read only as a string: its value decoded (`None` inside: not a string), or `None`
/// when it does not decode.
fn strict(v: Option<&RawValue>) -> Option<Option<String>> {
    match v {
        Some(v) if v.get().starts_with('"') => serde_json::from_str(v.get()).ok().map(Some),
        _ => Some(None),
    }
}

/// The same reading written plainly with serde_json: lists of members with raw values, the last
/// occurrence of a key counting, fields decoded from their raw text; a body read is ambiguous at
/// the first fault in it (see [`ambiguities`]; at one place, a key standing twice is said before
/// its shape). The generated bodies are UTF-8, so only the grammar, the escapes and which
/// occurrence counts are in question here (`utf8_is_checked_where_serde_json_checks_it` and
/// tests/it/properties.rs cover the rest).
fn reference(body: &[u8], field: &str) -> Verdict {
    faulted(body, field).0
}

/// An element of a `taskIds` array, as a place of a fault (its key: `params.notifications.taskIds`).
const TASK_ID: &str = "params.notifications.taskIds[]";

/// [`reference`], and for an ambiguous body where its first fault lies, finer than its key:
/// [`TASK_ID`] for an element of a `taskIds` array.
fn faulted(body: &[u8], field: &str) -> (Verdict, Option<&'static str>) {
    if serde_json::from_slice::<IgnoredAny>(body).is_err() {
        return (Verdict::NotJson, None);
    }
    let text = std::str::from_utf8(body).expect("the generated bodies are UTF-8");
    let top = text.trim_start_matches([' ', '\t', '\n', '\r']);
    // Only a body otherwise read is ambiguous: the first fault, in the body's order.
    let mut found = Vec::new();
    let (batch, requests): (bool, Vec<Option<&str>>) = match top.as_bytes().first() {
        Some(b'{') => (false, vec![Some(top)]),
        Some(b'[') => {
            let elements: Vec<&RawValue> = serde_json::from_str(top).unwrap();
            // An element that is no request (nor `null`) is of the wrong shape.
            for e in elements.iter().filter(|e| !object(e)) {
                misshapen(text, e, "{", "a batch element", &mut found);
            }
            let requests = elements.into_iter().map(|e| object(e).then(|| e.get())).collect();
            (true, requests)
        }
        _ => (false, vec![None]),
    };
    let mut read = Vec::new();
    for request in &requests {
        match request.map_or(Some(Fields::default()), |r| request_fields(r, field)) {
            Some(fields) => read.push(fields),
            None => return (Verdict::NotJson, None),
        }
    }
    for request in requests.iter().flatten() {
        ambiguities(text, request, field, &mut found);
    }
    // At one place, a second occurrence is said to stand twice before its shape is judged.
    if let Some(&(_, place, how)) = found.iter().min_by_key(|&&(at, _, how)| (at, how == Reading::Shape)) {
        let key = match place {
            TASK_ID => "params.notifications.taskIds",
            key => key,
        };
        return (Verdict::Ambiguous(key, how), Some(place));
    }
    let mut read = read.into_iter();
    let read = Verdict::Read {
        batch,
        first: read.next().unwrap_or_default(),
        rest: read.collect(),
    };
    (read, None)
}

/// One request object's fields, or `None` when it is not JSON: a key of it, of any of its
/// `params` or of their `notifications` that does not decode, or a field read that does not.
fn request_fields(request: &str, field: &str) -> Option<Fields> {
    let top = members(request)?;
    // Every `params` is read, whichever counts: its keys, and those of its `notifications`.
    for params in all(&top, "params").into_iter().filter(|p| object(p)) {
        let params = members(params.get())?;
        for notifications in all(&params, "notifications").into_iter().filter(|n| object(n)) {
            members(notifications.get())?;
        }
    }
    let mut f = Fields {
        id: last(&top, "id").map(|v| v.get().to_owned()),
        method: strict(last(&top, "method"))?,
        ..Fields::default()
    };
    // A key field named like a field read before it is never read as the key field.
    f.message_id = match last(&top, field) {
        _ if ["id", "method", "params"].contains(&field) => None,
        Some(raw) if raw.get().starts_with(|c: char| c == '-' || c.is_ascii_digit()) => Some(raw.get().to_owned()),
        raw => strict(raw)?,
    };
    // A later `params` replaces an earlier one whole.
    if let Some(params) = last(&top, "params").filter(|p| object(p)) {
        let params = members(params.get()).expect("read above");
        f.request_state = strict(last(&params, "requestState"))?;
        f.task_id = strict(last(&params, "taskId"))?;
        f.name = strict(last(&params, "name"))?;
        f.uri = strict(last(&params, "uri"))?;
        let notifications = last(&params, "notifications").filter(|n| object(n));
        let listed = notifications.and_then(|n| last(&members(n.get()).expect("read above"), "taskIds"));
        if let Some(listed) = listed.filter(|l| l.get().starts_with('[')) {
            let elements: Vec<&RawValue> = serde_json::from_str(listed.get()).unwrap();
            for e in elements {
                if let Some(id) = strict(Some(e))? {
                    f.task_ids.push(id);
                }
            }
        }
    }
    let target = match f.method.as_deref() {
        Some("resources/read") => f.uri.take(),
        _ => f.name.take(),
    };
    Some(f.acting_on(target))
}

/// Whether `key` is another spelling of `name` for a reader that matches keys regardless of
/// case (Go's `encoding/json`): not the same, but the same letter for letter when ASCII case is
/// ignored, `ſ` (U+017F) counts as an `s` and the Kelvin sign (U+212A) as a `k`.
fn another_spelling(key: &str, name: &str) -> bool {
    let same = |k: char, n: char| {
        k.eq_ignore_ascii_case(&n)
            || (k == 'ſ' && n.eq_ignore_ascii_case(&'s'))
            || (k == '\u{212a}' && n.eq_ignore_ascii_case(&'k'))
    };
    key != name && key.chars().count() == name.chars().count() && key.chars().zip(name.chars()).all(|(k, n)| same(k, n))
}

/// A fault found: where in the body the value at fault starts, the key as the router names it
/// (or [`TASK_ID`]), and how it reads two ways.
type Fault = (usize, &'static str, Reading);

/// Adds `v` as a fault of `key`'s when it is neither `null` nor starts with one of `starts`.
fn misshapen(text: &str, v: &RawValue, starts: &str, key: &'static str, found: &mut Vec<Fault>) {
    if v.get() != "null" && !v.get().starts_with(|c| starts.contains(c)) {
        found.push((v.get().as_ptr() as usize - text.as_ptr() as usize, key, Reading::Shape));
    }
}

/// Adds each fault of `request` (an object, read), of its `params` and their `notifications`
/// (those that are objects): a key read that stands a second time in its object, one that spells
/// otherwise a key read there, every occurrence of a key read whose value is not of its shape
/// (and every element of a `taskIds` array that is no string), each with where its value starts
/// in `text`, as the router names it.
fn ambiguities(text: &str, request: &str, field: &str, found: &mut Vec<Fault>) {
    // Each key read, as the router names it, and what its value may start with (or `null`).
    const STRING: &str = "\"";
    let mut top = vec![
        ("id", "id", "\"-0123456789tf{["),
        ("method", "method", STRING),
        ("params", "params", "{"),
    ];
    if !["id", "method", "params"].contains(&field) {
        top.push((field, "the key field", "\"-0123456789"));
    }
    let params = [
        ("requestState", "params.requestState", STRING),
        ("taskId", "params.taskId", STRING),
        ("name", "params.name", STRING),
        ("uri", "params.uri", STRING),
        ("notifications", "params.notifications", "{"),
    ];
    let notifications = [("taskIds", "params.notifications.taskIds", "[")];
    let check = |members: &[(String, &RawValue)], read: &[(&str, &'static str, &str)], found: &mut Vec<Fault>| {
        let at = |v: &RawValue| v.get().as_ptr() as usize - text.as_ptr() as usize;
        for &(name, said, starts) in read {
            let values = all(members, name);
            found.extend(values.iter().skip(1).map(|v| (at(v), said, Reading::Twice)));
            for v in values {
                misshapen(text, v, starts, said, found);
            }
        }
        for (key, v) in members {
            if read.iter().all(|(name, ..)| key != name) {
                if let Some(&(_, said, _)) = read.iter().find(|(name, ..)| another_spelling(key, name)) {
                    found.push((at(v), said, Reading::Spelled));
                }
            }
        }
    };
    let request = members(request).expect("read before");
    check(&request, &top, found);
    for p in all(&request, "params").into_iter().filter(|p| object(p)) {
        let p = members(p.get()).expect("read before");
        check(&p, &params, found);
        for n in all(&p, "notifications").into_iter().filter(|n| object(n)) {
            let n = members(n.get()).expect("read before");
            check(&n, &notifications, found);
            for listed in all(&n, "taskIds").into_iter().filter(|l| l.get().starts_with('[')) {
                let elements: Vec<&RawValue> = serde_json::from_str(listed.get()).unwrap();
                for e in elements {
                    misshapen(text, e, STRING, TASK_ID, found);
                }
            }
        }
    }
}

const STRINGS: [&str; 13] = [
    "",
    "tools/call",
    "resources/read",
    "k-0123456789abcdef",
    "quarterly revenue by region",
    r#"a\"b"#,
    r"line\nbreak\t\\",
    r"\u00e9t\u00E9",
    r"\ud83d\ude00",
    r"\ud800",
    "é ü 漢字",
    r"\/slash",
    "mrt1.abc.def",
];
const NUMBERS: [&str; 10] = [
    "0",
    "-0",
    "42",
    "-17",
    "3.25",
    "1e9",
    "2.5E-3",
    "1E+2",
    "0.0",
    "123456789012",
];
const SPACE: [&str; 5] = ["", "", " ", "\n  ", "\t\r\n"];

/// Keys of the objects nothing reads (below `params`, in `arguments`...): the router's among
/// them, which count for nothing there.
const ANY_KEYS: [&str; 13] = [
    "id",
    "method",
    "params",
    "messageId",
    "requestState",
    "taskId",
    "name",
    "uri",
    "notifications",
    "taskIds",
    "arguments",
    "jsonrpc",
    "Method",
];
/// Keys nothing reads beside those the router does, near misses of them among them.
const UNREAD: [&str; 8] = [
    "arguments",
    "jsonrpc",
    "_meta",
    "méthod",
    "param",
    "task_id",
    "nåme",
    "ids",
];

/// What a key's value is drawn as: of its shape mostly, now and then `null` (its absence) or a
/// value of another shape.
#[derive(Clone, Copy)]
enum Slot {
    /// Any value.
    Any,
    /// A string.
    Text,
    /// A string or a number (the key field).
    Key,
    Params,
    Notifications,
    /// An array of strings (now and then an element `null` or of another shape).
    TaskIds,
}

impl Slot {
    /// What a value of the slot's shape starts with (as [`Gen::value_of`] names the kinds).
    fn starts(self) -> &'static str {
        match self {
            Slot::Any => "\"0t{[",
            Slot::Text => "\"",
            Slot::Key => "\"0",
            Slot::Params | Slot::Notifications => "{",
            Slot::TaskIds => "[",
        }
    }
}

/// The keys read in a request (both key fields the test uses), in `params`, in
/// `params.notifications`, and other spellings of them.
const REQUEST: [(&str, Slot); 5] = [
    ("id", Slot::Any),
    ("method", Slot::Text),
    ("params", Slot::Params),
    ("messageId", Slot::Key),
    ("callId", Slot::Key),
];
const REQUEST_VARIANTS: [&str; 10] = [
    "ID",
    "Id",
    "METHOD",
    "Method",
    "PARAMS",
    "Params",
    "MessageID",
    "messageid",
    "meſſageId",
    "CallID",
];
const PARAMS: [(&str, Slot); 5] = [
    ("requestState", Slot::Text),
    ("taskId", Slot::Text),
    ("name", Slot::Text),
    ("uri", Slot::Text),
    ("notifications", Slot::Notifications),
];
const PARAMS_VARIANTS: [&str; 11] = [
    "RequestState",
    "requeſtState",
    "TaskId",
    "taſkId",
    "ta\u{212a}Id",
    "Name",
    "NAME",
    "URI",
    "Uri",
    "Notifications",
    "notificationſ",
];
const NOTIFICATIONS: [(&str, Slot); 1] = [("taskIds", Slot::TaskIds)];
const NOTIFICATIONS_VARIANTS: [&str; 4] = ["taskids", "TaskIds", "taſkIds", "tas\u{212a}Ids"];

struct Gen {
    rng: StdRng,
    out: String,
}

impl Gen {
    fn pick<'s>(&mut self, from: &[&'s str]) -> &'s str {
        from[self.rng.random_range(0..from.len())]
    }

    fn space(&mut self) {
        let s = self.pick(&SPACE);
        self.out.push_str(s);
    }

    fn string(&mut self, from: &[&str]) {
        let s = self.pick(from);
        self.out.push('"');
        self.out.push_str(s);
        self.out.push('"');
    }

    /// A key's literal: now and then a character of it escaped (`m\u0065thod` is `method`).
    fn key(&mut self, key: &str) {
        self.out.push('"');
        for c in key.chars() {
            match self.rng.random_bool(0.04) {
                true => self.out.push_str(&format!("\\u{:04X}", c as u32)),
                false => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    fn value(&mut self, depth: u32) {
        self.space();
        let kinds: &[char] = match depth >= 5 {
            true => &['"', '"', '0', '0', 't', 'n'],
            false => &['"', '"', '0', '0', 't', 'n', '{', '['],
        };
        let kind = kinds[self.rng.random_range(0..kinds.len())];
        self.value_of(kind, depth);
        self.space();
    }

    /// A value not of the shape whose values start with one of `starts` (nor `null`): one a
    /// reader that coerces could read otherwise.
    fn misfit(&mut self, depth: u32, starts: &str) {
        let kinds: Vec<char> = "\"0t{[".chars().filter(|&c| !starts.contains(c)).collect();
        let kind = kinds[self.rng.random_range(0..kinds.len())];
        self.value_of(kind, depth);
    }

    /// A value of a kind, named by what it starts with: `"` a string, `0` a number, `t` `true`
    /// or `false`, `n` `null`, `{` an object, `[` an array.
    fn value_of(&mut self, kind: char, depth: u32) {
        match kind {
            '"' => self.string(&STRINGS),
            '0' => {
                let n = self.pick(&NUMBERS);
                self.out.push_str(n);
            }
            't' => {
                let l = self.pick(&["true", "false"]);
                self.out.push_str(l);
            }
            'n' => self.out.push_str("null"),
            '{' => self.object(depth + 1),
            _ => {
                self.out.push('[');
                for i in 0..self.rng.random_range(0..4) {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.value(depth + 1);
                }
                self.space();
                self.out.push(']');
            }
        }
    }

    /// An object no one reads, or a request of random keys (each may stand twice).
    fn object(&mut self, depth: u32) {
        self.out.push('{');
        for i in 0..self.rng.random_range(0..6) {
            if i > 0 {
                self.out.push(',');
            }
            self.space();
            let key = self.pick(&ANY_KEYS);
            self.key(key);
            self.space();
            self.out.push(':');
            self.value(depth);
        }
        self.space();
        self.out.push('}');
    }

    /// An object the router reads: each of `read` about half the time, in any order, keys
    /// nothing reads between them; now and then a key read standing again, or another
    /// spelling of one.
    fn read_object(&mut self, depth: u32, read: &[(&str, Slot)], variants: &[&str]) {
        let mut members: Vec<(&str, Slot)> = read.iter().copied().filter(|_| self.rng.random_bool(0.5)).collect();
        for _ in 0..self.rng.random_range(0..3) {
            members.push((self.pick(&UNREAD), Slot::Any));
        }
        if self.rng.random_bool(0.1) {
            members.push(read[self.rng.random_range(0..read.len())]);
        }
        if self.rng.random_bool(0.07) {
            members.push((self.pick(variants), Slot::Any));
        }
        members.shuffle(&mut self.rng);
        self.out.push('{');
        for (i, (key, slot)) in members.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.space();
            self.key(key);
            self.space();
            self.out.push(':');
            self.space();
            let (depth, p) = (depth + 1, self.rng.random_range(0..100));
            match slot {
                Slot::Any => self.value(depth),
                _ if p < 4 => self.out.push_str("null"),
                _ if p < 10 => self.misfit(depth, slot.starts()),
                Slot::Text => self.string(&STRINGS),
                Slot::Key if p < 75 => self.string(&STRINGS),
                Slot::Key => self.value_of('0', depth),
                Slot::Params => self.read_object(depth, &PARAMS, &PARAMS_VARIANTS),
                Slot::Notifications => self.read_object(depth, &NOTIFICATIONS, &NOTIFICATIONS_VARIANTS),
                Slot::TaskIds => {
                    self.out.push('[');
                    for i in 0..self.rng.random_range(0..4) {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.space();
                        match self.rng.random_range(0..100) {
                            0..90 => self.string(&STRINGS),
                            90..94 => self.out.push_str("null"),
                            _ => self.misfit(depth, Slot::Text.starts()),
                        }
                        self.space();
                    }
                    self.out.push(']');
                }
            }
            self.space();
        }
        self.out.push('}');
    }

    /// A body: mostly a request object, sometimes a batch (of requests, mostly) or a bare
    /// value.
    fn body(&mut self) -> String {
        self.out.clear();
        self.space();
        match self.rng.random_range(0..10) {
            0 => self.value(0),
            1 | 2 => {
                self.out.push('[');
                for i in 0..self.rng.random_range(0..4) {
                    if i > 0 {
                        self.out.push(',');
                    }
                    // Now and then an element that is no request: `null`, or of another shape.
                    match self.rng.random_range(0..100) {
                        0..85 => self.read_object(0, &REQUEST, &REQUEST_VARIANTS),
                        85..89 => self.out.push_str("null"),
                        _ => self.value(1),
                    }
                    self.space();
                }
                self.out.push(']');
            }
            _ => self.read_object(0, &REQUEST, &REQUEST_VARIANTS),
        }
        self.space();
        std::mem::take(&mut self.out)
    }
}

/// Damage that keeps the body ASCII-or-whole-UTF-8 (invalid UTF-8 is covered by its own test).
fn damage(rng: &mut StdRng, body: &str) -> String {
    const BYTES: &[u8] = b"{}[]\",:\\ 0123456789.-+eEaflnrstuE\x01\x1f";
    let mut b = body.as_bytes().to_vec();
    let ascii_at = |b: &[u8], rng: &mut StdRng| -> Option<usize> {
        (0..8)
            .map(|_| rng.random_range(0..b.len().max(1)))
            .find(|&i| b.get(i).is_some_and(u8::is_ascii))
    };
    match rng.random_range(0..4) {
        0 => {
            // Truncated at a char boundary.
            let mut cut = rng.random_range(0..=b.len());
            while !body.is_char_boundary(cut) {
                cut -= 1;
            }
            b.truncate(cut);
        }
        1 => {
            if let Some(i) = ascii_at(&b, rng) {
                b[i] = BYTES[rng.random_range(0..BYTES.len())];
            }
        }
        2 => {
            if let Some(i) = ascii_at(&b, rng) {
                b.remove(i);
            }
        }
        _ => {
            if let Some(i) = ascii_at(&b, rng) {
                b.insert(i, BYTES[rng.random_range(0..BYTES.len())]);
            }
        }
    }
    String::from_utf8(b).expect("damage keeps UTF-8")
}

#[test]
fn agrees_with_serde_json_on_generated_and_damaged_bodies() {
    let mut gen = Gen {
        rng: StdRng::seed_from_u64(0x6d74_7231),
        out: String::new(),
    };
    let mut damage_rng = StdRng::seed_from_u64(7);
    let (mut read, mut not_json, mut batches) = (0, 0, 0);
    // Ambiguous bodies by the place of their fault and how it reads two ways.
    let mut ambiguous: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    // Requests (a batch's each) where the method, key, requestState, taskId, name, uri and
    // taskIds were read.
    let mut seen = [0; 7];
    for round in 0..8000 {
        let field = ["messageId", "messageId", "callId", "id", "params"][round % 5];
        let body = gen.body();
        let mut bodies = vec![body.clone()];
        bodies.extend((0..6).map(|_| damage(&mut damage_rng, &body)));
        for b in &bodies {
            let (expected, place) = faulted(b.as_bytes(), field);
            assert_eq!(scanned(b.as_bytes(), field), expected, "body {b:?}, field {field}");
            match &expected {
                Verdict::Read { first, rest, .. } => {
                    read += 1;
                    batches += usize::from(!rest.is_empty());
                    for f in std::iter::once(first).chain(rest) {
                        let fields = [
                            f.method.is_some(),
                            f.message_id.is_some(),
                            f.request_state.is_some(),
                            f.task_id.is_some(),
                            f.name.is_some(),
                            f.uri.is_some(),
                            !f.task_ids.is_empty(),
                        ];
                        for (n, field) in seen.iter_mut().zip(fields) {
                            *n += usize::from(field);
                        }
                    }
                }
                Verdict::Ambiguous(_, how) => {
                    let place = place.expect("an ambiguity has its place");
                    *ambiguous.entry((place, said(*how))).or_default() += 1;
                }
                Verdict::NotJson => not_json += 1,
            }
        }
    }
    // The generator must reach every verdict and the fields, or the agreement proves little.
    assert!(read > 10_000 && not_json > 10_000, "{read} read, {not_json} not JSON");
    assert!(batches > 500, "{batches} batches of several requests read");
    let refused: usize = ambiguous.values().sum();
    assert!(refused > 4000, "{refused} ambiguous");
    // `uri` is read only for a `resources/read`, one method string in thirteen.
    assert!(
        seen.iter()
            .zip([150, 150, 150, 150, 150, 40, 150])
            .all(|(&n, least)| n > least),
        "method, key, requestState, taskId, name, uri, taskIds read: {seen:?}"
    );
    // Every key read, twice and spelled otherwise; every one but `id` (any value) of another
    // shape, and so a batch element and an element of `taskIds`; nothing else.
    let keys = [
        "id",
        "method",
        "params",
        "the key field",
        "params.requestState",
        "params.taskId",
        "params.name",
        "params.uri",
        "params.notifications",
        "params.notifications.taskIds",
    ];
    let mut expected: Vec<(&str, &str)> = keys
        .iter()
        .flat_map(|&key| [(key, said(Reading::Twice)), (key, said(Reading::Spelled))])
        .collect();
    expected.extend(
        keys[1..]
            .iter()
            .chain(&["a batch element", TASK_ID])
            .map(|&key| (key, said(Reading::Shape))),
    );
    for (key, how) in &expected {
        let n = ambiguous.get(&(key, how)).copied().unwrap_or(0);
        assert!(n > 20, "{key} {how}: {n} bodies");
    }
    let unexpected: Vec<_> = ambiguous.keys().filter(|k| !expected.contains(k)).collect();
    assert!(unexpected.is_empty(), "ambiguous as no key can be: {unexpected:?}");
    let shapes: usize = expected
        .iter()
        .filter(|(_, how)| *how == said(Reading::Shape))
        .map(|k| ambiguous[k])
        .sum();
    assert!(
        shapes < refused * 3 / 4,
        "{shapes} of {refused} ambiguous by a shape: the others are crowded out"
    );
}

/// How an ambiguity reads two ways, in words.
fn said(how: Reading) -> &'static str {
    match how {
        Reading::Twice => "twice",
        Reading::Spelled => "spelled otherwise",
        Reading::Shape => "of another shape",
    }
}

#[test]
fn skipped_values_nest_without_limit_and_unclosed_ones_fail() {
    let arguments = format!("{}1{}", r#"[{"a":"#.repeat(20_000), "}]".repeat(20_000));
    let deep = format!(r#"{{"params":{{"arguments":{arguments}}},"messageId":"m"}}"#);
    let env = parse_request(deep.as_bytes(), "messageId").unwrap();
    assert_eq!(env.first.message_id.as_deref(), Some("m"));
    assert!(serde_json::from_str::<IgnoredAny>(&deep).is_ok());
    let unclosed = format!(r#"{{"params":{}"#, "[".repeat(100_000));
    assert!(parse_request(unclosed.as_bytes(), "messageId").is_err());
    let mismatched = format!(r#"{{"a":{}1{}}}"#, "[".repeat(300), "]".repeat(299) + "}");
    assert!(parse_request(mismatched.as_bytes(), "messageId").is_err());
}

#[test]
fn every_string_is_checked_as_utf8() {
    // A skipped string is checked too: serde_json refuses it when it reads the body as a value
    // (as a backend does), though not when it skips it as `IgnoredAny`.
    let mut skipped = br#"{"messageId":"m","params":{"arguments":{"q":"x"}}}"#.to_vec();
    let at = skipped.iter().rposition(|&c| c == b'x').unwrap();
    skipped[at] = 0xff;
    assert!(serde_json::from_slice::<IgnoredAny>(&skipped).is_ok());
    assert!(serde_json::from_slice::<serde_json::Value>(&skipped).is_err());
    assert!(matches!(
        parse_request(&skipped, "messageId"),
        Err(Unreadable::NotJson(_))
    ));
    // Keys and the fields the router reads must be UTF-8, in every element of a batch (a byte
    // string, not a raw one: in `br"\xff"` the JSON would hold a bad escape, not a bad byte).
    for bad in [
        &b"{\"k\xff\":1}"[..],
        b"{\"messageId\":\"\xff\"}",
        b"{\"id\":[\"\xff\"]}",
        b"{\"method\":\"\xff\"}",
        b"[{\"id\":1},{\"method\":\"\xff\"}]",
        b"[{\"id\":1},{\"params\":{\"k\xff\":1}}]",
        b"{\"params\":{\"notifications\":{\"taskIds\":[\"\xff\"]}}}",
        b"{\"params\":{\"notifications\":{\"taskIds\":[[\"\xff\"]]}}}",
        b"{\"params\":{\"name\":[\"\xff\"]}}",
    ] {
        assert!(
            matches!(parse_request(bad, "messageId"), Err(Unreadable::NotJson(_))),
            "{}",
            bad.escape_ascii()
        );
    }
    // A name or a uri that is no UTF-8, a string inside a `taskIds` of another shape: refused
    // as a body that is not JSON, like every other string that is not UTF-8.
    for bad in [
        &b"{\"params\":{\"name\":\"\xff\",\"uri\":\"a\xff\"}}"[..],
        b"{\"method\":\"resources/read\",\"params\":{\"name\":\"n\",\"uri\":\"a\xff\"}}",
        b"[{\"id\":1},{\"params\":{\"notifications\":{\"taskIds\":{\"a\":\"\xff\"}}}}]",
    ] {
        assert!(
            matches!(parse_request(bad, "messageId"), Err(Unreadable::NotJson(_))),
            "{}",
            bad.escape_ascii()
        );
    }
}

#[test]
fn the_error_says_where_the_body_stops_being_json() {
    let e = parse_request(br#"{"id":1,"method":tools}"#, "messageId").unwrap_err();
    assert_eq!(e, Unreadable::NotJson(mrtr_router::internals::NotJson { at: 17 }));
    assert_eq!(e.to_string(), "not JSON at byte 17");
}

/// The rule for a body where a key read stands twice: whether it is JSON is decided by the
/// occurrence of each field that counts, the last, so an earlier one that does not decode
/// leaves it ambiguous, as for `requestState` and `taskIds`.
#[test]
fn the_last_task_ids_decide() {
    for (body, key) in [
        (
            &br#"{"params":{"requestState":"\ud800","requestState":"a"}}"#[..],
            "params.requestState",
        ),
        (
            br#"{"params":{"notifications":{"taskIds":["\ud800"],"taskIds":[]}}}"#,
            "params.notifications.taskIds",
        ),
        (
            br#"{"params":{"notifications":{"taskIds":["\ud800"]},"notifications":{}}}"#,
            "params.notifications",
        ),
    ] {
        let expected = Verdict::Ambiguous(key, Reading::Twice);
        assert_eq!(scanned(body, "messageId"), expected, "{}", body.escape_ascii());
    }
}

/// `null` stands for a key's absence, whatever its shape; of a body's faults the first in it is
/// said, each occurrence's shape is judged (the first of two too), and a second occurrence
/// stands twice whatever its shape.
#[test]
fn null_is_absence_and_the_first_fault_is_said() {
    for body in [
        r#"{"id":null,"method":null,"messageId":null,"params":null}"#,
        r#"{"params":{"requestState":null,"taskId":null,"name":null,"uri":null,"notifications":null}}"#,
        r#"{"params":{"notifications":{"taskIds":null}}}"#,
        r#"{"params":{"notifications":{"taskIds":[null,"t",null]}}}"#,
        r#"[null,{"id":1},null]"#,
        r#"{"id":[{"method":1}],"messageId":-2.5e3,"params":{"arguments":{"name":1}}}"#,
        r#"{"messageId":true,"callId":7}"#,
    ] {
        let expected = reference(body.as_bytes(), "callId");
        assert!(matches!(expected, Verdict::Read { .. }), "{body}: {expected:?}");
        assert_eq!(scanned(body.as_bytes(), "callId"), expected, "{body}");
    }
    for (body, key, how) in [
        (r#"{"method":1,"method":"a"}"#, "method", Reading::Shape),
        (r#"{"method":"a","method":1}"#, "method", Reading::Twice),
        (r#"{"Method":1,"method":[]}"#, "method", Reading::Spelled),
        (r#"{"params":{"name":1},"method":true}"#, "params.name", Reading::Shape),
        (
            r#"{"params":{"taskId":1},"params":{"taskId":2}}"#,
            "params.taskId",
            Reading::Shape,
        ),
        (r#"{"params":{},"params":{"taskId":2}}"#, "params", Reading::Twice),
        (r#"{"params":"p","params":{}}"#, "params", Reading::Shape),
        (r#"{"callId":true,"id":{}}"#, "the key field", Reading::Shape),
        (
            r#"{"params":{"notifications":{"taskIds":["a",1]},"Name":"n"}}"#,
            "params.notifications.taskIds",
            Reading::Shape,
        ),
        (
            r#"{"params":{"notifications":{"taskIds":[]},"notifications":{"taskIds":{}}}}"#,
            "params.notifications",
            Reading::Twice,
        ),
        (r#"[{"id":1},2,{"method":3}]"#, "a batch element", Reading::Shape),
        (r#"[{"method":3},[]]"#, "method", Reading::Shape),
    ] {
        let expected = Verdict::Ambiguous(key, how);
        assert_eq!(reference(body.as_bytes(), "callId"), expected, "{body}");
        assert_eq!(scanned(body.as_bytes(), "callId"), expected, "{body}");
    }
    // Not JSON is still said first.
    assert_eq!(scanned(br#"{"method":1,"id":}"#, "callId"), Verdict::NotJson);
}
