//! What a request carries to its backend: a POST's body, read whole, or any other method's body
//! streamed from the client as it comes — bounded in time, and told apart when it fails, so that
//! a client's broken or stalled body is the client's fault and never the backend's.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::time::Sleep;

/// Body sent upstream: the buffered POST body, or the client's stream.
pub type UpstreamBody = Either<Full<Bytes>, ClientBody>;

/// Why a client's streamed body ended before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    /// The client's stream broke: a bad chunk, a reset, a half-close mid-body.
    Broken,
    /// It was not all received within the body read timeout.
    Timeout,
}

/// Where a [`ClientBody`] records its fault, for the request that sent it.
#[derive(Clone, Default)]
pub struct FaultCell(Arc<AtomicU8>);

impl FaultCell {
    pub fn get(&self) -> Option<BodyFault> {
        match self.0.load(Ordering::Acquire) {
            1 => Some(BodyFault::Broken),
            2 => Some(BodyFault::Timeout),
            _ => None,
        }
    }

    fn set(&self, fault: BodyFault) {
        let code = match fault {
            BodyFault::Broken => 1,
            BodyFault::Timeout => 2,
        };
        self.0.store(code, Ordering::Release);
    }
}

/// A client's request body, passed upstream frame by frame; it fails (and says why in its
/// [`FaultCell`]) when the client's stream breaks or has not ended within the read timeout.
pub struct ClientBody {
    inner: Incoming,
    deadline: Pin<Box<Sleep>>,
    fault: FaultCell,
}

impl ClientBody {
    /// `inner` streamed within `timeout` from now; `fault` hears why it failed, if it does.
    pub fn new(inner: Incoming, timeout: Duration, fault: FaultCell) -> ClientBody {
        ClientBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            fault,
        }
    }
}

/// The error a [`ClientBody`] fails with.
#[derive(Debug)]
pub struct ClientBodyError(pub BodyFault);

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            BodyFault::Broken => f.write_str("the client's request body broke off"),
            BodyFault::Timeout => f.write_str("the client's request body was not received in time"),
        }
    }
}

impl std::error::Error for ClientBodyError {}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(_))) => {
                this.fault.set(BodyFault::Broken);
                Poll::Ready(Some(Err(ClientBodyError(BodyFault::Broken))))
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.fault.set(BodyFault::Timeout);
                    Poll::Ready(Some(Err(ClientBodyError(BodyFault::Timeout))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
