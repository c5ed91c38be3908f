//! HTTP/2 to backends (`http2 = true`): a few multiplexed connections per backend, each run by
//! the `h2` crate in a task of its own (HTTP/2 multiplexes many requests over one connection,
//! so no single request can drive it, as the HTTP/1.1 pool's requests do).
//!
//! A request takes a stream on the first open connection with room: fewer streams in flight
//! than the backend's `SETTINGS_MAX_CONCURRENT_STREAMS`. A new connection is opened only when
//! every open one is full, by one request at a time (the others wait and take its room). The
//! backend's SETTINGS and GOAWAY frames are also followed as the connection reads them
//! ([`Observed`]): a new connection is used once the backend's SETTINGS came, and one that got
//! a GOAWAY takes no new request (those in flight on it finish). A request the backend never
//! processed comes back as [`SendError::Refused`] with a copy, to be sent once more: refused
//! with `REFUSED_STREAM`, or failed by a GOAWAY whose last stream id is below the request's
//! (RFC 9113 §8.7). The `h2` crate is used directly, not through hyper, for that: hyper's
//! error for a request failed by a GOAWAY does not say whether its stream went out.
//!
//! This file is the pool, the lease a request holds and the answer's body; what the backend's
//! frames say, read on their way in, is `watch`.

mod watch;

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full};

use super::exchange::{SendError, UpstreamBody};
use super::request_body::ClientBody;
use super::tls::{ConnectError, Stream};
use crate::config::defaults;
use watch::{Observed, Watch};

/// Receive windows: a stream may bring 1 MiB before the router reads it, a connection 4 MiB.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 4 << 20;

/// The HTTP/2 connections to one backend.
pub struct H2Pool {
    conns: parking_lot::Mutex<Vec<Arc<H2Conn>>>,
    /// Held by the one request opening a connection.
    opening: tokio::sync::Mutex<()>,
    /// `:scheme` and `:authority` of every request.
    scheme: Scheme,
    authority: Authority,
    /// `mrtr_upstream_connections_opened_total` for this backend.
    opened: Option<prometheus::IntCounter>,
}

struct H2Conn {
    sender: h2::client::SendRequest<Bytes>,
    watch: Arc<Watch>,
    /// Streams taken and not yet given back (the answer's body ended or was dropped).
    inflight: AtomicU32,
    /// Since when no stream is in flight.
    idle_since: parking_lot::Mutex<Instant>,
}

impl H2Conn {
    /// Open, and no GOAWAY received.
    fn usable(&self) -> bool {
        self.watch.usable()
    }

    /// Fewer streams in flight than the backend allows. Its SETTINGS are seen here as they are
    /// read, a moment before h2 applies them: the lower of the two is the limit either way.
    fn has_room(&self) -> bool {
        let applied = u32::try_from(self.sender.current_max_send_streams()).unwrap_or(u32::MAX);
        let max = applied.min(self.watch.max_streams());
        self.inflight.load(Ordering::Acquire) < max
    }

    fn idle_for(&self, now: Instant) -> Option<Duration> {
        (self.inflight.load(Ordering::Acquire) == 0).then(|| now.saturating_duration_since(*self.idle_since.lock()))
    }
}

impl H2Pool {
    pub fn new(scheme: Scheme, authority: Authority, opened: Option<prometheus::IntCounter>) -> Arc<H2Pool> {
        Arc::new(H2Pool {
            conns: parking_lot::Mutex::new(Vec::new()),
            opening: tokio::sync::Mutex::new(()),
            scheme,
            authority,
            opened,
        })
    }

    /// A stream on an open connection with room, if there is one. Lets go of connections that
    /// ended, got a GOAWAY, or idled past `max_idle`, once nothing is in flight on them.
    pub fn checkout(&self, max_idle: Duration) -> Option<H2Lease> {
        let now = Instant::now();
        let mut conns = self.conns.lock();
        conns.retain(|c| match c.idle_for(now) {
            Some(idle) => c.usable() && idle < max_idle,
            None => true,
        });
        let conn = conns.iter().find(|c| c.usable() && c.has_room())?;
        conn.inflight.fetch_add(1, Ordering::AcqRel);
        Some(H2Lease { conn: conn.clone() })
    }

    /// A stream on a new connection over what `open` opens, unless a request that opened one
    /// meanwhile left room on it.
    pub async fn connect(
        self: &Arc<Self>,
        open: impl Future<Output = Result<Stream, ConnectError>>,
        max_idle: Duration,
    ) -> Result<H2Lease, ConnectError> {
        let _one_at_a_time = self.opening.lock().await;
        if let Some(lease) = self.checkout(max_idle) {
            return Ok(lease);
        }
        let stream = open.await?;
        let watch = Arc::new(Watch::default());
        let io = Observed::new(stream, watch.clone());
        let (sender, conn) = h2::client::Builder::new()
            .initial_max_send_streams(defaults::H2_INITIAL_MAX_STREAMS as usize)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| watch.connect_error(&e))?;
        let ended = watch.clone();
        tokio::spawn(async move {
            let result = conn.await;
            if let Err(e) = &result {
                tracing::debug!(error = %super::tls::Chain(e), "upstream HTTP/2 connection ended");
            }
            ended.end(result.as_ref().err());
        });
        // The backend's limit is known before the connection takes a request.
        match tokio::time::timeout(defaults::CONNECT_TIMEOUT, watch.settings()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(ConnectError::connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 SETTINGS from the backend",
                )))
            }
        }
        if let Some(c) = &self.opened {
            c.inc();
        }
        let conn = Arc::new(H2Conn {
            sender,
            watch,
            inflight: AtomicU32::new(1),
            idle_since: parking_lot::Mutex::new(Instant::now()),
        });
        self.conns.lock().push(conn.clone());
        Ok(H2Lease { conn })
    }

    /// Lets go of idle connections past `max_idle`, and of those that ended or were told to go
    /// away, once nothing is in flight on them.
    pub fn evict_idle(&self, max_idle: Duration) {
        let now = Instant::now();
        self.conns.lock().retain(|c| match c.idle_for(now) {
            Some(idle) => c.usable() && idle < max_idle,
            None => true,
        });
    }

    /// The request's head for HTTP/2: the absolute URI gives `:scheme` and `:authority`, which
    /// stand for `Host`.
    fn head(&self, parts: http::request::Parts) -> Request<()> {
        let mut head = Request::from_parts(parts, ());
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(self.authority.clone());
        uri.path_and_query = head.uri().path_and_query().cloned();
        if let Ok(uri) = Uri::from_parts(uri) {
            *head.uri_mut() = uri;
        }
        head.headers_mut().remove(http::header::HOST);
        *head.version_mut() = Version::HTTP_2;
        head
    }
}

