//! The router's catalog across reloads: each backend's tools as last learned, how its asks
//! went, which backends to ask again now, and the metrics of it all. The asking itself is
//! `fleet::catalog`'s loop; routing reads [`super::ToolRoutes`] from the snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use serde_json::{json, Value};

use super::arguments::{ArgumentChecks, Counted};
use super::ask::AskFailed;
use super::definition::{within_value_bounds, Definition};
use super::fleet::{BackendTools, Change, FleetTools};
use super::routes::{shown, ToolRoutes};
use crate::config::Lock;
use crate::upstream::BackendKey;

/// The least time between two asks of a backend when it is told to be asked again.
pub const ASK_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// Tools given a label of their own in `mrtr_tool_definitions{tool}` (names come from
/// backends): the drifted ones first; the rest are counted in `mrtr_tool_definitions_unlabelled`.
pub const LABELLED_TOOLS: usize = 500;

/// Drifted tools the status page's `catalog` member shows (its names and descriptions cut as an
/// error shows a name): the page is sent every second, and backends write what is in it.
const SUMMARY_TOOLS: usize = 50;

/// The longest tool name given a label (the MCP spec asks for names of 1 to 128 characters).
const LABEL_MAX: usize = 128;

/// Whether a tool name may be a label of `mrtr_tool_definitions`.
fn labelable(tool: &str) -> bool {
    !tool.is_empty() && tool.len() <= LABEL_MAX && crate::config::printable(tool)
}

/// The `result` labels of `mrtr_catalog_refreshes_total`: `ok`, and each `AskFailed::label`.
const RESULTS: [&str; 5] = ["ok", "unreachable", "refused", "too_large", "timeout"];

/// The catalog's metrics (docs/src/observability.md).
pub struct CatalogMetrics {
    /// `mrtr_tool_argument_checks_total{result}`.
    argument_checks: Counted,
    tools: IntGaugeVec,
    refreshes: IntCounterVec,
    definitions: IntGaugeVec,
    unlabelled: IntGauge,
    changes: IntCounter,
}

impl CatalogMetrics {
    pub fn register(r: &Registry) -> CatalogMetrics {
        let reg = |m: Box<dyn prometheus::core::Collector>| r.register(m).expect("unique metric");
        let tools = IntGaugeVec::new(
            Opts::new("mrtr_catalog_tools", "Tools each backend lists, as last learned"),
            &["backend"],
        )
        .expect("valid metric");
        let refreshes = IntCounterVec::new(
            Opts::new(
                "mrtr_catalog_refreshes_total",
                "Asks of a backend for its tools, by result (ok, unreachable, refused, too_large, timeout)",
            ),
            &["backend", "result"],
        )
        .expect("valid metric");
        let definitions = IntGaugeVec::new(
            Opts::new(
                "mrtr_tool_definitions",
                "Distinct definitions of each tool across the fleet (more than 1: the fleet disagrees)",
            ),
            &["tool"],
        )
        .expect("valid metric");
        let unlabelled = IntGauge::new(
            "mrtr_tool_definitions_unlabelled",
            "Tools past the label cap of mrtr_tool_definitions (shown there with no series)",
        )
        .expect("valid metric");
        let changes = IntCounter::new(
            "mrtr_tool_definition_changes_total",
            "Tools added, removed or defined otherwise on a backend since it was first learned",
        )
        .expect("valid metric");
        let argument_checks = IntCounterVec::new(
            Opts::new(
                "mrtr_tool_argument_checks_total",
                "New calls of a tool served with more than one inputSchema, by whether a schema accepted their arguments (matched, unmatched)",
            ),
            &["result"],
        )
        .expect("valid metric");
        reg(Box::new(tools.clone()));
        reg(Box::new(refreshes.clone()));
        reg(Box::new(argument_checks.clone()));
        reg(Box::new(definitions.clone()));
        reg(Box::new(unlabelled.clone()));
        reg(Box::new(changes.clone()));
        CatalogMetrics {
            argument_checks: Counted::of(&argument_checks),
            tools,
            refreshes,
            definitions,
            unlabelled,
            changes,
        }
    }
}

