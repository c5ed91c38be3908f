//! A request's upstream deadline (`server.upstream_timeout`): one bound over its whole
//! exchange with the backend, up to a JSON answer's last byte.
//!
//! **One timer per HTTP/1.1 connection.** A tokio timer registered and removed for every
//! request cost a wheel re-registration (~97 instructions) and a removal (~44) a request, and
//! their hot code, for a deadline that almost never fires: 39,809 instructions per
//! header-keyed request with it, 39,523 without (callgrind, bench/FINDINGS.md). An HTTP/1.1 connection serves one
//! request at a time, all polled by its own task, so its requests share one timer
//! ([`ConnectionTimer`]) that is re-armed only lazily: a new request's deadline is later than
//! the one the timer is set for (the same timeout, started later), so the timer is left alone;
//! when it fires for a request that has since ended, the request now in flight finds its own
//! deadline not yet passed and sets the timer to it. The wheel is touched once per timeout
//! per busy connection instead of twice a request. HTTP/2 streams each run in a task of their
//! own and keep a timer each, made at their first wait.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use parking_lot::Mutex;
use tokio::time::{sleep_until, Instant, Sleep};

/// The timer an HTTP/1.1 connection's requests share (see the module's comment). Dropped with
/// the connection; [`ConnectionTimer::release`] gives it back earlier.
#[derive(Default)]
pub struct ConnectionTimer {
    sleep: Mutex<Option<Pin<Box<Sleep>>>>,
}

impl ConnectionTimer {
    /// Ready once `at` has passed. Waits on the shared timer, set to `at` when it is unset,
    /// set later than `at` (a shorter timeout since a reload), or fired for an earlier request.
    fn poll_until(&self, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let mut slot = self.sleep.lock();
        let sleep = slot.get_or_insert_with(|| Box::pin(sleep_until(at)));
        if sleep.deadline() > at {
            sleep.as_mut().reset(at);
        }
        loop {
            ready!(sleep.as_mut().poll(cx));
            if sleep.deadline() >= at {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(at);
        }
    }

    /// Unsets the timer: a connection whose answer now streams (SSE) waits on no deadline, and
    /// should hold no timer while it streams.
    pub fn release(&self) {
        self.sleep.lock().take();
    }
}

/// One request's upstream deadline: its connection's timer (HTTP/1.1), or a timer of its own.
pub(super) struct Deadline<'a> {
    at: Instant,
    shared: Option<&'a ConnectionTimer>,
    /// The request's own timer, made at its first wait (HTTP/2).
    own: Pin<&'a mut Option<Sleep>>,
}

impl<'a> Deadline<'a> {
    /// The deadline `at`, on `shared` when the connection has one, else on `own`.
    pub fn new(at: Instant, shared: Option<&'a ConnectionTimer>, own: Pin<&'a mut Option<Sleep>>) -> Deadline<'a> {
        Deadline { at, shared, own }
    }

    /// The same deadline, for one wait of several.
    pub fn reborrow(&mut self) -> Deadline<'_> {
        Deadline {
            at: self.at,
            shared: self.shared,
            own: self.own.as_mut(),
        }
    }

    /// Ready once the deadline has passed.
    pub fn poll_passed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(timer) = self.shared {
            return timer.poll_until(self.at, cx);
        }
        if self.own.is_none() {
            self.own.set(Some(sleep_until(self.at)));
        }
        match self.own.as_mut().as_pin_mut() {
            Some(sleep) => sleep.poll(cx),
            None => unreachable!("the request's own timer is set just above"),
        }
    }
}

/// Runs `f` until the deadline passes (`None`). `f` comes pinned by the caller, so its state is
/// stored once, in the caller's future (an `async fn` taking it by value would hold it twice).
pub(super) fn within<'a, F: Future + ?Sized>(
    mut deadline: Deadline<'a>,
    mut f: Pin<&'a mut F>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(out) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        deadline.poll_passed(cx).map(|()| None)
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_timer_fires_for_each_request_at_its_own_deadline() {
        let timer = ConnectionTimer::default();
        let timeout = Duration::from_secs(300);
        let never = std::future::pending::<()>();
        let mut own = std::pin::pin!(None);
        // The first request waits once (the timer is set for it) and ends well before its
        // deadline.
        let first = Instant::now() + timeout;
        let yielded = std::pin::pin!(tokio::task::yield_now());
        let quick = within(Deadline::new(first, Some(&timer), own.as_mut()), yielded);
        assert_eq!(quick.await, Some(()));
        assert_eq!(timer.sleep.lock().as_ref().map(|s| s.deadline()), Some(first));
        // The next starts 100 s later: the timer, still set for the first, fires at 300 s and
        // is re-armed; the second request times out at its own deadline, 400 s.
        tokio::time::advance(Duration::from_secs(100)).await;
        let second = Instant::now() + timeout;
        let started = Instant::now();
        let never = std::pin::pin!(never);
        let slow = within(Deadline::new(second, Some(&timer), own.as_mut()), never);
        assert_eq!(slow.await, None);
        assert_eq!(Instant::now() - started, timeout);
        // A shorter timeout (a reload) is honoured at once.
        let third = Instant::now() + Duration::from_secs(5);
        let started = Instant::now();
        let never = std::pin::pin!(std::future::pending::<()>());
        let short = within(Deadline::new(third, Some(&timer), own.as_mut()), never);
        assert_eq!(short.await, None);
        assert_eq!(Instant::now() - started, Duration::from_secs(5));
        assert!(
            own.is_none(),
            "a request on a connection timer makes no timer of its own"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_a_connection_timer_keeps_its_own() {
        let mut own = std::pin::pin!(None);
        let at = Instant::now() + Duration::from_secs(7);
        let started = Instant::now();
        let never = std::future::pending::<()>();
        assert_eq!(
            within(Deadline::new(at, None, own.as_mut()), std::pin::pin!(never)).await,
            None
        );
        assert_eq!(Instant::now() - started, Duration::from_secs(7));
        assert!(own.is_some());
    }
}
