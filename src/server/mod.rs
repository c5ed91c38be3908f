//! Listeners: accepting connections (HTTP/1.1 and h2c, or either over TLS), the admin
//! endpoints, background upkeep, and graceful shutdown.

mod limits;
mod park;
mod shutdown;
pub(crate) mod socket_activation;
mod watchdog;

pub use limits::raise_open_file_limit;
pub use shutdown::Shutdown;

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncWrite, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::body::ProxyBody;
use crate::config::ServerConfig;
use crate::state::Shared;
use crate::{admin, proxy, tls};

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
    let permits = Arc::new(tokio::sync::Semaphore::new(cap));
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

/// Logs through `log` unless it logged less than 10 s ago (a flood would repeat it per connection).
fn warn_at_most_every_10s(last: &mut Option<tokio::time::Instant>, log: impl FnOnce()) {
    let now = tokio::time::Instant::now();
    if last.is_none_or(|t| now >= t + Duration::from_secs(10)) {
        *last = Some(now);
        log();
    }
}

/// An accepted proxy connection, with what serving it needs.
struct Connection {
    shared: Arc<Shared>,
    builders: Arc<Builders>,
    shutdown: Arc<Shutdown>,
    activity: Arc<watchdog::Activity>,
    peer: SocketAddr,
    open: OpenConnection,
}

/// A client connection's place under `max_connections`, and in `mrtr_connections{protocol}`,
/// held until it closes.
struct OpenConnection {
    _permit: tokio::sync::OwnedSemaphorePermit,
    gauge: parking_lot::Mutex<prometheus::IntGauge>,
    gauges: prometheus::IntGaugeVec,
}

