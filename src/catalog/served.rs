//! What routing reads of the prompts and resources backends list (part of [`super::ToolRoutes`]):
//! for each prompt name and each resource URI, the backends listing it. A new `prompts/get` or
//! `resources/read` goes among them; one naming what no backend lists goes as any request.
//! Built with the tool routes, never on the request path.

use std::collections::{BTreeSet, HashMap};

use super::fleet::FleetTools;
use crate::upstream::BackendKey;

/// A prompt name or resource URI → the backends listing it.
type ByName = HashMap<Box<str>, Box<[BackendKey]>>;

/// The backends listing each prompt and each resource.
#[derive(Debug, Default)]
pub(super) struct ServedRoutes {
    prompts: ByName,
    resources: ByName,
}

/// Each name of `listed` (one backend's names, by backend) with the backends listing it.
fn by_name<'f>(listed: impl Iterator<Item = (BackendKey, &'f BTreeSet<String>)>) -> ByName {
    let mut backends: HashMap<&str, Vec<BackendKey>> = HashMap::new();
    for (key, names) in listed {
        for name in names {
            backends.entry(name).or_default().push(key);
        }
    }
    backends
        .into_iter()
        .map(|(name, keys)| (name.into(), keys.into()))
        .collect()
}

impl ServedRoutes {
    /// The routes of what `fleet`'s backends list, for the backends `key_of` knows (one the
    /// snapshot no longer has is left out).
    pub(super) fn build(fleet: &FleetTools, key_of: impl Fn(&str) -> Option<BackendKey>) -> ServedRoutes {
        let known: Vec<_> = fleet
            .backends()
            .filter_map(|(name, listed)| Some((key_of(name)?, listed)))
            .collect();
        ServedRoutes {
            prompts: by_name(known.iter().map(|(key, listed)| (*key, &listed.prompts))),
            resources: by_name(known.iter().map(|(key, listed)| (*key, &listed.resources))),
        }
    }

    /// The backends listing what a `prompts/get` (the prompt `name`) or a `resources/read`
    /// (the URI `name`) asks for; `None` for any other method, or a name no backend lists.
    /// No allocation: a borrowed slice, and nothing hashed when nothing of the kind is known.
    #[inline]
    pub(super) fn serving(&self, method: &str, name: &str) -> Option<&[BackendKey]> {
        let served = match method {
            "prompts/get" => &self.prompts,
            "resources/read" => &self.resources,
            _ => return None,
        };
        if served.is_empty() {
            return None;
        }
        served.get(name).map(|keys| &keys[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{BackendTools, Lists};

    fn lists(prompts: &[&str], resources: &[&str]) -> BackendTools {
        BackendTools::of(Lists {
            tools: Vec::new(),
            prompts: prompts.iter().map(|p| p.to_string()).collect(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
        })
    }

    #[test]
    fn a_prompt_or_resource_goes_among_the_backends_listing_it() {
        let mut fleet = FleetTools::default();
        fleet.learn("w1", lists(&["greet", "both"], &["file:///a"]));
        fleet.learn("w2", lists(&["both"], &[]));
        fleet.learn("gone", lists(&["greet"], &["file:///a"]));
        // "gone" left the snapshot: never a candidate.
        let key_of = |name: &str| (name != "gone").then(|| BackendKey::of(name));
        let routes = ServedRoutes::build(&fleet, key_of);
        let (w1, w2) = (BackendKey::of("w1"), BackendKey::of("w2"));
        assert_eq!(routes.serving("prompts/get", "greet"), Some(&[w1][..]));
        assert_eq!(routes.serving("prompts/get", "both"), Some(&[w1, w2][..]));
        assert_eq!(routes.serving("resources/read", "file:///a"), Some(&[w1][..]));
        // Nobody lists it: routed as any request.
        assert_eq!(routes.serving("prompts/get", "nobody"), None);
        assert_eq!(routes.serving("resources/read", "file:///b"), None);
        // A prompt's name is no resource's URI, and other methods are not routed by it.
        assert_eq!(routes.serving("resources/read", "greet"), None);
        assert_eq!(routes.serving("prompts/list", "greet"), None);
        assert_eq!(routes.serving("tools/call", "greet"), None);
        // A fleet that lists nothing of the kind.
        let empty = ServedRoutes::build(&FleetTools::default(), key_of);
        assert_eq!(empty.serving("prompts/get", "greet"), None);
    }
}