/// A stream taken on a connection: given back when dropped (with the answer's body).
pub struct H2Lease {
    conn: Arc<H2Conn>,
}

impl Drop for H2Lease {
    fn drop(&mut self) {
        if self.conn.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.conn.idle_since.lock() = Instant::now();
        }
    }
}

impl H2Lease {
    /// Sends `req` on a new stream of this connection and waits for the answer's head.
    pub async fn send(&self, pool: &H2Pool, req: Request<UpstreamBody>) -> Result<Response<H2Body>, SendError> {
        let (parts, body) = req.into_parts();
        let head = pool.head(parts);
        // A buffered body is kept to send again; a streamed one cannot be read twice.
        let (data, streamed) = match body {
            Either::Left(full) => (Some(bytes_of(full)), None),
            Either::Right(incoming) => (None, Some(incoming)),
        };
        let again = |body: UpstreamBody| {
            let mut req = Request::new(body);
            *req.method_mut() = head.method().clone();
            *req.uri_mut() = head.uri().clone();
            *req.version_mut() = head.version();
            *req.headers_mut() = head.headers().clone();
            Box::new(req)
        };
        let body_of = |data: &Option<Bytes>, streamed: Option<ClientBody>| match streamed {
            Some(incoming) => Either::Right(incoming),
            None => Either::Left(Full::new(data.clone().unwrap_or_default())),
        };
        let mut sender = self.conn.sender.clone();
        // Until a stream is opened nothing went out: a failure here leaves the request unsent.
        if let Err(e) = poll_fn(|cx| sender.poll_ready(cx)).await {
            return Err(SendError::Unsent(again(body_of(&data, streamed)), e.into()));
        }
        let end = match (&data, &streamed) {
            (Some(data), _) => data.is_empty(),
            (None, Some(incoming)) => incoming.is_end_stream(),
            (None, None) => true,
        };
        let (response, mut stream) = match sender.send_request(clone_head(&head), end) {
            Ok(sent) => sent,
            Err(e) => return Err(SendError::Unsent(again(body_of(&data, streamed)), e.into())),
        };
        let id = response.stream_id().as_u32();
        match (&data, streamed) {
            // An error sending shows in the answer.
            (Some(data), _) if !end => {
                let _ = stream.send_data(data.clone(), true);
            }
            (_, Some(incoming)) if !end => {
                tokio::spawn(pump(incoming, stream));
            }
            _ => {}
        }
        match response.await {
            Ok(resp) => {
                let (mut parts, recv) = resp.into_parts();
                // Passed on to an HTTP/1.1 client as its own version.
                parts.version = Version::HTTP_11;
                Ok(Response::from_parts(parts, H2Body { recv, data_done: false }))
            }
            Err(e) => {
                if e.is_go_away() {
                    self.conn.watch.went_away();
                }
                match data {
                    Some(data) if self.conn.watch.never_processed(&e, id) => {
                        Err(SendError::Refused(again(Either::Left(Full::new(data))), e.into()))
                    }
                    _ => Err(SendError::Failed(self.conn.watch.error(e))),
                }
            }
        }
    }
}

fn clone_head(head: &Request<()>) -> Request<()> {
    let mut copy = Request::new(());
    *copy.method_mut() = head.method().clone();
    *copy.uri_mut() = head.uri().clone();
    *copy.version_mut() = head.version();
    *copy.headers_mut() = head.headers().clone();
    copy
}

/// The bytes of a buffered body: a `Full` hands them out at its first poll, ready at once.
fn bytes_of(mut full: Full<Bytes>) -> Bytes {
    match Pin::new(&mut full).poll_frame(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

/// Sends a streamed request body as the backend's flow control lets it; resets the stream if
/// the client's body breaks off.
async fn pump(mut body: ClientBody, mut stream: h2::SendStream<Bytes>) {
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(_) => return stream.send_reset(h2::Reason::CANCEL),
        };
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = stream.send_trailers(trailers);
                }
                return;
            }
        };
        while !data.is_empty() {
            stream.reserve_capacity(data.len());
            match poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(Ok(n)) if n > 0 => {
                    let chunk = data.split_to(n.min(data.len()));
                    if stream.send_data(chunk, false).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                _ => return,
            }
        }
    }
    let _ = stream.send_data(Bytes::new(), true);
}

/// The body of an answer on an HTTP/2 stream. Dropped before its end, the stream is reset
/// (`CANCEL`): the backend sees the client go.
pub struct H2Body {
    recv: h2::RecvStream,
    data_done: bool,
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Read: the backend may send as much again.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
