//! What one request sends upstream, and how sending it can fail: the types the HTTP/1.1 pool
//! and the HTTP/2 connections share.

use bytes::Bytes;
use http::Request;
use http_body_util::{Either, Full};
use hyper::body::Incoming;

/// Body sent upstream: the buffered POST body, or the client's stream as received.
pub type UpstreamBody = Either<Full<Bytes>, Incoming>;

/// Why a request got no answer.
pub enum SendError {
    /// The connection ended before the request was written: it can go on another connection.
    Unsent(Box<Request<UpstreamBody>>, hyper::Error),
    /// HTTP/2: the backend refused the request unprocessed (`REFUSED_STREAM`, or a GOAWAY
    /// before it); here is a copy to send again.
    Refused(Box<Request<UpstreamBody>>, hyper::Error),
    /// The request may have reached the backend.
    Failed(hyper::Error),
}

impl SendError {
    pub fn error(&self) -> &hyper::Error {
        match self {
            SendError::Unsent(_, e) | SendError::Refused(_, e) | SendError::Failed(e) => e,
        }
    }
}
