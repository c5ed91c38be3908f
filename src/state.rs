//! The router's hot state: one immutable [`Snapshot`] (config, backends, ring) swapped
//! atomically whenever anything that routing depends on changes (reload, health, discovery,
//! draining), beside the long-lived parts (pin table, metrics, client pool).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use http::uri::{Authority, Scheme};
use parking_lot::Mutex;

use crate::balance::HashRing;
use crate::config::{BackendConfig, Config, ConfigError};
use crate::metrics::Metrics;
use crate::pins::{PinKind, PinTable, PinTtls};
use crate::sealing::Sealing;
use crate::upstream::{Backend, BackendKey};

/// Everything a request needs that changes only on reload, read as one consistent unit.
pub struct Snapshot {
    pub config: Config,
    /// Every backend a pin may name (serving and draining), by key.
    pub backends: HashMap<BackendKey, Arc<Backend>>,
    /// Backends that take new keys: configured or discovered, healthy, not draining.
    pub ring: HashRing,
    pub ttls: PinTtls,
    /// Sealing keys when `[tokens]` is configured.
    pub sealing: Option<Arc<Sealing>>,
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

/// Which backends exist, beyond what the config file lists.
#[derive(Default)]
struct Membership {
    /// Serving backends (configured or discovered) by name; reused across rebuilds so
    /// in-flight counts, health and pins carry over.
    serving: HashMap<String, Arc<Backend>>,
    /// Removed backends that keep serving their pins until the deadline or their last pin.
    draining: HashMap<String, (Arc<Backend>, Instant)>,
    /// Backends found by `[discovery]` at the last successful resolution.
    discovered: Vec<BackendConfig>,
}

/// Looks up `[discovery].dns`; replaceable for tests (default: the system resolver).
pub type Resolver = Arc<
    dyn Fn(String, u16) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> + Send + Sync,
>;

/// State shared by every connection of one router.
pub struct Shared {
    /// The file reloads re-read; `None` when built from a `Config` value.
    pub config_path: Option<PathBuf>,
    snapshot: ArcSwap<Snapshot>,
    pub pins: PinTable,
    pub metrics: Metrics,
    membership: Mutex<Membership>,
    /// Set once shutdown begins: `/readyz` answers 503 from then on.
    pub shutting_down: AtomicBool,
    resolver: Mutex<Option<Resolver>>,
    /// Digests of the config text last applied and last rejected, so an unchanged file is not
    /// reloaded again and a broken one is reported once.
    config_digests: Mutex<(Option<u64>, Option<u64>)>,
}

/// Digest of config file content.
pub fn config_digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl Shared {
    /// Shared state for `config`; `config_path` (with the digest of the text `config` came
    /// from) is the file reloads re-read.
    pub fn new(config: Config, config_path: Option<(PathBuf, u64)>) -> Result<Arc<Shared>, ConfigError> {
        let metrics = Metrics::new();
        let mut membership = Membership::default();
        let snapshot = build_snapshot(config, &mut membership, &metrics)?;
        let (config_path, digest) = config_path.map_or((None, None), |(p, d)| (Some(p), Some(d)));
        Ok(Arc::new(Shared {
            config_path,
            config_digests: Mutex::new((digest, None)),
            snapshot: ArcSwap::from_pointee(snapshot),
            pins: PinTable::new(),
            metrics,
            membership: Mutex::new(membership),
            shutting_down: AtomicBool::new(false),
            resolver: Mutex::new(None),
        }))
    }

    /// Replaces the DNS resolver used by discovery.
    pub fn set_resolver(&self, resolver: Resolver) {
        *self.resolver.lock() = Some(resolver);
    }

    pub fn resolver(&self) -> Option<Resolver> {
        self.resolver.lock().clone()
    }

    /// Drains (or undrains) a serving backend on request; false if no such backend serves.
    pub fn set_admin_drained(&self, name: &str, drained: bool) -> bool {
        let found = self.membership.lock().serving.get(name).cloned();
        let Some(b) = found else { return false };
        b.admin_drained.store(drained, Ordering::Relaxed);
        tracing::info!(backend = %name, drained, "drain state changed by the admin API");
        self.rebuild();
        true
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
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

    /// Swaps in a new config (ring and backends rebuilt with it, as one unit). Pins are untouched.
    pub fn apply(&self, config: Config) -> Result<(), ConfigError> {
        let old = self.snapshot();
        if old.config.server.listen != config.server.listen || old.config.admin.listen != config.admin.listen {
            tracing::warn!("listen addresses changed in the config; they take effect only after a restart");
        }
        self.rebuild_with(config)
    }

    /// Rebuilds the snapshot from the current config: after a health change, a discovery
    /// change or a drain.
    pub fn rebuild(&self) {
        let config = self.snapshot().config.clone();
        // The running config was valid when applied; rebuilding it cannot fail.
        let _ = self.rebuild_with(config);
    }

    fn rebuild_with(&self, config: Config) -> Result<(), ConfigError> {
        let mut membership = self.membership.lock();
        let next = build_snapshot(config, &mut membership, &self.metrics)?;
        self.snapshot.store(Arc::new(next));
        Ok(())
    }

    /// Re-reads the config file and applies it if its content, or the content of the TLS
    /// files it names, changed since the last load; an invalid file leaves the running config.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let Some(path) = &self.config_path else {
            return Ok(());
        };
        let text = Config::read_text(path)?;
        let digest = config_digest(text.as_bytes());
        // Unchanged text may still name TLS files whose content changed (a renewed
        // certificate): with TLS on, the config is read again and compared whole.
        let unchanged = self.config_digests.lock().0 == Some(digest);
        if unchanged && self.snapshot().config.server.tls.is_none() {
            tracing::debug!(path = %path.display(), "config unchanged; nothing to reload");
            return Ok(());
        }
        let parsed = Config::parse(path, &text);
        if unchanged && parsed.as_ref().is_ok_and(|config| *config == self.snapshot().config) {
            tracing::debug!(path = %path.display(), "config and TLS files unchanged; nothing to reload");
            return Ok(());
        }
        match parsed.and_then(|config| self.apply(config)) {
            Ok(()) => {
                *self.config_digests.lock() = (Some(digest), None);
                self.metrics.config_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(path = %path.display(), "config reloaded");
                Ok(())
            }
            Err(e) => {
                self.config_digests.lock().1 = Some(digest);
                self.metrics.config_reloads.with_label_values(&["error"]).inc();
                tracing::error!(error = %e, "config reload rejected; keeping the running config");
                Err(e)
            }
        }
    }

