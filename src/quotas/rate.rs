//! The rate of new calls per caller: GCRA (the generic cell rate algorithm), one theoretical
//! arrival time (TAT) per caller, on a clock the caller passes in (`now`), so tests simulate
//! time and a shared store could use its own.
//!
//! With an emission interval `T` (the period over the rate's N, rounded up to the nanosecond,
//! so never faster than configured) and a tolerance `τ = T × (burst − 1)`, a call at `now` is
//! admitted when `max(TAT, now) − now ≤ τ`, and moves TAT to `max(TAT, now) + T`. Over any
//! window of length `w` at most `burst + w / T` calls are admitted (`tests.rs` checks it for
//! random arrivals).
//!
//! Why not the `governor` crate: its keyed store has no bound (a cap and an overflow bucket
//! would be checked outside its lock), its clock is the limiter's rather than a parameter of
//! each check, and it brings several crates for what is one `u64` and ten lines here.
//!
//! Pruning loses nothing: an entry whose TAT is not after `now` behaves exactly as an absent
//! one (a full burst), so [`RateLimiter::prune`] removes exactly those.
//!
//! Memory: one tracked caller costs its map entry (16-byte key, 8-byte TAT, one control byte)
//! over the map's load: 32.8 bytes per caller measured at 100,000 callers
//! (`tests/it/quota_memory.rs` prints it), between 29 and 57 as the maps fill and grow, so the
//! default `max_tracked_callers` is 3 to 6 MB per rate table.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::caller::CallerKey;
use super::table::Table;
use crate::config::Rate;

/// A refused call: when to try again, and when the whole burst is back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter {
    /// Until one more call is admitted.
    pub after: Duration,
    /// Until a whole burst is admitted again (the `t` of the `RateLimit` header).
    pub reset: Duration,
    /// The caller was not tracked (the table was full): it shares the overflow bucket.
    pub overflow: bool,
}

/// One rate quota: a TAT per caller, bounded, with the overflow bucket.
pub struct RateLimiter {
    rate: Rate,
    emission: u64,
    tolerance: u64,
    epoch: Instant,
    table: Table<u64>,
    /// The TAT every caller past the cap shares: together they get one caller's rate, so a
    /// flood of new identities cannot buy more than that (fail closed).
    overflow: Mutex<u64>,
    /// Calls checked against the overflow bucket.
    overflowed: AtomicU64,
}

/// One GCRA step: the new TAT, or when to retry.
fn step(tat: u64, now: u64, emission: u64, tolerance: u64) -> Result<u64, RetryAfter> {
    let tat = tat.max(now);
    if tat - now > tolerance {
        return Err(RetryAfter {
            after: Duration::from_nanos(tat - tolerance - now),
            reset: Duration::from_nanos(tat - now),
            overflow: false,
        });
    }
    Ok(tat + emission)
}

impl RateLimiter {
    /// A limiter whose clock starts at `epoch` (a `now` before it counts as `epoch`).
    pub fn new(rate: Rate, max_tracked: usize, epoch: Instant) -> RateLimiter {
        let period = rate.period.as_nanos() as u64;
        let emission = period.div_ceil(u64::from(rate.count.max(1)));
        RateLimiter {
            rate,
            emission,
            tolerance: emission * u64::from(rate.burst.max(1) - 1),
            epoch,
            table: Table::new(max_tracked),
            overflow: Mutex::new(0),
            overflowed: AtomicU64::new(0),
        }
    }

    fn nanos(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Admits one call of `key` at `now`, or says when to retry.
    pub fn check(&self, key: &CallerKey, now: Instant) -> Result<(), RetryAfter> {
        let now = self.nanos(now);
        let (emission, tolerance) = (self.emission, self.tolerance);
        let tracked = self.table.update(
            key,
            || now,
            |tat| {
                *tat = step(*tat, now, emission, tolerance)?;
                Ok(())
            },
        );
        match tracked {
            Some(result) => result,
            None => {
                self.overflowed.fetch_add(1, Ordering::Relaxed);
                let mut tat = self.overflow.lock();
                *tat = step(*tat, now, emission, tolerance).map_err(|e| RetryAfter { overflow: true, ..e })?;
                Ok(())
            }
        }
    }

    /// Forgets every caller whose whole burst is back by `now`; returns how many.
    pub fn prune(&self, now: Instant) -> usize {
        let now = self.nanos(now);
        self.table.retain(|&tat| tat > now)
    }

    /// Callers tracked.
    pub fn tracked(&self) -> usize {
        self.table.len()
    }

    /// Calls checked against the overflow bucket since the start.
    pub fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// The rate this limiter enforces.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The emission interval `T`.
    pub fn emission(&self) -> Duration {
        Duration::from_nanos(self.emission)
    }

    /// A key's TAT, for tests.
    #[cfg(test)]
    pub(super) fn tat(&self, key: &CallerKey) -> Option<u64> {
        self.table.get(key)
    }
}
