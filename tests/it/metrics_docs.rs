//! The metrics table of docs/src/observability.md against a live router's `/metrics`: every
//! metric the docs list is exported, with the type and the labels they say, every enumerated
//! label takes exactly the values they list, and the reverse. The docs cannot drift from
//! what an operator's Prometheus sees.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::*;
use serde_json::json;

/// One metric as documented, or as exported: its type, and each label with its values (for
/// the docs: `None` for a free label such as `backend`).
#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeMap<String, Option<BTreeSet<String>>>,
}

/// The backticked names in `cell`.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The docs' metrics table: one row per group of metrics sharing type and labels, each label
/// `name` or `name (` values separated by ` / ` `)`.
fn documented() -> BTreeMap<String, Family> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/observability.md")).unwrap();
    let mut rows = text
        .lines()
        .skip_while(|l| !l.starts_with("| metric | type | labels | meaning |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut out = BTreeMap::new();
    for row in rows.by_ref() {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 4, "a row of four cells: {row}");
        let mut labels = BTreeMap::new();
        // Labels separated by ", " outside parentheses.
        let mut depth = 0;
        let mut start = 0;
        let cell = cells[2];
        let mut parts = Vec::new();
        for (i, c) in cell.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&cell[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&cell[start..]);
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let (name, values) = match part.split_once(" (") {
                Some((name, values)) => (name, Some(ticked(values).into_iter().collect())),
                None => (part, None),
            };
            let name = ticked(name)
                .pop()
                .unwrap_or_else(|| panic!("a backticked label: {part:?} in {row}"));
            labels.insert(name, values);
        }
        for name in ticked(cells[0]) {
            let family = Family {
                kind: cells[1].to_string(),
                labels: labels.clone(),
            };
            assert!(out.insert(name.clone(), family).is_none(), "{name} is listed twice");
        }
    }
    assert!(out.len() > 20, "the table was found: {} rows", out.len());
    out
}

/// What the Prometheus text shows: each family's type and the values of each label.
fn exported(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.entry(name.to_string()).or_default().kind = kind.to_string();
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, _) = line.rsplit_once(' ').unwrap();
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| out.get(*f).is_some_and(|f| f.kind == "histogram"))
            })
            .unwrap_or(name);
        let family = out.get_mut(family).unwrap_or_else(|| panic!("{name} has a TYPE line"));
        for pair in labels.trim_end_matches('}').split("\",").filter(|p| !p.is_empty()) {
            let (label, value) = pair.split_once("=\"").unwrap();
            if label == "le" {
                continue;
            }
            let values = family
                .labels
                .entry(label.to_string())
                .or_insert_with(|| Some(BTreeSet::new()));
            values.as_mut().unwrap().insert(value.trim_end_matches('"').to_string());
        }
    }
    out
}

#[tokio::test]
async fn the_metrics_table_is_what_a_live_router_exports() {
    let extra = "[tokens]\nkeys = [\"metrics-docs-key-0123456789abcdef012345\"]\n\
                 [catalog]\nenabled = true\ninterval = \"1s\"\n";
    let fleet = Fleet::start(2, extra).await;
    // The catalog's series, once both workers' tools are learned.
    fleet
        .wait_metric(
            "mrtr_catalog_tools{backend=\"worker-1\"}",
            5.0,
            std::time::Duration::from_secs(10),
        )
        .await;
    fleet
        .wait_metric(
            "mrtr_catalog_tools{backend=\"worker-0\"}",
            5.0,
            std::time::Duration::from_secs(10),
        )
        .await;
    // One request, so that the per-request series exist.
    let a = fleet
        .post(
            &[],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}}),
        )
        .await;
    assert_eq!(a.status, 200);
    let docs = documented();
    let live = exported(&fleet.metrics().await);
    let names = |m: &BTreeMap<String, Family>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        names(&docs),
        names(&live),
        "documented (left) and exported (right) metrics differ"
    );
    for (name, doc) in &docs {
        let live = &live[name];
        assert_eq!(doc.kind, live.kind, "{name}: its type");
        let label_names = |f: &Family| f.labels.keys().cloned().collect::<BTreeSet<_>>();
        assert_eq!(label_names(doc), label_names(live), "{name}: its labels");
        for (label, values) in &doc.labels {
            if let Some(values) = values {
                assert_eq!(
                    Some(values),
                    live.labels[label].as_ref(),
                    "{name}: the values of `{label}` documented (left) and exported (right)"
                );
            }
        }
    }
}
