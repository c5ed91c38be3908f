//! `mrtr-router`: a reverse proxy for fleets of MCP servers that sends every round of a
//! multi-round call to the instance holding it.
//!
//! ARCHITECTURE.md is the map: the problem, one request through the phases of `proxy`, each
//! top-level module with its key types, the invariants, the words the code uses. docs/ is the
//! book. Each module's own `//!` lines say what it owns.
//!
//! This file is the surface: [`Router`] (built from a file or a [`Config`], run on bound
//! [`Listeners`]), [`RouterControl`] (reload, and a look at backends, ring and pins), and
//! [`internals`], the few inner types the benches, fuzz targets and tests exercise directly;
//! it is not a stable interface.

mod admin;
mod auth;
mod balance;
mod body;
mod calls;
mod catalog;
pub mod config;
pub mod control;
pub mod demo;
mod dialect;
mod error;
pub mod example;
mod fleet;
mod metrics;
mod pins;
mod proxy;
mod quotas;
mod route;
mod sealing;
mod server;
mod state;
mod telemetry;
mod tls;
mod token;
mod upstream;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use config::{Config, ConfigError};
pub use control::RouterControl;
pub use server::raise_open_file_limit;
pub use telemetry::{flush_logs, init_logging};

use config::ConfigFile;
use server::Shutdown;
use state::Shared;

/// The inner types benches, fuzz targets and tests exercise directly. Not a stable interface.
pub mod internals {
    pub use crate::auth::{
        is_valid_scope, keep_fresh, Algorithm, AlgorithmSet, AuthFailure, FetchOutcome, InvalidScope, IssuerKeys,
        JwksConfig, Key, KeySet, Policy as AuthPolicy, Principal, Scopes, Verified, AUTH_RESULTS, MAX_BEARER_BYTES,
        MAX_JWKS_BYTES, MAX_KEYS,
    };
    pub use crate::balance::HashRing;
    pub use crate::body::split_sse;
    pub use crate::dialect::{
        parse_outcome, parse_request, request_state_at, Ambiguity, NotJson, Outcome, Reading, RequestEnvelope,
        Unreadable,
    };
    pub use crate::pins::{Clock, Pin, PinKey, PinKind, PinTable, PinTtls};
    pub use crate::quotas::{CallerKey, PerCaller, RateLimiter};
    pub use crate::token::{Claims, Kind as TokenKind, LegacySealingKeys, SealingKeys};
    pub use crate::upstream::{Backend, BackendKey};
}

/// The two listeners a router serves, already bound (tests bind port 0).
pub struct Listeners {
    pub proxy: TcpListener,
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds the addresses the config names.
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        Ok(Listeners {
            proxy: server::listen(config.server.listen)?,
            admin: server::listen(config.admin.listen)?,
        })
    }

    /// The listeners systemd passed by socket activation, else those the config names. With
    /// `LISTEN_FDS` set (and `LISTEN_PID`, when set, this process), the sockets from fd 3 on
    /// are named by `LISTEN_FDNAMES` (`proxy`, `admin`; unnamed: the first is the proxy's, the
    /// second the admin's); one not passed is bound from the config. A restart then queues new
    /// connections in the kernel instead of refusing them.
    pub async fn from_systemd_or_bind(config: &Config) -> std::io::Result<(Listeners, bool)> {
        let passed = server::socket_activation::listeners()?;
        if passed.is_empty() {
            return Ok((Listeners::bind(config).await?, false));
        }
        let mut proxy = None;
        let mut admin = None;
        for (name, listener) in passed {
            match name.as_str() {
                "proxy" => proxy = Some(listener),
                "admin" => admin = Some(listener),
                other => tracing::warn!(name = other, "ignoring a socket passed with an unknown name"),
            }
        }
        let proxy = match proxy {
            Some(l) => l,
            None => server::listen(config.server.listen)?,
        };
        let admin = match admin {
            Some(l) => l,
            None => server::listen(config.admin.listen)?,
        };
        Ok((Listeners { proxy, admin }, true))
    }
}

