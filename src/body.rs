//! Response bodies on their way to the client: buffered answers, and streams passed through
//! frame by frame, with SSE split into whole events so each JSON-RPC message can be observed
//! before the bytes that carry it reach the client.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::sealing::Replacement;
use crate::upstream::{DrivenBody, InflightGuard};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Called with the `data` of each SSE event before the event is sent on (empty for an event
/// without data, such as a `: ping` comment: the stream is alive); may ask for a string in the
/// event to be replaced (a `requestState` sealed for the client).
pub type MessageSink = Box<dyn FnMut(&[u8]) -> Option<Replacement> + Send>;

/// Called once if the upstream stream fails, with the `kind` label of the error.
pub type ErrorHook = Box<dyn FnOnce(&str) + Send>;

/// Called once when a response body is done with (sent whole, or dropped when its client went
/// away), with the bytes of it that went out.
pub type EndHook = Box<dyn FnOnce(u64) + Send>;

/// Largest SSE event the router inspects; a longer one is passed through unread.
pub const MAX_OBSERVED_EVENT: usize = 8 * 1024 * 1024;

/// The body of every response the router sends.
pub struct ProxyBody {
    kind: Kind,
}

/// A body whose request is observed (access log, tracing): counts the bytes sent, and calls
/// its hook when dropped.
struct Observed {
    body: ProxyBody,
    sent: u64,
    hook: Option<EndHook>,
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(hook) = self.hook.take() {
            hook(self.sent);
        }
    }
}

enum Kind {
    Full(Option<Bytes>),
    Stream(Box<Stream>),
    Observed(Box<Observed>),
}

struct Stream {
    inner: DrivenBody,
    /// Bytes already read from `inner` (a buffered prefix) to send first.
    prefix: Option<Bytes>,
    sse: Option<SseSplitter>,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
    /// Holds the backend's in-flight count until the stream ends or the client goes away.
    _guard: Option<InflightGuard>,
    on_error: Option<ErrorHook>,
}

#[derive(Debug)]
pub struct StreamIdle;

impl std::fmt::Display for StreamIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("upstream stream idle timeout")
    }
}
impl std::error::Error for StreamIdle {}

impl ProxyBody {
    pub fn full(data: impl Into<Bytes>) -> ProxyBody {
        let data: Bytes = data.into();
        ProxyBody {
            kind: Kind::Full(if data.is_empty() { None } else { Some(data) }),
        }
    }

    pub fn empty() -> ProxyBody {
        ProxyBody { kind: Kind::Full(None) }
    }

    /// Streams `inner` to the client. With a `sink`, the stream is SSE and each event's data
    /// goes to the sink before the event is sent. `on_error` hears of an upstream failure mid-stream.
    pub fn stream(
        inner: DrivenBody,
        prefix: Option<Bytes>,
        sink: Option<MessageSink>,
        idle_timeout: Duration,
        guard: Option<InflightGuard>,
        on_error: Option<ErrorHook>,
    ) -> ProxyBody {
        let stream = Stream {
            inner,
            prefix,
            sse: sink.map(SseSplitter::new),
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            idle_timeout,
            _guard: guard,
            on_error,
        };
        ProxyBody {
            kind: Kind::Stream(Box::new(stream)),
        }
    }

    /// Calls `hook` with the bytes sent once the body is done with (see [`EndHook`]).
    pub fn on_end(&mut self, hook: EndHook) {
        let body = std::mem::replace(self, ProxyBody::empty());
        self.kind = Kind::Observed(Box::new(Observed {
            body,
            sent: 0,
            hook: Some(hook),
        }));
    }
}

