//! Which backends exist: the configured ones merged with the discovered ones, those removed and
//! still draining their pins, and those an operator drained. Each method says what it changed;
//! the caller rebuilds the routing snapshot from [`Membership::members`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::uri::Authority;

use super::backend::Backend;
use crate::config::{BackendConfig, DiscoveryConfig, UpstreamConfig};

#[derive(Default)]
pub struct Membership {
    /// Serving backends (configured or discovered) by name; reused across rebuilds so
    /// in-flight counts, health and pins carry over.
    serving: HashMap<String, Arc<Backend>>,
    /// Removed backends that keep serving their pins until the deadline or their last pin.
    draining: HashMap<String, (Arc<Backend>, Instant)>,
    /// Backends found by `[discovery]` at the last successful resolution.
    discovered: Vec<BackendConfig>,
}

/// A draining backend let go, and why.
pub struct Retired {
    pub backend: Arc<Backend>,
    pub why: &'static str,
}

impl Membership {
    /// Makes the serving set the configured backends plus the discovered ones (a configured
    /// name wins). A backend that stays keeps its object; one whose address changed is a new
    /// backend; one no longer wanted drains until `drain_timeout` from now. `create` makes a
    /// new backend; one that stays takes what `upstream` and its config say now.
    pub fn update(
        &mut self,
        configured: &[BackendConfig],
        upstream: &UpstreamConfig,
        drain_timeout: Duration,
        create: impl Fn(&BackendConfig) -> Backend,
    ) {
        let discovered = self
            .discovered
            .iter()
            .filter(|d| !configured.iter().any(|b| b.name == d.name));
        let desired: Vec<BackendConfig> = configured.iter().chain(discovered).cloned().collect();
        let mut serving = HashMap::with_capacity(desired.len());
        for cfg in &desired {
            let reuse = self
                .serving
                .remove(&cfg.name)
                .or_else(|| self.draining.remove(&cfg.name).map(|(b, _)| b));
            let backend = match reuse {
                Some(b) if b.matches(cfg) => b,
                _ => Arc::new(create(cfg)),
            };
            backend.refresh(cfg, upstream);
            serving.insert(cfg.name.clone(), backend);
        }
        // What is no longer wanted drains: it keeps its pins but takes nothing new.
        let deadline = Instant::now() + drain_timeout;
        for (name, b) in self.serving.drain() {
            tracing::info!(backend = %name, "backend removed; draining until its pins end");
            self.draining.insert(name, (b, deadline));
        }
        self.serving = serving;
    }

    /// Replaces the discovered backends by those at `addrs` (each named `dns:<ip>:<port>`,
    /// reached with `d.scheme`; under TLS checked against `d.tls_server_name`, else the DNS
    /// name); true if the set changed.
    pub fn set_discovered(&mut self, d: &DiscoveryConfig, addrs: &[SocketAddr]) -> bool {
        let tls_server_name =
            (d.scheme == http::uri::Scheme::HTTPS).then(|| d.tls_server_name.clone().unwrap_or_else(|| d.host.clone()));
        let mut found: Vec<BackendConfig> = addrs
            .iter()
            .filter_map(|a| {
                let addr = SocketAddr::new(a.ip(), d.port);
                Some(BackendConfig {
                    name: format!("dns:{addr}"),
                    scheme: d.scheme.clone(),
                    authority: Authority::try_from(addr.to_string().as_str()).ok()?,
                    base_path: String::new(),
                    weight: 1,
                    http2: None,
                    tls_server_name: tls_server_name.clone(),
                })
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found.dedup_by(|a, b| a.name == b.name);
        let changed = self.discovered != found;
        self.discovered = found;
        changed
    }

    /// Drains (or undrains) the serving backend `name` for an operator; false if none serves.
    pub fn admin_drain(&self, name: &str, drained: bool) -> bool {
        let Some(b) = self.serving.get(name) else { return false };
        b.admin_drained.store(drained, Ordering::Relaxed);
        true
    }

    /// Lets go of draining backends whose deadline passed, or that are `idle` (no pins, nothing
    /// in flight).
    pub fn retire(&mut self, idle: impl Fn(&Backend) -> bool) -> Vec<Retired> {
        let now = Instant::now();
        let done: Vec<String> = self
            .draining
            .iter()
            .filter(|(_, (b, deadline))| now >= *deadline || idle(b))
            .map(|(name, _)| name.clone())
            .collect();
        done.iter()
            .filter_map(|name| self.draining.remove(name))
            .map(|(backend, deadline)| Retired {
                backend,
                why: match now >= deadline {
                    true => "drain_timeout passed",
                    false => "its last pin ended",
                },
            })
            .collect()
    }

    /// Every backend: serving ones by name, then draining ones; each with whether it drains
    /// because it was removed.
    pub fn members(&self) -> Vec<(Arc<Backend>, bool)> {
        let mut out: Vec<_> = self.serving.values().map(|b| (b.clone(), false)).collect();
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out.extend(self.draining.values().map(|(b, _)| (b.clone(), true)));
        out
    }
}
