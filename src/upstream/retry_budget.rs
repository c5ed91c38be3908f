//! The retry budget (`[upstream] retry_budget`, docs/src/routing.md): retries stay within a
//! share of the requests forwarded over the last ten seconds, with a floor, so that a fleet
//! that fails every request is not asked twice for each (Envoy's retry budget). A request pays
//! one relaxed increment; the counts are sampled once a second off the request path
//! (`fleet::upkeep`), and read only when a retry is considered.

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
    /// (when, requests then, retries then), a second apart, the oldest within the window first.
    samples: Mutex<VecDeque<(Instant, u64, u64)>>,
}

impl RetryBudget {
    /// One request forwarded.
    #[inline]
    pub fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the counts at `now` (once a second), keeping the samples of the last window.
    pub fn sample(&self, now: Instant) {
        let requests = self.requests.load(Ordering::Relaxed);
        let retries = self.retries.load(Ordering::Relaxed);
        let mut samples = self.samples.lock();
        samples.push_back((now, requests, retries));
        while samples.front().is_some_and(|(at, ..)| now.duration_since(*at) > WINDOW) {
            samples.pop_front();
        }
    }

    /// Whether one more retry fits in `share` of the requests since the oldest sample of the
    /// window (or under [`FLOOR`]): if it does, it is counted as made.
    pub fn try_retry(&self, share: f64) -> bool {
        let requests = self.requests.load(Ordering::Relaxed);
        let retries = self.retries.load(Ordering::Relaxed);
        let (requests_then, retries_then) = {
            let samples = self.samples.lock();
            samples.front().map_or((0, 0), |&(_, r, t)| (r, t))
        };
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
    fn retries_stay_within_the_share_of_the_window_s_requests() {
        let budget = RetryBudget::default();
        let start = Instant::now();
        budget.sample(start);
        // 100 requests served, then 1,000 that each fail and ask for a retry, in 5 s.
        for _ in 0..100 {
            budget.count_request();
        }
        let mut made = 0;
        for i in 0..1_000u64 {
            if i % 200 == 0 {
                budget.sample(start + Duration::from_secs(i / 200));
            }
            budget.count_request();
            if budget.try_retry(0.2) {
                made += 1;
            }
        }
        assert!(made <= 220 + FLOOR, "{made}");
        assert!(made >= 200, "{made}: the served requests count too");
        // Few requests: the floor.
        let quiet = RetryBudget::default();
        quiet.sample(start);
        let allowed = (0..50).filter(|_| quiet.try_retry(0.2)).count() as u64;
        assert_eq!(allowed, FLOOR);
        // The window moves on: eleven seconds later there is room again.
        quiet.sample(start + Duration::from_secs(11));
        assert!(quiet.try_retry(0.2));
    }
}