impl From<Bytes> for ProxyBody {
    fn from(b: Bytes) -> Self {
        ProxyBody::full(b)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Stream(s) => s.poll_frame(cx),
            Kind::Observed(o) => {
                let polled = Pin::new(&mut o.body).poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    o.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(data) => data.is_none(),
            Kind::Observed(o) => o.body.is_end_stream(),
            Kind::Stream(s) => {
                s.prefix.is_none() && s.inner.is_end_stream() && s.sse.as_ref().is_none_or(|s| s.buf.is_empty())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Observed(o) => o.body.size_hint(),
            Kind::Stream(s) if s.sse.is_none() => {
                let inner = s.inner.size_hint();
                let extra = s.prefix.as_ref().map_or(0, |p| p.len() as u64);
                match inner.exact() {
                    Some(n) => SizeHint::with_exact(n + extra),
                    None => SizeHint::default(),
                }
            }
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}

impl Stream {
    fn fail(&mut self, what: &str) {
        if let Some(f) = self.on_error.take() {
            f(what);
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(p) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        loop {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    self.idle.as_mut().reset(Instant::now() + self.idle_timeout);
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    };
                    let Some(sse) = &mut self.sse else {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    };
                    let out = sse.feed(&data);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.fail("reset");
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let rest = self.sse.as_mut().map(|s| s.finish()).unwrap_or_default();
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
                Poll::Pending => {
                    if self.idle.as_mut().poll(cx).is_ready() {
                        self.fail("stream_idle");
                        return Poll::Ready(Some(Err(Box::new(StreamIdle))));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

/// Splits an SSE byte stream into whole events and hands each event's data to a sink.
pub struct SseSplitter {
    buf: BytesMut,
    /// Where scanning for the end of the current event resumes.
    scan: usize,
    /// Start of the current line within `buf`.
    line_start: usize,
    /// Set while passing through an event too large to observe, until its end.
    skipping: bool,
    /// The stream's first event is still to come: a UTF-8 byte order mark may start it, which
    /// an event-stream parser skips (HTML's "event stream interpretation").
    first: bool,
    sink: MessageSink,
}

impl SseSplitter {
    pub fn new(sink: MessageSink) -> SseSplitter {
        SseSplitter {
            buf: BytesMut::new(),
            scan: 0,
            line_start: 0,
            skipping: false,
            first: true,
            sink,
        }
    }

    /// Takes the next chunk; returns the bytes of every event it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.buf.extend_from_slice(chunk);
        let mut complete = 0;
        let mut rewrites: Vec<(usize, usize, Replacement)> = Vec::new();
        let mut i = self.scan;
        let len = self.buf.len();
        while i < len {
            let c = self.buf[i];
            if c != b'\n' && c != b'\r' {
                i += 1;
                continue;
            }
            // A lone CR at the end of the buffer may be the start of CRLF: wait for more.
            if c == b'\r' && i + 1 == len {
                break;
            }
            let end = if c == b'\r' && self.buf[i + 1] == b'\n' {
                i + 2
            } else {
                i + 1
            };
            if i == self.line_start {
                // An empty line ends the event.
                if self.skipping {
                    self.first = false;
                } else {
                    if let Some(r) = self.observe(complete, i) {
                        rewrites.push((complete, end, r));
                    }
                }
                self.skipping = false;
                complete = end;
            }
            self.line_start = end;
            i = end;
        }
        self.scan = i;
        if complete == 0 && self.buf.len() > MAX_OBSERVED_EVENT {
            // Too large to hold: pass it through unobserved.
            self.skipping = true;
            complete = self.buf.len();
        }
        let out = self.buf.split_to(complete).freeze();
        self.scan -= complete.min(self.scan);
        self.line_start -= complete.min(self.line_start);
        if rewrites.is_empty() {
            return out;
        }
        let mut rewritten = BytesMut::with_capacity(out.len() + 256);
        let mut pos = 0;
        for (start, end, r) in rewrites {
            rewritten.extend_from_slice(&out[pos..start]);
            match r.apply(&out[start..end]) {
                Some(event) => rewritten.extend_from_slice(&event),
                None => rewritten.extend_from_slice(&out[start..end]),
            }
            pos = end;
        }
        rewritten.extend_from_slice(&out[pos..]);
        rewritten.freeze()
    }

    /// The stream ended: whatever is left (an unterminated event) goes out as is, after the
    /// sink has seen it.
    pub fn finish(&mut self) -> Bytes {
        let rewrite = if !self.skipping && !self.buf.is_empty() {
            self.observe(0, self.buf.len())
        } else {
            None
        };
        self.scan = 0;
        self.line_start = 0;
        let rest = self.buf.split().freeze();
        match rewrite {
            Some(r) => r.apply(&rest).unwrap_or(rest),
            None => rest,
        }
    }

    fn observe(&mut self, start: usize, end: usize) -> Option<Replacement> {
        let mut event = &self.buf[start..end];
        if std::mem::take(&mut self.first) {
            event = event.strip_prefix("\u{feff}".as_bytes()).unwrap_or(event);
        }
        let mut data: Vec<u8> = Vec::new();
        let mut lines = 0;
        for line in event.split(|&b| b == b'\n' || b == b'\r') {
            let Some(value) = line.strip_prefix(b"data:") else {
                continue;
            };
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if lines > 0 {
                data.push(b'\n');
            }
            data.extend_from_slice(value);
            lines += 1;
        }
        (self.sink)(&data)
    }
}

/// For tests and fuzz targets (re-exported in `internals`), not the request path: `chunks` fed
/// through an [`SseSplitter`] whose sink only records. Returns the data of each event the sink
/// saw, in order, and the bytes sent on.
pub fn split_sse(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let mut splitter = SseSplitter::new(Box::new(move |data: &[u8]| {
        sink.lock().unwrap().push(data.to_vec());
        None
    }));
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend_from_slice(&splitter.feed(chunk));
    }
    out.extend_from_slice(&splitter.finish());
    let events = std::mem::take(&mut *seen.lock().unwrap());
    (events, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn splitter() -> (SseSplitter, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let sink = move |d: &[u8]| {
            s.lock().unwrap().push(String::from_utf8_lossy(d).into_owned());
            None
        };
        (SseSplitter::new(Box::new(sink)), seen)
    }

    #[test]
    fn a_byte_order_mark_before_the_first_event_is_read_past() {
        let (events, out) = split_sse(&[b"\xef\xbb", b"\xbfdata: {\"a\":1}\n\n\xef\xbb\xbfdata: b\n\n"]);
        // Only the stream's first: a mark later starts a field of another name.
        assert_eq!(events, [b"{\"a\":1}".to_vec(), Vec::new()]);
        assert!(out.starts_with(b"\xef\xbb\xbfdata"), "the bytes go on as they came");
    }

    #[test]
    fn splits_events_across_chunks() {
        let (mut sp, seen) = splitter();
        assert_eq!(&sp.feed(b": ping\n\nevent: message\ndata: {\"a\""), &b": ping\n\n"[..]);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![String::new()],
            "a comment is an event without data"
        );
        assert_eq!(&sp.feed(b":1}\n"), &b""[..]);
        assert_eq!(
            &sp.feed(b"\nid: 2\r\ndata: x\r\ndata: y\r"),
            &b"event: message\ndata: {\"a\":1}\n\n"[..]
        );
        assert_eq!(&sp.feed(b"\n\r\n"), &b"id: 2\r\ndata: x\r\ndata: y\r\n\r\n"[..]);
        assert_eq!(*seen.lock().unwrap(), ["", "{\"a\":1}", "x\ny"]);
        assert_eq!(&sp.feed(b"data: tail"), &b""[..]);
        assert_eq!(&sp.finish(), &b"data: tail"[..]);
        assert_eq!(seen.lock().unwrap().len(), 4);
    }

    #[test]
    fn events_can_be_rewritten() {
        let sink = |d: &[u8]| {
            let at = memchr::memmem::find(d, b"\"s1\"")?;
            (d.starts_with(b"{\"result\"")).then(|| Replacement::new(d, at..at + 4, "mrt1.x"))
        };
        let mut sp = SseSplitter::new(Box::new(sink));
        let out = sp.feed(
            b": ping\n\nevent: message\ndata: {\"result\":{\"requestState\":\"s1\"}}\n\ndata: {\"x\":\"s1\"}\n\n",
        );
        assert_eq!(
            &out[..],
            &b": ping\n\nevent: message\ndata: {\"result\":{\"requestState\":\"mrt1.x\"}}\n\ndata: {\"x\":\"s1\"}\n\n"
                [..]
        );
        assert_eq!(&sp.finish(), &b""[..]);
    }

    #[test]
    fn oversized_event_passes_unobserved() {
        let (mut sp, seen) = splitter();
        let big = vec![b'x'; MAX_OBSERVED_EVENT + 1];
        let mut out = sp.feed(b"data: ").len();
        out += sp.feed(&big).len();
        out += sp.feed(b"\n\ndata: ok\n\n").len();
        assert_eq!(out, 6 + big.len() + 12);
        // (Its blank line may read as an event of its own, with no data.)
        let seen = seen.lock().unwrap();
        assert_eq!(seen.iter().filter(|d| !d.is_empty()).collect::<Vec<_>>(), ["ok"]);
    }
}
