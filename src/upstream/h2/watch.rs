//! What an HTTP/2 connection's frames say, read as the connection's task reads them: the
//! backend's `SETTINGS_MAX_CONCURRENT_STREAMS`, its first SETTINGS, a GOAWAY and its last stream
//! id ([`Watch`]), scanned from the bytes on their way in ([`Observed`], [`FrameScan`]) across
//! any split of the reads; and what a connection's failure was (TLS behind it, or not).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use crate::config::defaults;
use crate::upstream::exchange::BoxError;
use crate::upstream::tls::{tls_error, ConnectError, Stream};

/// What a connection's frames said, as its task reads them.
pub(super) struct Watch {
    /// The backend's `SETTINGS_MAX_CONCURRENT_STREAMS`, as last read.
    max_streams: AtomicU32,
    /// The lowest last stream id of the GOAWAYs received (`u32::MAX` before any).
    last_stream_id: AtomicU32,
    /// The backend's first SETTINGS came.
    settled: AtomicBool,
    going_away: AtomicBool,
    /// The connection's task returned.
    ended: AtomicBool,
    /// Why it returned, if it failed.
    error: parking_lot::Mutex<Option<ConnectError>>,
    /// The TLS failure the connection's stream reported, if any: h2 keeps only the text of an
    /// I/O error, so what rustls said is kept here, where the error passes through.
    tls_failure: parking_lot::Mutex<Option<rustls::Error>>,
    notify: Notify,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            max_streams: AtomicU32::new(defaults::H2_INITIAL_MAX_STREAMS),
            last_stream_id: AtomicU32::new(u32::MAX),
            settled: AtomicBool::new(false),
            going_away: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            error: parking_lot::Mutex::new(None),
            tls_failure: parking_lot::Mutex::new(None),
            notify: Notify::new(),
        }
    }
}

impl Watch {
    /// Waits for the backend's first SETTINGS; fails if the connection ends first.
    pub(super) async fn settings(&self) -> Result<(), ConnectError> {
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

    /// Whether the connection takes new requests: open, and no GOAWAY received.
    pub(super) fn usable(&self) -> bool {
        !self.going_away.load(Ordering::Acquire) && !self.ended.load(Ordering::Acquire)
    }

    /// The backend's `SETTINGS_MAX_CONCURRENT_STREAMS`, as last read.
    pub(super) fn max_streams(&self) -> u32 {
        self.max_streams.load(Ordering::Acquire)
    }

    /// A request failed by a GOAWAY: the connection takes no new one.
    pub(super) fn went_away(&self) {
        self.going_away.store(true, Ordering::Release);
    }

    /// The connection's task returned, with `failure` if it failed.
    pub(super) fn end(&self, failure: Option<&h2::Error>) {
        if let Some(e) = failure {
            *self.error.lock() = Some(self.connect_error(e));
        }
        self.ended.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// An I/O error of the connection's stream, noted if TLS is behind it.
    pub(super) fn io_failed(&self, e: &io::Error) {
        if let Some(tls) = tls_error(e) {
            *self.tls_failure.lock() = Some(tls.clone());
        }
    }

    /// A request's error: the TLS failure behind it, if there was one.
    pub(super) fn error(&self, e: h2::Error) -> BoxError {
        match self.tls_failure.lock().clone() {
            Some(tls) => Box::new(tls),
            None => Box::new(e),
        }
    }

    /// Why a connection could not be used: TLS, if a TLS failure is behind it.
    pub(super) fn connect_error(&self, e: &h2::Error) -> ConnectError {
        match self.tls_failure.lock().clone() {
            Some(tls) => ConnectError::tls(io::Error::other(tls)),
            None => ConnectError::of(e),
        }
    }

    /// Whether `e`, the error of the request on stream `id`, says the backend never processed
    /// it: it refused the stream, or a GOAWAY let through only lower stream ids.
    pub(super) fn never_processed(&self, e: &h2::Error, id: u32) -> bool {
        let refused = e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM);
        let above_goaway = e.is_go_away() && id > self.last_stream_id.load(Ordering::Acquire);
        e.is_remote() && (refused || above_goaway)
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
                if let Some(id) = payload.get(..4) {
                    let last = u32::from_be_bytes([id[0], id[1], id[2], id[3]]) & 0x7fff_ffff;
                    self.last_stream_id.fetch_min(last, Ordering::AcqRel);
                }
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
/// The most of a frame's payload kept to read (SETTINGS take 6 bytes a setting; a GOAWAY's
/// fields are 8 bytes before its debug data).
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
pub(super) struct Observed {
    inner: Stream,
    frames: FrameScan,
    watch: Arc<Watch>,
}

impl Observed {
    /// `inner`, its frames followed into `watch`.
    pub(super) fn new(inner: Stream, watch: Arc<Watch>) -> Observed {
        Observed {
            inner,
            frames: FrameScan::default(),
            watch,
        }
    }
}

impl AsyncRead for Observed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &result {
            Poll::Ready(Ok(())) => this.frames.feed(&buf.filled()[before..], &this.watch),
            Poll::Ready(Err(e)) => this.watch.io_failed(e),
            Poll::Pending => {}
        }
        result
    }
}

impl AsyncWrite for Observed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Err(e)) = &result {
            this.watch.io_failed(e);
        }
        result
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
        // SETTINGS (header table size 4096, max concurrent streams 7); a DATA frame; a GOAWAY
        // letting through stream 5, with debug data; a later GOAWAY cannot raise it.
        let mut bytes = frame(FRAME_SETTINGS, 0, &[0, 1, 0, 0, 16, 0, 0, 3, 0, 0, 0, 7]);
        bytes.extend(frame(0x0, 0, b"some data"));
        bytes.extend(frame(FRAME_GOAWAY, 0, &[0, 0, 0, 5, 0, 0, 0, 0, b'b', b'y', b'e']));
        bytes.extend(frame(FRAME_GOAWAY, 0, &[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0]));
        for split in 1..bytes.len() {
            let (watch, mut scan) = (Watch::default(), FrameScan::default());
            for chunk in bytes.chunks(split) {
                scan.feed(chunk, &watch);
            }
            assert!(watch.settled.load(Ordering::Acquire), "split {split}");
            assert_eq!(watch.max_streams.load(Ordering::Acquire), 7, "split {split}");
            assert_eq!(watch.last_stream_id.load(Ordering::Acquire), 5, "split {split}");
            assert!(watch.going_away.load(Ordering::Acquire), "split {split}");
        }
        // A SETTINGS ACK is not the backend's SETTINGS.
        let (watch, mut scan) = (Watch::default(), FrameScan::default());
        scan.feed(&frame(FRAME_SETTINGS, FLAG_ACK, &[0, 3, 0, 0, 0, 1]), &watch);
        assert!(!watch.settled.load(Ordering::Acquire));
        assert_eq!(
            watch.max_streams.load(Ordering::Acquire),
            defaults::H2_INITIAL_MAX_STREAMS
        );
        // An empty SETTINGS (the backend keeps the defaults) settles the connection too.
        let (watch, mut scan) = (Watch::default(), FrameScan::default());
        scan.feed(&frame(FRAME_SETTINGS, 0, &[]), &watch);
        assert!(watch.settled.load(Ordering::Acquire));
        assert!(!watch.going_away.load(Ordering::Acquire));
    }
}
