//! Active health checks of one backend: a TCP connect (and the TLS handshake, for an
//! `https://` backend), or an HTTP GET of `health.path` answered 2xx, over the same endpoint,
//! TLS, protocol and pool as the requests it serves.

use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Method, Request};
use http_body_util::{BodyExt, Either, Full};

use super::backend::{Backend, Connection};

/// One check of `backend` within `timeout`: true when it passed.
pub async fn check(backend: &Backend, path: &str, timeout: Duration) -> bool {
    let attempt = async {
        if path.is_empty() {
            return match backend.open(backend.is_http2()).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(backend = %backend.name, error = %e, "health check failed");
                    false
                }
            };
        }
        let Ok(Ok(target)) = PathAndQuery::try_from(path).map(|pq| backend.target_for(Some(&pq))) else {
            return false;
        };
        let Ok(req) = Request::builder()
            .method(Method::GET)
            .uri(target)
            .header(http::header::HOST, backend.host())
            .body(Either::Left(Full::new(Bytes::new())))
        else {
            return false;
        };
        let conn = match backend.connection() {
            Connection::Ready(conn) => conn,
            Connection::Opening(opening) => match opening.await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(backend = %backend.name, error = %e, "health check failed");
                    return false;
                }
            },
        };
        match conn.send(req).await {
            // Read to the end, so that the connection can serve the next check.
            Ok(resp) if resp.status().is_success() => resp.into_body().collect().await.is_ok(),
            _ => false,
        }
    };
    tokio::time::timeout(timeout, attempt).await.unwrap_or(false)
}
