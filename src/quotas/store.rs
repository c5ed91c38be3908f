//! The shared rate store (`[quotas] store = "redis://…"`): the rate quotas' GCRA state in Redis,
//! so every replica that names the same Redis counts against one limit per caller.
//!
//! **One round trip per new call.** Every rate that applies to a call (its tool's, then its
//! caller's) is checked by one Lua script, atomic on the Redis side, on Redis's clock (`TIME`):
//! the replicas' clocks never meet, so their skew cannot widen the limit. A TAT is kept in
//! microseconds under `mrtr:rate:caller:HEX` or `mrtr:rate:tool:NAME:HEX` and expires when its
//! whole burst is back, exactly when it would behave as absent (so Redis holds only callers
//! that are spending their burst). The step is the local one (`rate.rs`), the emission interval
//! rounded up to the microsecond.
//!
//! **Failure.** A round trip that fails or takes longer than `store_timeout` decides the call
//! by `store_failure`: `open` admits it, `closed` answers 503 `quota_store_unavailable`. After a
//! failure the store is left alone for [`RETRY_INTERVAL`] (checks are decided by the failure
//! mode without a round trip), so an outage costs one timeout per interval rather than one per
//! request; the connection manager reconnects meanwhile. A round trip given up on may still run
//! on Redis (a unit spent for a call decided otherwise): the limit errs towards fewer calls.
//!
//! Only the rates are shared. In flight and open calls stay per replica: a request in flight
//! and a pinned call live on the replica that serves them, their counts change at every request
//! end (a shared count would need a round trip there too, and a replica that dies would leave
//! its counts held in Redis forever), while a rate's state is a clock that expires by itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntCounter};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::rate::{RateLimiter, RetryAfter};
use crate::config::StoreFailure;

/// After a failed round trip, checks skip the store this long.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// GCRA over `KEYS` in order, on one reading of Redis's clock; `ARGV` holds each key's emission
/// interval and tolerance (µs). `{0, 0, 0}` when every key admits; else `{i, after, reset}` for
/// the first key that refuses (the keys before it keep their unit, as in the local store).
/// `%d`: Lua 5.1 prints a number past 10^14 in exponent form, which would round the TAT.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i, key in ipairs(KEYS) do
  local emission = tonumber(ARGV[2 * i - 1])
  local tolerance = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  if tat - now > tolerance then
    return {i, tat - tolerance - now, tat - now}
  end
  local next = tat + emission
  redis.call('SET', key, string.format('%d', next), 'PX', math.ceil((next - now) / 1000))
end
return {0, 0, 0}
";

/// One rate to check: its key in Redis, emission interval and tolerance in µs.
pub struct SharedRate {
    pub key: String,
    pub emission_us: u64,
    pub tolerance_us: u64,
}

impl SharedRate {
    /// `limiter`'s rate under `key`: `T` rounded up to the microsecond (never faster than
    /// configured, as the local table's nanoseconds are), `τ = T × (burst − 1)`.
    pub fn of(limiter: &RateLimiter, key: String) -> SharedRate {
        let emission_us = (limiter.emission().as_nanos() as u64).div_ceil(1_000).max(1);
        SharedRate {
            key,
            emission_us,
            tolerance_us: emission_us * u64::from(limiter.rate().burst.max(1) - 1),
        }
    }
}

/// What the store said of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    /// The rate at this index (of those passed) refused.
    Refused(usize, RetryAfter),
    /// The store did not answer, and `store_failure = "closed"`.
    Unavailable,
}

/// A check the store did not decide: the `kind` of `mrtr_quota_store_errors_total`.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// No answer within `store_timeout`.
    Timeout = 0,
    /// Redis unreachable, or an error from it.
    Error = 1,
    /// Not asked: within [`RETRY_INTERVAL`] of a failure.
    Down = 2,
}

/// The store's metrics: `mrtr_quota_store_seconds` and `mrtr_quota_store_errors_total` by kind.
#[derive(Clone)]
pub struct StoreMetrics {
    pub seconds: Histogram,
    /// By [`Failure`]: `timeout`, `error`, `down`.
    pub errors: [IntCounter; 3],
}

