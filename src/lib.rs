//! `mrtr-router`: a reverse proxy for fleets of MCP servers that sends every round of a
//! multi-round call to the instance holding it (see `../shared/DESIGN.md` and README.md).
//!
//! Map of the modules, in the order a request meets them:
//! - [`server`]   listeners, HTTP/1.1 + h2c (or TLS) connections, the per-connection timer (header
//!   read timeout, a client that leaves mid-request or stops reading its answer:
//!   `server::head_timeout`), graceful shutdown, upkeep task
//! - [`tls`]      TLS on the proxy listener: PEM files → rustls server config (ring, ALPN)
//! - [`proxy`]    the request path: read → keys → choose backend → forward → observe answer
//! - [`dialect`]  reading keys out of requests (one validating scan, `dialect::scan`) and
//!   outcomes out of answers (DESIGN §2)
//! - [`route`]    the routing decision (DESIGN §3), shared with `route` and `/debug/route`
//! - [`pins`]     the pin table of in-flight calls (DESIGN §4)
//! - [`balance`]  consistent-hash ring, bounded load, keyless least-outstanding choice
//! - [`upstream`] backends, in-flight accounting, health state
//! - [`pool`]     keep-alive connections per backend, driven by the request holding them
//! - [`fleet`]    background upkeep: pin expiry, health checks, discovery, config watch, draining
//! - [`body`]     response bodies: buffered, streamed, SSE split into events
//! - [`state`]    the hot snapshot (config + backends + ring) swapped as one on reload
//! - [`token`]    sealed routing tokens (DESIGN §5): the format, sealing and verifying
//! - [`sealing`]  where tokens travel: unsealing requests, sealing answers
//! - [`config`]   TOML → validated [`config::Config`]; every default in [`config::defaults`]
//! - [`error`]    the router's own errors, rendered in one place (DESIGN §6)
//! - [`metrics`], [`admin`]  Prometheus metrics and the admin endpoints
//! - [`example`], [`demo`]   built-in example MCP workers and the `demo` command

pub mod admin;
pub mod balance;
pub mod body;
pub mod config;
pub mod demo;
pub mod dialect;
pub mod error;
pub mod example;
pub mod fleet;
pub mod metrics;
pub mod pins;
pub mod pool;
pub mod proxy;
pub mod route;
pub mod sealing;
pub mod server;
pub mod state;
pub mod tls;
pub mod token;
pub mod upstream;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use config::{Config, ConfigError};
pub use state::Shared;

/// The two listeners a router serves, already bound (tests bind port 0).
pub struct Listeners {
    pub proxy: TcpListener,
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds the addresses the config names.
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        Ok(Listeners {
            proxy: TcpListener::bind(config.server.listen).await?,
            admin: TcpListener::bind(config.admin.listen).await?,
        })
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
        let digest = state::config_digest(text.as_bytes());
        Ok(Router {
            shared: Shared::new(config, Some((path.to_path_buf(), digest)))?,
        })
    }

    /// A router from a config value (no file to reload).
    pub fn new(config: Config) -> Result<Router, ConfigError> {
        Ok(Router {
            shared: Shared::new(config, None)?,
        })
    }

    /// A handle on the running router's state: reload, pins, metrics.
    pub fn handle(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests (bounded) and returns.
    pub async fn run(self, listeners: Listeners, shutdown: impl Future<Output = ()> + Send + 'static) {
        let shared = self.shared;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let admin_stop = {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|stopped| *stopped).await;
            }
        };
        let admin = tokio::spawn(server::serve_admin(shared.clone(), listeners.admin, admin_stop));
        let upkeep = [
            tokio::spawn(fleet::upkeep(shared.clone())),
            tokio::spawn(fleet::health_checks(shared.clone())),
            tokio::spawn(fleet::discovery(shared.clone())),
            tokio::spawn(fleet::watch_config(shared.clone())),
        ];
        server::serve_proxy(shared.clone(), listeners.proxy, shutdown).await;
        let _ = stop_tx.send(true);
        for task in upkeep {
            task.abort();
        }
        let _ = admin.await;
    }
}
