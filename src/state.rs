//! The router's hot state: one immutable [`Snapshot`] (config, backends, ring) swapped
//! atomically on reload, beside the long-lived parts (pin table, metrics, client pool).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::balance::HashRing;
use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::pins::{PinKind, PinTable, PinTtls};
use crate::upstream::{self, Backend, BackendKey, UpstreamClient};

/// Everything a request needs that changes only on reload, read as one consistent unit.
pub struct Snapshot {
    pub config: Config,
    /// Every backend a pin may name, by key.
    pub backends: HashMap<BackendKey, Arc<Backend>>,
    /// Backends that take new keys.
    pub ring: HashRing,
    pub ttls: PinTtls,
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
    pub config_path: Option<PathBuf>,
    snapshot: ArcSwap<Snapshot>,
    pub pins: PinTable,
    pub metrics: Metrics,
    pub client: UpstreamClient,
    /// Backend objects by name, reused across reloads so in-flight counts carry over.
    registry: Mutex<HashMap<String, Arc<Backend>>>,
    /// Set once shutdown begins: `/readyz` answers 503 from then on.
    pub shutting_down: AtomicBool,
}

impl Shared {
    pub fn new(config: Config, config_path: Option<PathBuf>) -> Arc<Shared> {
        let metrics = Metrics::new();
        let registry = Mutex::new(HashMap::new());
        let snapshot = build_snapshot(config, &registry, &metrics);
        Arc::new(Shared {
            config_path,
            snapshot: ArcSwap::from_pointee(snapshot),
            pins: PinTable::new(),
            metrics,
            client: upstream::client(),
            registry,
            shutting_down: AtomicBool::new(false),
        })
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
        let next = build_snapshot(config, &self.registry, &self.metrics);
        self.snapshot.store(Arc::new(next));
    }

    /// Re-reads the config file and applies it; an invalid file leaves the running config.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let Some(path) = &self.config_path else {
            return Ok(());
        };
        match Config::load(path) {
            Ok(config) => {
                self.apply(config);
                self.metrics.config_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(path = %path.display(), "config reloaded");
                Ok(())
            }
            Err(e) => {
                self.metrics.config_reloads.with_label_values(&["error"]).inc();
                tracing::error!(error = %e, "config reload rejected; keeping the running config");
                Err(e)
            }
        }
    }
}

fn build_snapshot(config: Config, registry: &Mutex<HashMap<String, Arc<Backend>>>, metrics: &Metrics) -> Snapshot {
    let mut registry = registry.lock();
    let mut backends = HashMap::new();
    let mut members = Vec::new();
    for cfg in &config.backends {
        let backend = match registry.get(&cfg.name) {
            Some(b) if b.matches(cfg) => b.clone(),
            _ => {
                let gauge = metrics.backend_inflight.with_label_values(&[&cfg.name]);
                let b = Arc::new(Backend::new(cfg, Some(gauge)));
                registry.insert(cfg.name.clone(), b.clone());
                b
            }
        };
        metrics.backend_up.with_label_values(&[&cfg.name]).set(1);
        metrics.backend_draining.with_label_values(&[&cfg.name]).set(0);
        backends.insert(backend.key, backend.clone());
        members.push(backend);
    }
    // Backends no longer configured are forgotten; their series go with them.
    registry.retain(|name, _| {
        let keep = config.backends.iter().any(|b| &b.name == name);
        if !keep {
            let _ = metrics.backend_up.remove_label_values(&[name]);
            let _ = metrics.backend_draining.remove_label_values(&[name]);
            let _ = metrics.backend_inflight.remove_label_values(&[name]);
        }
        keep
    });
    let r = &config.routing;
    let ring = HashRing::new(members, r.virtual_nodes, r.load_factor);
    metrics.ring_members.set(ring.len() as i64);
    let ttls = PinTtls {
        client: r.pin_idle_ttl,
        request_state: r.pin_idle_ttl,
        task: r.task_idle_ttl,
        session: r.session_idle_ttl,
        replay_window: r.replay_window,
    };
    Snapshot {
        config,
        backends,
        ring,
        ttls,
    }
}
