//! Listeners: accepting connections (HTTP/1.1 and h2c, or either over TLS), the admin
//! endpoints, background upkeep, and graceful shutdown.
//!
//! - `accept`: the proxy listener's accept loop, the connection cap, the shutdown's grace
//! - `connection`: one client connection, from its first bytes (or TLS handshake) to its end
//! - `serve`: the loop that serves a hyper connection with its watchdog and the shutdown
//! - `park`: idle HTTP/1 connections held as their socket alone
//! - `watchdog`: the per-connection timer (header read timeout, a client that left, stalls)
//! - `limits`, `shutdown`, `socket_activation`: the open-file limit, the shutdown signal,
//!   listeners passed by systemd

mod accept;
mod connection;
mod limits;
mod park;
mod proxy_protocol;
mod serve;
mod shutdown;
pub(crate) mod socket_activation;
mod watchdog;

pub use accept::serve_proxy;
pub use limits::raise_open_file_limit;
pub use shutdown::Shutdown;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::admin;
use crate::state::Shared;
use connection::MAX_HEAD_BYTES;

/// Connections the kernel queues for a listener while the router does not accept (at
/// `max_connections`, or during a restart); the kernel caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket at `addr` with a deep backlog (std's is 128), address reuse on.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Logs through `log` unless it logged less than 10 s ago (a flood would repeat it per connection).
fn warn_at_most_every_10s(last: &mut Option<tokio::time::Instant>, log: impl FnOnce()) {
    let now = tokio::time::Instant::now();
    if last.is_none_or(|t| now >= t + Duration::from_secs(10)) {
        *last = Some(now);
        log();
    }
}

/// Serves the admin endpoints until `stop` starts.
///
/// HTTP/1.1 only (Prometheus, probes and curl speak it), each connection with the
/// `admin.header_read_timeout` of the config running when it was accepted (hyper's own: it
/// bounds each request head and each idle keep-alive wait); `admin.body_read_timeout` bounds a
/// request body. At most `admin.max_connections` are open: one more closes the oldest, so slow
/// or idle clients can never keep a probe or a scrape out (a connection that sends its request
/// at once is served before it could become the oldest).
pub async fn serve_admin(shared: Arc<Shared>, status: Arc<admin::Status>, listener: TcpListener, stop: Arc<Shutdown>) {
    let local = listener.local_addr().ok();
    let loopback = local.is_some_and(|a| a.ip().is_loopback());
    if shared.snapshot().config.admin.token.is_none() && !loopback {
        tracing::warn!(
            admin = ?local,
            "admin.token is not set and the admin listener is not on loopback: POST /backends/* answers 403"
        );
    }
    let metrics = &shared.metrics;
    let mut last_warning: Option<tokio::time::Instant> = None;
    // The open connections, oldest first.
    let mut open: std::collections::VecDeque<tokio::task::AbortHandle> = std::collections::VecDeque::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
            () = stop.started() => return,
        };
        let snap = shared.snapshot();
        let admin = &snap.config.admin;
        open.retain(|c| !c.is_finished());
        while open.len() >= admin.max_connections {
            let Some(oldest) = open.pop_front() else { break };
            oldest.abort();
            metrics.connections_refused.with_label_values(&["admin_cap"]).inc();
            let cap = admin.max_connections;
            warn_at_most_every_10s(&mut last_warning, || {
                tracing::warn!(cap, "admin.max_connections open: closing the oldest admin connection")
            });
        }
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(admin.header_read_timeout)
            .max_headers(snap.config.server.max_headers)
            .max_buf_size(MAX_HEAD_BYTES);
        drop(snap);
        let (shared, status) = (shared.clone(), status.clone());
        let service = service_fn(move |req| {
            let (shared, status) = (shared.clone(), status.clone());
            async move { Ok::<_, Infallible>(admin::answer(&shared, &status, req, loopback).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        open.push_back(
            tokio::spawn(async move {
                let _ = conn.await;
            })
            .abort_handle(),
        );
    }
}
