//! What one connection's requests have done, as the watchdog's checks read it: requests
//! started and finished ([`Activity`], [`RequestDone`]), and how hyper has polled the answers'
//! bodies ([`BodyPolls`], counted by the [`Tracked`] body each answer is wrapped in).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// What one connection's requests have done, counted by the service and the answers' bodies.
#[derive(Default)]
pub struct Activity {
    /// Requests whose head was read (the service was called).
    started: AtomicU64,
    /// Answers written whole, or given up (their body was dropped).
    finished: AtomicU64,
    /// How hyper polls the answers' bodies (HTTP/1: one answer at a time).
    polls: BodyPolls,
    /// The timer the connection's requests' upstream deadlines share (HTTP/1.1): here, in an
    /// allocation the connection has anyway.
    timer: crate::proxy::ConnectionTimer,
}

impl AsRef<crate::proxy::ConnectionTimer> for Activity {
    fn as_ref(&self) -> &crate::proxy::ConnectionTimer {
        &self.timer
    }
}

/// How hyper has polled an answer's body (or, for HTTP/1, the connection's answers): it asks
/// for more only once it has written what it was handed, so a body whose last poll handed it
/// data and that no poll has followed for long sits behind a client that takes nothing.
#[derive(Default)]
pub struct BodyPolls {
    /// Polls of the body by hyper.
    count: AtomicU64,
    /// The last poll handed hyper data.
    holding: AtomicBool,
}

impl BodyPolls {
    fn record(&self, handed_data: bool) {
        // Relaxed: read by a timer on the same task (HTTP/2) or a quarter timeout later (HTTP/1).
        self.count.fetch_add(1, Ordering::Relaxed);
        self.holding.store(handed_data, Ordering::Relaxed);
    }

    /// Polls of the body by hyper so far.
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// `Some(polls so far)` while the last poll handed hyper data.
    pub(super) fn holding(&self) -> Option<u64> {
        self.holding
            .load(Ordering::Relaxed)
            .then(|| self.count.load(Ordering::Relaxed))
    }
}

impl Activity {
    /// Called as a request's head reaches the service; its answer's body must carry the
    /// returned guard, so that the request counts as in flight until the answer is written.
    pub fn start(self: &Arc<Self>) -> RequestDone {
        // Relaxed: the counters only grow, and the timer compares them a quarter timeout apart
        // (an HTTP/2 stream may bump them from another task).
        self.started.fetch_add(1, Ordering::Relaxed);
        RequestDone(self.clone())
    }

    /// How hyper polls the connection's answers' bodies (HTTP/1).
    pub(super) fn polls(&self) -> &BodyPolls {
        &self.polls
    }

    /// How many requests have reached the service on this connection.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Requests started and finished so far.
    pub(super) fn snapshot(&self) -> (u64, u64) {
        (
            self.started.load(Ordering::Relaxed),
            self.finished.load(Ordering::Relaxed),
        )
    }
}

/// Marks a request finished when dropped.
pub struct RequestDone(Arc<Activity>);

impl Drop for RequestDone {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Relaxed);
    }
}

/// An answer's body, carrying its request's [`RequestDone`] until hyper has written it, and
/// counting hyper's polls of it: in the connection's [`Activity`] (HTTP/1), or in the
/// stream's own [`BodyPolls`] (HTTP/2, see [`StreamExecutor`]).
pub struct Tracked<B> {
    inner: B,
    _done: RequestDone,
    stream: Option<Arc<BodyPolls>>,
    /// HTTP/2: what is left of the last frame, handed on [`H2_SLICE`] at a time.
    rest: Option<Bytes>,
}

impl<B> Tracked<B> {
    pub fn new(inner: B, done: RequestDone, stream: Option<Arc<BodyPolls>>) -> Tracked<B> {
        Tracked {
            inner,
            _done: done,
            stream,
            rest: None,
        }
    }
}

/// The most of an answer an HTTP/2 stream hands hyper at a time (one DATA frame's worth): h2
/// takes whatever it is handed, beyond the client's window, and hyper asks for more only once
/// h2 has sent it all. So a stream's next poll comes once its client has taken this much, and
/// one that does not come for `stream_idle_timeout` means a client taking less than that.
const H2_SLICE: usize = 16 * 1024;

impl<B: Body<Data = Bytes> + Unpin> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let Some(stream) = &this.stream else {
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            this._done.0.polls.record(matches!(polled, Poll::Ready(Some(Ok(_)))));
            return polled;
        };
        let polled = match this.rest.take() {
            Some(mut rest) => {
                if rest.len() > H2_SLICE {
                    let piece = rest.split_to(H2_SLICE);
                    this.rest = Some(rest);
                    rest_piece(piece)
                } else {
                    rest_piece(rest)
                }
            }
            None => {
                let mut polled = Pin::new(&mut this.inner).poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &mut polled {
                    if let Some(data) = frame.data_mut().filter(|d| d.len() > H2_SLICE) {
                        this.rest = Some(data.split_off(H2_SLICE));
                    }
                }
                polled
            }
        };
        stream.record(matches!(polled, Poll::Ready(Some(Ok(_)))));
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.rest {
            None => self.inner.size_hint(),
            Some(rest) => {
                let inner = self.inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + rest.len() as u64);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + rest.len() as u64);
                }
                hint
            }
        }
    }
}

fn rest_piece<E>(piece: Bytes) -> Poll<Option<Result<Frame<Bytes>, E>>> {
    Poll::Ready(Some(Ok(Frame::data(piece))))
}