impl OpenConnection {
    fn new(shared: &Shared, permit: tokio::sync::OwnedSemaphorePermit) -> OpenConnection {
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
    fn speaks(&self, protocol: &str) {
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

impl Connection {
    /// Serves the connection to its end: cleartext, the protocol told by its first bytes; TLS,
    /// the protocol ALPN chose (HTTP/2 for `h2`, else HTTP/1.1) once the handshake is done.
    ///
    /// The task's future is held for the connection's life, idle or not, and is as large as its
    /// largest state: so whatever is large and not held for the whole life is boxed (the
    /// protocol sniff, the TLS and HTTP/2 paths, hyper's HTTP/1 connection, which
    /// [`Connection::serve_http1`] drops while the connection waits). An `async` block rather
    /// than an `async fn`: an `async fn` keeps its arguments twice in its state (as they came,
    /// and moved into its body).
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    fn serve(self, stream: TcpStream) -> impl Future<Output = ()> + Send {
        async move {
            let timeout = self.builders.header_read_timeout;
            // Not `match self.builders.tls.clone()`: the match would keep the clone across
            // the awaits, in the task.
            let served = match self.builders.tls.is_some() {
                true => Box::pin(self.serve_tls(stream)).await,
                false => match Box::pin(self.sniffed(&stream, timeout)).await {
                    Some(Protocol::Http1) => self.serve_http1(stream, false).await,
                    Some(Protocol::Http2) => Box::pin(self.serve_http2(stream, false)).await,
                    None => Ok(()),
                },
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, peer = %self.peer, "connection ended with an error");
            }
        }
    }

    /// Serves an HTTP/1 connection (cleartext, or TLS without `h2`) to its end.
    ///
    /// **A connection that waits between requests is parked** ([`park`]): once its watchdog
    /// finds it waiting (a check, every quarter of `header_read_timeout`, with no request
    /// started, finished or in flight since the last) and hyper holds nothing of it (no byte
    /// unread or unwritten), hyper's connection is taken apart and only the socket is kept,
    /// until the client sends again (or closes): then a new hyper connection serves it. An idle
    /// keep-alive connection so holds its socket, task and timer, not hyper's state (~700
    /// bytes, and the boxes it keeps). Nothing changes for a busy connection: a request that
    /// follows another within a check never meets a parked connection, and the closing after
    /// `header_read_timeout` of waiting is the same. A separate block, not inline in
    /// [`Connection::serve`], because TLS and cleartext share it: a block of its own costs
    /// each wake-up one more layer of future, a few instructions. What can be made before it
    /// runs is made here, outside the block, which would otherwise hold `io` twice.
    fn serve_http1<S: park::ClientIo>(&self, io: S, tls: bool) -> impl Future<Output = hyper::Result<()>> + Send + '_ {
        self.open.speaks("http1");
        let (timeout, stall_limit) = self.limits();
        // The raw socket, under TLS too: a peek at it finds the client's end of stream (see
        // `watchdog`), and its readiness wakes a parked connection.
        let mut timer = watchdog::Watchdog::new(timeout, Some(io.tcp().as_raw_fd()), stall_limit);
        let mut io = TokioIo::new(io);
        async move {
            // What is left of a connection closed for waiting `header_read_timeout`: its
            // socket, and what it read of a head (none when it was parked).
            let (io, unread) = loop {
                let service = self.service(tls, false);
                let mut conn = Box::new(self.builders.http1.serve_connection(io, service));
                match serve(Pin::new(&mut *conn), &self.shutdown, &self.activity, &mut timer).await {
                    Served::Ended(r) => return r,
                    Served::ClientLeft => {
                        self.shared.metrics.client_aborts.inc();
                        return Ok(());
                    }
                    Served::TimedOut => {
                        // Taken apart whole: nothing of it is kept across the answer's await.
                        let hyper::server::conn::http1::Parts { io, read_buf, .. } = conn.into_parts();
                        break (io, read_buf);
                    }
                    Served::Idle => {
                        // `is_idle`: nothing was read that is not yet served. The box is
                        // freed here, not at the end of the loop's turn, after the wait.
                        io = { conn }.into_parts().io;
                        let parked = park::Parked::new(&self.shared.metrics.connections_parked);
                        match parked
                            .wait(io.inner().tcp(), &mut timer, &self.activity, &self.shutdown)
                            .await
                        {
                            park::Unparked::Readable => continue,
                            park::Unparked::TimedOut | park::Unparked::Shutdown => break (io, Bytes::new()),
                        }
                    }
                }
            };
            Box::pin(watchdog::answer(&self.shared, io, unread)).await;
            Ok(())
        }
    }

    /// The protocol `stream`'s first bytes tell ([`sniff`]), within [`Connection::until_shutdown`].
    async fn sniffed(&self, stream: &TcpStream, timeout: Duration) -> Option<Protocol> {
        self.until_shutdown(pin!(sniff(stream, timeout))).await.flatten()
    }

    /// `f`'s output, or `None` if the shutdown starts first: a connection that has not reached
    /// hyper yet (protocol sniff, TLS handshake) closes at once on shutdown instead of holding
    /// it for up to `header_read_timeout`.
    ///
    /// It gets [`LAST_CALL`] more first: a client that connected as the shutdown began has
    /// usually sent its request already (a restart under socket activation hands the next
    /// process only the connections not yet accepted), and that request is served.
    ///
    /// `f` comes pinned by the caller: taken by value, its state would be stored twice in
    /// the task (as passed, and pinned), 424 bytes more per connection for the protocol sniff.
    async fn until_shutdown<F: Future>(&self, mut f: Pin<&mut F>) -> Option<F::Output> {
        let mut watch = self.shutdown.register();
        tokio::select! {
            out = f.as_mut() => Some(out),
            () = poll_fn(|cx| watch.poll_started(cx)) => tokio::time::timeout(LAST_CALL, f).await.ok(),
        }
    }

    /// The connection's `header_read_timeout`, and how long its client may take nothing of an
    /// answer (`stream_idle_timeout`, the limit on an answer that moves no bytes).
    fn limits(&self) -> (Duration, Duration) {
        (
            self.builders.header_read_timeout,
            self.builders.server.stream_idle_timeout,
        )
    }

    /// TLS: the handshake has `header_read_timeout` too, so a client that never finishes it is
    /// dropped; a client that is not speaking TLS (plain HTTP to this port) fails it.
    async fn serve_tls(&self, stream: TcpStream) -> hyper::Result<()> {
        let Some(acceptor) = self.builders.tls.clone() else {
            return Ok(());
        };
        let timeout = self.builders.header_read_timeout;
        let handshake = tokio::time::timeout(timeout, acceptor.accept(stream));
        let Some(handshake) = self.until_shutdown(pin!(handshake)).await else {
            return Ok(());
        };
        match handshake {
            Ok(Ok(stream)) if tls::is_h2(stream.get_ref().1) => self.serve_http2(stream, true).await,
            Ok(Ok(stream)) => self.serve_http1(stream, true).await,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, peer = %self.peer, "TLS handshake failed");
                Ok(())
            }
            Err(_) => {
                tracing::debug!(peer = %self.peer, "TLS handshake timed out");
                Ok(())
            }
        }
    }

    /// Serves an HTTP/2 connection (h2c, or TLS with ALPN `h2`).
    async fn serve_http2<I>(&self, io: I, tls: bool) -> hyper::Result<()>
    where
        I: tokio::io::AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.open.speaks("http2");
        let conn = self
            .builders
            .http2
            .serve_connection(TokioIo::new(io), self.service(tls, true));
        let mut conn = pin!(conn);
        let (timeout, stall_limit) = self.limits();
        // No socket to peek at: hyper reads an HTTP/2 connection all the time, and notices a
        // client that leaves itself.
        let mut timer = watchdog::Watchdog::new(timeout, None, stall_limit);
        match serve(conn.as_mut(), &self.shutdown, &self.activity, &mut timer).await {
            Served::Ended(r) => r,
            Served::ClientLeft | Served::Idle => Ok(()),
            // No stream for the whole timeout: GOAWAY, and the connection ends. h2 waits for
            // the client to acknowledge the GOAWAY's PING (and a connection still in its
            // handshake waits for the preface): a client that does neither is dropped after
            // one more timeout, not held forever.
            Served::TimedOut => {
                conn.as_mut().graceful_shutdown();
                tokio::time::timeout(timeout, conn).await.unwrap_or(Ok(()))
            }
        }
    }

    /// The connection's service: each request to [`proxy::handle`], counted in its activity;
    /// an HTTP/2 stream's answer also counts hyper's polls of it for [`watchdog::StreamExecutor`].
    fn service(
        &self,
        tls: bool,
        h2: bool,
    ) -> impl Service<
        Request<Incoming>,
        Response = Response<watchdog::Tracked<ProxyBody>>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<watchdog::Tracked<ProxyBody>>, Infallible>> + Send + 'static,
    > + Send
           + 'static {
        let (shared, activity) = (self.shared.clone(), self.activity.clone());
        let peer_ip = HeaderValue::from_str(&self.peer.ip().to_string()).expect("an IP is a valid header value");
        service_fn(move |req| {
            let done = activity.start();
            // Small: `proxy::handle` boxes the large part of the request's future itself.
            let answer = proxy::handle(shared.clone(), req, peer_ip.clone(), tls);
            async move {
                // First polled inside the stream's task (HTTP/2), where its polls are found.
                let stream = if h2 { watchdog::stream_polls() } else { None };
                Ok::<_, Infallible>(answer.await.map(|body| watchdog::Tracked::new(body, done, stream)))
            }
        })
    }
}

