//! Upstream connections: each backend's keep-alive pool of HTTP/1.1 connections (plain TCP or
//! TLS), each one driven by the request that holds it, so a proxied request costs no task hop
//! and no per-request spawn; and the one type a request holds whichever way it goes
//! ([`PooledConn`]: such a connection, or a stream of an HTTP/2 connection, see `h2`).
//!
//! hyper splits a client connection in two: the `SendRequest` handle and the `Connection`
//! state machine that does the socket I/O. hyper-util's client runs every `Connection` in a
//! task of its own and talks to it through channels. Here the request that holds a connection
//! polls its state machine itself ([`PooledConn::send`] for the answer's head, [`DrivenBody`]
//! for its body). An idle connection in the pool is polled by nobody; it is checked (one poll,
//! nobody to wake) when it is put back, and when it is taken out after a while idle.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::exchange::{BoxError, SendError, UpstreamBody};
use super::h2::{H2Body, H2Lease, H2Pool};
use super::slots::{ConnSlots, Slot, SlotGauges, Wait};
use super::tls::{ConnectError, Stream};
use crate::config::defaults;

/// Where a backend's connections go: its URL's host and port, as a socket address needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// A name or an IP literal; IPv6 without the brackets the URL writes around it.
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn of(authority: &Authority) -> Endpoint {
        // `Authority::host` keeps an IPv6 literal's brackets, which no resolver takes.
        let host = authority.host();
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        Endpoint {
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
        }
    }

    /// A TCP connection to it, within [`defaults::CONNECT_TIMEOUT`].
    pub async fn connect(&self) -> io::Result<TcpStream> {
        tokio::time::timeout(
            defaults::CONNECT_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }
}

type Driver = Pin<Box<http1::Connection<TokioIo<Stream>, UpstreamBody>>>;

/// How long a connection may have been idle and still be taken without a check: a backend that
/// closes keep-alive connections does so after seconds, not within the moment between two
/// requests; the check costs a poll of the connection's state machine (~700 instructions).
const CHECK_AFTER_IDLE: Duration = Duration::from_millis(250);

/// One HTTP/1.1 connection to a backend.
struct Conn {
    sender: http1::SendRequest<UpstreamBody>,
    /// The socket I/O; `None` once the connection has ended.
    driver: Option<Driver>,
    /// Its share of `max_connections_per_backend`, given back when it is dropped.
    _slot: Slot,
}

impl Conn {
    fn poll_driver(&mut self, cx: &mut Context<'_>) {
        if let Some(driver) = &mut self.driver {
            if let Poll::Ready(result) = driver.as_mut().poll(cx) {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
                self.driver = None;
            }
        }
    }

    /// Lets the connection take in what happened while nobody polled it (the end of the last
    /// answer, or the backend closing it); true if it can carry a request now.
    fn settle(&mut self) -> bool {
        self.poll_driver(&mut Context::from_waker(Waker::noop()));
        self.driver.is_some() && self.sender.is_ready()
    }
}

/// The idle keep-alive connections to one backend, most recently used last.
pub struct ConnPool {
    idle: parking_lot::Mutex<Vec<(Conn, Instant)>>,
    /// `[upstream] idle_timeout` in nanoseconds: a connection idle this long is closed, not used.
    max_idle_nanos: std::sync::atomic::AtomicU64,
    /// `mrtr_upstream_connections_opened_total` for this backend.
    opened: Option<prometheus::IntCounter>,
    /// The cap on open connections, and the requests waiting under it.
    pub slots: Arc<ConnSlots>,
    /// `[upstream] queue_timeout` in nanoseconds.
    queue_nanos: std::sync::atomic::AtomicU64,
}

/// Room for one more request on a backend's HTTP/1.1 connections.
pub enum Room {
    /// An idle connection, put back while the request waited.
    Idle(PooledConn),
    /// A slot to open a connection with.
    Slot(Slot),
    /// The backend stayed at its cap for `queue_timeout`.
    Busy,
}

impl ConnPool {
    pub fn new(opened: Option<prometheus::IntCounter>, gauges: Option<SlotGauges>) -> Arc<ConnPool> {
        Arc::new(ConnPool {
            idle: parking_lot::Mutex::new(Vec::new()),
            max_idle_nanos: std::sync::atomic::AtomicU64::new(defaults::UPSTREAM_IDLE_TIMEOUT.as_nanos() as u64),
            opened,
            slots: ConnSlots::new(gauges),
            queue_nanos: std::sync::atomic::AtomicU64::new(defaults::UPSTREAM_QUEUE_TIMEOUT.as_nanos() as u64),
        })
    }

