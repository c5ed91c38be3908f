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
const MAX_SCHEMA: usize = 16 * 1024;

/// A schema is not compiled when, its local `$ref`s followed, it holds more subschemas than
/// this: a check's work grows with it (refs that fan out, or loop, would have it grow without
/// bound).
const MAX_NODES: usize = 1_000;

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
        if text_len > MAX_SCHEMA {
            return Schema(None);
        }
        let Some(checked) = checkable(schema) else {
            return Schema(None);
        };
        // No pattern is left to run (`checkable`), and formats are annotations only.
        let options = jsonschema::options().should_validate_formats(false);
        // What a backend wrote meets a library's code: a panic in it is a schema it cannot judge.
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| options.build(&checked).ok()));
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

/// What of `schema` is checked: the schema less its `pattern`s (a pattern's cost grows with
/// the string it reads and its own size, and two versions of a tool seldom differ by one alone:
/// an argument is not refused for one), or `None` when it is not checked at all: it has
/// `patternProperties` (dropping those would refuse what they allow), dynamic or recursive
/// refs, or more than [`MAX_NODES`] subschemas once its local `$ref`s are followed.
fn checkable(schema: &Value) -> Option<Value> {
    let mut budget = MAX_NODES;
    weigh(schema, schema, &mut budget)?;
    Some(without_patterns(schema))
}

/// Counts `node`'s subschemas into `budget`, following local `$ref`s into `root`; `None` past
/// the budget, or on what [`checkable`] refuses.
fn weigh(node: &Value, root: &Value, budget: &mut usize) -> Option<()> {
    *budget = budget.checked_sub(1)?;
    match node {
        Value::Object(map) => {
            for (key, value) in map {
                match key.as_str() {
                    "patternProperties" | "$dynamicRef" | "$recursiveRef" => return None,
                    // Values, not schemas.
                    "const" | "enum" | "default" | "examples" => {}
                    "$ref" => {
                        let target = value.as_str()?.strip_prefix('#')?;
                        weigh(root.pointer(target)?, root, budget)?;
                    }
                    _ => weigh(value, root, budget)?,
                }
            }
            Some(())
        }
        Value::Array(items) => items.iter().try_for_each(|i| weigh(i, root, budget)),
        _ => Some(()),
    }
}

/// `schema` with every `pattern` keyword (a string value) taken out; values (`const`, `enum`,
/// `default`, `examples`) as they are.
fn without_patterns(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, value)| !(key.as_str() == "pattern" && value.is_string()))
                .map(|(key, value)| match key.as_str() {
                    "const" | "enum" | "default" | "examples" => (key.clone(), value.clone()),
                    _ => (key.clone(), without_patterns(value)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_patterns).collect()),
        other => other.clone(),
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
        // Patterns are not run: an argument is not refused for one.
        let pattern = set.get(&json!({"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}));
        assert!(pattern.accepts(&json!({ "s": "b" })));
        assert!(
            !pattern.accepts(&json!({ "s": 1 })),
            "the rest of the schema still judges"
        );
        // Refs that fan out (ten to a level, twelve levels), or loop, or `patternProperties`:
        // not compiled, so they judge nothing.
        let mut defs = serde_json::Map::new();
        defs.insert("p0".into(), json!({"type": "string"}));
        for level in 1..=12 {
            let below = json!({"$ref": format!("#/$defs/p{}", level - 1)});
            defs.insert(format!("p{level}"), json!({"allOf": vec![below; 10]}));
        }
        let fan = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/p12"}}, "$defs": defs});
        assert!(set.get(&fan).accepts(&json!({"a": 1})));
        let looping = json!({"$defs": {"n": {"properties": {"next": {"$ref": "#/$defs/n"}}, "type": "object"}}, "$ref": "#/$defs/n"});
        assert!(set.get(&looping).accepts(&json!(7)));
        assert!(set
            .get(&json!({"patternProperties": {"^x": {"type": "string"}}, "type": "object"}))
            .accepts(&json!(7)));
        // A few local refs, as generated schemas have them, are followed and judge.
        let models = json!({"$defs": {"Item": {"type": "object", "required": ["id"]}}, "type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"]});
        let models = set.get(&models);
        assert!(models.accepts(&json!({"item": {"id": 1}})));
        assert!(!models.accepts(&json!({"item": {}})));
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
