//! A client connection of the proxy listener, served to its end: its protocol told (by its
//! first bytes, or ALPN under TLS), then hyper's HTTP/1 or HTTP/2 server, with the
//! connection's watchdog; an HTTP/1 connection that waits between requests parked.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncWrite, Interest};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use super::serve::{serve, Served};
use super::shutdown::Shutdown;
use super::{park, proxy_protocol, watchdog};
use crate::body::ProxyBody;
use crate::config::{Cidr, ServerConfig};
use crate::state::Shared;
use crate::{proxy, tls};

/// An accepted proxy connection, with what serving it needs.
pub(super) struct Connection {
    pub(super) shared: Arc<Shared>,
    pub(super) builders: Arc<Builders>,
    pub(super) shutdown: Arc<Shutdown>,
    pub(super) activity: Arc<watchdog::Activity>,
    pub(super) peer: SocketAddr,
    pub(super) open: OpenConnection,
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
    pub(super) fn serve(mut self, mut stream: TcpStream) -> impl Future<Output = ()> + Send {
        async move {
            let timeout = self.builders.header_read_timeout;
            if self.builders.server.proxy_protocol {
                let client = {
                    let header = Box::pin(self.proxy_header(&mut stream, timeout));
                    self.until_shutdown(pin!(header)).await.flatten()
                };
                match client {
                    Some(client) => self.peer = client,
                    None => return,
                }
            }
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

    /// With `server.proxy_protocol` on: the client's address, once a PROXY protocol header from
    /// a `proxy_protocol_from` peer has been read off `stream` (the peer itself for a header
    /// that names no client: a balancer's own health check), or the peer for a connection from
    /// anyone else that starts without one (left unread). `None`: the connection is to be closed
    /// without an answer: a trusted peer without a header or with a broken one, a header from a
    /// peer that is not trusted (it would be the client's own claim), or nothing to tell by
    /// within `timeout`.
    async fn proxy_header(&self, stream: &mut TcpStream, timeout: Duration) -> Option<SocketAddr> {
        use tokio::io::AsyncReadExt;
        let trusted = Cidr::any_contains(&self.builders.server.proxy_protocol_from, self.peer.ip());
        let (header, consumed) = match peek_proxy_header(stream, timeout).await {
            Ok(Some(found)) if trusted => found,
            Ok(None) if !trusted => return Some(self.peer),
            found => {
                let why = match found {
                    Ok(Some(_)) => "a PROXY protocol header from a peer not in server.proxy_protocol_from",
                    Ok(None) => "no PROXY protocol header from a server.proxy_protocol_from peer",
                    Err(why) => why,
                };
                tracing::debug!(peer = %self.peer, why, "connection closed without an answer");
                return None;
            }
        };
        // Peeked already: the bytes are there, and read now so TLS and HTTP start after them.
        let mut skip = [0u8; proxy_protocol::V2_MAX];
        stream.read_exact(&mut skip[..consumed]).await.ok()?;
        Some(header.source.unwrap_or(self.peer))
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

    /// The connection's service: each request to [`proxy::serve`], counted in its activity;
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
        // The connection's share of the body budget, as the config says when it opened; its
        // activity holds (HTTP/1.1) the one timer its requests' upstream deadlines share.
        let share = Some(Arc::new(proxy::ConnectionShare::new(
            shared.snapshot().config.connection_body_share(),
        )));
        service_fn(move |req| {
            let done = activity.start();
            let timer = (!h2).then(|| activity.clone());
            // Small: `proxy::serve` boxes the large part of the request's future itself.
            let answer = proxy::serve(shared.clone(), req, peer_ip.clone(), tls, share.clone(), timer);
            async move {
                // First polled inside the stream's task (HTTP/2), where its polls are found.
                let stream = if h2 { watchdog::stream_polls() } else { None };
                Ok::<_, Infallible>(answer.await.map(|body| watchdog::Tracked::new(body, done, stream)))
            }
        })
    }
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
pub(super) struct Builders {
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<watchdog::StreamExecutor>,
    /// How long a new connection may stay silent (or take for its TLS handshake), and an
    /// HTTP/1 request head may take ([`watchdog`] keeps it; hyper's own would cost a timer
    /// per request).
    header_read_timeout: Duration,
    /// Present when the listener speaks TLS.
    tls: Option<TlsAcceptor>,
    /// The settings these were made from.
    pub(super) server: ServerConfig,
}

impl Builders {
    pub(super) fn new(cfg: &ServerConfig, shared: &Shared) -> Builders {
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
        // A client cannot make the router buffer what it has not agreed to: what it may send
        // unread on the connection is within the connection's share of the body budget
        // (`Config::connection_body_share`), each stream a quarter of hyper's 1 MiB at most when
        // `[quotas]` sets the share (Envoy's edge guidance: small windows, a buffer limit).
        let config = &shared.snapshot().config;
        let tightened = config
            .quotas
            .as_ref()
            .is_some_and(|q| q.max_body_bytes_per_connection.is_some());
        let window = u32::try_from(config.connection_body_share()).unwrap_or(u32::MAX);
        if tightened || window < 1 << 20 {
            let window = window.min(1 << 20);
            http2
                .initial_connection_window_size(window)
                .initial_stream_window_size(window.min(256 << 10));
        }
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
pub(super) const MAX_HEAD_BYTES: usize = 64 * 1024;

enum Protocol {
    Http1,
    Http2,
}

/// A PROXY protocol header at the start of `stream`, peeked (not read), with its length;
/// `Ok(None)`: the connection starts with something else. Waits for more while the bytes are
/// too few to tell ([`peek_until`]), until `timeout`.
async fn peek_proxy_header(
    stream: &TcpStream,
    timeout: Duration,
) -> Result<Option<(proxy_protocol::Header, usize)>, &'static str> {
    let mut first = [0u8; proxy_protocol::V2_MAX];
    let told = peek_until(stream, &mut first, timeout, |seen| match proxy_protocol::parse(seen) {
        Ok(found) => Some(Ok(found)),
        Err(proxy_protocol::Error::Invalid(why)) => Some(Err(why)),
        Err(proxy_protocol::Error::Incomplete) => None,
    });
    match told.await {
        Ok(found) => found,
        Err(Untold::Closed(0)) => Err("closed before its first bytes"),
        Err(Untold::Closed(_)) => Err("closed within its PROXY protocol header"),
        Err(Untold::TimedOut(0)) => Err("no PROXY protocol header, nor anything else, within header_read_timeout"),
        Err(Untold::TimedOut(_)) => Err("an incomplete PROXY protocol header at header_read_timeout"),
    }
}

/// Which protocol a new connection speaks, from its first bytes. `None`: it closed, failed,
/// or did not send enough to tell within `timeout`.
async fn sniff(stream: &TcpStream, timeout: Duration) -> Option<Protocol> {
    let mut first = [0u8; H2_PREFACE.len()];
    let told = peek_until(stream, &mut first, timeout, |seen| match seen {
        seen if seen == H2_PREFACE => Some(Protocol::Http2),
        seen if !H2_PREFACE.starts_with(seen) => Some(Protocol::Http1),
        // A first segment that begins the preface but is too short to tell: "P" could also
        // begin a POST (clients rarely split it).
        _ => None,
    });
    told.await.ok()
}

/// Why [`peek_until`] could not tell, with how many bytes it had seen.
enum Untold {
    /// The client closed its end (or the socket failed): no more bytes are coming.
    Closed(usize),
    /// The timeout came first.
    TimedOut(usize),
}

/// Peeks (reads nothing) at `stream`'s first bytes, up to `buf`'s length, until `tell` decides
/// from them, and returns what it decided; while they are too few, waits for more, or for the
/// client's end of stream, until `timeout`.
///
/// The wait is on readiness, so a connection that stalls in its first bytes costs what a
/// silent one does (looking again every 2 ms, 300 of them kept a core busy). A peek leaves the
/// socket readable, so a peek that finds no more bytes than the last is turned into
/// `WouldBlock`, for `try_io` to clear the readiness; tokio clears it only if no event came
/// since `ready` returned it (its readiness has a tick), and each new segment, and the FIN,
/// is a new event (edge-triggered), so bytes that come between the peek and the clearing still
/// wake the wait.
async fn peek_until<T>(
    stream: &TcpStream,
    buf: &mut [u8],
    timeout: Duration,
    mut tell: impl FnMut(&[u8]) -> Option<T>,
) -> Result<T, Untold> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = 0;
    loop {
        let ready = match tokio::time::timeout_at(deadline, stream.ready(Interest::READABLE)).await {
            Ok(Ok(ready)) => ready,
            Ok(Err(_)) => return Err(Untold::Closed(seen)),
            Err(_) => return Err(Untold::TimedOut(seen)),
        };
        let more = stream.try_io(Interest::READABLE, || match peek(stream, buf)? {
            n if n > seen => Ok(n),
            _ => Err(io::ErrorKind::WouldBlock.into()),
        });
        match more {
            Ok(n) => {
                seen = n;
                if let Some(told) = tell(&buf[..n]) {
                    return Ok(told);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(Untold::Closed(seen)),
        }
        // The FIN comes after every byte the client sent, so the peek after `ready` saw it
        // saw them all: still too few to tell, and no more are coming.
        if ready.is_read_closed() {
            return Err(Untold::Closed(seen));
        }
    }
}

/// What `stream` holds now, peeked into `buf`, without waiting (tokio's sockets are
/// non-blocking): `WouldBlock` if nothing, `Ok(0)` at the client's end of stream.
fn peek(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `u8` and `MaybeUninit<u8>` have one layout, and `recv` writes only initialised
    // bytes, so `buf` stays initialised.
    let buf = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
    socket2::SockRef::from(stream).peek(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use tokio::net::TcpListener;

    /// A connection's task is held for the connection's whole life, idle or not, so its size
    /// is memory per connection: the largest of its states. It was 1,784 bytes while two
    /// `async fn`s kept their argument twice (the hyper connection, the protocol sniff), 1,064
    /// with hyper's HTTP/1 connection (~700 bytes) in it, and is 368 with that boxed (it is
    /// dropped while the connection is parked), the protocol sniff boxed (it is over once the
    /// connection is served) and nothing held twice. Up to 408 bytes, tokio's task (the
    /// future, its header and trailer, 128-byte aligned) takes 512 bytes; more, 640, the size
    /// of hyper's connection box: tasks and boxes then share the allocator's pages, and a parked
    /// connection's freed box stays resident between live tasks (bench/FINDINGS.md).
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
}
