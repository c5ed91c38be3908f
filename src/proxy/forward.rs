//! Forwarding one request: a connection to the chosen backend (pooled, else new; an unpinned
//! request whose backend refuses the connection, or fails its TLS handshake, moves once to the
//! next candidate, with `upstream.retry` on and within its budget), sending it (once more when
//! it never reached the backend: a pooled connection turned out closed before the request went
//! out, or an HTTP/2 backend refused the stream), all within the request's one upstream
//! deadline; failures count toward the backend's health, TLS failures as `upstream_tls`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};

use super::deadline::{within, Deadline};
use crate::body::ErrorHook;
use crate::config::Retry;
use crate::dialect::RequestHandles;
use crate::error::RouterError;
use crate::route::{self, Decision};
use crate::state::{Shared, Snapshot};
use crate::telemetry::RequestTrace;
use crate::upstream::{
    tls_error, Backend, BodyFault, Chain, ConnectError, Connection, DrivenBody, FaultCell, InflightGuard, PooledConn,
    SendError, UpstreamBody,
};

/// What forwarding one request needs.
pub(super) struct Forward<'a> {
    pub shared: &'a Arc<Shared>,
    pub snap: &'a Snapshot,
}

impl Forward<'_> {
    /// A connection to the chosen backend: an idle one from its pool, else a new one. A backend
    /// that refuses the connection never saw the request, so an unpinned request moves once to
    /// the next candidate on the ring; pinned follow-ups never move, nor do requests whose token
    /// names the backend (this replica may hold no pin for a call another one started). The
    /// request counts as in flight from here on (bounded load reads that count). With `trace`,
    /// each attempt has a client span; a failed one's ends here.
    pub(super) async fn connect(
        &self,
        decision: &Decision,
        handles: &RequestHandles<'_>,
        mut deadline: Deadline<'_>,
        mut trace: Option<&mut RequestTrace>,
    ) -> Result<(PooledConn, Arc<Backend>, InflightGuard), RouterError> {
        let (shared, snap) = (self.shared, self.snap);
        let unpinned = decision.pin_lost || (decision.matched.is_none() && decision.source != route::Source::Token);
        let mut backend = decision.backend.clone();
        let mut retried = false;
        shared.retry_budget.count_request();
        loop {
            if let Some(t) = trace.as_deref_mut() {
                t.start_attempt(&backend.name, backend.host().to_str().unwrap_or(""));
            }
            let guard = backend.start_request();
            let connected = match backend.connection() {
                Connection::Ready(conn) => Some(Ok(conn)),
                Connection::Opening(mut opening) => within(deadline.reborrow(), opening.as_mut()).await,
            };
            let Some(result) = connected else {
                if let Some(t) = trace.as_deref_mut() {
                    t.attempt_failed("timeout");
                }
                return Err(self.timed_out(&backend));
            };
            let e = match result {
                Ok(conn) => return Ok((conn, backend, guard)),
                Err(e) => e,
            };
            if e.is_busy() {
                // The router's own cap: the backend is up, and the request waited its turn.
                if let Some(t) = trace.as_deref_mut() {
                    t.attempt_failed("busy");
                }
                return Err(RouterError::UpstreamBusy {
                    backend: backend.name.to_string(),
                });
            }
            if e.is_local() {
                // Out of descriptors (or memory, or ports) here: no backend is to blame.
                tracing::warn!(backend = %backend.name, error = %e, "cannot open an upstream connection: local resources exhausted");
                return Err(RouterError::Overloaded);
            }
            if let Some(t) = trace.as_deref_mut() {
                t.attempt_failed("connect");
            }
            connect_failed(shared, snap, &backend, &e);
            let next = (unpinned && !retried)
                .then(|| {
                    // With the catalog routing the request, only where its tool is served.
                    let among = snap.tools.as_ref().and_then(|t| t.fallback_among(handles));
                    let ring = &shared.snapshot().ring;
                    ring.fallback(handles.client_key(), backend.key, among.as_deref())
                        .cloned()
                })
                .flatten()
                .filter(|_| self.may_retry());
            if next.is_some() {
                shared.metrics.retries_connect.inc();
            }
            let Some(next) = next else {
                return Err(match e.is_tls() {
                    true => RouterError::upstream_tls(&backend.name),
                    false => RouterError::upstream_unavailable(&backend.name),
                });
            };
            backend = next;
            retried = true;
        }
    }

    /// Whether a request its backend never saw may go to the next one: `upstream.retry` on, and
    /// the retry budget not spent (counted when it is).
    pub(super) fn may_retry(&self) -> bool {
        let upstream = &self.snap.config.upstream;
        if upstream.retry == Retry::Off {
            return false;
        }
        let fits = self.shared.retry_budget.try_retry(upstream.retry_budget);
        if !fits {
            self.shared.metrics.retries_budget_exhausted.inc();
        }
        fits
    }

    /// The answer's head, once the request's first attempt (on a connection taken from the
    /// pool if `reused`) ended as `first` says (`None`: the deadline passed). A request that
    /// never reached the backend is sent once more, to the same backend: a pooled connection
    /// that turns out closed before the request went out is replaced by a new one; an HTTP/2
    /// stream the backend refused goes on a connection with room. The first attempt is the
    /// caller's (`PooledConn::send` within the deadline): the request goes to the connection
    /// before the caller's `join_the_write_burst`, and its future is held once.
    pub(super) async fn answer(
        &self,
        first: Option<Result<Response<DrivenBody>, SendError>>,
        reused: bool,
        backend: &Backend,
        client_fault: Option<&FaultCell>,
        mut deadline: Deadline<'_>,
    ) -> Result<Response<DrivenBody>, RouterError> {
        let (shared, snap) = (self.shared, self.snap);
        let failed = |e: SendError| match tls_error(e.error()) {
            Some(tls) => {
                tracing::warn!(backend = %backend.name, error = %tls, "upstream TLS failed");
                "tls"
            }
            None => {
                tracing::debug!(backend = %backend.name, error = %Chain(e.error()), "upstream request failed");
                "reset"
            }
        };
        let result = match first {
            Some(Err(SendError::Unsent(request, e))) if reused => {
                tracing::debug!(backend = %backend.name, error = %e, "pooled connection closed; sending again");
                within(deadline.reborrow(), self.resend(backend, request, failed).as_mut()).await
            }
            Some(Err(SendError::Refused(request, e))) => {
                tracing::debug!(backend = %backend.name, error = %Chain(e.as_ref()), "backend refused the stream; sending again");
                within(deadline.reborrow(), self.resend(backend, request, failed).as_mut()).await
            }
            other => other.map(|sent| sent.map_err(failed)),
        };
        match result {
            Some(Ok(resp)) => Ok(answered(backend, resp)),
            // The client's streamed body broke or stalled: its fault, answered as such.
            Some(Err(_)) | None if client_fault.and_then(FaultCell::get).is_some() => {
                Err(match client_fault.and_then(FaultCell::get) {
                    Some(BodyFault::Timeout) => RouterError::BodyTimeout,
                    _ => RouterError::BodyBroken,
                })
            }
            // The resend found the backend at its connection cap.
            Some(Err("busy")) => Err(RouterError::UpstreamBusy {
                backend: backend.name.to_string(),
            }),
            Some(Err(kind)) => {
                passive_failure(shared, snap, backend, kind);
                Err(match kind {
                    "tls" => RouterError::upstream_tls(&backend.name),
                    _ => RouterError::upstream_unavailable(&backend.name),
                })
            }
            None => Err(self.timed_out(backend)),
        }
    }

    /// The one more attempt of a request that never reached `backend`, counted in
    /// `mrtr_upstream_resends_total`. Boxed: a cold path, kept out of every request's future.
    #[allow(clippy::type_complexity)]
    fn resend<'a>(
        &self,
        backend: &'a Backend,
        request: Box<Request<UpstreamBody>>,
        failed: impl Fn(SendError) -> &'static str + Send + 'a,
    ) -> Pin<Box<dyn Future<Output = Result<Response<DrivenBody>, &'static str>> + Send + 'a>> {
        self.shared
            .metrics
            .upstream_resends
            .with_label_values(&[&backend.name])
            .inc();
        Box::pin(async move {
            let conn = match backend.reconnect() {
                Connection::Ready(conn) => conn,
                Connection::Opening(opening) => opening.await.map_err(|e| {
                    tracing::debug!(backend = %backend.name, error = %e, "upstream connect failed");
                    e.kind
                })?,
            };
            conn.send(*request).await.map_err(failed)
        })
    }

    /// The error for a request whose upstream deadline passed. Counted, but not toward the
    /// backend's health: a slow answer (a long tool call) says nothing of whether the backend
    /// is up; its health checks tell that.
    pub(super) fn timed_out(&self, backend: &Backend) -> RouterError {
        self.shared
            .metrics
            .upstream_errors
            .with_label_values(&[&backend.name, "timeout"])
            .inc();
        RouterError::upstream_timeout(&backend.name)
    }
}

