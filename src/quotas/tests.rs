//! The quotas' unit and property tests, on simulated clocks (every check takes `now`).

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use proptest::prelude::*;

use super::*;
use crate::config::{CallerSource, ToolQuota};

fn key(n: u8) -> CallerKey {
    CallerKey([n; 16])
}

fn per_second(count: u32, burst: u32) -> Rate {
    Rate {
        count,
        period: Duration::from_secs(1),
        burst,
    }
}

/// Admission never waits with the local store: a future that is not ready at once fails here.
fn admit(q: &Quotas, caller: CallerKey, request: &Request<'_>, now: Instant) -> Result<Admission, Refusal> {
    let admitted = q.admit(caller, request, now).now_or_never();
    admitted.expect("the local store never waits").map_err(|e| match e {
        NotAdmitted::Refused(refusal) => refusal,
        NotAdmitted::StoreUnavailable => panic!("the local store is never unavailable"),
    })
}

const NEW: Request<'static> = Request {
    tools: &[],
    new_calls: 1,
    may_open_call: false,
};

fn config() -> QuotasConfig {
    QuotasConfig {
        caller: CallerSource::Ip,
        trusted_proxies: Vec::new(),
        rate: None,
        max_in_flight: None,
        max_open_calls: None,
        max_body_bytes_per_connection: None,
        max_body_bytes_per_caller: None,
        max_tracked_callers: 1000,
        tools: Vec::new(),
        store: QuotaStore::Local,
        store_timeout: Duration::from_millis(50),
        store_failure: crate::config::StoreFailure::Open,
    }
}

#[test]
fn a_burst_then_one_per_interval_and_retry_after_is_exact() {
    let t0 = Instant::now();
    let limiter = RateLimiter::new(per_second(10, 3), 100, t0);
    for _ in 0..3 {
        limiter.check(&key(1), t0).unwrap();
    }
    let refused = limiter.check(&key(1), t0).unwrap_err();
    assert_eq!(refused.after, Duration::from_millis(100));
    assert_eq!(refused.reset, Duration::from_millis(300));
    assert!(!refused.overflow);
    // A nanosecond early is still too early; on time is admitted, and only once.
    assert!(limiter
        .check(&key(1), t0 + refused.after - Duration::from_nanos(1))
        .is_err());
    limiter.check(&key(1), t0 + refused.after).unwrap();
    assert!(limiter.check(&key(1), t0 + refused.after).is_err());
    // Another caller has its own burst.
    limiter.check(&key(2), t0).unwrap();
    // A `now` before the epoch counts as the epoch.
    let early = RateLimiter::new(per_second(1, 1), 10, t0 + Duration::from_secs(5));
    early.check(&key(1), t0).unwrap();
    assert!(early.check(&key(1), t0).is_err());
}

#[test]
fn the_emission_interval_rounds_up_never_faster_than_configured() {
    let limiter = RateLimiter::new(per_second(3, 1), 10, Instant::now());
    assert_eq!(limiter.emission(), Duration::from_nanos(333_333_334));
    let per_minute = Rate {
        count: 30,
        period: Duration::from_secs(60),
        burst: 5,
    };
    assert_eq!(
        RateLimiter::new(per_minute, 10, Instant::now()).emission(),
        Duration::from_secs(2)
    );
}

#[test]
fn pruning_forgets_only_callers_back_to_a_full_burst() {
    let t0 = Instant::now();
    let limiter = RateLimiter::new(per_second(1, 2), 100, t0);
    limiter.check(&key(1), t0).unwrap();
    limiter.check(&key(2), t0 + Duration::from_secs(3)).unwrap();
    assert_eq!(limiter.tracked(), 2);
    // Key 1's TAT is t0 + 1 s: at t0 + 1 s it is back to a full burst.
    assert_eq!(limiter.prune(t0 + Duration::from_millis(999)), 0);
    assert_eq!(limiter.prune(t0 + Duration::from_secs(1)), 1);
    assert_eq!((limiter.tat(&key(1)), limiter.tracked()), (None, 1));
    assert!(limiter.tat(&key(2)).is_some());
    // Forgetting lost nothing: a full burst, then a refusal, as for a caller never seen.
    let now = t0 + Duration::from_secs(1);
    limiter.check(&key(1), now).unwrap();
    limiter.check(&key(1), now).unwrap();
    assert!(limiter.check(&key(1), now).is_err());
}

#[test]
fn callers_past_the_cap_share_one_bucket_and_it_is_counted() {
    let t0 = Instant::now();
    let limiter = RateLimiter::new(per_second(1, 2), 2, t0);
    limiter.check(&key(1), t0).unwrap();
    limiter.check(&key(2), t0).unwrap();
    // Two new callers past the cap: together, one caller's burst.
    limiter.check(&key(3), t0).unwrap();
    limiter.check(&key(4), t0).unwrap();
    let refused = limiter.check(&key(5), t0).unwrap_err();
    assert!(refused.overflow);
    assert_eq!((limiter.tracked(), limiter.overflowed()), (2, 3));
    // The tracked callers are unaffected.
    limiter.check(&key(1), t0).unwrap();
    // Once pruned, a new caller is tracked again.
    limiter.prune(t0 + Duration::from_secs(10));
    limiter.check(&key(5), t0 + Duration::from_secs(10)).unwrap();
    assert_eq!(limiter.tracked(), 1);
}

