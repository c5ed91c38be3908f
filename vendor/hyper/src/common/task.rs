use std::task::{Context, Poll};

/// A function to help "yield" a future, such that it is re-scheduled immediately.
///
/// Useful for spin counts, so a future doesn't hog too much time.
pub(crate) fn yield_now(cx: &mut Context<'_>) -> Poll<std::convert::Infallible> {
    cx.waker().wake_by_ref();
    Poll::Pending
}

// mrtr-router patch: `noop_waker` and `now_or_never` removed with their one use, the client
// dispatch queue's `try_recv` (`client/dispatch.rs`).
