//! Active health checks of one backend: a TCP connect (and the TLS handshake, for an
//! `https://` backend), or an HTTP GET of `health.path` answered 2xx, over the same endpoint,
//! TLS, protocol and pool as the requests it serves.

use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Method, Request};
use http_body_util::{BodyExt, Either, Full};

use super::backend::{Backend, Connection};
use super::tls::ConnectError;

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Up,
    Down,
    /// The check could not be made for a reason of this machine's (out of file descriptors,
    /// memory, local ports): it says nothing about the backend and counts neither way.
    Unknown,
}

/// One check of `backend` within `timeout`.
pub async fn check(backend: &Backend, path: &str, timeout: Duration) -> Verdict {
    let connect_failed = |e: ConnectError| {
        tracing::debug!(backend = %backend.name, error = %e, "health check failed");
        match e.is_local() {
            true => Verdict::Unknown,
            false => Verdict::Down,
        }
    };
    let attempt = async {
        if path.is_empty() {
            return match backend.open(backend.is_http2()).await {
                Ok(_) => Verdict::Up,
                Err(e) => connect_failed(e),
            };
        }
        let Ok(Ok(target)) = PathAndQuery::try_from(path).map(|pq| backend.target_for(Some(&pq))) else {
            return Verdict::Down;
        };
        let Ok(req) = Request::builder()
            .method(Method::GET)
            .uri(target)
            .header(http::header::HOST, backend.host())
            .body(Either::Left(Full::new(Bytes::new())))
        else {
            return Verdict::Down;
        };
        let conn = match backend.check_connection() {
            Connection::Ready(conn) => conn,
            Connection::Opening(opening) => match opening.await {
                Ok(conn) => conn,
                Err(e) => return connect_failed(e),
            },
        };
        match conn.send(req).await {
            // Read to the end, so that the connection can serve the next check.
            Ok(resp) if resp.status().is_success() => match resp.into_body().collect().await {
                Ok(_) => Verdict::Up,
                Err(_) => Verdict::Down,
            },
            _ => Verdict::Down,
        }
    };
    tokio::time::timeout(timeout, attempt).await.unwrap_or(Verdict::Down)
}
