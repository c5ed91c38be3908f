//! The proxy listener's accept loop: the connection cap (`server.max_connections`, within what
//! the open-file limit affords: docs/src/limits.md), and the graceful shutdown of what was
//! accepted.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connection::{Builders, Connection};
use super::shutdown::Shutdown;
use super::{limits, warn_at_most_every_10s, watchdog};
use crate::state::Shared;

/// Serves the proxy until `shutdown` resolves, then stops accepting and lets in-flight
/// requests and streams finish for up to `server.shutdown_grace`.
///
/// Each connection is served with the `[server]` settings of the config running when it was
/// accepted (header read timeout, header limits, TLS certificate): a reload changes them for
/// the connections accepted after it.
pub async fn serve_proxy(shared: Arc<Shared>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let mut builders = Arc::new(Builders::new(&shared.snapshot().config.server, &shared));
    let shutdown_conns = Arc::new(Shutdown::default());
    let configured = shared.snapshot().config.server.max_connections;
    let fd_limit = limits::open_file_limit();
    let cap = limits::connection_cap(configured, fd_limit);
    if cap < configured {
        tracing::warn!(
            max_connections = configured,
            open_file_limit = fd_limit,
            cap,
            "the open-file limit allows fewer client connections than server.max_connections"
        );
    }
    tracing::info!(cap, "accepting client connections");
    let permits = Arc::new(Semaphore::new(cap));
    let metrics = &shared.metrics;
    let mut last_warning: Option<tokio::time::Instant> = None;
    // Connections live in a set so that, past the grace period, the ones left can be closed.
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while conns.try_join_next().is_some() {}
        // At the cap, nothing is accepted until a connection closes: clients wait in the
        // kernel's backlog rather than taking descriptors the router needs for backends.
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                metrics.connections_refused.with_label_values(&["cap"]).inc();
                warn_at_most_every_10s(&mut last_warning, || {
                    tracing::warn!(cap, "max_connections open: new connections wait until one closes")
                });
                tokio::select! {
                    permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                    _ = &mut shutdown => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    metrics.connections_refused.with_label_values(&["fds"]).inc();
                    warn_at_most_every_10s(&mut last_warning, || tracing::warn!(error = %e, "accept failed"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        {
            let snap = shared.snapshot();
            if builders.server != snap.config.server {
                builders = Arc::new(Builders::new(&snap.config.server, &shared));
            }
        }
        let conn = Connection {
            shared: shared.clone(),
            builders: builders.clone(),
            shutdown: shutdown_conns.clone(),
            activity: Arc::new(watchdog::Activity::default()),
            peer,
            open: OpenConnection::new(&shared, permit),
        };
        conns.spawn(conn.serve(stream));
    }
    drop(listener);
    shared.shutting_down.store(true, Ordering::SeqCst);
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    shutdown_conns.start();
    let grace = shared.snapshot().config.server.shutdown_grace;
    tokio::select! {
        _ = async { while conns.join_next().await.is_some() {} } => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!("shutdown grace period over; closing remaining connections"),
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// A client connection's place under `max_connections`, and in `mrtr_connections{protocol}`,
/// held until it closes.
pub(super) struct OpenConnection {
    _permit: OwnedSemaphorePermit,
    gauge: parking_lot::Mutex<prometheus::IntGauge>,
    gauges: prometheus::IntGaugeVec,
}

impl OpenConnection {
    pub(super) fn new(shared: &Shared, permit: OwnedSemaphorePermit) -> OpenConnection {
        let gauges = shared.metrics.connections.clone();
        let gauge = gauges.with_label_values(&["pending"]);
        gauge.inc();
        OpenConnection {
            _permit: permit,
            gauge: parking_lot::Mutex::new(gauge),
            gauges,
        }
    }

    /// The connection turned out to speak `protocol` (`http1`, `http2`).
    pub(super) fn speaks(&self, protocol: &str) {
        let next = self.gauges.with_label_values(&[protocol]);
        next.inc();
        std::mem::replace(&mut *self.gauge.lock(), next).dec();
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.lock().dec();
    }
}
