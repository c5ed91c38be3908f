//! Listeners: accepting connections (HTTP/1.1 and h2c), the admin endpoints, background
//! upkeep, and graceful shutdown.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::TcpListener;

use crate::state::Shared;
use crate::{admin, proxy};

/// Serves the proxy until `shutdown` resolves, then stops accepting and lets in-flight
/// requests and streams finish for up to `server.shutdown_grace`.
pub async fn serve_proxy(shared: Arc<Shared>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let cfg = shared.snapshot().config.server.clone();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_read_timeout)
        .max_headers(cfg.max_headers)
        .max_buf_size(64 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .max_header_list_size(64 * 1024);
    let drain = Arc::new(Drain::default());
    // Connections live in a set so that, past the grace period, the ones left can be closed.
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while conns.try_join_next().is_some() {}
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let peer_ip = http::HeaderValue::from_str(&peer.ip().to_string()).expect("an IP is a valid header value");
        let service = service_fn(move |req| {
            let shared = shared.clone();
            let peer_ip = peer_ip.clone();
            // Boxed: the request's future is large (~4 KiB), and hyper would move it by value.
            let answer = Box::pin(proxy::handle(shared, req, peer_ip, false));
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        let conn = drain.clone().watch(conn);
        conns.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    shared.shutting_down.store(true, Ordering::SeqCst);
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    drain.start();
    tokio::select! {
        _ = async { while conns.join_next().await.is_some() {} } => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(cfg.shutdown_grace) => tracing::warn!("shutdown grace period over; closing remaining connections"),
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Graceful shutdown of the proxy's connections: once it starts, each connection finishes the
/// requests it has in flight and closes (idle keep-alive connections close at once). Cheap on
/// the hot path: a poll reads one flag, and registers its task's waker only when the waker
/// changes, which in practice is once per connection. (hyper-util's `GracefulShutdown` polls a
/// `watch` channel on every poll of every connection, ~700 instructions per request.)
#[derive(Default)]
struct Drain {
    started: AtomicBool,
    /// The task of each live connection, woken when the drain starts.
    tasks: parking_lot::Mutex<HashMap<u64, Waker>>,
    next_id: AtomicU64,
}

impl Drain {
    fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
        for (_, task) in self.tasks.lock().drain() {
            task.wake();
        }
    }

    /// Serves `conn` until it ends, shutting it down gracefully once the drain starts.
    async fn watch<C: GracefulConnection>(self: Arc<Self>, conn: C) -> C::Output {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let registration = Registration { drain: &self, id };
        let mut conn = std::pin::pin!(conn);
        let mut waker: Option<Waker> = None;
        let mut draining = false;
        std::future::poll_fn(|cx| {
            if !draining {
                // Registered before the flag is read: a drain that starts in between still
                // finds this task (it sets the flag before it wakes the tasks).
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    registration.drain.tasks.lock().insert(id, cx.waker().clone());
                    waker = Some(cx.waker().clone());
                }
                if registration.drain.started.load(Ordering::SeqCst) {
                    conn.as_mut().graceful_shutdown();
                    draining = true;
                }
            }
            conn.as_mut().poll(cx)
        })
        .await
    }
}

/// A connection's place in [`Drain::tasks`], given up when the connection ends or is dropped.
struct Registration<'a> {
    drain: &'a Drain,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.drain.tasks.lock().remove(&self.id);
    }
}

/// Serves the admin endpoints until `shutdown` resolves.
pub async fn serve_admin(shared: Arc<Shared>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
            _ = &mut shutdown => return,
        };
        let shared = shared.clone();
        let service = service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(admin::handle(&shared, req).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}