#[test]
fn follow_ups_are_never_refused_by_the_rate_but_count_in_flight() {
    let t0 = Instant::now();
    let q = Quotas::new(
        &QuotasConfig {
            rate: Some(per_second(1, 1)),
            max_in_flight: Some(2),
            ..config()
        },
        t0,
        StoreMetrics::unregistered(),
    );
    let a = key(1);
    let first = admit(&q, a, &NEW, t0).unwrap();
    let refused = admit(&q, a, &NEW, t0).err().unwrap();
    assert_eq!((refused.quota, refused.scope), (Quota::Rate, Scope::Caller));
    assert_eq!(refused.quota.reason(), "rate_limited");
    assert_eq!(refused.retry_after_secs(), 1);
    let follow_up = Request { new_calls: 0, ..NEW };
    let second = admit(&q, a, &follow_up, t0).unwrap();
    // Two in flight: the next follow-up waits for one to end.
    let busy = admit(&q, a, &follow_up, t0).err().unwrap();
    assert_eq!(
        (busy.quota, busy.quota.reason()),
        (Quota::InFlight, "too_many_in_flight")
    );
    assert_eq!(busy.rate_limit_headers(), None);
    drop(first);
    let _third = admit(&q, a, &follow_up, t0).unwrap();
    drop(second);
    // The refused new call spent no in-flight count.
    assert_eq!(q.stats().tracked, 2, "the rate entry and the in-flight entry");
}

#[test]
fn open_calls_are_reserved_for_new_calls_that_may_pin() {
    let t0 = Instant::now();
    let q = Quotas::new(
        &QuotasConfig {
            max_open_calls: Some(1),
            ..config()
        },
        t0,
        StoreMetrics::unregistered(),
    );
    let may_pin = Request {
        may_open_call: true,
        ..NEW
    };
    let mut admitted = admit(&q, key(1), &may_pin, t0).unwrap();
    let call = admitted.take_open_call().expect("a slot reserved");
    drop(admitted);
    // The call is open (its pins hold the slot): the caller's next new call is refused...
    let refused = admit(&q, key(1), &may_pin, t0).err().unwrap();
    assert_eq!(
        (refused.quota.reason(), refused.scope),
        ("too_many_open_calls", Scope::Caller)
    );
    // ...but not its follow-ups, nor requests that cannot pin, nor other callers.
    let follow_up = Request {
        new_calls: 0,
        ..may_pin
    };
    assert!(admit(&q, key(1), &follow_up, t0).unwrap().take_open_call().is_none());
    assert!(admit(&q, key(1), &NEW, t0).is_ok());
    assert!(admit(&q, key(2), &may_pin, t0).is_ok());
    // An answer that pinned nothing gives the slot back with the admission.
    drop(call);
    drop(admit(&q, key(1), &may_pin, t0).unwrap());
    assert!(admit(&q, key(1), &may_pin, t0).is_ok());
}

#[test]
fn tool_quotas_rate_per_caller_and_in_flight_across_callers() {
    let t0 = Instant::now();
    let q = Quotas::new(
        &QuotasConfig {
            rate: Some(per_second(100, 100)),
            tools: vec![
                ToolQuota {
                    name: "search".into(),
                    rate: Some(per_second(1, 1)),
                    max_in_flight: None,
                },
                ToolQuota {
                    name: "slow".into(),
                    rate: None,
                    max_in_flight: Some(1),
                },
            ],
            ..config()
        },
        t0,
        StoreMetrics::unregistered(),
    );
    let search = Request {
        tools: &["search"],
        ..NEW
    };
    drop(admit(&q, key(1), &search, t0).unwrap());
    let refused = admit(&q, key(1), &search, t0).err().unwrap();
    assert_eq!((refused.quota, refused.scope), (Quota::Rate, Scope::Tool));
    let (policy, state) = refused.rate_limit_headers().unwrap();
    assert_eq!(
        (policy.as_str(), state.as_str()),
        ("\"tool\";q=1;w=1", "\"tool\";r=0;t=1")
    );
    // Per caller: another caller's search is admitted; other tools are not limited by it.
    assert!(admit(&q, key(2), &search, t0).is_ok());
    assert!(admit(
        &q,
        key(1),
        &Request {
            tools: &["other"],
            ..NEW
        },
        t0
    )
    .is_ok());
    let slow = Request {
        tools: &["slow"],
        ..NEW
    };
    let held = admit(&q, key(1), &slow, t0).unwrap();
    let refused = admit(&q, key(2), &slow, t0).err().unwrap();
    assert_eq!((refused.quota, refused.scope), (Quota::InFlight, Scope::Tool));
    drop(held);
    assert!(admit(&q, key(2), &slow, t0).is_ok());
}