    /// Sets `[upstream] max_connections_per_backend` and `queue_timeout`.
    pub fn set_limits(&self, max_connections: usize, queue_timeout: Duration) {
        self.slots.set_limit(max_connections);
        let nanos = u64::try_from(queue_timeout.as_nanos()).unwrap_or(u64::MAX);
        self.queue_nanos.store(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    /// Room for a request that found no idle connection: a slot under the cap at once, else
    /// whichever comes first within `queue_timeout` — a freed slot or a connection put back.
    pub async fn room(self: &Arc<Self>) -> Room {
        if let Some(slot) = self.slots.try_take() {
            return Room::Slot(slot);
        }
        self.wait_for_room().await
    }

    /// The cold half of [`ConnPool::room`].
    async fn wait_for_room(self: &Arc<Self>) -> Room {
        let patience = Duration::from_nanos(self.queue_nanos.load(std::sync::atomic::Ordering::Relaxed));
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match self.slots.wait(deadline, || !self.idle.lock().is_empty()).await {
                Wait::Slot(slot) => return Room::Slot(slot),
                Wait::Busy => return Room::Busy,
                Wait::Retry => {
                    if let Some(conn) = self.checkout() {
                        return Room::Idle(conn);
                    }
                }
            }
        }
    }

    /// Sets `[upstream] idle_timeout`.
    pub fn set_max_idle(&self, max_idle: Duration) {
        let nanos = u64::try_from(max_idle.as_nanos()).unwrap_or(u64::MAX);
        self.max_idle_nanos.store(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn max_idle(&self) -> Duration {
        Duration::from_nanos(self.max_idle_nanos.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// An idle connection that is still open, if there is one. One idle past `idle_timeout` is
    /// closed (and with it every other: they have idled longer). One idle for a while is checked
    /// first (the backend may have closed it); a recently released one is not: the request's
    /// first poll of the connection (in [`PooledConn::send`]) takes in a close all the same, and
    /// hands back the request unsent, to go on a new connection.
    pub fn checkout(self: &Arc<Self>) -> Option<PooledConn> {
        loop {
            let (mut conn, since) = self.idle.lock().pop()?;
            let idle = since.elapsed();
            if idle.as_nanos() >= u128::from(self.max_idle_nanos.load(std::sync::atomic::Ordering::Relaxed)) {
                // Closed outside the lock.
                let expired = std::mem::take(&mut *self.idle.lock());
                drop((conn, expired));
                return None;
            }
            if idle < CHECK_AFTER_IDLE || conn.settle() {
                return Some(self.hold(conn, true));
            }
        }
    }

    /// Opens a new connection over `stream` (TCP, or TLS over it), taking `slot`.
    pub async fn connect(self: &Arc<Self>, stream: Stream, slot: Slot) -> Result<PooledConn, ConnectError> {
        // Head and body copied into one buffer and written with one `write`: for MCP's small
        // bodies cheaper than queueing both for `writev`.
        let (sender, driver) = http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ConnectError::connect(io::Error::other(e)))?;
        if let Some(c) = &self.opened {
            c.inc();
        }
        let conn = Conn {
            sender,
            driver: Some(Box::pin(driver)),
            _slot: slot,
        };
        Ok(self.hold(conn, false))
    }

    fn hold(self: &Arc<Self>, conn: Conn, reused: bool) -> PooledConn {
        PooledConn {
            held: Held::Http1 {
                conn: Some(conn),
                pool: self.clone(),
            },
            reused,
        }
    }

    fn release(&self, mut conn: Conn) {
        // One opened beyond the cap (for a health check, or before a reload lowered it) is
        // closed rather than kept: the pool never holds more than the cap allows, so the cap
        // bounds the idle list too.
        if !conn.settle() || self.slots.over_limit() {
            return;
        }
        self.idle.lock().push((conn, Instant::now()));
        self.slots.connection_released();
    }

    /// Closes connections idle for longer than `max_idle`, and lets go of those the backend
    /// closed meanwhile (nobody polls an idle connection, so its socket would otherwise wait
    /// in CLOSE_WAIT until it is taken or expires).
    pub fn evict_idle(&self, max_idle: Duration) {
        let now = Instant::now();
        self.idle
            .lock()
            .retain_mut(|(conn, since)| now.duration_since(*since) < max_idle && conn.settle());
    }

    pub fn idle_len(&self) -> usize {
        self.idle.lock().len()
    }
}

/// A connection taken from a pool; it goes back when dropped if it can carry another request.
/// Or a stream of an HTTP/2 connection, given back when dropped.
pub struct PooledConn {
    held: Held,
    /// Taken from the pool rather than opened for this request.
    pub reused: bool,
}

enum Held {
    Http1 { conn: Option<Conn>, pool: Arc<ConnPool> },
    Http2(H2Lease, Arc<H2Pool>),
}

impl PooledConn {
    pub fn http2(lease: H2Lease, pool: &Arc<H2Pool>, reused: bool) -> PooledConn {
        PooledConn {
            held: Held::Http2(lease, pool.clone()),
            reused,
        }
    }
}

impl PooledConn {
    /// Hands `req` to the connection now (it is written when the returned future is first
    /// polled) and returns the wait for the answer's head, which drives the connection. The
    /// answer's body keeps the connection, drives it as it is read, and puts it back at its
    /// end. A future of its own, not an `async` block: hyper's wait (which can hand the request
    /// back, so it is hundreds of bytes) is then made in place and moved once, by the caller.
    pub fn send(
        mut self,
        req: Request<UpstreamBody>,
    ) -> Sent<impl Future<Output = Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<UpstreamBody>>>>>
    {
        match &mut self.held {
            Held::Http1 { conn, .. } => {
                let answer = conn.as_mut().expect("held until dropped").sender.try_send_request(req);
                Sent::Http1 {
                    conn: Some(self),
                    answer,
                }
            }
            Held::Http2(..) => Sent::Http2 {
                answer: self.send_http2(req),
            },
        }
    }

    /// Boxed: kept out of the HTTP/1.1 request's future.
    fn send_http2(
        self,
        req: Request<UpstreamBody>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<DrivenBody>, SendError>> + Send>> {
        Box::pin(async move {
            let Held::Http2(lease, pool) = &self.held else {
                unreachable!("an HTTP/2 stream")
            };
            let resp = lease.send(pool, req).await?;
            Ok(resp.map(|inner| DrivenBody {
                inner: Inner::Http2(inner),
                conn: self,
            }))
        })
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if let Held::Http1 { conn, pool } = &mut self.held {
            if let Some(conn) = conn.take() {
                pool.release(conn);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The wait for an answer's head ([`PooledConn::send`]).
    #[project = SentProj]
    pub enum Sent<F> {
        /// On an HTTP/1.1 connection, which it drives while it waits.
        Http1 { conn: Option<PooledConn>, #[pin] answer: F },
        /// On an HTTP/2 stream (boxed: kept out of the HTTP/1.1 request's future).
        Http2 { answer: Pin<Box<dyn Future<Output = Result<Response<DrivenBody>, SendError>> + Send>> },
    }
}

impl<F> Future for Sent<F>
where
    F: Future<Output = Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<UpstreamBody>>>>,
{
    type Output = Result<Response<DrivenBody>, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (conn, answer) = match self.project() {
            SentProj::Http1 { conn, answer } => (conn, answer),
            SentProj::Http2 { answer } => return answer.as_mut().poll(cx),
        };
        let pooled = conn.as_mut().expect("polled after it was ready");
        let Held::Http1 { conn: Some(driven), .. } = &mut pooled.held else {
            unreachable!("an HTTP/1.1 connection, held until dropped")
        };
        // The driver first: it writes the request, and reads the answer that completes `answer`.
        driven.poll_driver(cx);
        let result = std::task::ready!(answer.poll(cx));
        let pooled = conn.take().expect("polled after it was ready");
        Poll::Ready(match result {
            Ok(resp) => Ok(resp.map(|inner| DrivenBody {
                inner: Inner::Http1(inner),
                conn: pooled,
            })),
            Err(mut e) => match e.take_message() {
                Some(req) => Err(SendError::Unsent(Box::new(req), e.into_error().into())),
                None => Err(SendError::Failed(e.into_error().into())),
            },
        })
    }
}

/// An answer's body from a pooled connection: reading it drives the connection. Or the body
/// of an HTTP/2 stream, whose connection its own task drives.
pub struct DrivenBody {
    inner: Inner,
    conn: PooledConn,
}

enum Inner {
    Http1(Incoming),
    Http2(H2Body),
}

impl Body for DrivenBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let inner = match &mut this.inner {
            Inner::Http1(inner) => inner,
            Inner::Http2(inner) => return Pin::new(inner).poll_frame(cx).map_err(Into::into),
        };
        // What the connection has read already is taken without polling it: a small answer
        // usually came whole with its head, and a poll of the connection's state machine
        // (with a read attempt that finds nothing) costs hundreds of instructions.
        if let Poll::Ready(frame) = Pin::new(&mut *inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Held::Http1 { conn: Some(conn), .. } = &mut this.conn.held {
            conn.poll_driver(cx);
        }
        Pin::new(inner).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Http1(inner) => inner.is_end_stream(),
            Inner::Http2(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Http1(inner) => inner.size_hint(),
            Inner::Http2(inner) => inner.size_hint(),
        }
    }
}
