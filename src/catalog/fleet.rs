//! The fleet's tools: each backend's catalog as last learned, and what they say together —
//! which backends expose a tool, how many definitions of it the fleet serves, which changed.
//! With them, the prompts and resources each backend lists (routed by, never fingerprinted).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::ask::Lists;
use super::definition::{Definition, Fingerprint};

/// One backend's tools, as its last successful ask (or a `tools/list` answer passing through)
/// gave them, and the prompts and resources its last ask listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendTools {
    pub tools: BTreeMap<String, Definition>,
    /// Names its list gave more than once (each one tool whose definition is all its entries).
    pub twice: BTreeSet<String>,
    /// Tools a `tools/list` answer to a client defined otherwise than the backend's last
    /// answer to the catalog, as the client saw them: a backend that tells the router one
    /// thing and its clients another. Cleared when either answer agrees again.
    pub seen_otherwise: BTreeMap<String, Definition>,
    /// Not asked yet: all that is known is what it told clients (`seen_otherwise`), which
    /// routes new calls of those tools to it until its first ask answers (a new instance of a
    /// rollout is listed to clients before the catalog has asked it).
    pub unasked: bool,
    /// It told clients of more than [`TOLD_MAX`] tools the catalog does not know of it in that
    /// definition: what it told is kept no further, and under a lock it is approved for nothing
    /// while it stays in the fleet (a backend whose lists to clients agree with its catalog
    /// never comes near it).
    pub told_too_much: bool,
    /// The names of the prompts it lists (none when it declares no prompts, its list failed,
    /// or it is unasked).
    pub prompts: BTreeSet<String>,
    /// The URIs of the resources it lists (resource templates are not learned).
    pub resources: BTreeSet<String>,
}

impl BackendTools {
    /// A catalog of `definitions` in the order listed. A name listed twice is one tool whose
    /// definition is all of its entries (the fingerprint is over each entry's, in order): a
    /// client may read either, so no lock approves it by approving one of them.
    pub fn new(definitions: impl IntoIterator<Item = Definition>) -> BackendTools {
        let mut tools: BTreeMap<String, Definition> = BTreeMap::new();
        let mut twice = BTreeSet::new();
        for d in definitions {
            match tools.get_mut(&d.name) {
                None => {
                    tools.insert(d.name.clone(), d);
                }
                Some(listed) => {
                    listed.fingerprint = Fingerprint::of_parts([&listed.fingerprint.0[..], &d.fingerprint.0[..]]);
                    twice.insert(d.name);
                }
            }
        }
        BackendTools {
            tools,
            twice,
            seen_otherwise: BTreeMap::new(),
            unasked: false,
            told_too_much: false,
            prompts: BTreeSet::new(),
            resources: BTreeSet::new(),
        }
    }

    /// What an ask learned: its tools as [`BackendTools::new`] reads them, with its prompts
    /// and resources (a name or URI listed twice is served once).
    pub fn of(lists: Lists) -> BackendTools {
        BackendTools {
            prompts: lists.prompts.into_iter().collect(),
            resources: lists.resources.into_iter().collect(),
            ..BackendTools::new(lists.tools)
        }
    }

    /// Whether `other` lists the same tools in the same definitions, and the same prompts and
    /// resources (what routing reads of it is the same).
    pub fn lists_as(&self, other: &BackendTools) -> bool {
        self.tools == other.tools
            && self.twice == other.twice
            && self.prompts == other.prompts
            && self.resources == other.resources
    }

    /// The catalog's own fingerprint: over its tools' names and fingerprints, in name order.
    pub fn fingerprint(&self) -> Fingerprint {
        let parts = self
            .tools
            .values()
            .flat_map(|d| [d.name.as_bytes(), &d.fingerprint.0[..]]);
        Fingerprint::of_parts(parts)
    }
}

/// A definition of a tool that changed on one backend: what it was, what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub backend: String,
    pub tool: String,
    pub was: Option<Fingerprint>,
    pub is: Option<Fingerprint>,
}

/// The most tools a backend's answers to clients may tell of (definitions other than its
/// catalog's, or tools it never told the catalog of) that are kept: its lists to clients
/// cannot grow the router's memory without bound.
pub const TOLD_MAX: usize = 1024;

/// Every backend's tools, by backend name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetTools {
    backends: BTreeMap<String, BackendTools>,
}

