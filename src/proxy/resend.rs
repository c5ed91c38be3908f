//! A first round sent again, to the next backend of the ring, when its backend failed after it
//! was sent and before any byte of its answer (docs/src/routing.md, "Retries"): only what may
//! run twice (a `ping`, a list, a `tools/call` of a tool every definition of which the catalog
//! knows as `readOnlyHint` or `idempotentHint`), never a follow-up, a pinned call, a call in a
//! session or a batch, within `upstream.retry_budget`. The copy it sends is made only for such
//! a request, when its body was read whole.

use std::future::Future;
use std::pin::Pin;

use http::{Method, Response};

use super::deadline::{within, Deadline};
use super::phases::{Exchange, Resend, Routed};
use crate::config::Retry;
use crate::dialect::RequestHandles;
use crate::error::RouterError;
use crate::route;
use crate::upstream::{Connection, DrivenBody};

/// Methods whose request changes nothing on the server.
fn lists_or_pings(method: &str) -> bool {
    matches!(
        method,
        "ping" | "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list"
    )
}

impl Exchange<'_> {
    /// Whether this request may be sent again elsewhere should its backend fail after it was
    /// sent: what to keep for that, or `None`.
    #[inline]
    pub(super) fn resend_of(&self, handles: &RequestHandles, routed: &Routed, method: &Method) -> Option<Box<Resend>> {
        if self.snap.config.upstream.retry == Retry::Off || *method != Method::POST {
            return None;
        }
        // A call of a tool is repeatable only by what the catalog knows: without it, no work.
        if handles.method.as_deref() == Some("tools/call") && self.snap.tools.is_none() {
            return None;
        }
        self.repeatable_resend(handles, routed)
    }

    /// [`Exchange::resend_of`] once the cheap refusals are passed.
    #[cold]
    fn repeatable_resend(&self, handles: &RequestHandles, routed: &Routed) -> Option<Box<Resend>> {
        let repeatable = match handles.method.as_deref()? {
            "tools/call" => {
                let tools = self.snap.tools.as_ref()?;
                tools.repeatable(handles.name.as_deref()?)
            }
            other => lists_or_pings(other),
        };
        let d = &routed.decision;
        let unpinned = d.pin_lost || (d.matched.is_none() && d.source != route::Source::Token);
        // A handle of a call under way (a state, a task) makes it a later round, known here
        // or not; a batch, even of one, is never sent twice.
        let first_round = handles.request_state.is_none() && handles.task_id.is_none();
        let alone = handles.session_id.is_none() && !handles.is_batch();
        (repeatable && unpinned && alone && first_round && !d.follow_up).then(|| {
            Box::new(Resend {
                request: None,
                key: handles.client_key().map(Into::into),
                among: self.snap.tools.as_ref().and_then(|t| t.fallback_among(handles)),
            })
        })
    }

    /// Whether `failed` (the first backend's answer) may be followed by a second try.
    pub(super) fn may_resend(&self, failed: &RouterError) -> bool {
        matches!(failed, RouterError::UpstreamUnavailable { .. }) && self.has_resend_copy()
    }

    /// The request sent to the next backend of the ring, within the budget and the deadline:
    /// its answer, or `None` when it cannot be sent (the first backend's failure stands).
    /// Boxed: a cold path, out of every request's future.
    #[allow(clippy::type_complexity)]
    pub(super) fn resend<'a>(
        &'a mut self,
        mut deadline: Deadline<'a>,
    ) -> Pin<Box<dyn Future<Output = Option<Result<Response<DrivenBody>, RouterError>>> + Send + 'a>> {
        Box::pin(async move {
            let Resend { request, key, among } = *self.take_resend()?;
            let request = request?;
            let forward = self.forwarding().0;
            let snapshot = self.shared.snapshot();
            let next = snapshot
                .ring
                .fallback(key.as_deref(), self.backend_key(), among.as_deref())
                .cloned();
            drop(snapshot);
            let next = next.filter(|_| forward.may_retry())?;
            self.shared.metrics.retries_reset.inc();
            let guard = next.start_request();
            let conn = match next.connection() {
                Connection::Ready(conn) => conn,
                Connection::Opening(mut opening) => match within(deadline.reborrow(), opening.as_mut()).await {
                    Some(Ok(conn)) => conn,
                    _ => return None,
                },
            };
            let reused = conn.reused;
            self.moved_to(next.clone(), guard);
            let sent = std::pin::pin!(conn.send(*request));
            let sent = within(deadline.reborrow(), sent).await;
            let forward = self.forwarding().0;
            Some(forward.answer(sent, reused, &next, None, deadline).await)
        })
    }
}
