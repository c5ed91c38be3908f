//! The retry budget (`[upstream] retry_budget`, docs/src/errors.md "Retries"): retries stay
//! within a share of the requests forwarded over the last ten seconds, with a floor, so that a
//! fleet that fails every request is not asked twice for each (Envoy's retry budget). A request
//! pays one relaxed increment; the window is read only when a retry is considered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How far back the budget looks.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Retries always allowed within the window, however few the requests (one a second).
pub const FLOOR: u64 = 10;

/// Requests and retries counted, and the window's samples of both.
#[derive(Default)]
pub struct RetryBudget {
    requests: AtomicU64,
    retries: AtomicU64,
    /// (when, requests then, retries then), one a second at most, the oldest within the window
    /// first.
    samples: Mutex<VecDeque<(Instant, u64, u64)>>,
}

impl RetryBudget {
    /// One request forwarded.
    #[inline]
    pub fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether one more retry fits in `share` of the window's requests (or under [`FLOOR`]):
    /// if it does, it is counted as made.
    pub fn try_retry(&self, share: f64, now: Instant) -> bool {
        let requests = self.requests.load(Ordering::Relaxed);
        let retries = self.retries.load(Ordering::Relaxed);
        let mut samples = self.samples.lock();
        if samples
            .back()
            .is_none_or(|(at, ..)| now.duration_since(*at) >= Duration::from_secs(1))
        {
            samples.push_back((now, requests, retries));
        }
        // The base is the oldest sample still within the window.
        while samples.len() > 1 && samples.front().is_some_and(|(at, ..)| now.duration_since(*at) > WINDOW) {
            samples.pop_front();
        }
        let (_, requests_then, retries_then) = samples.front().copied().unwrap_or((now, requests, retries));
        let allowed = ((requests.saturating_sub(requests_then) as f64 * share) as u64).max(FLOOR);
        if retries.saturating_sub(retries_then) >= allowed {
            return false;
        }
        self.retries.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_the_share_over_the_floor() {
        let budget = RetryBudget::default();
        let start = Instant::now();
        // Every request fails and asks for a retry: 1,000 requests in 5 s.
        let mut made = 0;
        for i in 0..1_000u64 {
            budget.count_request();
            if budget.try_retry(0.2, start + Duration::from_millis(i * 5)) {
                made += 1;
            }
        }
        assert!(made <= 200 + FLOOR, "{made}");
        assert!(made >= 150, "{made}");
        // Few requests: the floor.
        let quiet = RetryBudget::default();
        let allowed = (0..50).filter(|_| quiet.try_retry(0.2, start)).count() as u64;
        assert_eq!(allowed, FLOOR);
        // The window moves on: a minute later there is room again.
        assert!(quiet.try_retry(0.2, start + Duration::from_secs(60)));
    }
}