/// How asking one backend went.
#[derive(Debug, Clone, Default)]
struct Asked {
    /// When its tools were last learned.
    learned: Option<SystemTime>,
    /// The last ask's failure, if it failed.
    failure: Option<String>,
    /// When it is due to be asked (`None`: now).
    due: Option<Instant>,
    asking: bool,
    /// When its last ask started.
    started: Option<Instant>,
    /// Told to be asked again while an ask was under way.
    again: bool,
}

/// What learning one backend's tools did.
pub struct Learned {
    pub changes: Vec<Change>,
    /// The backend's tools are not what they were (or were never known): routes change.
    pub routes_changed: bool,
    /// Tools that began to have more than one definition across the fleet.
    pub drifted: Vec<(String, usize)>,
}

/// A list a client got of at most this many bytes is read whatever else is being read.
pub const SMALL_LIST: usize = 64 * 1024;

/// What [`Catalog::client_saw`] did with a list a client got.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientList {
    /// Small: read at once; whether the routes change with what it told.
    Read { changed: bool },
    /// Large: claimed, for [`Catalog::read_claimed`] to read on a thread of its own.
    Claimed,
    /// Past an ask's bounds, or large while another is being read: the backend is asked instead.
    Declined,
}

/// The catalog of a router.
pub struct Catalog {
    fleet: Mutex<FleetTools>,
    asked: Mutex<BTreeMap<String, Asked>>,
    labelled: Mutex<BTreeSet<String>>,
    /// The drifted tools' compiled schemas, kept from one build of the routes to the next.
    argument_checks: Mutex<ArgumentChecks>,
    /// Set while a large list a client got is read (over [`SMALL_LIST`]): one at a time, on one
    /// blocking thread, so that many answered at once cost the memory of one parse and take
    /// no more threads; the others have the backend asked instead.
    reading: std::sync::atomic::AtomicBool,
    pub(crate) wake: tokio::sync::Notify,
    metrics: CatalogMetrics,
}

impl Catalog {
    pub fn new(metrics: CatalogMetrics) -> Catalog {
        Catalog {
            fleet: Mutex::default(),
            asked: Mutex::default(),
            labelled: Mutex::default(),
            argument_checks: Mutex::new(ArgumentChecks::new(metrics.argument_checks.clone())),
            reading: std::sync::atomic::AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            metrics,
        }
    }

    /// The routes of what is known now.
    pub fn routes(
        &self,
        key_of: impl Fn(&str) -> Option<BackendKey>,
        lock: Option<&Lock>,
        by_tool: bool,
        snapshot_backends: usize,
    ) -> ToolRoutes {
        let failing: BTreeSet<String> = {
            let asked = self.asked.lock();
            asked
                .iter()
                .filter(|(_, a)| a.failure.is_some())
                .map(|(n, _)| n.clone())
                .collect()
        };
        let failing = |backend: &str| failing.contains(backend);
        let mut checks = self.argument_checks.lock();
        ToolRoutes::build(
            &self.fleet.lock(),
            key_of,
            lock,
            by_tool,
            failing,
            &mut checks,
            snapshot_backends,
        )
    }

    /// Asks `backend` again at the next round (its tools may have changed: a
    /// `notifications/tools/list_changed` passed, or it came back), but not within
    /// [`ASK_AGAIN_AFTER`] of its last ask: what clients send cannot make the router ask in a loop.
    pub fn ask_again(&self, backend: &str) {
        let mut asked = self.asked.lock();
        let Some(a) = asked.get_mut(backend) else { return };
        if a.asking {
            // What it tells may have come after the ask read the list: once more after it.
            a.again = true;
            return;
        }
        let now = Instant::now();
        let soonest = a.started.map_or(now, |s| (s + ASK_AGAIN_AFTER).max(now));
        if a.due.is_some_and(|due| due > soonest) {
            a.due = Some(soonest);
            drop(asked);
            self.wake.notify_one();
        }
    }

    /// When `a`, whose ask just ended, is due next: at `next`, or soon when it was told to
    /// be asked again meanwhile.
    fn ended(a: &mut Asked, next: Instant) {
        a.asking = false;
        a.due = Some(match std::mem::take(&mut a.again) {
            true => a.started.map_or(next, |s| (s + ASK_AGAIN_AFTER).min(next)),
            false => next,
        });
    }