/// What became of a connection served by [`serve`]; unpolled since, unless it ended.
enum Served {
    /// The connection ended by itself.
    Ended(hyper::Result<()>),
    /// It waited `header_read_timeout` for a request.
    TimedOut,
    /// Its client left while a request was in flight: the connection is dropped, and the
    /// request with it (its upstream connection closes).
    ClientLeft,
    /// It waits between requests holding nothing (HTTP/1): see [`Connection::serve_http1`].
    Idle,
}

/// Serves `conn` until it ends, has waited `header_read_timeout` for a request, its client has
/// left mid-request (HTTP/1: `timer` peeks at its socket, see [`watchdog`]), or is found idle
/// (see [`park::Parkable`]) at one of `timer`'s checks; shutting it down gracefully if the
/// shutdown starts meanwhile. `timer` is the connection's, kept across the hyper connections
/// that serve it in turn (see [`Connection::serve_http1`]). A bare `poll_fn`: an `async` block
/// around it would hold what it needs twice (in the block, and in the closure).
fn serve<'a, C>(
    mut conn: Pin<&'a mut C>,
    shutdown: &'a Shutdown,
    activity: &'a watchdog::Activity,
    timer: &'a mut watchdog::Watchdog,
) -> impl Future<Output = Served> + Send + 'a
where
    C: GracefulConnection<Error = hyper::Error> + park::Parkable + Send + 'a,
{
    let mut watch = shutdown.register();
    // The count of requests begun that the shutdown waits to see grow before it shuts the
    // connection down: one served after the shutdown began (see `LAST_CALL`, and a parked one
    // whose client sent as it began), or found between requests with its client's next one
    // in its socket, first reads that request. Shut down before it has one, hyper would close
    // it unread.
    let mut wait_past = shutdown.is_started().then(|| activity.started());
    let mut closing = false;
    poll_fn(move |cx| {
        if !closing && watch.poll_started(cx).is_ready() {
            match wait_past {
                None if conn.is_idle() && timer.client_sent() => wait_past = Some(activity.started()),
                Some(begun) if activity.started() == begun => {}
                _ => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            return Poll::Ready(Served::Ended(r));
        }
        if !closing && wait_past.is_some_and(|begun| activity.started() != begun) {
            // The request waited for has just begun: shut down at the next poll, which an
            // answer made at once would not otherwise bring.
            cx.waker().wake_by_ref();
        }
        // After the connection: what it just did is in the counters the timer reads.
        match ready!(timer.poll_expired(cx, activity)) {
            watchdog::Expiry::Waiting if conn.is_idle() => Poll::Ready(Served::Idle),
            watchdog::Expiry::Waiting => Poll::Pending,
            watchdog::Expiry::HeadTimeout => Poll::Ready(Served::TimedOut),
            watchdog::Expiry::ClientLeft => {
                tracing::debug!("client left while its request was in flight");
                Poll::Ready(Served::ClientLeft)
            }
            watchdog::Expiry::Stalled => {
                tracing::debug!("client took nothing of its answer for stream_idle_timeout");
                Poll::Ready(Served::ClientLeft)
            }
        }
    })
}

/// How long a connection that has not shown its protocol (or finished its TLS handshake) when
/// the shutdown begins may still do so, and have its request served.
const LAST_CALL: Duration = Duration::from_millis(250);

/// The HTTP/2 connection preface (RFC 9113 §3.4), with which an h2c client opens.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The proxy's connection builders, made from the `[server]` settings (again when a reload
/// changes them). A cleartext connection goes to hyper's HTTP/1 or HTTP/2 server directly once
/// its first bytes (peeked, not read) tell which it speaks, so no replay buffer sits under
/// every later read; a TLS connection goes where ALPN says.
struct Builders {
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<watchdog::StreamExecutor>,
    /// How long a new connection may stay silent (or take for its TLS handshake), and an
    /// HTTP/1 request head may take ([`watchdog`] keeps it; hyper's own would cost a timer
    /// per request).
    header_read_timeout: Duration,
    /// Present when the listener speaks TLS.
    tls: Option<TlsAcceptor>,
    /// The settings these were made from.
    server: ServerConfig,
}

impl Builders {
    fn new(cfg: &ServerConfig, shared: &Shared) -> Builders {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .max_headers(cfg.max_headers)
            .max_header_size(MAX_HEAD_BYTES)
            .max_buf_size(MAX_HEAD_BYTES)
            // One buffer, one `write`: see `pool::ConnPool::connect`.
            .writev(false)
            // No read on every poll to notice a client that leaves mid-request: the
            // connection's timer looks for that (`watchdog`). A client that half-closes
            // while its request is in flight is still taken as gone, as hyper would.
            .half_close(true);
        let streams = watchdog::StreamExecutor::new(cfg.stream_idle_timeout, shared.metrics.client_aborts.clone());
        let mut http2 = hyper::server::conn::http2::Builder::new(streams);
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(cfg.h2_max_concurrent_streams)
            .max_header_list_size(MAX_HEAD_BYTES as u32);
        Builders {
            http1,
            http2,
            header_read_timeout: cfg.header_read_timeout,
            tls: cfg.tls.as_ref().map(|t| TlsAcceptor::from(t.server.clone())),
            server: cfg.clone(),
        }
    }
}

/// The largest request head (HTTP/1 buffer, HTTP/2 header list): 64 KiB, then 431.
const MAX_HEAD_BYTES: usize = 64 * 1024;

enum Protocol {
    Http1,
    Http2,
}

/// How soon [`sniff`] looks again at a connection whose first bytes were too few to tell.
const SNIFF_AGAIN: Duration = Duration::from_millis(2);

/// Which protocol a new connection speaks, from its first bytes. `None`: it closed, failed,
/// or did not send enough to tell within `timeout`.
async fn sniff(stream: &TcpStream, timeout: Duration) -> Option<Protocol> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut first = [0u8; H2_PREFACE.len()];
    let mut read_closed = false;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return None,
        };
        match &first[..n] {
            seen if seen == H2_PREFACE => return Some(Protocol::Http2),
            seen if !H2_PREFACE.starts_with(seen) => return Some(Protocol::Http1),
            // Too short to tell, and no more is coming.
            _ if read_closed => return None,
            // A first segment that begins the preface but is too short to tell ("P" could also
            // begin a POST; clients rarely split it): look again shortly. Waiting on readiness
            // would mean clearing what the peek left set, and bytes that came between the peek
            // and the clearing would then go unseen, by this wait and by hyper's first read. A
            // client's FIN: one more look, and no more waiting.
            _ => {
                use futures_util::FutureExt;
                let ready = stream.ready(Interest::READABLE).now_or_never();
                read_closed = matches!(ready, Some(Ok(r)) if r.is_read_closed());
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return None;
                }
                tokio::time::sleep_until((now + SNIFF_AGAIN).min(deadline)).await;
            }
        }
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
pub async fn serve_admin(shared: Arc<Shared>, listener: TcpListener, stop: Arc<Shutdown>) {
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
        let shared = shared.clone();
        let service = service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(admin::handle(&shared, req, loopback).await) }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A connection's task is held for the connection's whole life, idle or not, so its size
    /// is memory per connection: the largest of its states. It was 1,784 bytes while two
    /// `async fn`s kept their argument twice (the hyper connection, the protocol sniff), 1,064
    /// with hyper's HTTP/1 connection (~700 bytes) in it, and is 368 with that boxed (it is
    /// dropped while the connection is parked), the protocol sniff boxed (it is over once the
    /// connection is served) and nothing held twice. Up to 408 bytes, tokio's task (the
    /// future, its header and trailer, 128-byte aligned) takes 512 bytes; more, 640, the size
    /// of hyper's connection box: tasks and boxes then share the allocator's pages, and a parked
    /// connection's freed box stays resident between live tasks (BENCHMARKS.md, session 13).
    #[tokio::test]
    async fn a_connection_task_holds_each_state_once() {
        let text = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n";
        let config = Config::parse(std::path::Path::new("test.toml"), text).expect("a valid config");
        let shared = Shared::new(config, None);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let permit = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().unwrap();
        let conn = Connection {
            builders: Arc::new(Builders::new(&shared.snapshot().config.server, &shared)),
            shutdown: Arc::new(Shutdown::default()),
            activity: Arc::new(watchdog::Activity::default()),
            peer: stream.local_addr().unwrap(),
            open: OpenConnection::new(&shared, permit),
            shared,
        };
        let task = conn.serve(stream);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 408, "a connection's task takes {size} bytes");
    }

    /// At the shutdown, a connection between requests whose client has just sent its next one
    /// reads and serves it before it closes; one whose client sent nothing closes at once.
    /// The request is in the socket but tokio's reactor (which turns only when this test
    /// awaits) has not seen it, as under load a shutdown often wakes a connection first: shut
    /// down then, hyper would close the connection with the request unread.
    #[tokio::test(flavor = "current_thread")]
    async fn at_the_shutdown_a_request_in_the_socket_is_served_first() {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for sends in [false, true] {
            let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let fd = server.as_raw_fd();
            let (shutdown, activity) = (Shutdown::default(), Arc::new(watchdog::Activity::default()));
            let mut timer = watchdog::Watchdog::new(Duration::from_secs(60), Some(fd), Duration::from_secs(60));
            let counts = activity.clone();
            let answer = service_fn(move |_: Request<Incoming>| {
                let done = counts.start();
                async move {
                    drop(done);
                    Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from_static(b"ok"))))
                }
            });
            let http1 = hyper::server::conn::http1::Builder::new();
            let mut conn = Box::pin(http1.serve_connection(TokioIo::new(server), answer));
            let ended = {
                let mut served = pin!(serve(conn.as_mut(), &shutdown, &activity, &mut timer));
                // hyper reads, finds nothing, and waits between requests.
                assert!(served.as_mut().poll(&mut cx).is_pending());
                if sends {
                    client
                        .write_all(b"POST /mcp HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}")
                        .unwrap();
                    // SAFETY: the socket is open: `conn` owns it.
                    watchdog::spin_until_sent(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
                }
                shutdown.start();
                let first = served.as_mut().poll(&mut cx);
                match sends {
                    false => first,
                    true => {
                        assert!(first.is_pending(), "held for the request in its socket");
                        // Bounded, and a timeout's firing would poll it once more: shut down
                        // only then, it took the whole 10 s.
                        let waiting = std::time::Instant::now();
                        let ended = tokio::time::timeout(Duration::from_secs(10), served).await;
                        assert!(waiting.elapsed() < Duration::from_secs(5), "{:?}", waiting.elapsed());
                        ended.map(Poll::Ready).expect("served, then shut down")
                    }
                }
            };
            assert!(matches!(ended, Poll::Ready(Served::Ended(Ok(())))), "sends: {sends}");
            drop(conn);
            let mut answer = String::new();
            client.read_to_string(&mut answer).unwrap();
            match sends {
                false => assert_eq!(answer, "", "closed without a word"),
                true => {
                    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
                    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
                }
            }
            assert_eq!(activity.started(), u64::from(sends));
        }
    }
}
