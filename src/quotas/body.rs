//! Buffered request-body bytes per caller (`max_body_bytes_per_caller`): what one caller's
//! bodies being read hold of the router's body budget, all its connections together, so that
//! a caller who opens many connections still gets one share. A body takes bytes frame by frame
//! as it is read ([`BodyShare::try_take`]) and gives them all back when it is dropped (the
//! request ends); a caller's entry is removed when it holds nothing, so only callers with a
//! body in flight take memory. Callers past `max_tracked_callers` share one overflow count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::caller::CallerKey;
use super::inflight::Refused;
use super::table::Table;

/// The bytes each caller's bodies hold, each at most `max`.
pub struct BodyShares {
    max: u64,
    table: Table<u64>,
    /// What every caller past the cap holds together (fail closed: one caller's share).
    overflow: AtomicU64,
}

/// One body's bytes, counted against its caller until dropped.
pub struct BodyShare {
    owner: Arc<BodyShares>,
    key: CallerKey,
    /// Where its bytes are counted, decided at the first byte taken.
    counted: Counted,
    held: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    /// Nothing taken yet.
    Nowhere,
    /// In the caller's entry.
    Caller,
    /// In the overflow count (the table was full).
    Overflow,
}

impl BodyShares {
    pub fn new(max: u64, max_tracked: usize) -> Arc<BodyShares> {
        Arc::new(BodyShares {
            max,
            table: Table::new(max_tracked),
            overflow: AtomicU64::new(0),
        })
    }

    /// The share of one body of `key`'s, holding nothing yet.
    pub fn share(self: &Arc<Self>, key: CallerKey) -> BodyShare {
        BodyShare {
            owner: self.clone(),
            key,
            counted: Counted::Nowhere,
            held: 0,
        }
    }

    /// Callers with a body being read.
    pub fn tracked(&self) -> usize {
        self.table.len()
    }
}

impl BodyShare {
    /// What `max_body_bytes_per_caller` is.
    pub fn limit(&self) -> u64 {
        self.owner.max
    }

    /// Takes `n` more bytes of the caller's share, or refuses when that would pass it.
    pub fn try_take(&mut self, n: u64) -> Result<(), Refused> {
        let owner = &*self.owner;
        let max = owner.max;
        if self.counted != Counted::Overflow {
            let taken = owner.table.update(
                &self.key,
                || 0,
                |held| {
                    let room = *held + n <= max;
                    if room {
                        *held += n;
                    }
                    room
                },
            );
            match taken {
                Some(true) => {
                    self.counted = Counted::Caller;
                    self.held += n;
                    return Ok(());
                }
                Some(false) => {
                    // Inserted at 0 by this refusal when it held nothing: not kept.
                    if self.counted == Counted::Nowhere {
                        owner.table.update_existing(&self.key, |held| *held == 0);
                    }
                    return Err(Refused { overflow: false });
                }
                // The table is full and this caller is not in it: the overflow share, unless
                // this body holds tracked bytes already (its entry cannot be gone then).
                None if self.counted == Counted::Caller => return Err(Refused { overflow: false }),
                None => self.counted = Counted::Overflow,
            }
        }
        let taken = owner
            .overflow
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + n <= max).then_some(held + n)
            });
        match taken {
            Ok(_) => {
                self.held += n;
                Ok(())
            }
            Err(_) => Err(Refused { overflow: true }),
        }
    }
}

impl Drop for BodyShare {
    fn drop(&mut self) {
        let held = self.held;
        match self.counted {
            Counted::Nowhere => {}
            Counted::Caller => self.owner.table.update_existing(&self.key, |h| {
                *h -= held;
                *h == 0
            }),
            Counted::Overflow => {
                self.owner.overflow.fetch_sub(held, Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CallerKey {
        CallerKey([n; 16])
    }

    #[test]
    fn a_caller_holds_at_most_its_share_across_bodies_and_gets_it_back() {
        let shares = BodyShares::new(100, 10);
        let (mut one, mut two) = (shares.share(key(1)), shares.share(key(1)));
        one.try_take(60).unwrap();
        two.try_take(40).unwrap();
        assert_eq!(two.try_take(1), Err(Refused { overflow: false }));
        // Another caller has its own share.
        let mut other = shares.share(key(2));
        other.try_take(100).unwrap();
        assert_eq!(shares.tracked(), 2);
        drop(one);
        two.try_take(60).unwrap();
        drop((two, other));
        assert_eq!(shares.tracked(), 0, "nothing held, nothing kept");
        // A refused first take keeps no entry.
        let mut big = shares.share(key(3));
        assert!(big.try_take(101).is_err());
        assert_eq!(shares.tracked(), 0);
    }

    #[test]
    fn callers_past_the_cap_share_one_overflow_share() {
        let shares = BodyShares::new(100, 1);
        let mut tracked = shares.share(key(1));
        tracked.try_take(100).unwrap();
        let (mut a, mut b) = (shares.share(key(2)), shares.share(key(3)));
        a.try_take(70).unwrap();
        assert_eq!(b.try_take(31), Err(Refused { overflow: true }));
        b.try_take(30).unwrap();
        drop((a, b));
        assert_eq!(shares.overflow.load(Ordering::Acquire), 0);
        assert_eq!(shares.tracked(), 1);
    }
}
