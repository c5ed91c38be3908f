//! What one tracked caller costs: the bytes the quota tables allocate per caller, measured by
//! a counting allocator, printed, and held to a bound (the figure in `quotas::rate`'s comment
//! comes from here: `cargo test --test quota_memory -- --nocapture`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use mrtr_router::config::Rate;
use mrtr_router::internals::{CallerKey, PerCaller, RateLimiter};

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CALLERS: usize = 100_000;

fn caller(i: usize) -> CallerKey {
    CallerKey::from_ip(std::net::IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]))
}

#[test]
fn bytes_per_tracked_caller() {
    let t0 = Instant::now();
    let rate = Rate {
        count: 10,
        period: Duration::from_secs(1),
        burst: 10,
    };
    let limiter = RateLimiter::new(rate, CALLERS, t0);
    let before = HELD.load(Ordering::Relaxed);
    for i in 0..CALLERS {
        limiter.check(&caller(i), t0).unwrap();
    }
    assert_eq!(limiter.tracked(), CALLERS);
    let rate_bytes = (HELD.load(Ordering::Relaxed) - before) as f64 / CALLERS as f64;

    let in_flight = PerCaller::new(4, CALLERS);
    let before = HELD.load(Ordering::Relaxed);
    let mut permits = Vec::with_capacity(CALLERS);
    let permits_bytes = HELD.load(Ordering::Relaxed) - before;
    for i in 0..CALLERS {
        permits.push(in_flight.try_acquire(caller(i)).unwrap());
    }
    let in_flight_bytes = (HELD.load(Ordering::Relaxed) - before - permits_bytes) as f64 / CALLERS as f64;
    println!(
        "per tracked caller at {CALLERS} callers: rate {rate_bytes:.1} bytes, in flight {in_flight_bytes:.1} bytes \
         (the permits themselves: {} bytes each, held by the requests)",
        std::mem::size_of_val(&permits[0])
    );
    assert!(rate_bytes <= 64.0, "{rate_bytes}");
    assert!(in_flight_bytes <= 48.0, "{in_flight_bytes}");
    // Pruned, the memory comes back.
    let before = HELD.load(Ordering::Relaxed);
    assert_eq!(limiter.prune(t0 + Duration::from_secs(2)), CALLERS);
    let freed = before - HELD.load(Ordering::Relaxed);
    assert!(freed as f64 >= 0.9 * rate_bytes * CALLERS as f64, "freed {freed}");
    drop(permits);
    assert_eq!(in_flight.tracked(), 0);
}