    /// Whether file content with this digest is neither the running config nor one already rejected.
    pub fn config_is_new(&self, digest: u64) -> bool {
        let d = self.config_digests.lock();
        d.0 != Some(digest) && d.1 != Some(digest)
    }

    /// Replaces the set of discovered backends (addresses from `[discovery]`).
    pub fn set_discovered(&self, port: u16, addrs: &[SocketAddr]) {
        let mut found: Vec<BackendConfig> = addrs
            .iter()
            .filter_map(|a| {
                let addr = SocketAddr::new(a.ip(), port);
                Some(BackendConfig {
                    name: format!("dns:{addr}"),
                    scheme: Scheme::HTTP,
                    authority: Authority::try_from(addr.to_string().as_str()).ok()?,
                    base_path: String::new(),
                    weight: 1,
                })
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found.dedup_by(|a, b| a.name == b.name);
        let changed = {
            let mut m = self.membership.lock();
            let changed = m.discovered != found;
            m.discovered = found;
            changed
        };
        if changed {
            tracing::info!(backends = addrs.len(), "discovery changed the backend set");
            self.rebuild();
        }
    }

    /// Forgets draining backends whose deadline passed, or that have no pins and nothing in
    /// flight. `busy` lists those that had requests in flight before the pins were counted
    /// (an answer arriving since may have pinned a call the count missed): they wait a round.
    /// Returns true when something was forgotten (the snapshot was rebuilt).
    pub fn retire_drained(&self, busy: &[BackendKey]) -> bool {
        let now = Instant::now();
        let idle = |b: &Backend| b.pins.load(Ordering::Relaxed) == 0 && b.inflight() == 0 && !busy.contains(&b.key);
        let retired: Vec<String> = {
            let m = self.membership.lock();
            m.draining
                .iter()
                .filter(|(_, (b, deadline))| now >= *deadline || idle(b))
                .map(|(name, _)| name.clone())
                .collect()
        };
        if retired.is_empty() {
            return false;
        }
        {
            let mut m = self.membership.lock();
            for name in &retired {
                if let Some((b, deadline)) = m.draining.remove(name) {
                    let why = if now >= deadline {
                        "drain_timeout passed"
                    } else {
                        "its last pin ended"
                    };
                    tracing::info!(backend = %b.name, "draining backend forgotten: {why}");
                    for gauge in [
                        &self.metrics.backend_up,
                        &self.metrics.backend_draining,
                        &self.metrics.backend_inflight,
                    ] {
                        let _ = gauge.remove_label_values(&[name]);
                    }
                }
            }
        }
        self.rebuild();
        true
    }

    /// Every backend the router knows: serving first, then draining.
    pub fn backend_states(&self) -> Vec<(Arc<Backend>, bool)> {
        let m = self.membership.lock();
        let mut out: Vec<_> = m.serving.values().map(|b| (b.clone(), false)).collect();
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out.extend(m.draining.values().map(|(b, _)| (b.clone(), true)));
        out
    }
}

fn build_snapshot(config: Config, m: &mut Membership, metrics: &Metrics) -> Result<Snapshot, ConfigError> {
    let sealing = config.tokens.as_ref().map(|t| Arc::new(Sealing::new(t)));
    let now = Instant::now();
    let desired: Vec<&BackendConfig> = config
        .backends
        .iter()
        .chain(
            m.discovered
                .iter()
                .filter(|d| !config.backends.iter().any(|b| b.name == d.name)),
        )
        .collect();
    let mut serving = HashMap::with_capacity(desired.len());
    for cfg in &desired {
        let reuse = m
            .serving
            .remove(&cfg.name)
            .or_else(|| m.draining.remove(&cfg.name).map(|(b, _)| b));
        let backend = match reuse {
            Some(b) if b.matches(cfg) => b,
            _ => Arc::new(Backend::new(cfg, Some(metrics))),
        };
        backend.set_weight(cfg.weight);
        serving.insert(cfg.name.clone(), backend);
    }
    // What is no longer wanted drains: it keeps its pins but takes nothing new.
    let deadline = now + config.routing.drain_timeout;
    for (name, b) in m.serving.drain() {
        tracing::info!(backend = %name, "backend removed; draining until its pins end");
        m.draining.insert(name, (b, deadline));
    }
    m.serving = serving;

    let mut backends = HashMap::new();
    let mut members = Vec::new();
    for (name, b) in &m.serving {
        let drained = b.admin_drained.load(Ordering::Relaxed);
        metrics.backend_up.with_label_values(&[name]).set(b.is_healthy() as i64);
        metrics.backend_draining.with_label_values(&[name]).set(drained as i64);
        if b.is_healthy() && !drained {
            members.push(b.clone());
        }
        backends.insert(b.key, b.clone());
    }
    for (name, (b, _)) in &m.draining {
        metrics.backend_up.with_label_values(&[name]).set(b.is_healthy() as i64);
        metrics.backend_draining.with_label_values(&[name]).set(1);
        backends.insert(b.key, b.clone());
    }
    members.sort_by(|a, b| a.name.cmp(&b.name));
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
    Ok(Snapshot {
        config,
        backends,
        ring,
        ttls,
        sealing,
    })
}