#[test]
fn rate_limit_headers_follow_the_draft() {
    let retry = RetryAfter {
        after: Duration::from_millis(50),
        reset: Duration::from_millis(1950),
        overflow: false,
    };
    let (policy, state) = rate_limit_headers("caller", per_second(20, 40), &retry);
    assert_eq!(policy, "\"caller\";q=40;w=2");
    assert_eq!(state, "\"caller\";r=0;t=2");
    let per_minute = Rate {
        count: 30,
        period: Duration::from_secs(60),
        burst: 5,
    };
    let (policy, _) = rate_limit_headers("caller", per_minute, &retry);
    assert_eq!(policy, "\"caller\";q=5;w=10");
    // Both parse as HTTP header values.
    assert!(http::HeaderValue::from_str(&policy).is_ok() && http::HeaderValue::from_str(&state).is_ok());
}

#[test]
fn the_caller_comes_from_the_configured_source() {
    let q = Quotas::new(
        &QuotasConfig {
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
            ..config()
        },
        Instant::now(),
        StoreMetrics::unregistered(),
    );
    let mut h = HeaderMap::new();
    h.insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
    let peer: IpAddr = "10.0.0.1".parse().unwrap();
    assert_eq!(q.client_ip(&h, peer), "198.51.100.1".parse::<IpAddr>().unwrap());
    assert_eq!(
        q.caller(None, &h, peer),
        CallerKey::from_ip("198.51.100.1".parse().unwrap())
    );
}

/// Arrival gaps in nanoseconds, some simultaneous, some long.
fn gaps() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop_oneof![Just(0u64), 0u64..50_000_000, 0u64..2_000_000_000], 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Over every window between two admitted calls, at most `burst + rate × window` calls are
    /// admitted; and a caller that never calls faster than the rate is never refused.
    #[test]
    fn gcra_never_admits_more_than_rate_times_t_plus_burst(
        count in 1u32..200,
        per_minute in any::<bool>(),
        burst in 1u32..20,
        gaps in gaps(),
    ) {
        let period = if per_minute { Duration::from_secs(60) } else { Duration::from_secs(1) };
        let rate = Rate { count, period, burst };
        let t0 = Instant::now();
        let limiter = RateLimiter::new(rate, 10, t0);
        let mut now = 0u64;
        let mut admitted = Vec::new();
        for gap in gaps {
            now += gap;
            if limiter.check(&key(1), t0 + Duration::from_nanos(now)).is_ok() {
                admitted.push(now);
            }
        }
        let period = period.as_nanos();
        for i in 0..admitted.len() {
            for j in i..admitted.len() {
                let window = u128::from(admitted[j] - admitted[i]);
                let calls = (j - i + 1) as u128;
                // calls ≤ burst + window × count / period, without rounding.
                prop_assert!(
                    calls.saturating_sub(burst.into()) * period <= window * u128::from(count),
                    "{calls} calls in {window} ns at {count}/{period} ns, burst {burst}"
                );
            }
        }
    }

    #[test]
    fn gcra_admits_every_call_at_or_below_the_rate(
        count in 1u32..200,
        burst in 1u32..20,
        extra in prop::collection::vec(0u64..1_000_000, 1..100),
    ) {
        let rate = per_second(count, burst);
        let t0 = Instant::now();
        let limiter = RateLimiter::new(rate, 10, t0);
        let interval = limiter.emission().as_nanos() as u64;
        let mut now = 0;
        for e in extra {
            prop_assert!(limiter.check(&key(1), t0 + Duration::from_nanos(now)).is_ok());
            now += interval + e;
        }
    }

    /// Many callers at random: each keeps its own bound, the table never passes its cap, and
    /// the overflow bucket as a whole keeps one caller's bound.
    #[test]
    fn many_callers_stay_within_the_cap_and_their_own_bounds(
        arrivals in prop::collection::vec((0u8..12, 0u64..20_000_000), 1..400),
        cap in 1usize..8,
    ) {
        let rate = per_second(50, 3);
        let t0 = Instant::now();
        let limiter = RateLimiter::new(rate, cap, t0);
        let mut now = 0u64;
        let mut counts = std::collections::HashMap::<u8, u128>::new();
        let mut overflow = 0u128;
        for (caller, gap) in arrivals {
            now += gap;
            let at = t0 + Duration::from_nanos(now);
            let tracked_before = limiter.tat(&key(caller)).is_some();
            let room = limiter.tracked() < cap;
            match limiter.check(&key(caller), at) {
                Ok(()) if tracked_before || room => *counts.entry(caller).or_default() += 1,
                Ok(()) => overflow += 1,
                Err(e) => prop_assert_eq!(e.overflow, !(tracked_before || room)),
            }
            prop_assert!(limiter.tracked() <= cap);
            if now.is_multiple_of(7) {
                limiter.prune(at);
            }
        }
        // Over the whole run, pruned or not: a pruned entry was a full burst, as if kept.
        let bound = |calls: u128| calls.saturating_sub(3) * 1_000_000_000 <= u128::from(now) * 50;
        for (_, calls) in counts {
            prop_assert!(bound(calls));
        }
        prop_assert!(overflow.saturating_sub(3) * 1_000_000_000 <= u128::from(now) * 50);
    }
}