impl FleetTools {
    /// Puts `tools` as `backend`'s, and says what changed on it (a tool added, removed or
    /// defined otherwise). The first catalog learned of a backend is no change, and neither is
    /// a prompt or resource it lists or no longer lists: those have no definition to change.
    pub fn learn(&mut self, backend: &str, tools: BackendTools) -> Vec<Change> {
        let changes = match self.backends.get(backend).filter(|b| !b.unasked) {
            None => Vec::new(),
            Some(before) => {
                let names: BTreeSet<&String> = before.tools.keys().chain(tools.tools.keys()).collect();
                names
                    .into_iter()
                    .filter_map(|name| {
                        let was = before.tools.get(name).map(|d| d.fingerprint);
                        let is = tools.tools.get(name).map(|d| d.fingerprint);
                        (was != is).then(|| Change {
                            backend: backend.to_string(),
                            tool: name.clone(),
                            was,
                            is,
                        })
                    })
                    .collect()
            }
        };
        let mut tools = tools;
        // The first ask replaces what an unasked backend told clients; after it, what clients
        // were told otherwise stays noted until this answer agrees with it. Telling of too
        // many is remembered either way: no answer of its own makes up for tools nobody kept.
        if let Some(before) = self.backends.remove(backend) {
            tools.told_too_much = before.told_too_much;
            if !before.unasked {
                tools.seen_otherwise = before
                    .seen_otherwise
                    .into_iter()
                    .filter(|(name, told)| tools.tools.get(name).is_none_or(|d| d.fingerprint != told.fingerprint))
                    .collect();
            }
        }
        self.backends.insert(backend.to_string(), tools);
        changes
    }

    /// What a `tools/list` answer to a client said of `backend`'s tools: each definition that
    /// differs from the one the backend gave the catalog is noted, and so is a tool it did not
    /// list to the catalog at all; one that agrees clears a note. True when the notes changed
    /// (routes change with them).
    pub fn seen_by_client(&mut self, backend: &str, seen: &[Definition]) -> bool {
        let tools = self
            .backends
            .entry(backend.to_string())
            .or_insert_with(|| BackendTools {
                unasked: true,
                ..BackendTools::default()
            });
        let mut changed = false;
        for d in seen {
            let asked = tools.tools.get(&d.name).map(|a| a.fingerprint);
            if asked == Some(d.fingerprint) {
                changed |= tools.seen_otherwise.remove(&d.name).is_some();
            } else if tools.seen_otherwise.len() >= TOLD_MAX && !tools.seen_otherwise.contains_key(&d.name) {
                // Past the bound: noted as a whole instead (under a lock, nothing of it is
                // approved while it stays in the fleet, asked or not).
                changed |= !std::mem::replace(&mut tools.told_too_much, true);
            } else {
                let told = tools.seen_otherwise.insert(d.name.clone(), d.clone());
                changed |= told.is_none_or(|t| t.fingerprint != d.fingerprint);
            }
        }
        changed
    }

    /// Forgets a backend that left the fleet.
    pub fn forget(&mut self, backend: &str) {
        self.backends.remove(backend);
    }

    pub fn backend(&self, name: &str) -> Option<&BackendTools> {
        self.backends.get(name)
    }

