//! A call's arguments checked against each `inputSchema` of a drifted tool: when the backends
//! serving a tool disagree on its schema (a rollout that changed it), a new call goes to those
//! whose schema accepts its arguments. Schemas are compiled once, off the request path, and
//! kept across rebuilds; a request pays for a check only when its tool has drifted.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// A schema whose JSON text is longer is not compiled (it accepts every call): what one
/// backend's list can make a rebuild compile, and a call's check cost, stay small.
pub const MAX_SCHEMA: usize = 16 * 1024;

/// A schema with more patterns (`pattern`, each `patternProperties` key) is not compiled.
const MAX_PATTERNS: usize = 32;

/// The compiled size of one pattern, at most (its automaton and its DFA's cache): a pattern
/// past it fails to compile, and so does its schema.
const PATTERN_SIZE: usize = 16 * 1024;

/// At most this many schemas are compiled in all (the drifted tools' distinct schemas); the
/// rest accept every call. With the bounds above, the compiled schemas stay within a few MiB.
const MAX_COMPILED: usize = 64;

/// Arguments whose JSON text is longer are not checked (the call goes among every backend
/// serving the tool, counted `unmatched`): a check's cost stays within what a schema of
/// [`MAX_SCHEMA`] can ask of arguments of this size.
const MAX_ARGUMENTS: usize = 8 * 1024;

/// One compiled `inputSchema`. `None` inside: it could not be compiled (not a valid schema,
/// too large, or referring to a document outside itself, which the router never fetches), and
/// it accepts every call: the backend judges.
pub struct Schema(Option<jsonschema::Validator>);

impl Schema {
    fn compile(schema: &Value, text_len: usize) -> Schema {
        if text_len > MAX_SCHEMA || patterns_in(schema) > MAX_PATTERNS {
            return Schema(None);
        }
        // Patterns on the `regex` crate: linear time, whatever a backend's schema or a
        // client's arguments hold (the default engine backtracks), and each bounded in size.
        let patterns = jsonschema::PatternOptions::regex()
            .size_limit(PATTERN_SIZE)
            .dfa_size_limit(PATTERN_SIZE);
        let options = jsonschema::options().with_pattern_options(patterns);
        // What a backend wrote meets a library's code: a panic in it is a schema it cannot judge.
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| options.build(schema).ok()));
        Schema(built.ok().flatten())
    }

    /// Whether `arguments` are valid for this schema (a validator that panics judges nothing:
    /// the backend does).
    pub fn accepts(&self, arguments: &Value) -> bool {
        let Some(validator) = &self.0 else { return true };
        let valid = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| validator.is_valid(arguments)));
        valid.unwrap_or(true)
    }
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Schema"
        } else {
            "Schema(accepts all)"
        })
    }
}

/// The compiled schemas of the last build, by their JSON text, and the counters of the checks
/// (`mrtr_tool_argument_checks_total{result}`).
#[derive(Default)]
pub struct ArgumentChecks {
    compiled: HashMap<String, Arc<Schema>>,
    pub(super) counted: Option<Counted>,
}

/// The counters a check adds to, given to each build's routes.
#[derive(Clone, Debug)]
pub struct Counted {
    pub matched: IntCounter,
    pub unmatched: IntCounter,
}

impl Counted {
    pub fn of(checks: &IntCounterVec) -> Counted {
        Counted {
            matched: checks.with_label_values(&["matched"]),
            unmatched: checks.with_label_values(&["unmatched"]),
        }
    }
}

impl ArgumentChecks {
    pub fn new(counted: Counted) -> ArgumentChecks {
        ArgumentChecks {
            compiled: HashMap::new(),
            counted: Some(counted),
        }
    }

    /// A build's schemas: each compiled now only if the last build did not have it; what the
    /// last build had and this one does not is dropped when the returned set is kept.
    pub fn build(&mut self) -> SchemaSet<'_> {
        let before = std::mem::take(&mut self.compiled);
        SchemaSet { checks: self, before }
    }
}

/// The schemas one build of the routes uses.
pub struct SchemaSet<'c> {
    checks: &'c mut ArgumentChecks,
    before: HashMap<String, Arc<Schema>>,
}

impl SchemaSet<'_> {
    /// `schema` compiled (once across builds; past [`MAX_COMPILED`], not: it accepts all).
    pub fn get(&mut self, schema: &Value) -> Arc<Schema> {
        let text = schema.to_string();
        if let Some(s) = self.checks.compiled.get(&text) {
            return s.clone();
        }
        if self.checks.compiled.len() >= MAX_COMPILED {
            return Arc::new(Schema(None));
        }
        let compiled = self
            .before
            .remove(&text)
            .unwrap_or_else(|| Arc::new(Schema::compile(schema, text.len())));
        self.checks.compiled.insert(text, compiled.clone());
        compiled
    }

    pub fn counted(&self) -> Option<Counted> {
        self.checks.counted.clone()
    }
}

