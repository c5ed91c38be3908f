//! Background upkeep of the fleet: pin expiry, active health checks, DNS discovery, reloading
//! on a config file change, forgetting drained backends, keeping the issuer's keys fresh, and
//! learning the fleet's tools. Each loop reads the current snapshot every round, so reloads
//! change intervals and targets at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::{keep_fresh, JwksConfig};
use crate::catalog::{self, AskFailed, BackendTools, Limits};
use crate::config::JwksSource;
use crate::pins::PinKind;
use crate::state::Shared;
use crate::upstream::health::{self, Verdict};
use crate::upstream::HealthChange;

/// How often the config file is compared with what was last loaded.
pub const CONFIG_POLL: Duration = Duration::from_secs(1);

/// Sweeps expired pins once a second, keeps the pin gauges and per-backend pin counts current,
/// and forgets draining backends whose last pin ended or whose deadline passed.
pub async fn upkeep(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        sweep_once(&shared);
        shared.retry_budget.sample(std::time::Instant::now());
    }
}

/// One round of [`upkeep`].
pub fn sweep_once(shared: &Shared) {
    let busy: Vec<_> = shared
        .backend_states()
        .iter()
        .filter(|(b, _)| b.inflight() > 0)
        .map(|(b, _)| b.key)
        .collect();
    let swept = shared.pins.sweep();
    if let Some(quotas) = &shared.snapshot().quotas {
        // Callers idle long enough to be at full allowance again are forgotten: bounded memory.
        quotas.prune(std::time::Instant::now());
    }
    for kind in PinKind::ALL {
        let n = swept.expired[kind as usize];
        if n > 0 {
            shared.metrics.pins_expired.with_label_values(&[kind.label()]).inc_by(n);
        }
    }
    for (b, _) in shared.backend_states() {
        let by_kind = swept.per_backend.get(&b.key).copied().unwrap_or_default();
        b.pins.store(by_kind.iter().sum(), Ordering::Relaxed);
        for kind in PinKind::ALL {
            let n = i64::try_from(by_kind[kind as usize]).unwrap_or(i64::MAX);
            shared
                .metrics
                .backend_pins
                .with_label_values(&[&b.name, kind.label()])
                .set(n);
        }
    }
    shared.update_pin_gauges();
    shared.retire_drained(&busy);
    let max_idle = shared.snapshot().config.upstream.idle_timeout;
    for (b, _) in shared.backend_states() {
        b.pool.evict_idle(max_idle);
        b.h2.evict_idle(max_idle);
    }
}

/// Active health checks of every known backend (serving and draining), every `[health].interval`
/// on a fixed cadence: a round starts at each tick whether or not the last one is done (a
/// check may take up to `health.timeout`), so a backend that stops answering is ejected within
/// `interval × unhealthy_after + timeout`.
pub async fn health_checks(shared: Arc<Shared>) {
    let mut checks = tokio::task::JoinSet::new();
    let mut every = shared.snapshot().config.health.interval;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        while checks.try_join_next().is_some() {}
        let cfg = shared.snapshot().config.health.clone();
        if cfg.interval != every {
            every = cfg.interval;
            tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        for (b, _) in shared.backend_states() {
            let (shared, cfg) = (shared.clone(), cfg.clone());
            checks.spawn(async move {
                let change = match health::check(&b, &cfg.path, cfg.timeout).await {
                    Verdict::Up => b.record_check_success(cfg.healthy_after),
                    Verdict::Down => b.record_check_failure(cfg.unhealthy_after),
                    Verdict::Unknown => None,
                };
                match change {
                    Some(HealthChange::Ejected) => {
                        tracing::warn!(backend = %b.name, "backend ejected: health checks failing")
                    }
                    Some(HealthChange::Readmitted) => {
                        tracing::info!(backend = %b.name, "backend healthy again");
                        // It may come back as another version: its tools are asked again.
                        shared.catalog.ask_again(&b.name);
                    }
                    None => return,
                }
                shared.rebuild();
            });
        }
    }
}

/// Resolves `[discovery].dns` every interval and merges the addresses with the static backends.
/// A failed lookup keeps the last known set; an empty answer drains every discovered backend.
pub async fn discovery(shared: Arc<Shared>) {
    loop {
        let Some(d) = shared.snapshot().config.discovery.clone() else {
            tokio::time::sleep(CONFIG_POLL).await;
            continue;
        };
        match shared.lookup.resolve(&d.host, d.port).await {
            Ok(addrs) => {
                shared.metrics.discovery_resolutions.with_label_values(&["ok"]).inc();
                shared.set_discovered(&d, &addrs);
            }
            Err(e) => {
                shared.metrics.discovery_resolutions.with_label_values(&["error"]).inc();
                tracing::warn!(host = %d.host, error = %e, "discovery lookup failed; keeping the last known backends");
            }
        }
        tokio::time::sleep(d.interval).await;
    }
}

