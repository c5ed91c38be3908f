//! The router's shared state: one immutable [`Snapshot`] (config, backends, ring, sealing keys)
//! swapped atomically whenever anything routing depends on changes (reload, health, discovery,
//! draining), beside the long-lived parts: the pin table, the metrics, and which backends exist.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::auth::{IssuerKeys, Resource};
use crate::balance::HashRing;
use crate::catalog::{Catalog, CatalogMetrics, ToolRoutes};
use crate::config::{Config, ConfigError, ConfigFile, DiscoveryConfig, Reread};
use crate::metrics::Metrics;
use crate::pins::{PinKind, PinTable, PinTtls};
use crate::quotas::Quotas;
use crate::sealing::Sealing;
use crate::telemetry::Tracing;
use crate::upstream::{Backend, BackendKey, Lookup, Membership, RetryBudget};

/// Everything a request needs that changes only when the snapshot is rebuilt (a reload, a
/// health or membership change, a drain), read as one consistent unit.
pub struct Snapshot {
    pub config: Config,
    /// Every backend a pin may name (serving and draining), by key.
    pub backends: HashMap<BackendKey, Arc<Backend>>,
    /// Backends that take new keys: configured or discovered, healthy, not draining.
    pub ring: HashRing,
    pub ttls: PinTtls,
    /// Sealing keys when `[tokens]` is configured.
    pub sealing: Option<Sealing>,
    /// OpenTelemetry tracing when `[tracing]` turns it on: the same one across rebuilds, until
    /// a reload changes `[tracing]`.
    pub tracing: Option<Arc<Tracing>>,
    /// This resource as `[auth]` describes it, when on.
    pub auth: Option<Arc<Resource>>,
    /// `[quotas]`, when on: the same one (and its counts) across rebuilds with the same config.
    pub quotas: Option<Arc<Quotas>>,
    /// With `[catalog]` on, routing by tool and the lock: which backends serve which tool.
    pub tools: Option<Arc<ToolRoutes>>,
}

impl Snapshot {
    pub fn backend(&self, key: BackendKey) -> Option<&Arc<Backend>> {
        self.backends.get(&key)
    }

    pub fn backend_name(&self, key: BackendKey) -> String {
        match self.backend(key) {
            Some(b) => b.name.to_string(),
            None => format!("<removed backend {:016x}>", key.0),
        }
    }
}

/// State shared by every connection of one router.
pub struct Shared {
    /// The file reloads re-read; `None` when built from a `Config` value.
    pub(crate) config_file: Option<ConfigFile>,
    snapshot: ArcSwap<Snapshot>,
    pub(crate) pins: PinTable,
    pub(crate) metrics: Metrics,
    /// The issuer's keys when `[auth]` is on (kept across reloads that keep its issuer).
    pub(crate) issuer_keys: IssuerKeys,
    /// The fleet's tools, when `[catalog]` is on (kept across reloads).
    pub(crate) catalog: Catalog,
    /// Requests forwarded and retries made, for `upstream.retry_budget`.
    pub(crate) retry_budget: RetryBudget,
    membership: Mutex<Membership>,
    /// How `[discovery]` resolves its name.
    pub(crate) lookup: Lookup,
    /// Set once shutdown begins: `/readyz` answers 503 from then on.
    pub(crate) shutting_down: AtomicBool,
}