/// The backend answered: its head is in. The driver's first attempt (the usual case) comes
/// here without [`Forward::answer`]'s future, which would hold the answer and move it twice.
#[inline(always)]
pub(super) fn answered(backend: &Backend, resp: Response<DrivenBody>) -> Response<DrivenBody> {
    backend.record_request_success();
    resp
}

/// Logs and counts a connection that could not be opened: a TLS failure names the backend
/// and what rustls said (unknown issuer, expired, name mismatch, a refused client certificate).
fn connect_failed(shared: &Shared, snap: &Snapshot, backend: &Backend, e: &ConnectError) {
    match e.is_tls() {
        true => tracing::warn!(backend = %backend.name, error = %e, "upstream TLS failed"),
        false => tracing::debug!(backend = %backend.name, error = %e, "upstream connect failed"),
    }
    passive_failure(shared, snap, backend, e.kind);
}

/// Counts a failed request against the backend's health; ejects it after `unhealthy_after`.
pub(super) fn passive_failure(shared: &Shared, snap: &Snapshot, backend: &Backend, kind: &str) {
    shared
        .metrics
        .upstream_errors
        .with_label_values(&[&backend.name, kind])
        .inc();
    if backend.record_failure(snap.config.health.unhealthy_after).is_some() {
        tracing::warn!(backend = %backend.name, kind, "backend ejected after failed requests");
        shared.rebuild();
    }
}

pub(super) fn upstream_error_hook(shared: &Arc<Shared>, backend: &Arc<Backend>) -> ErrorHook {
    let shared = shared.clone();
    let backend = backend.clone();
    Box::new(move |kind| {
        shared
            .metrics
            .upstream_errors
            .with_label_values(&[&backend.name, kind])
            .inc()
    })
}