    pub fn backends(&self) -> impl Iterator<Item = (&str, &BackendTools)> {
        self.backends.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// Each tool's definitions across the fleet: fingerprint → the backends serving it.
    pub fn definitions(&self) -> BTreeMap<&str, BTreeMap<Fingerprint, Vec<&str>>> {
        let mut out: BTreeMap<&str, BTreeMap<Fingerprint, Vec<&str>>> = BTreeMap::new();
        for (backend, tools) in &self.backends {
            // What an unasked backend told clients stands for its catalog until it is asked.
            let served = if tools.unasked {
                &tools.seen_otherwise
            } else {
                &tools.tools
            };
            for (name, d) in served {
                out.entry(name)
                    .or_default()
                    .entry(d.fingerprint)
                    .or_default()
                    .push(backend);
            }
        }
        out
    }

    /// Each tool's number of distinct definitions across the fleet: a backend that lists it
    /// twice, or tells its clients another definition than the catalog, adds one.
    pub fn definition_counts(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = self
            .definitions()
            .into_iter()
            .map(|(name, defs)| (name.to_string(), defs.len()))
            .collect();
        for tools in self.backends.values().filter(|t| !t.unasked) {
            for name in tools.twice.iter().chain(tools.seen_otherwise.keys()) {
                *counts.entry(name.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// The tools the fleet serves in more than one definition.
    pub fn drifted(&self) -> HashMap<String, usize> {
        self.definition_counts().into_iter().filter(|(_, n)| *n > 1).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools(list: serde_json::Value) -> BackendTools {
        BackendTools::new(list.as_array().unwrap().iter().filter_map(Definition::read))
    }

    fn exposing<'a>(fleet: &'a FleetTools, tool: &'a str) -> Vec<&'a str> {
        fleet
            .backends()
            .filter(|(_, t)| t.tools.contains_key(tool))
            .map(|(n, _)| n)
            .collect()
    }

    #[test]
    fn the_fleet_says_who_exposes_what_and_what_drifted() {
        let mut fleet = FleetTools::default();
        let v1 = json!([{"name": "a", "description": "v1"}, {"name": "b"}]);
        let v2 = json!([{"name": "a", "description": "v2"}, {"name": "b"}, {"name": "c"}]);
        assert!(fleet.learn("w1", tools(v1.clone())).is_empty());
        assert!(fleet.learn("w2", tools(v2.clone())).is_empty());
        assert_eq!(exposing(&fleet, "c"), ["w2"]);
        assert_eq!(exposing(&fleet, "b"), ["w1", "w2"]);
        assert_eq!(fleet.drifted(), HashMap::from([("a".to_string(), 2)]));
        assert_ne!(
            fleet.backend("w1").unwrap().fingerprint(),
            fleet.backend("w2").unwrap().fingerprint()
        );
        // w1 rolls to v2: a changed, c added; the fleet agrees again.
        let changes = fleet.learn("w1", tools(v2));
        let changed: Vec<_> = changes
            .iter()
            .map(|c| (c.tool.as_str(), c.was.is_some(), c.is.is_some()))
            .collect();
        assert_eq!(changed, [("a", true, true), ("c", false, true)]);
        assert!(fleet.drifted().is_empty());
        assert_eq!(
            fleet.backend("w1").unwrap().fingerprint(),
            fleet.backend("w2").unwrap().fingerprint()
        );
        fleet.forget("w2");
        assert_eq!(exposing(&fleet, "b"), ["w1"]);
    }

    fn with_lists(tools_listed: serde_json::Value, prompts: &[&str], resources: &[&str]) -> BackendTools {
        BackendTools::of(Lists {
            tools: tools_listed
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Definition::read)
                .collect(),
            prompts: prompts.iter().map(|p| p.to_string()).collect(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
        })
    }

    #[test]
    fn prompts_and_resources_are_kept_and_change_no_tool_definition() {
        let one = json!([{"name": "a"}]);
        let listed = with_lists(one.clone(), &["greet", "greet", "bye"], &["file:///a"]);
        assert_eq!(listed.prompts, BTreeSet::from(["bye".into(), "greet".into()]));
        assert_eq!(listed.resources, BTreeSet::from(["file:///a".into()]));
        // The backend's fingerprint is its tools' alone.
        assert_eq!(listed.fingerprint(), tools(one.clone()).fingerprint());
        let mut fleet = FleetTools::default();
        assert!(fleet.learn("w1", listed.clone()).is_empty());
        // A prompt or resource more or less is no tool definition change, but lists otherwise
        // (its routes change).
        let other = with_lists(one.clone(), &["greet"], &["file:///a", "file:///b"]);
        assert!(!listed.lists_as(&other));
        assert!(listed.lists_as(&listed.clone()));
        assert!(fleet.learn("w1", other.clone()).is_empty());
        assert_eq!(fleet.backend("w1").unwrap().prompts.len(), 1);
        // A backend a client's tools/list made known before its first ask lists neither.
        assert!(fleet.seen_by_client("w2", &tools(one).tools.into_values().collect::<Vec<_>>()));
        let unasked = fleet.backend("w2").unwrap();
        assert!(unasked.unasked && unasked.prompts.is_empty() && unasked.resources.is_empty());
    }

    #[test]
    fn a_name_listed_twice_is_neither_of_its_definitions() {
        let one = tools(json!([{"name": "a", "description": "v1"}]));
        let other = tools(json!([{"name": "a", "description": "v2"}]));
        let twice = tools(json!([{"name": "a", "description": "v1"}, {"name": "a", "description": "v2"}]));
        let fp = |t: &BackendTools| t.tools["a"].fingerprint;
        assert_eq!(twice.tools.len(), 1);
        assert_ne!(fp(&twice), fp(&one));
        assert_ne!(fp(&twice), fp(&other));
        let reversed = tools(json!([{"name": "a", "description": "v2"}, {"name": "a", "description": "v1"}]));
        assert_ne!(fp(&twice), fp(&reversed));
    }
}