impl Shared {
    pub fn new(config: Config, config_file: Option<ConfigFile>) -> Arc<Shared> {
        let metrics = Metrics::new();
        let mut membership = Membership::default();
        let issuer_keys = IssuerKeys::new(config.auth.as_ref());
        let catalog = Catalog::new(CatalogMetrics::register(metrics.registry()));
        let snapshot = build_snapshot(config, &mut membership, &metrics, &catalog, None);
        Arc::new(Shared {
            issuer_keys,
            catalog,
            retry_budget: RetryBudget::default(),
            config_file,
            snapshot: ArcSwap::from_pointee(snapshot),
            pins: PinTable::new(),
            metrics,
            membership: Mutex::new(membership),
            lookup: Lookup::default(),
            shutting_down: AtomicBool::new(false),
        })
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Swaps in a new config (ring and backends rebuilt with it, as one unit). Pins are untouched.
    pub fn apply(&self, config: Config) {
        let old = self.snapshot();
        if old.config.server.listen != config.server.listen || old.config.admin.listen != config.admin.listen {
            tracing::warn!("listen addresses changed in the config; they take effect only after a restart");
        }
        if let Some(auth) = &config.auth {
            if let Err(e) = self.issuer_keys.apply(auth) {
                tracing::warn!(error = %e, "auth.jwks_file: keys not loaded; the last good set stays in use");
            }
        }
        self.rebuild_with(config);
    }

    /// Rebuilds the snapshot from the current config: after a health change, a discovery
    /// change or a drain.
    pub fn rebuild(&self) {
        self.rebuild_with(self.snapshot().config.clone());
    }

    fn rebuild_with(&self, config: Config) {
        let mut membership = self.membership.lock();
        let next = build_snapshot(
            config,
            &mut membership,
            &self.metrics,
            &self.catalog,
            Some(&self.snapshot()),
        );
        self.snapshot.store(Arc::new(next));
    }

    /// Re-reads the config file and applies it if its content, or the content of the TLS
    /// files it names, changed since the last load; an invalid file leaves the running config.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let Some(file) = &self.config_file else {
            return Ok(());
        };
        match file.reread(&self.snapshot().config) {
            Ok(Reread::Unchanged) => {
                tracing::debug!(path = %file.path().display(), "config unchanged; nothing to reload");
                Ok(())
            }
            Ok(Reread::Changed(config, digest)) => {
                self.apply(*config);
                file.applied(digest);
                self.metrics.config_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(path = %file.path().display(), "config reloaded");
                Ok(())
            }
            Err(e) => {
                self.metrics.config_reloads.with_label_values(&["error"]).inc();
                tracing::error!(error = %e, "config reload rejected; keeping the running config");
                Err(e)
            }
        }
    }

    /// Drains (or undrains) a serving backend on request; false if no such backend serves.
    pub fn set_admin_drained(&self, name: &str, drained: bool) -> bool {
        if !self.membership.lock().admin_drain(name, drained) {
            return false;
        }
        tracing::info!(backend = %name, drained, "drain state changed by the admin API");
        self.rebuild();
        true
    }

    /// Replaces the set of discovered backends (addresses from `[discovery]`).
    pub fn set_discovered(&self, discovery: &DiscoveryConfig, addrs: &[SocketAddr]) {
        if self.membership.lock().set_discovered(discovery, addrs) {
            tracing::info!(backends = addrs.len(), "discovery changed the backend set");
            self.rebuild();
        }
    }

    /// Forgets draining backends whose deadline passed, or that have no pins and nothing in
    /// flight. `busy` lists those that had requests in flight before the pins were counted
    /// (an answer arriving since may have pinned a call the count missed): they wait a round.
    /// Returns true when something was forgotten (the snapshot was rebuilt).
    pub fn retire_drained(&self, busy: &[BackendKey]) -> bool {
        let idle = |b: &Backend| b.pins.load(Ordering::Relaxed) == 0 && b.inflight() == 0 && !busy.contains(&b.key);
        let retired = self.membership.lock().retire(idle);
        if retired.is_empty() {
            return false;
        }
        for r in &retired {
            tracing::info!(backend = %r.backend.name, "draining backend forgotten: {}", r.why);
            self.metrics.forget_backend(&r.backend.name);
        }
        self.rebuild();
        true
    }

    /// Every backend the router knows: serving first, then draining (the flag).
    pub fn backend_states(&self) -> Vec<(Arc<Backend>, bool)> {
        self.membership.lock().members()
    }

    /// Copies the pin table's per-kind counts into the `mrtr_pins` gauge.
    pub fn update_pin_gauges(&self) {
        for kind in PinKind::ALL {
            self.metrics
                .pins
                .with_label_values(&[kind.label()])
                .set(self.pins.count(kind));
        }
    }
}

fn build_snapshot(
    config: Config,
    m: &mut Membership,
    metrics: &Metrics,
    catalog: &Catalog,
    previous: Option<&Snapshot>,
) -> Snapshot {
    m.update(
        &config.backends,
        &config.upstream,
        config.routing.drain_timeout,
        |cfg| Backend::new(cfg, &config.upstream, Some(metrics)),
    );
    let mut backends = HashMap::new();
    let mut ring_members = Vec::new();
    for (b, removed) in m.members() {
        metrics.know_backend(&b.name);
        let draining = removed || b.admin_drained.load(Ordering::Relaxed);
        metrics
            .backend_up
            .with_label_values(&[&b.name])
            .set(b.is_healthy() as i64);
        metrics
            .backend_draining
            .with_label_values(&[&b.name])
            .set(draining as i64);
        if b.is_healthy() && !draining {
            ring_members.push(b.clone());
        }
        backends.insert(b.key, b);
    }
    let r = &config.routing;
    let ring = HashRing::new(ring_members, r.virtual_nodes, r.load_factor);
    metrics.ring_members.set(ring.len() as i64);
    let ttls = PinTtls {
        client: r.pin_idle_ttl,
        request_state: r.pin_idle_ttl,
        task: r.task_idle_ttl,
        session: r.session_idle_ttl,
        replay_window: r.replay_window,
    };
    let tracing = config
        .tracing
        .as_ref()
        .map(|t| match previous.and_then(|p| p.tracing.as_ref()) {
            Some(running) if running.config() == t => running.clone(),
            _ => Arc::new(Tracing::start(t, metrics.spans_dropped.clone())),
        });
    let quotas = config.quotas.as_ref().map(|q| {
        let same = previous
            .filter(|p| p.config.quotas.as_ref() == Some(q))
            .and_then(|p| p.quotas.clone());
        same.unwrap_or_else(|| Arc::new(Quotas::new(q, std::time::Instant::now(), metrics.quota_store.clone())))
    });
    let tools = config.catalog.as_ref().map(|c| {
        catalog.know(backends.values().map(|b| &*b.name));
        let key_of = |name: &str| Some(BackendKey::of(name)).filter(|k| backends.contains_key(k));
        let lock = c.lock.as_ref().map(|l| &l.lock);
        Arc::new(catalog.routes(key_of, lock, c.route_by_tool, backends.len()))
    });
    Snapshot {
        quotas,
        tools,
        sealing: config.tokens.as_ref().map(Sealing::new),
        auth: config.auth.as_ref().map(|a| {
            let same = previous.and_then(|p| p.auth.as_ref()).filter(|r| r.config == *a);
            same.cloned().unwrap_or_else(|| Arc::new(Resource::new(a)))
        }),
        tracing,
        config,
        backends,
        ring,
        ttls,
    }
}
