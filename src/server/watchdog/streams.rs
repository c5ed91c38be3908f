//! The watch of each HTTP/2 stream: hyper spawns a stream's task on [`StreamExecutor`], which
//! resets a stream whose client has taken nothing of its answer for `stream_idle_timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use super::activity::BodyPolls;

tokio::task_local! {
    /// The [`BodyPolls`] of the HTTP/2 stream whose task is being polled for the first time.
    static STREAM_POLLS: Arc<BodyPolls>;
}

/// The [`BodyPolls`] of the HTTP/2 stream being served, for its answer's [`Tracked`] body. Only
/// within the first poll of a stream's task, where the stream's service future first runs.
pub fn stream_polls() -> Option<Arc<BodyPolls>> {
    STREAM_POLLS.try_with(Arc::clone).ok()
}

/// The executor hyper's HTTP/2 server spawns each stream's task on: a stream whose answer's
/// body handed hyper data, and that hyper has not polled again for `stall_limit`, waits for a
/// client that takes nothing (it never opens its flow-control window: hyper polls a body only
/// once it has room to send what it was handed). Such a stream's task is dropped: h2 resets
/// the stream (`RST_STREAM` `CANCEL`), and the request upstream is dropped with the body, as
/// the connection watchdog drops an HTTP/1 connection whose client takes nothing.
///
/// A stream costs a [`BodyPolls`] (one allocation) and no timer while its client reads: the
/// timer is armed only when a poll of the task ends with the body's data still with hyper.
#[derive(Clone)]
pub struct StreamExecutor {
    stall_limit: Duration,
    aborts: prometheus::IntCounter,
}

impl StreamExecutor {
    /// `aborts` counts the streams reset for it.
    pub fn new(stall_limit: Duration, aborts: prometheus::IntCounter) -> StreamExecutor {
        StreamExecutor { stall_limit, aborts }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Watched {
            inner: fut,
            polls: Arc::new(BodyPolls::default()),
            first: true,
            stall_limit: self.stall_limit,
            stall: None,
            timer: None,
            aborts: self.aborts.clone(),
        });
    }
}

pin_project_lite::pin_project! {
    /// An HTTP/2 stream's task under [`StreamExecutor`]'s watch.
    struct Watched<F> {
        #[pin]
        inner: F,
        polls: Arc<BodyPolls>,
        first: bool,
        stall_limit: Duration,
        // The body's poll count when the task was last found waiting with its data with hyper,
        // and since when.
        stall: Option<(u64, tokio::time::Instant)>,
        // Armed at the first such wait; left in place (and re-aimed when it fires) after.
        timer: Option<Pin<Box<Sleep>>>,
        aborts: prometheus::IntCounter,
    }
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let inner = this.inner;
        let polled = match std::mem::take(this.first) {
            true => STREAM_POLLS.sync_scope(this.polls.clone(), || inner.poll(cx)),
            false => inner.poll(cx),
        };
        if polled.is_ready() {
            return Poll::Ready(());
        }
        let Some(count) = this.polls.holding() else {
            *this.stall = None;
            return Poll::Pending;
        };
        match *this.stall {
            Some((seen, since)) if seen == count => {
                let Some(timer) = this.timer.as_mut() else {
                    return Poll::Pending;
                };
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                // The timer was aimed at this stall or an earlier one.
                let deadline = since + *this.stall_limit;
                if tokio::time::Instant::now() >= deadline {
                    this.aborts.inc();
                    tracing::debug!("HTTP/2 client took nothing of its answer for stream_idle_timeout: stream reset");
                    return Poll::Ready(());
                }
                timer.as_mut().reset(deadline);
                let _ = timer.as_mut().poll(cx);
            }
            _ => {
                let now = tokio::time::Instant::now();
                *this.stall = Some((count, now));
                let deadline = now + *this.stall_limit;
                match this.timer {
                    None => {
                        let mut timer = Box::pin(tokio::time::sleep_until(deadline));
                        let _ = timer.as_mut().poll(cx);
                        *this.timer = Some(timer);
                    }
                    Some(timer) if timer.is_elapsed() => {
                        timer.as_mut().reset(deadline);
                        let _ = timer.as_mut().poll(cx);
                    }
                    // Aimed at an earlier stall: it fires sooner, and is aimed at this one then.
                    Some(_) => {}
                }
            }
        }
        Poll::Pending
    }
}