/// A configured router, ready to serve.
pub struct Router {
    shared: Arc<Shared>,
}

impl Router {
    /// A router from a config file; `reload` re-reads that file.
    pub fn from_file(path: &Path) -> Result<Router, ConfigError> {
        let text = Config::read_text(path)?;
        let config = Config::parse(path, &text)?;
        Ok(Router {
            shared: Shared::new(config, Some(ConfigFile::new(path, &text))),
        })
    }

    /// A router from a config value (no file to reload).
    pub fn new(config: Config) -> Router {
        Router {
            shared: Shared::new(config, None),
        }
    }

    /// The running router's controls: reload, and a look at its backends, ring and pins.
    pub fn control(&self) -> RouterControl {
        RouterControl::new(self.shared.clone())
    }

    /// `mrtr-router catalog lock`: asks the backends the config lists (or only `only`) for
    /// their tools and writes the definitions they serve to `[catalog] lock`; returns the file
    /// written and the number of tools approved.
    pub async fn lock_catalog(&self, only: Option<&str>) -> Result<(std::path::PathBuf, usize), String> {
        let snap = self.shared.snapshot();
        let cfg = snap
            .config
            .catalog
            .as_ref()
            .ok_or("[catalog] is off: set enabled = true and lock = PATH")?;
        let path = cfg
            .lock
            .as_ref()
            .map(|l| l.path.clone())
            .ok_or("[catalog] names no lock file: set lock = PATH")?;
        let backends: Vec<_> = self.shared.backend_states().into_iter().map(|(b, _)| b).collect();
        let lock = catalog::lock_of(&backends, cfg, only).await?;
        let tmp = path.with_extension("lock.tmp");
        std::fs::write(&tmp, lock.render()).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((path, lock.tools.len()))
    }

    /// How a request would be routed, as JSON (what `/debug/route` answers): `key` stands in
    /// the routing header; `bearer`, with `[auth]` on, an access token to explain; `body` is a
    /// JSON-RPC request body, or empty.
    pub fn explain(
        &self,
        key: Option<&str>,
        bearer: Option<&str>,
        body: &[u8],
    ) -> Result<serde_json::Value, dialect::Unreadable> {
        admin::explain(&self.shared, &http::HeaderMap::new(), key, bearer, body)
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests (bounded) and returns.
    pub async fn run(self, listeners: Listeners, shutdown: impl Future<Output = ()> + Send + 'static) {
        let shared = self.shared;
        // The admin listener outlives the proxy's drain: `/readyz` says 503 meanwhile.
        let stop_admin = Arc::new(Shutdown::default());
        let status = admin::Status::new();
        let admin = tokio::spawn(server::serve_admin(
            shared.clone(),
            status.clone(),
            listeners.admin,
            stop_admin.clone(),
        ));
        let upkeep = [
            tokio::spawn(admin::sample(shared.clone(), status)),
            tokio::spawn(fleet::upkeep(shared.clone())),
            tokio::spawn(fleet::health_checks(shared.clone())),
            tokio::spawn(fleet::discovery(shared.clone())),
            tokio::spawn(fleet::watch_config(shared.clone())),
            tokio::spawn(fleet::jwks(shared.clone())),
            tokio::spawn(fleet::catalog(shared.clone())),
        ];
        server::serve_proxy(shared.clone(), listeners.proxy, shutdown).await;
        // The spans of the requests just drained go out before the router returns (bounded).
        if let Some(tracing) = shared.snapshot().tracing.clone() {
            let _ = tokio::task::spawn_blocking(move || tracing.shutdown(std::time::Duration::from_secs(5))).await;
        }
        stop_admin.start();
        for task in upkeep {
            task.abort();
        }
        let _ = admin.await;
    }
}
