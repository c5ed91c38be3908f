//! One tool as a backend defines it, and its fingerprint: a digest of the parts a client relies
//! on (name, description, `inputSchema`, `outputSchema`, annotations) in a canonical form, so
//! that two instances serving the same definition agree on it whatever order their JSON keys
//! come in, and a changed byte of any of those parts changes it.

use std::fmt;

use serde_json::{Map, Value};

/// The most JSON objects and arrays, and the most values of any kind, one ask (all its pages)
/// or one list a client got may hold for the catalog to read it. Parsed, a value costs tens of
/// bytes and an object or array hundreds however short its text (`0,` is 2 bytes, `{"a":0}` 7
/// and becomes a map), so `max_bytes` alone does not bound the memory a list takes: a 4 MiB
/// list of tiny objects took a gigabyte, one of numbers 300 MB. A thousand tools with ten
/// properties each hold some 20,000 objects and arrays and 70,000 values.
pub const MAX_CONTAINERS: usize = 50_000;
pub const MAX_VALUES: usize = 300_000;

/// Whether `json` holds at most [`MAX_CONTAINERS`] objects and arrays (its `{` and `[` outside
/// strings) and [`MAX_VALUES`] values (those and the members and elements after a `,`): one
/// pass, no allocation, stopping at the first bound passed, whether the text is valid JSON or
/// not. `spent` carries the counts across the pages of one ask.
pub fn within_value_bounds(json: &[u8], spent: &mut (usize, usize)) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    let (containers, values) = spent;
    for &b in json {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (_, b'"') => in_string = !in_string,
            (false, b'{' | b'[') => {
                *containers += 1;
                *values += 1;
                if *containers > MAX_CONTAINERS || *values > MAX_VALUES {
                    return false;
                }
            }
            (false, b',') => {
                *values += 1;
                if *values > MAX_VALUES {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

/// A definition's fingerprint: SHA-256 of its canonical form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// SHA-256 of `parts`, each length-prefixed (the catalog's digest over its tools' ones).
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Fingerprint {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for part in parts {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        Fingerprint(ctx.finish().as_ref().try_into().expect("SHA-256 is 32 bytes"))
    }

    /// The first 8 bytes in hex: what `/catalog` and the log show.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.short())
    }
}

/// What a tool's annotations say a call of it may do (the MCP defaults when absent: not
/// read-only, not idempotent, destructive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub idempotent: bool,
    pub destructive: bool,
}

impl Hints {
    fn of(annotations: Option<&Value>) -> Hints {
        let flag = |name: &str| annotations.and_then(|a| a.get(name)).and_then(Value::as_bool);
        let read_only = flag("readOnlyHint").unwrap_or(false);
        Hints {
            read_only,
            idempotent: flag("idempotentHint").unwrap_or(false),
            // A read-only tool changes nothing, whatever its destructive hint says.
            destructive: !read_only && flag("destructiveHint").unwrap_or(true),
        }
    }
}

/// One tool of a backend's catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub fingerprint: Fingerprint,
    pub hints: Hints,
    /// The `inputSchema` as served, for validating a call's arguments when definitions differ.
    pub input_schema: Value,
    /// The description (shown by `/catalog`, never interpreted).
    pub description: String,
}

impl Definition {
    /// The definition of one element of a `tools/list` result's `tools`, or `None` when it is
    /// no tool (no string `name`).
    pub fn read(tool: &Value) -> Option<Definition> {
        let name = tool.get("name")?.as_str()?.to_string();
        let part = |key: &str| tool.get(key).cloned().unwrap_or(Value::Null);
        let mut canonical = Map::new();
        for key in ["name", "description", "inputSchema", "outputSchema", "annotations"] {
            canonical.insert(key.to_string(), part(key));
        }
        // serde_json's map keeps its keys sorted (no `preserve_order`): its text is canonical.
        let text = Value::Object(canonical).to_string();
        Some(Definition {
            fingerprint: Fingerprint::of_parts([text.as_bytes()]),
            hints: Hints::of(tool.get("annotations")),
            input_schema: part("inputSchema"),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_arrays_and_values_are_counted_outside_strings() {
        let mut spent = (0, 0);
        assert!(within_value_bounds(br#"{"a":[1,{"b":"[{,\"}"}],"c":"\\"}"#, &mut spent));
        assert_eq!(spent, (3, 5));
        let mut near = (MAX_CONTAINERS - 1, 0);
        assert!(within_value_bounds(b"[", &mut near) && !within_value_bounds(b"[", &mut near));
        let mut near = (0, MAX_VALUES - 1);
        assert!(within_value_bounds(b",", &mut near) && !within_value_bounds(b"0,0", &mut near));
        assert!(within_value_bounds(br#""{[,""#, &mut (0, 0)));
    }

    #[test]
    fn the_fingerprint_ignores_key_order_and_sees_every_part() {
        let a = json!({"name": "search", "description": "d", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}, "annotations": {"readOnlyHint": true}});
        let reordered: Value = serde_json::from_str(
            r#"{"annotations":{"readOnlyHint":true},"inputSchema":{"properties":{"q":{"type":"string"}},"type":"object"},"description":"d","name":"search"}"#,
        )
        .unwrap();
        let fa = Definition::read(&a).unwrap();
        assert_eq!(fa.fingerprint, Definition::read(&reordered).unwrap().fingerprint);
        assert!(fa.hints.read_only && !fa.hints.destructive);
        for changed in [
            json!({"name": "search", "description": "e", "inputSchema": a["inputSchema"], "annotations": a["annotations"]}),
            json!({"name": "search", "description": "d", "inputSchema": {"type": "object"}, "annotations": a["annotations"]}),
            json!({"name": "search", "description": "d", "inputSchema": a["inputSchema"]}),
            json!({"name": "search", "description": "d", "inputSchema": a["inputSchema"], "annotations": a["annotations"], "outputSchema": {}}),
        ] {
            assert_ne!(
                Definition::read(&changed).unwrap().fingerprint,
                fa.fingerprint,
                "{changed}"
            );
        }
        // Fields a client does not rely on (a title, `_meta`) change nothing.
        let mut titled = a.clone();
        titled["title"] = json!("Search");
        titled["_meta"] = json!({"x": 1});
        assert_eq!(Definition::read(&titled).unwrap().fingerprint, fa.fingerprint);
        assert!(Definition::read(&json!({"name": 7})).is_none());
    }

    #[test]
    fn hints_follow_the_protocol_defaults() {
        let unannotated = Definition::read(&json!({"name": "t"})).unwrap().hints;
        assert_eq!(
            unannotated,
            Hints {
                read_only: false,
                idempotent: false,
                destructive: true
            }
        );
        let idempotent = Definition::read(&json!({"name": "t", "annotations": {"idempotentHint": true}}))
            .unwrap()
            .hints;
        assert!(idempotent.idempotent && idempotent.destructive);
    }
}