/// Reloads when the config file's content changes (also through a symlink swap, as a
/// Kubernetes ConfigMap update does). A file that fails to load is reported once per content.
pub async fn watch_config(shared: Arc<Shared>) {
    let Some(file) = &shared.config_file else { return };
    let path = file.path().to_path_buf();
    loop {
        tokio::time::sleep(CONFIG_POLL).await;
        let Ok(bytes) = tokio::fs::read(&path).await else {
            continue;
        };
        if file.is_new(&bytes) {
            tracing::info!(path = %path.display(), "config file changed");
            let _ = shared.reload();
        }
    }
}

/// Keeps the issuer's keys fresh while `[auth]` fetches them, over the TLS client of
/// `[upstream]`; idle otherwise (auth off, or its keys in a file), since a reload may turn it on.
pub async fn jwks(shared: Arc<Shared>) {
    let config = || {
        let snapshot = shared.snapshot();
        let auth = snapshot.config.auth.as_ref()?;
        if matches!(auth.jwks, JwksSource::File { .. }) {
            return None;
        }
        Some(JwksConfig {
            auth: auth.clone(),
            tls: snapshot.config.upstream.tls.clients.as_ref().map(|c| c.http1.clone()),
        })
    };
    keep_fresh(&shared.issuer_keys, config, shared.metrics.jwks_refreshes.clone()).await;
}

/// Keeps the catalog while `[catalog]` is on (docs/src/catalog.md): asks each known backend
/// for its tools every `interval`, and at once when it is new, came back, or a
/// `notifications/tools/list_changed` of it passed; one ask per backend at a time, each within
/// `timeout`. A failed ask is counted and keeps the backend's last tools: health stays the
/// health checks' business. A change of what a backend serves rebuilds the snapshot, whose
/// tool routes requests read; asking never holds a request up.
pub async fn catalog(shared: Arc<Shared>) {
    let mut asks = tokio::task::JoinSet::new();
    loop {
        while asks.try_join_next().is_some() {}
        let Some(cfg) = shared.snapshot().config.catalog.clone() else {
            shared.catalog.clear();
            tokio::time::sleep(CONFIG_POLL).await;
            continue;
        };
        let members = shared.backend_states();
        let names: Vec<&str> = members.iter().map(|(b, _)| &*b.name).collect();
        if shared.catalog.keep_only(&names) {
            shared.rebuild();
        }
        let now = tokio::time::Instant::now();
        let limits = Limits {
            max_tools: cfg.max_tools,
            max_bytes: cfg.max_bytes,
        };
        for name in shared.catalog.due(&names, now.into_std()) {
            let Some((backend, _)) = members.iter().find(|(b, _)| *b.name == name) else {
                continue;
            };
            let (backend, shared, path) = (backend.clone(), shared.clone(), cfg.path.clone());
            let next = (now + cfg.interval).into_std();
            asks.spawn(async move {
                let asked = tokio::time::timeout(cfg.timeout, catalog::lists(&backend, &path, limits)).await;
                learn(&shared, &name, asked.unwrap_or(Err(AskFailed::Timeout)), next);
            });
        }
        // A round a second, or at once when told.
        let _ = tokio::time::timeout(Duration::from_secs(1), shared.catalog.wake.notified()).await;
    }
}

/// What one ask of `backend` gave, put in the catalog; the backend is due again at `next`.
fn learn(shared: &Shared, backend: &str, asked: Result<catalog::Lists, AskFailed>, next: std::time::Instant) {
    let lists = match asked {
        Ok(lists) => lists,
        Err(e) => {
            tracing::warn!(backend, error = %e, "catalog: asking the backend for its tools failed; its last known tools stay");
            if shared.catalog.failed(backend, &e, next) {
                // Under a lock, none of its definitions is approved until an ask succeeds.
                shared.rebuild();
            }
            return;
        }
    };
    let learned = shared.catalog.learned(backend, BackendTools::of(lists), Some(next));
    for c in &learned.changes {
        let (was, is) = (c.was.map(|f| f.short()), c.is.map(|f| f.short()));
        // A tool's name is the backend's text: escaped and cut, it forges no log line.
        let tool = catalog::shown(&c.tool);
        tracing::warn!(backend, tool = ?tool, was = ?was, is = ?is, "catalog: a tool's definition changed on a backend");
    }
    for (tool, definitions) in &learned.drifted {
        let tool = catalog::shown(tool);
        tracing::warn!(tool = ?tool, definitions, "catalog: tool definitions differ across the fleet");
    }
    if learned.routes_changed {
        shared.rebuild();
    }
}
