//! The request envelope scanner (`dialect::parse_request`) against serde_json, on generated
//! JSON-RPC bodies and on every kind of damage done to them: both must agree on whether a body
//! is JSON and, when it is, on every field the router reads.

use std::collections::BTreeMap;

use mrtr_router::internals::{parse_request, request_state_at};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::value::RawValue;

/// The fields as the router reads them, owned for comparison.
#[derive(Debug, PartialEq)]
struct Fields {
    id: Option<String>,
    method: Option<String>,
    message_id: Option<String>,
    request_state: Option<String>,
    task_id: Option<String>,
}

fn scanned(body: &[u8], field: &str) -> Option<Fields> {
    let e = parse_request(body, field).ok()?;
    // Where the router puts a wrapped state back: the literal there is the state's.
    let at_state = request_state_at(body, field).map(|at| serde_json::from_slice::<String>(&body[at]).unwrap());
    assert_eq!(
        at_state.as_deref(),
        e.request_state.as_deref(),
        "{:?}",
        String::from_utf8_lossy(body)
    );
    Some(Fields {
        id: e.id.map(str::to_owned),
        method: e.method.map(|m| m.into_owned()),
        message_id: e.message_id.map(|m| m.into_owned()),
        request_state: e.request_state.map(|m| m.into_owned()),
        task_id: e.task_id.map(|m| m.into_owned()),
    })
}

/// The same reading written plainly with serde_json: maps of raw values (the last duplicate
/// key wins, as in serde_json and Python), fields decoded from their raw text.
fn reference(body: &[u8], field: &str) -> Option<Fields> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).ok()?;
    let text = std::str::from_utf8(body).ok()?;
    let top = text.trim_start_matches([' ', '\t', '\n', '\r']);
    let object = match top.as_bytes().first() {
        Some(b'{') => top,
        Some(b'[') => {
            let batch: Vec<&RawValue> = serde_json::from_str(top).ok()?;
            match batch.first().map(|v| v.get()) {
                Some(first) if first.starts_with('{') => first,
                _ => return Some(Fields::none()),
            }
        }
        _ => return Some(Fields::none()),
    };
    let map: BTreeMap<String, &RawValue> = serde_json::from_str(object).ok()?;
    let string = |raw: &RawValue| -> Option<Option<String>> {
        match raw.get().starts_with('"') {
            true => serde_json::from_str::<String>(raw.get()).ok().map(Some),
            false => Some(None),
        }
    };
    let method = match map.get("method") {
        Some(m) => string(m)?,
        None => None,
    };
    let (mut request_state, mut task_id) = (None, None);
    if let Some(params) = map.get("params").filter(|p| p.get().starts_with('{')) {
        let params: BTreeMap<String, &RawValue> = serde_json::from_str(params.get()).ok()?;
        if let Some(s) = params.get("requestState") {
            request_state = string(s)?;
        }
        if let Some(t) = params.get("taskId") {
            task_id = string(t)?;
        }
    }
    let message_id = match map.get(field) {
        Some(_) if ["id", "method", "params"].contains(&field) => None,
        Some(raw)
            if raw
                .get()
                .starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']) =>
        {
            Some(raw.get().to_owned())
        }
        Some(raw) => string(raw)?,
        None => None,
    };
    Some(Fields {
        id: map.get("id").map(|v| v.get().to_owned()),
        method,
        message_id,
        request_state,
        task_id,
    })
}

impl Fields {
    fn none() -> Fields {
        Fields {
            id: None,
            method: None,
            message_id: None,
            request_state: None,
            task_id: None,
        }
    }
}

