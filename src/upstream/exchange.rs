//! What one request sends upstream, and how sending it can fail: the types the HTTP/1.1 pool
//! and the HTTP/2 connections share.

use http::Request;

pub use super::request_body::UpstreamBody;

/// An error of hyper (HTTP/1.1) or of h2 (HTTP/2), boxed: built only when something failed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no answer.
pub enum SendError {
    /// The connection ended before the request was written: it can go on another connection.
    Unsent(Box<Request<UpstreamBody>>, BoxError),
    /// HTTP/2: the backend said it never processed the request (`REFUSED_STREAM`, or a
    /// GOAWAY whose last stream id is below the request's); here is a copy to send again.
    Refused(Box<Request<UpstreamBody>>, BoxError),
    /// The request may have reached the backend.
    Failed(BoxError),
}

impl SendError {
    pub fn error(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            SendError::Unsent(_, e) | SendError::Refused(_, e) | SendError::Failed(e) => e.as_ref(),
        }
    }
}
