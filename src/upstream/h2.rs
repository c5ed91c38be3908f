//! HTTP/2 to backends (`http2 = true`): a few multiplexed connections per backend, each run by
//! hyper in a task of its own (HTTP/2 multiplexes many requests over one connection, so no
//! single request can drive it, as the HTTP/1.1 pool's requests do).
//!
//! A request takes a stream on the first open connection with room: fewer streams in flight
//! than the backend's `SETTINGS_MAX_CONCURRENT_STREAMS`. A new connection is opened only when
//! every open one is full, by one request at a time (the others wait and take its room). The
//! backend's SETTINGS and GOAWAY frames are read off the connection as hyper reads it
//! ([`Observed`]): a new connection is used once the backend's SETTINGS came, and one that got
//! a GOAWAY takes no new request (those in flight on it finish). A request that the backend
//! never processed (refused with `REFUSED_STREAM`, above a GOAWAY's last stream id, or sent
//! after it) comes back as [`SendError::Refused`] with a copy, to be sent once more.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri, Version};
use http_body::Body;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::exchange::{SendError, UpstreamBody};
use super::tls::{ConnectError, Stream};
use crate::config::defaults;

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
    sender: http2::SendRequest<UpstreamBody>,
    watch: Arc<Watch>,
    /// Streams taken and not yet given back (the answer's body ended or was dropped).
    inflight: AtomicU32,
    /// Since when no stream is in flight.
    idle_since: parking_lot::Mutex<Instant>,
}

impl H2Conn {
    /// Open, and no GOAWAY received.
    fn usable(&self) -> bool {
        !self.watch.going_away.load(Ordering::Acquire)
            && !self.watch.ended.load(Ordering::Acquire)
            && !self.sender.is_closed()
    }

    fn has_room(&self) -> bool {
        self.inflight.load(Ordering::Acquire) < self.watch.max_streams.load(Ordering::Acquire)
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
        let io = TokioIo::new(Observed {
            inner: stream,
            frames: FrameScan::default(),
            watch: watch.clone(),
        });
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(io)
            .await
            .map_err(|e| ConnectError::of(&e))?;
        let ended = watch.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %super::tls::Chain(&e), "upstream HTTP/2 connection ended");
                *ended.error.lock() = Some(ConnectError::of(&e));
            }
            ended.ended.store(true, Ordering::Release);
            ended.notify.notify_waiters();
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

    /// Connections open (busy or idle).
    pub fn len(&self) -> usize {
        self.conns.lock().len()
    }

    /// Turns a request built for HTTP/1.1 into one for HTTP/2: the absolute URI gives
    /// `:scheme` and `:authority`, which stand for `Host`.
    fn prepare(&self, req: &mut Request<UpstreamBody>) {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = req.uri().path_and_query().cloned();
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        req.headers_mut().remove(http::header::HOST);
        *req.version_mut() = Version::HTTP_2;
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
    /// Sends `req` on this stream's connection and waits for the answer's head.
    pub async fn send(&self, pool: &H2Pool, mut req: Request<UpstreamBody>) -> Result<Response<Incoming>, SendError> {
        pool.prepare(&mut req);
        let copy = copy_of(&mut req);
        let mut sender = self.conn.sender.clone();
        match sender.try_send_request(req).await {
            Ok(mut resp) => {
                // Passed on to an HTTP/1.1 client as its own version.
                *resp.version_mut() = Version::HTTP_11;
                Ok(resp)
            }
            Err(mut e) => {
                let unsent = e.take_message();
                let error = e.into_error();
                if let Some(req) = unsent {
                    return Err(SendError::Unsent(Box::new(req), error));
                }
                if never_processed(&error) {
                    if is_go_away(&error) {
                        self.conn.watch.going_away.store(true, Ordering::Release);
                    }
                    if let Some(copy) = copy {
                        return Err(SendError::Refused(Box::new(copy), error));
                    }
                }
                Err(SendError::Failed(error))
            }
        }
    }
}

/// A copy of a request with a buffered body, to send again if the backend refuses it; `None`
/// for a streamed body (which cannot be read twice).
fn copy_of(req: &mut Request<UpstreamBody>) -> Option<Request<UpstreamBody>> {
    let Either::Left(full) = req.body_mut() else {
        return None;
    };
    // A `Full` hands out its bytes at the first poll, ready at once.
    let data = match Pin::new(&mut *full).poll_frame(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    };
    *full = Full::new(data.clone());
    let mut copy = Request::new(Either::Left(Full::new(data)));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}

fn h2_error(e: &hyper::Error) -> Option<&h2::Error> {
    let mut next = e.source();
    while let Some(e) = next {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return Some(h2);
        }
        next = e.source();
    }
    None
}

fn is_go_away(e: &hyper::Error) -> bool {
    h2_error(e).is_some_and(|h2| h2.is_go_away() && h2.is_remote())
}

/// Whether the backend said it never processed the request (RFC 9113 §8.7): it refused the
/// stream, or the stream is above the last one its GOAWAY let through (h2 fails those, and any
/// request sent after the GOAWAY, with the GOAWAY's error).
pub fn never_processed(e: &hyper::Error) -> bool {
    h2_error(e).is_some_and(|h2| {
        h2.is_remote() && (h2.is_go_away() || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)))
    })
}

