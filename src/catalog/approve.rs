//! `mrtr-router catalog lock`: the fleet's tools asked now, and their definitions written as the
//! approved ones (docs/src/catalog.md). The fleet must agree: a tool served in two definitions,
//! or a backend that cannot be asked, leaves the lock as it was, unless one backend is named as
//! the one whose definitions are approved.

use std::sync::Arc;
use std::time::Duration;

use super::ask::{tools, Limits};
use super::fleet::{BackendTools, FleetTools};
use crate::config::{CatalogConfig, Lock};
use crate::upstream::Backend;

/// The lock of what `backends` serve now (only `only`'s, when named).
pub async fn lock_of(backends: &[Arc<Backend>], cfg: &CatalogConfig, only: Option<&str>) -> Result<Lock, String> {
    let asked: Vec<&Arc<Backend>> = backends.iter().filter(|b| only.is_none_or(|o| *b.name == *o)).collect();
    if asked.is_empty() {
        return Err(match only {
            Some(name) => format!("no backend named {name:?} in the config"),
            None => "the config lists no backend to ask".to_string(),
        });
    }
    let limits = Limits {
        max_tools: cfg.max_tools,
        max_bytes: cfg.max_bytes,
    };
    let mut fleet = FleetTools::default();
    for backend in asked {
        let listed = tokio::time::timeout(
            cfg.timeout.max(Duration::from_secs(1)),
            tools(backend, &cfg.path, limits),
        )
        .await
        .map_err(|_| format!("{}: no whole answer within catalog.timeout", backend.name))?
        .map_err(|e| format!("{}: {e}", backend.name))?;
        let tools = BackendTools::new(listed);
        if !tools.twice.is_empty() {
            let names: Vec<&String> = tools.twice.iter().collect();
            return Err(format!(
                "{} lists these tools more than once, in definitions a client cannot tell apart: {names:?}",
                backend.name
            ));
        }
        fleet.learn(&backend.name, tools);
    }
    let drifted = fleet.drifted();
    if !drifted.is_empty() {
        let mut names: Vec<&String> = drifted.keys().collect();
        names.sort();
        return Err(format!(
            "the fleet serves these tools in more than one definition: {names:?}; finish the rollout, \
             or name the backend whose definitions to approve with --backend"
        ));
    }
    let mut lock = Lock::default();
    for (tool, definitions) in fleet.definitions() {
        if let Some(fingerprint) = definitions.keys().next() {
            lock.tools.insert(tool.to_string(), fingerprint.0);
        }
    }
    Ok(lock)
}
