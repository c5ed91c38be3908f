//! What one tracked caller costs: the bytes the quota tables allocate per caller, measured by
//! a counting allocator, printed, and held to a bound (the figure in `quotas::rate`'s comment
//! comes from here: `cargo test --test it quota_memory:: -- --nocapture`).

use std::time::{Duration, Instant};

use mrtr_router::config::Rate;
use mrtr_router::internals::{CallerKey, PerCaller, RateLimiter};

use crate::support::counting::live_bytes;

const CALLERS: usize = 100_000;

fn caller(i: usize) -> CallerKey {
    CallerKey::from_ip(std::net::IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]))
}

#[test]
fn bytes_per_tracked_caller() {
    if crate::support::ran_alone() {
        return;
    }
    let t0 = Instant::now();
    let rate = Rate {
        count: 10,
        period: Duration::from_secs(1),
        burst: 10,
    };
    let limiter = RateLimiter::new(rate, CALLERS, t0);
    let before = live_bytes();
    for i in 0..CALLERS {
        limiter.check(&caller(i), t0).unwrap();
    }
    assert_eq!(limiter.tracked(), CALLERS);
    let rate_bytes = (live_bytes() - before) as f64 / CALLERS as f64;

    let in_flight = PerCaller::new(4, CALLERS);
    let before = live_bytes();
    let mut permits = Vec::with_capacity(CALLERS);
    let permits_bytes = live_bytes() - before;
    for i in 0..CALLERS {
        permits.push(in_flight.try_acquire(caller(i)).unwrap());
    }
    let in_flight_bytes = (live_bytes() - before - permits_bytes) as f64 / CALLERS as f64;
    println!(
        "per tracked caller at {CALLERS} callers: rate {rate_bytes:.1} bytes, in flight {in_flight_bytes:.1} bytes \
         (the permits themselves: {} bytes each, held by the requests)",
        std::mem::size_of_val(&permits[0])
    );
    assert!(rate_bytes <= 64.0, "{rate_bytes}");
    assert!(in_flight_bytes <= 48.0, "{in_flight_bytes}");
    // Pruned, the memory comes back.
    let before = live_bytes();
    assert_eq!(limiter.prune(t0 + Duration::from_secs(2)), CALLERS);
    let freed = before - live_bytes();
    assert!(freed as f64 >= 0.9 * rate_bytes * CALLERS as f64, "freed {freed}");
    drop(permits);
    assert_eq!(in_flight.tracked(), 0);
}