const KEYS: [&str; 11] = [
    "id",
    "method",
    "params",
    "messageId",
    "requestState",
    "taskId",
    "name",
    "arguments",
    "jsonrpc",
    r"m\u0065thod",
    r"task\u0049d",
];
const STRINGS: [&str; 12] = [
    "",
    "tools/call",
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

    fn value(&mut self, depth: u32) {
        self.space();
        let kinds = if depth >= 5 { 6 } else { 8 };
        match self.rng.random_range(0..kinds) {
            0 | 1 => self.string(&STRINGS),
            2 | 3 => {
                let n = self.pick(&NUMBERS);
                self.out.push_str(n);
            }
            4 => {
                let l = self.pick(&["true", "false"]);
                self.out.push_str(l);
            }
            5 => self.out.push_str("null"),
            6 => self.object(depth + 1),
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
        self.space();
    }

    fn object(&mut self, depth: u32) {
        self.out.push('{');
        for i in 0..self.rng.random_range(0..6) {
            if i > 0 {
                self.out.push(',');
            }
            self.space();
            // Envelope keys are frequent near the top, where the router reads them.
            let keys = if depth <= 1 && self.rng.random_bool(0.6) {
                &KEYS[..6]
            } else {
                &KEYS[..]
            };
            let key = self.pick(keys);
            self.out.push_str(&format!("\"{key}\""));
            self.space();
            self.out.push(':');
            match key == "params" && self.rng.random_bool(0.7) {
                true => self.object(depth + 1),
                false => self.value(depth),
            }
        }
        self.space();
        self.out.push('}');
    }

    /// A body: mostly a request object, sometimes a batch or a bare value.
    fn body(&mut self) -> String {
        self.out.clear();
        self.space();
        match self.rng.random_range(0..10) {
            0 => self.value(0),
            1 => {
                self.out.push('[');
                self.object(1);
                self.out.push(',');
                self.value(1);
                self.out.push(']');
            }
            _ => self.object(0),
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
    let (mut json, mut not_json) = (0, 0);
    let mut seen = [0; 4];
    for round in 0..8000 {
        let field = ["messageId", "messageId", "callId", "id", "params"][round % 5];
        let body = gen.body();
        let mut bodies = vec![body.clone()];
        bodies.extend((0..6).map(|_| damage(&mut damage_rng, &body)));
        for b in &bodies {
            let expected = reference(b.as_bytes(), field);
            assert_eq!(scanned(b.as_bytes(), field), expected, "body {b:?}, field {field}");
            match &expected {
                Some(f) => {
                    json += 1;
                    let fields = [&f.method, &f.message_id, &f.request_state, &f.task_id];
                    for (n, field) in seen.iter_mut().zip(fields) {
                        *n += usize::from(field.is_some());
                    }
                }
                None => not_json += 1,
            }
        }
    }
    // The generator must reach both sides and the fields, or the agreement proves little.
    assert!(json > 10_000 && not_json > 10_000, "{json} JSON, {not_json} not");
    assert!(
        seen.iter().all(|&n| n > 150),
        "method, key, requestState, taskId read: {seen:?}"
    );
}

#[test]
fn skipped_values_nest_without_limit_and_unclosed_ones_fail() {
    let arguments = format!("{}1{}", r#"[{"a":"#.repeat(20_000), "}]".repeat(20_000));
    let deep = format!(r#"{{"params":{{"arguments":{arguments}}},"messageId":"m"}}"#);
    let env = parse_request(deep.as_bytes(), "messageId").unwrap();
    assert_eq!(env.message_id.as_deref(), Some("m"));
    assert!(serde_json::from_str::<serde::de::IgnoredAny>(&deep).is_ok());
    let unclosed = format!(r#"{{"params":{}"#, "[".repeat(100_000));
    assert!(parse_request(unclosed.as_bytes(), "messageId").is_err());
    let mismatched = format!(r#"{{"a":{}1{}}}"#, "[".repeat(300), "]".repeat(299) + "}");
    assert!(parse_request(mismatched.as_bytes(), "messageId").is_err());
}

#[test]
fn utf8_is_checked_where_serde_json_checks_it() {
    // A skipped string is not decoded, so bad UTF-8 in it passes (as in serde_json).
    let mut skipped = br#"{"messageId":"m","params":{"arguments":{"q":"x"}}}"#.to_vec();
    let at = skipped.iter().rposition(|&c| c == b'x').unwrap();
    skipped[at] = 0xff;
    assert!(serde_json::from_slice::<serde::de::IgnoredAny>(&skipped).is_ok());
    assert_eq!(
        parse_request(&skipped, "messageId").unwrap().message_id.as_deref(),
        Some("m")
    );
    // Keys and the fields the router reads must be UTF-8.
    for bad in [
        &br#"{"k\xff":1}"#[..],
        br#"{"messageId":"\xff"}"#,
        br#"{"id":["\xff"]}"#,
    ] {
        assert!(parse_request(bad, "messageId").is_err(), "{bad:?}");
    }
}

#[test]
fn the_error_says_where_the_body_stops_being_json() {
    let e = parse_request(br#"{"id":1,"method":tools}"#, "messageId").unwrap_err();
    assert_eq!(e.at, 17);
    assert_eq!(e.to_string(), "not JSON at byte 17");
}