    /// Claims the one read of a large list a client got (over [`SMALL_LIST`]), before a thread
    /// is taken or the list copied for it: false when the list is past an ask's bounds or
    /// another large list is being read, and the backend is asked instead. A claim is given
    /// back by [`Catalog::read_claimed`].
    fn claim_large_read(&self, backend: &str, msg: &[u8], max_bytes: usize) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let fits = msg.len() <= max_bytes && within_value_bounds(msg, &mut (0, 0));
        let claimed = fits && self.reading.compare_exchange(false, true, AcqRel, Acquire).is_ok();
        if !claimed {
            self.ask_again(backend);
        }
        claimed
    }

    /// Reads a large list [`Catalog::client_saw`] claimed, and gives the claim back; true when
    /// the routes change with what it told.
    pub fn read_claimed(&self, backend: &str, msg: &[u8]) -> bool {
        /// Gives the claim back however the read ends (a panic too: no claim is kept forever).
        struct Claim<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Claim<'_> {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        let _claim = Claim(&self.reading);
        self.read_told(backend, msg)
    }

    /// What a `tools/list` answer's body (a JSON-RPC message) `backend` gave a client tells:
    /// a tool it lists that the catalog does not know of it in that definition has it asked
    /// again, and is noted as told otherwise (unapproved under a lock until an answer agrees).
    /// A small list is read at once (it holds few values: 64 KiB of `[]`, 32,768 arrays; of
    /// `0,`, 32,768 values); a large one (over [`SMALL_LIST`]) only when claimed, for the
    /// caller to read off the request threads ([`Catalog::read_claimed`]).
    pub fn client_saw(&self, backend: &str, msg: &[u8], max_bytes: usize) -> ClientList {
        match msg.len() {
            n if n <= SMALL_LIST.min(max_bytes) => ClientList::Read {
                changed: self.read_told(backend, msg),
            },
            _ if self.claim_large_read(backend, msg, max_bytes) => ClientList::Claimed,
            _ => ClientList::Declined,
        }
    }

    /// [`Catalog::client_saw`] once the list's size is judged.
    fn read_told(&self, backend: &str, msg: &[u8]) -> bool {
        let Ok(message) = serde_json::from_slice::<Value>(msg) else {
            return false;
        };
        let Some(tools) = message["result"]["tools"].as_array() else {
            return false;
        };
        let seen: Vec<Definition> = tools.iter().filter_map(Definition::read).collect();
        // A backend the catalog keeps (one of the fleet's, asked or about to be); a name it
        // has forgotten (left the fleet, an answer still under way) is not noted again.
        if !self.asked.lock().contains_key(backend) {
            return false;
        }
        let (known, changed, asked) = {
            let mut fleet = self.fleet.lock();
            let asked = fleet.backend(backend).filter(|k| !k.unasked);
            let known = asked.is_some_and(|k| {
                seen.iter()
                    .all(|d| k.tools.get(&d.name).is_some_and(|k| k.fingerprint == d.fingerprint))
            });
            let asked = asked.is_some();
            (known, fleet.seen_by_client(backend, &seen), asked)
        };
        if !known {
            self.ask_again(backend);
        }
        // Before its first ask, what it told clients is all the catalog knows of it.
        if changed && asked {
            tracing::warn!(
                backend,
                "catalog: a backend told a client other tool definitions than it told the catalog"
            );
        }
        if changed {
            self.label_definitions();
        }
        changed
    }

    /// The backends a snapshot routes to: one the catalog did not know is asked at once (the
    /// asking loop is woken), and what it tells clients before that ask answers counts
    /// ([`Catalog::client_saw`]). Called when a snapshot is built: a reload or a discovery that
    /// adds a backend.
    pub fn know<'n>(&self, present: impl IntoIterator<Item = &'n str>) {
        let mut asked = self.asked.lock();
        let before = asked.len();
        for name in present {
            self.asked_of(&mut asked, name);
        }
        let added = asked.len() > before;
        drop(asked);
        if added {
            self.wake.notify_one();
        }
    }

    /// `name`'s entry, made (due at once) if it had none.
    fn asked_of<'a>(&self, asked: &'a mut BTreeMap<String, Asked>, name: &str) -> &'a mut Asked {
        asked.entry(name.to_string()).or_insert_with(|| {
            // Every result's series from the first ask on, at 0 until counted.
            for result in RESULTS {
                self.metrics.refreshes.with_label_values(&[name, result]);
            }
            Asked::default()
        })
    }

    /// The backends of `present` due to be asked at `now`, marked as being asked.
    pub fn due(&self, present: &[&str], now: Instant) -> Vec<String> {
        let mut asked = self.asked.lock();
        let mut out = Vec::new();
        for &name in present {
            let a = self.asked_of(&mut asked, name);
            if !a.asking && a.due.is_none_or(|d| d <= now) {
                a.asking = true;
                a.started = Some(now);
                out.push(name.to_string());
            }
        }
        out
    }

    /// Forgets every backend not in `present` (it left the fleet); true when one was known.
    pub fn keep_only(&self, present: &[&str]) -> bool {
        let gone: Vec<String> = {
            let asked = self.asked.lock();
            let fleet = self.fleet.lock();
            let known = asked.keys().map(String::as_str).chain(fleet.backends().map(|(n, _)| n));
            let gone: BTreeSet<&str> = known.filter(|n| !present.contains(n)).collect();
            gone.into_iter().map(str::to_string).collect()
        };
        for name in &gone {
            self.asked.lock().remove(name);
            self.fleet.lock().forget(name);
            let _ = self.metrics.tools.remove_label_values(&[name]);
            for result in RESULTS {
                let _ = self.metrics.refreshes.remove_label_values(&[name, result]);
            }
        }
        if !gone.is_empty() {
            self.label_definitions();
        }
        !gone.is_empty()
    }

    /// Forgets everything (the catalog was turned off).
    pub fn clear(&self) -> bool {
        self.keep_only(&[])
    }

    /// `backend`'s tools, learned by an ask at `next` due (or from an answer passing through,
    /// `next` `None`: the schedule stays).
    pub fn learned(&self, backend: &str, tools: BackendTools, next: Option<Instant>) -> Learned {
        let count = tools.tools.len();
        let (changes, routes_changed, drifted) = {
            let mut fleet = self.fleet.lock();
            let before = fleet.drifted();
            let same = fleet.backend(backend).is_some_and(|b| !b.unasked && b.lists_as(&tools));
            let changes = fleet.learn(backend, tools);
            let drifted = fleet
                .drifted()
                .into_iter()
                .filter(|(tool, n)| before.get(tool).is_none_or(|b| b < n))
                .collect();
            (changes, !same, drifted)
        };
        let was_failing = {
            let mut asked = self.asked.lock();
            let a = asked.entry(backend.to_string()).or_default();
            a.learned = Some(SystemTime::now());
            let was_failing = a.failure.take().is_some();
            if let Some(next) = next {
                Catalog::ended(a, next);
            }
            was_failing
        };
        // A backend whose ask failed served no approved definition: it may again.
        let routes_changed = routes_changed || was_failing;
        self.metrics.tools.with_label_values(&[backend]).set(count as i64);
        self.metrics.refreshes.with_label_values(&[backend, "ok"]).inc();
        self.metrics.changes.inc_by(changes.len() as u64);
        if routes_changed {
            self.label_definitions();
        }
        Learned {
            changes,
            routes_changed,
            drifted,
        }
    }

    /// An ask of `backend` failed: counted, and its last good tools kept (shown, and routed
    /// by; under a lock, no longer approved: what it serves now is not known). True when the
    /// routes change: its last ask had not failed.
    pub fn failed(&self, backend: &str, failure: &AskFailed, next: Instant) -> bool {
        let mut asked = self.asked.lock();
        let a = asked.entry(backend.to_string()).or_default();
        let newly = a.failure.replace(failure.to_string()).is_none();
        Catalog::ended(a, next);
        self.metrics
            .refreshes
            .with_label_values(&[backend, failure.label()])
            .inc();
        newly
    }

    /// Sets `mrtr_tool_definitions{tool}`: the drifted tools first, then by name, up to
    /// [`LABELLED_TOOLS`]; the series of tools gone or past the cap removed.
    fn label_definitions(&self) {
        let counts = self.fleet.lock().definition_counts();
        // A label is a name an operator can read: a longer name, or one with characters that
        // render as nothing or move the text, is counted unlabelled.
        let mut order: Vec<(&String, &usize)> = counts.iter().filter(|(t, _)| labelable(t)).collect();
        order.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let keep: BTreeSet<String> = order.iter().take(LABELLED_TOOLS).map(|(t, _)| (*t).clone()).collect();
        let mut labelled = self.labelled.lock();
        for gone in labelled.difference(&keep) {
            let _ = self.metrics.definitions.remove_label_values(&[gone]);
        }
        for tool in &keep {
            self.metrics
                .definitions
                .with_label_values(&[tool])
                .set(counts[tool] as i64);
        }
        self.metrics
            .unlabelled
            .set(counts.len().saturating_sub(keep.len()) as i64);
        *labelled = keep;
    }

    /// `GET /catalog`: each backend's tools (name, fingerprint, hints, description), prompts
    /// (names) and resources (URIs), and how its asks go; and each tool's definitions across
    /// the fleet with the backends serving each.
    pub fn document(&self, lock: Option<&Lock>) -> Value {
        // `asked` before `fleet`, as everywhere both are held.
        let asked = self.asked.lock();
        let fleet = self.fleet.lock();
        let names: BTreeSet<&str> = asked
            .keys()
            .map(String::as_str)
            .chain(fleet.backends().map(|(n, _)| n))
            .collect();
        let backends: Vec<Value> = names
            .into_iter()
            .map(|name| {
                let a = asked.get(name).cloned().unwrap_or_default();
                let tools = fleet.backend(name);
                json!({
                    "name": name,
                    "learned_unix_ms": a.learned.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64),
                    "last_error": a.failure,
                    "fingerprint": tools.map(|t| t.fingerprint().short()),
                    "tools": tools.map(|t| t.tools.values().map(|d| json!({
                        "name": d.name,
                        "fingerprint": d.fingerprint.short(),
                        "listed_twice": t.twice.contains(&d.name),
                        "told_clients": t.seen_otherwise.get(&d.name).map(|f| f.fingerprint.short()),
                        "description": d.description,
                        "read_only": d.hints.read_only,
                        "idempotent": d.hints.idempotent,
                        "destructive": d.hints.destructive,
                    })).collect::<Vec<_>>()).unwrap_or_default(),
                    "prompts": tools.map(|t| t.prompts.iter().collect::<Vec<_>>()).unwrap_or_default(),
                    "resources": tools.map(|t| t.resources.iter().collect::<Vec<_>>()).unwrap_or_default(),
                })
            })
            .collect();
        let tools: Vec<Value> = fleet
            .definitions()
            .into_iter()
            .map(|(name, defs)| {
                let definitions: Vec<Value> = defs
                    .iter()
                    .map(|(fp, backends)| {
                        json!({
                            "fingerprint": fp.short(),
                            "backends": backends,
                            "approved": lock.map(|l| l.approves(name, &fp.0)),
                        })
                    })
                    .collect();
                json!({"name": name, "drifted": defs.len() > 1, "definitions": definitions})
            })
            .collect();
        json!({"backends": backends, "tools": tools, "locked": lock.is_some()})
    }

    /// The status page's `catalog` member: how many tools and backends are known, and each
    /// tool served in more than one definition, with the backends serving each definition.
    pub fn summary(&self) -> Value {
        let fleet = self.fleet.lock();
        let definitions = fleet.definitions();
        let drifted: Vec<Value> = definitions
            .iter()
            .filter(|(_, defs)| defs.len() > 1)
            .take(SUMMARY_TOOLS)
            .map(|(name, defs)| {
                let description = fleet
                    .backends()
                    .find_map(|(_, t)| t.tools.get(*name).map(|d| shown(&d.description)));
                let backends: Vec<String> = defs
                    .iter()
                    .map(|(fp, backends)| format!("{} ({})", backends.join(", "), fp.short()))
                    .collect();
                json!({"name": shown(name), "description": description, "definitions": defs.len(), "backends": backends})
            })
            .collect();
        json!({
            "tools_known": definitions.len(),
            "tools_drifted": definitions.values().filter(|defs| defs.len() > 1).count(),
            "backends_learned": fleet.backends().count(),
            "tools": drifted,
        })
    }
}

#[cfg(test)]
#[path = "keeper_tests.rs"]
mod tests;