/// What a connection's frames said, as its task reads them.
struct Watch {
    /// The backend's `SETTINGS_MAX_CONCURRENT_STREAMS`.
    max_streams: AtomicU32,
    /// The backend's first SETTINGS came.
    settled: AtomicBool,
    going_away: AtomicBool,
    /// The connection's task returned.
    ended: AtomicBool,
    /// Why it returned, if it failed.
    error: parking_lot::Mutex<Option<ConnectError>>,
    notify: Notify,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            max_streams: AtomicU32::new(defaults::H2_INITIAL_MAX_STREAMS),
            settled: AtomicBool::new(false),
            going_away: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            error: parking_lot::Mutex::new(None),
            notify: Notify::new(),
        }
    }
}

impl Watch {
    /// Waits for the backend's first SETTINGS; fails if the connection ends first.
    async fn settings(&self) -> Result<(), ConnectError> {
        loop {
            let notified = self.notify.notified();
            if self.settled.load(Ordering::Acquire) {
                return Ok(());
            }
            if self.ended.load(Ordering::Acquire) {
                return Err(self.error.lock().take().unwrap_or_else(|| {
                    ConnectError::connect(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the backend closed the HTTP/2 connection before its SETTINGS",
                    ))
                }));
            }
            notified.await;
        }
    }

    fn frame(&self, kind: u8, payload: &[u8]) {
        match kind {
            FRAME_SETTINGS => {
                for setting in payload.chunks_exact(6) {
                    if u16::from_be_bytes([setting[0], setting[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS {
                        let n = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                        self.max_streams.store(n, Ordering::Release);
                    }
                }
                if !self.settled.swap(true, Ordering::AcqRel) {
                    self.notify.notify_waiters();
                }
            }
            FRAME_GOAWAY => {
                tracing::debug!("upstream HTTP/2 connection got a GOAWAY; new requests go to a new connection");
                self.going_away.store(true, Ordering::Release);
            }
            _ => {}
        }
    }
}

const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// The most of a frame's payload kept to read (SETTINGS are 6 bytes a setting; a GOAWAY's
/// fields 8 bytes before its debug data).
const MAX_KEPT: usize = 1024;

/// Follows the frames of the byte stream a backend sends (RFC 9113 §4.1: a 9-byte header with a
/// 24-bit length, then the payload), keeping the payload of SETTINGS (not ACKs) and GOAWAY.
#[derive(Default)]
struct FrameScan {
    header: [u8; 9],
    /// Header bytes read so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    remaining: usize,
    /// The current frame's type, when its payload is kept.
    keep: Option<u8>,
    payload: Vec<u8>,
}

impl FrameScan {
    fn feed(&mut self, mut data: &[u8], watch: &Watch) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                if self.keep.is_some() && self.payload.len() < MAX_KEPT {
                    let room = MAX_KEPT - self.payload.len();
                    self.payload.extend_from_slice(&data[..n.min(room)]);
                }
                self.remaining -= n;
                data = &data[n..];
                if self.remaining == 0 {
                    self.end_frame(watch);
                }
                continue;
            }
            let n = (9 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let h = self.header;
            self.remaining = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
            let (kind, flags) = (h[3], h[4]);
            let kept = (kind == FRAME_SETTINGS && flags & FLAG_ACK == 0) || kind == FRAME_GOAWAY;
            self.keep = kept.then_some(kind);
            if self.remaining == 0 {
                self.end_frame(watch);
            }
        }
    }

    fn end_frame(&mut self, watch: &Watch) {
        if let Some(kind) = self.keep.take() {
            watch.frame(kind, &self.payload);
            self.payload.clear();
        }
    }
}

/// A connection's stream, with the backend's frames followed as they are read.
struct Observed {
    inner: Stream,
    frames: FrameScan,
    watch: Arc<Watch>,
}

impl AsyncRead for Observed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            this.frames.feed(&buf.filled()[before..], &this.watch);
        }
        result
    }
}

impl AsyncWrite for Observed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn settings_and_goaway_are_read_across_any_split() {
        // SETTINGS: header table size 4096, max concurrent streams 7; a DATA frame; a SETTINGS
        // ACK that names 1 stream (ignored); a GOAWAY with debug data.
        let mut bytes = frame(FRAME_SETTINGS, 0, &[0, 1, 0, 0, 16, 0, 0, 3, 0, 0, 0, 7]);
        bytes.extend(frame(0x0, 0, b"some data"));
        bytes.extend(frame(FRAME_SETTINGS, FLAG_ACK, &[0, 3, 0, 0, 0, 1]));
        bytes.extend(frame(FRAME_GOAWAY, 0, &[0, 0, 0, 5, 0, 0, 0, 0, b'b', b'y', b'e']));
        for split in 1..bytes.len() {
            let (watch, mut scan) = (Watch::default(), FrameScan::default());
            for chunk in bytes.chunks(split) {
                scan.feed(chunk, &watch);
                if !watch.settled.load(Ordering::Acquire) {
                    assert_eq!(
                        watch.max_streams.load(Ordering::Acquire),
                        defaults::H2_INITIAL_MAX_STREAMS
                    );
                }
            }
            assert!(watch.settled.load(Ordering::Acquire), "split {split}");
            assert_eq!(watch.max_streams.load(Ordering::Acquire), 7, "split {split}");
            assert!(watch.going_away.load(Ordering::Acquire), "split {split}");
        }
        // An empty SETTINGS (the backend keeps the defaults) settles the connection too.
        let (watch, mut scan) = (Watch::default(), FrameScan::default());
        scan.feed(&frame(FRAME_SETTINGS, 0, &[]), &watch);
        assert!(watch.settled.load(Ordering::Acquire));
        assert!(!watch.going_away.load(Ordering::Acquire));
    }
}
