//! `filter_list_by_scope` (docs/src/catalog.md, "Lists filtered by scope"): a `tools/list`
//! answer for a caller `[auth]` verified, without the tools whose `[[auth.tool]]` scopes it
//! lacks. Only the `tools` array is rewritten (the cursor and everything else stay as they
//! came); an answer from which nothing is dropped passes as it came, byte for byte.

use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::auth::{Caller, Resource};
use crate::sealing::Replacement;

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    result: Option<ListResult<'a>>,
}

#[derive(Deserialize)]
struct ListResult<'a> {
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
}

/// The `tools` array of a `tools/list` result in `msg`, as its byte range.
fn tools_at(msg: &[u8]) -> Option<(Range<usize>, &str)> {
    let message: Message = serde_json::from_slice(msg).ok()?;
    let raw = message.result?.tools?.get();
    // The raw value borrows from `msg`: its place is its offset.
    let start = raw.as_ptr() as usize - msg.as_ptr() as usize;
    Some((start..start + raw.len(), raw))
}

/// The edit that drops from `msg`'s tools those `caller` lacks the scopes of, if any is.
pub fn drop_unscoped(msg: &[u8], resource: &Resource, caller: &Caller) -> Option<Replacement> {
    let (at, raw) = tools_at(msg)?;
    let tools: Vec<&RawValue> = serde_json::from_str(raw).ok()?;
    let allowed = |tool: &&RawValue| {
        let name = serde_json::from_str::<Value>(tool.get()).ok();
        let name = name.as_ref().and_then(|t| t.get("name")).and_then(Value::as_str);
        // A tool without a string name names no scope: it stays, as the backend listed it.
        name.is_none_or(|n| {
            resource
                .tool_scopes(n)
                .iter()
                .all(|s| caller.verified.scopes.satisfies(s))
        })
    };
    let kept: Vec<&RawValue> = tools.iter().copied().filter(allowed).collect();
    if kept.len() == tools.len() {
        return None;
    }
    let text = serde_json::to_string(&kept).ok()?;
    Some(Replacement::json(msg, at, text))
}
