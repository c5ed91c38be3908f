//! The proxy listener's accept loop: the connection cap (`server.max_connections`, within what
//! the open-file limit affords: docs/src/limits.md), the connections it holds back in the
//! kernel's backlog and their count, and the graceful shutdown of what was accepted.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connection::{Builders, Connection, OpenConnection};
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
    let mut held_back = HeldBack::new(metrics.connections_refused.with_label_values(&["cap"]));
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
                warn_at_most_every_10s(&mut last_warning, || {
                    tracing::warn!(cap, "max_connections open: new connections wait until one closes")
                });
                match held_back.wait_for_permit(&permits, &listener, shutdown.as_mut()).await {
                    Some(permit) => permit,
                    None => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = held_back.accept(&listener) => match accepted {
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

/// Counts, in `mrtr_connections_refused_total{reason="cap"}`, each client connection that
/// waited in the kernel's backlog because `max_connections` were open (docs/src/observability.md).
///
/// Once the listener is at the cap, every connection it accepts without waiting, until its
/// backlog runs dry, was held back. Counted only so, a cap that lasted would show nothing while
/// clients wait: so the first connection that waits is counted as soon as it does (the
/// listener's readiness, watched while at the cap), and is not counted again when accepted (the
/// backlog is first in, first out). A connection that comes while the backlog is drained is
/// counted too: it is indistinguishable from one that waited.
struct HeldBack {
    counter: prometheus::IntCounter,
    /// The listener was at the cap since its backlog last ran dry.
    draining: bool,
    /// The connection at the head of the backlog has been counted already.
    head_counted: bool,
}

impl HeldBack {
    fn new(counter: prometheus::IntCounter) -> HeldBack {
        HeldBack {
            counter,
            draining: false,
            head_counted: false,
        }
    }

    /// Waits, at the cap, for a connection to close; counts the first connection to wait in
    /// the backlog meanwhile. `None`: the shutdown came first.
    async fn wait_for_permit<S: Future<Output = ()>>(
        &mut self,
        permits: &Arc<Semaphore>,
        listener: &TcpListener,
        mut shutdown: Pin<&mut S>,
    ) -> Option<OwnedSemaphorePermit> {
        self.draining = true;
        // Without the watch (a descriptor could not be had), the backlog is counted when drained.
        let backlog = match Backlog::watch(listener) {
            Ok(backlog) => Some(backlog),
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch the listener's backlog");
                None
            }
        };
        loop {
            tokio::select! {
                permit = permits.clone().acquire_owned() => return Some(permit.expect("the semaphore is never closed")),
                () = Backlog::occupied(backlog.as_ref()), if !self.head_counted => {
                    self.head_counted = true;
                    self.counter.inc();
                }
                () = shutdown.as_mut() => return None,
            }
        }
    }

    /// The next connection. While draining the backlog: one accepted without waiting was held
    /// back (unless counted already); the first accept that would wait ends the draining.
    async fn accept(&mut self, listener: &TcpListener) -> io::Result<(TcpStream, SocketAddr)> {
        if self.draining {
            // Unconstrained: tokio's budget would make a ready accept look like one that waits.
            match tokio::task::unconstrained(listener.accept()).now_or_never() {
                Some(Ok(accepted)) => {
                    if !std::mem::take(&mut self.head_counted) {
                        self.counter.inc();
                    }
                    return Ok(accepted);
                }
                Some(Err(e)) => return Err(e),
                None => {
                    self.draining = false;
                    self.head_counted = false;
                }
            }
        }
        listener.accept().await
    }
}

/// The listener's backlog, watched through a second descriptor of the listening socket while
/// the router is at the cap (tokio registers a socket once; the listener's own registration is
/// left alone, so it accepts as before when the cap lifts). Dropped at the end of each wait at
/// the cap: a stale readiness never carries over.
struct Backlog(AsyncFd<OwnedFd>);

impl Backlog {
    fn watch(listener: &TcpListener) -> io::Result<Backlog> {
        let fd = listener.as_fd().try_clone_to_owned()?;
        // SAFETY: `fd` is an open descriptor the `AsyncFd` owns (and closes) for its life.
        let watched = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
        Ok(Backlog(watched.map_err(|e| e.into_parts().1)?))
    }

    /// Resolves once a connection waits to be accepted; never, without a watch.
    async fn occupied(backlog: Option<&Backlog>) {
        let Some(Backlog(fd)) = backlog else {
            return std::future::pending().await;
        };
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return std::future::pending().await;
            };
            // tokio's readiness is a hint: the kernel is asked, and a hint it denies is cleared.
            if ready.try_io(|fd| waiting(fd.get_ref())).is_ok() {
                return;
            }
        }
    }
}

/// `Ok` if a connection waits in the backlog of the listening socket `fd`, `WouldBlock` if
/// none: `poll` without waiting, which takes nothing from the backlog.
fn waiting(fd: &OwnedFd) -> io::Result<()> {
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, and a zero timeout.
    match unsafe { libc::poll(&mut pollfd, 1, 0) } {
        1 if pollfd.revents & libc::POLLIN != 0 => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        _ => Err(io::ErrorKind::WouldBlock.into()),
    }
}