impl StoreMetrics {
    /// The `kind` labels of `mrtr_quota_store_errors_total`, in `errors`' order.
    pub const KINDS: [&'static str; 3] = ["timeout", "error", "down"];

    /// Metrics no registry shows (for quotas built without one, in unit tests).
    #[cfg(test)]
    pub fn unregistered() -> StoreMetrics {
        let opts = prometheus::HistogramOpts::new("mrtr_quota_store_seconds", "unregistered");
        StoreMetrics {
            seconds: Histogram::with_opts(opts).expect("valid metric"),
            errors: Self::KINDS.map(|k| IntCounter::new(format!("unregistered_{k}"), k).expect("valid metric")),
        }
    }
}

/// The Redis store of one `[quotas]`.
pub struct RedisStore {
    client: redis::Client,
    /// Made on first use, on the runtime (the connection manager spawns its tasks there);
    /// it connects in the background and reconnects by itself after an I/O error.
    manager: OnceLock<Option<ConnectionManager>>,
    script: redis::Script,
    timeout: Duration,
    failure: StoreFailure,
    epoch: Instant,
    /// Nanoseconds after `epoch` until which checks skip the store.
    down_until: AtomicU64,
    metrics: StoreMetrics,
}

impl RedisStore {
    /// The store at `url` (checked by the config reader already).
    pub fn new(url: &str, timeout: Duration, failure: StoreFailure, metrics: StoreMetrics) -> RedisStore {
        RedisStore {
            client: redis::Client::open(url).expect("quotas.store checked by the config reader"),
            manager: OnceLock::new(),
            script: redis::Script::new(GCRA),
            timeout,
            failure,
            epoch: Instant::now(),
            down_until: AtomicU64::new(0),
            metrics,
        }
    }

    fn manager(&self) -> Option<ConnectionManager> {
        let made = self.manager.get_or_init(|| {
            // The client's own bounds follow the store's, so that a connection stuck on a
            // frozen Redis is given up by the library too, not only by the check that waited on
            // it; twice as long, so that the check's own timeout is the one that decides.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(100))))
                .set_response_timeout(Some(2 * self.timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(RETRY_INTERVAL);
            match ConnectionManager::new_lazy_with_config(self.client.clone(), config) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::error!(error = %e, "quotas.store: cannot make the Redis connection manager");
                    None
                }
            }
        });
        made.clone()
    }

    fn nanos(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Checks `rates` (none empty) for one new call at `now`.
    pub async fn check(&self, rates: &[SharedRate], now: Instant) -> Verdict {
        if self.nanos(now) < self.down_until.load(Ordering::Relaxed) {
            return self.failed(Failure::Down);
        }
        let Some(mut conn) = self.manager() else {
            return self.failed(Failure::Error);
        };
        let mut invocation = self.script.prepare_invoke();
        for rate in rates {
            invocation.key(&rate.key).arg(rate.emission_us).arg(rate.tolerance_us);
        }
        let started = Instant::now();
        let answer = tokio::time::timeout(self.timeout, invocation.invoke_async::<(u64, u64, u64)>(&mut conn)).await;
        self.metrics.seconds.observe(started.elapsed().as_secs_f64());
        let failure = match answer {
            Ok(Ok((0, _, _))) => return Verdict::Admitted,
            Ok(Ok((i, after, reset))) if (1..=rates.len() as u64).contains(&i) => {
                let retry = RetryAfter {
                    after: Duration::from_micros(after),
                    reset: Duration::from_micros(reset),
                    overflow: false,
                };
                return Verdict::Refused(i as usize - 1, retry);
            }
            Ok(Ok(other)) => {
                tracing::warn!(?other, "quotas.store: the rate script answered outside its range");
                Failure::Error
            }
            Ok(Err(e)) if e.is_timeout() => Failure::Timeout,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "quotas.store: Redis failed a rate check");
                Failure::Error
            }
            Err(_) => Failure::Timeout,
        };
        let until = self.nanos(Instant::now()) + RETRY_INTERVAL.as_nanos() as u64;
        self.down_until.fetch_max(until, Ordering::Relaxed);
        self.failed(failure)
    }

    fn failed(&self, failure: Failure) -> Verdict {
        self.metrics.errors[failure as usize].inc();
        match self.failure {
            StoreFailure::Open => Verdict::Admitted,
            StoreFailure::Closed => Verdict::Unavailable,
        }
    }
}