/// The `params.arguments` of a body holding one `tools/call` (an empty object when absent, as
/// the SDKs read it). `None`: a batch, or a body that does not parse.
pub fn arguments(body: &[u8]) -> Option<Value> {
    #[derive(Deserialize)]
    struct Call<'a> {
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        arguments: Option<&'a RawValue>,
    }
    // One message is an object (serde would read a struct from an array too).
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let call: Call = serde_json::from_slice(body).ok()?;
    match call.params.and_then(|p| p.arguments) {
        Some(raw) if raw.get().len() > MAX_ARGUMENTS => None,
        Some(raw) => serde_json::from_str(raw.get()).ok(),
        None => Some(Value::Object(Default::default())),
    }
}

/// How many patterns `schema` holds: `pattern` values and `patternProperties` keys, at any depth.
fn patterns_in(schema: &Value) -> usize {
    match schema {
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| {
                let own = match (key.as_str(), value) {
                    ("pattern", Value::String(_)) => 1,
                    ("patternProperties", Value::Object(p)) => p.len(),
                    _ => 0,
                };
                own + patterns_in(value)
            })
            .sum(),
        Value::Array(items) => items.iter().map(patterns_in).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_judges_arguments_and_a_bad_one_accepts_all() {
        let mut checks = ArgumentChecks::default();
        let mut set = checks.build();
        let int = set.get(&json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}));
        assert!(int.accepts(&json!({"id": 5})));
        assert!(!int.accepts(&json!({"id": "abc"})));
        assert!(!int.accepts(&json!({})));
        // Not a schema, or one that points outside itself: the backend judges.
        assert!(set.get(&json!({"type": 17})).accepts(&json!({"id": "abc"})));
        let remote = set.get(&json!({"$ref": "http://127.0.0.1:9/schema.json"}));
        assert!(remote.accepts(&json!({"id": "abc"})));
        // Patterns on a linear-time engine: a backtracking pattern stays cheap.
        let pattern = set.get(&json!({"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}));
        let long = format!("{}b", "a".repeat(5000));
        assert!(!pattern.accepts(&json!({ "s": long })));
        // A pattern whose automaton is large (a Unicode class repeated), or too many patterns:
        // not compiled, so it judges nothing.
        let huge = set.get(&json!({"properties": {"s": {"type": "string", "pattern": "\\p{L}{60}\\p{N}{60}"}}}));
        assert!(huge.accepts(&json!({"s": 1})));
        let many: serde_json::Map<String, Value> = (0..=MAX_PATTERNS)
            .map(|i| (format!("p{i}"), json!({"type": "string", "pattern": format!("^x{i}$")})))
            .collect();
        let many = set.get(&json!({"type": "object", "properties": many}));
        assert!(many.accepts(&json!({"p0": 1})));
    }

    #[test]
    fn at_most_so_many_schemas_are_compiled() {
        let mut checks = ArgumentChecks::default();
        let mut set = checks.build();
        for i in 0..MAX_COMPILED {
            assert!(!set
                .get(&json!({"type": "object", "required": [format!("k{i}")]}))
                .accepts(&json!({})));
        }
        assert!(set
            .get(&json!({"type": "object", "required": ["past"]}))
            .accepts(&json!({})));
    }

    #[test]
    fn schemas_are_compiled_once_across_builds_and_dropped_when_unused() {
        let mut checks = ArgumentChecks::default();
        let schema = json!({"type": "object"});
        let first = checks.build().get(&schema);
        let again = checks.build().get(&schema);
        assert!(Arc::ptr_eq(&first, &again));
        drop(checks.build());
        assert!(checks.compiled.is_empty());
    }

    #[test]
    fn the_arguments_of_one_call() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"id":"x"}}}"#;
        assert_eq!(arguments(body), Some(json!({"id": "x"})));
        let bare = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#;
        assert_eq!(arguments(bare), Some(json!({})));
        assert_eq!(arguments(b"[{}]"), None);
        let big = format!(
            r#"{{"params":{{"name":"t","arguments":{{"s":"{}"}}}}}}"#,
            "a".repeat(MAX_ARGUMENTS)
        );
        assert_eq!(arguments(big.as_bytes()), None, "too large to check");
        assert_eq!(arguments(b"{"), None);
    }
}
