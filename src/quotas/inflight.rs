//! Concurrency quotas: requests in flight per caller (a count per caller, its entry removed
//! when the count goes back to 0, so only callers with something in flight take memory), and
//! per tool across all callers (one count). A [`Permit`] is released when dropped: the request
//! path holds it until the answer's body ends, so an SSE stream counts for its whole life.
//! A caller with something in flight costs 27.5 bytes of table at 100,000 such callers
//! (`tests/it/quota_memory.rs`), beside the 32-byte permit each request holds.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::caller::CallerKey;
use super::table::Table;

/// Past the quota: how the caller was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The caller was not tracked (the table was full): it shares the overflow count.
    pub overflow: bool,
}

/// A count per caller, each at most `max`, bounded in callers tracked.
pub struct PerCaller {
    max: u32,
    table: Table<u32>,
    /// What every caller past the cap shares (fail closed: together they get one caller's
    /// share).
    overflow: AtomicU32,
}

/// One request counted, until dropped.
#[must_use = "the request is counted only while the permit is held"]
pub struct Permit {
    owner: Arc<PerCaller>,
    /// `None`: counted in the overflow.
    key: Option<CallerKey>,
}

/// Adds one to `count` if it is below `max`.
fn try_add(count: &AtomicU32, max: u32) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
        .is_ok()
}

impl PerCaller {
    pub fn new(max: u32, max_tracked: usize) -> Arc<PerCaller> {
        Arc::new(PerCaller {
            max,
            table: Table::new(max_tracked),
            overflow: AtomicU32::new(0),
        })
    }

    /// Counts one more for `key`, or refuses when it has `max` already.
    pub fn try_acquire(self: &Arc<Self>, key: CallerKey) -> Result<Permit, Refused> {
        let max = self.max;
        let added = self.table.update(
            &key,
            || 0,
            |n| {
                let room = *n < max;
                *n += u32::from(room);
                room
            },
        );
        match added {
            Some(true) => Ok(Permit {
                owner: self.clone(),
                key: Some(key),
            }),
            Some(false) => Err(Refused { overflow: false }),
            None if try_add(&self.overflow, max) => Ok(Permit {
                owner: self.clone(),
                key: None,
            }),
            None => Err(Refused { overflow: true }),
        }
    }

    /// What `key` holds now (0 when untracked).
    pub fn count(&self, key: &CallerKey) -> u32 {
        let mut n = 0;
        self.table.update_existing(key, |v| {
            n = *v;
            false
        });
        n
    }

    /// Callers with something counted.
    pub fn tracked(&self) -> usize {
        self.table.len()
    }

    /// What the callers past the cap hold together.
    pub fn overflow_count(&self) -> u32 {
        self.overflow.load(Ordering::Acquire)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        match &self.key {
            Some(key) => self.owner.table.update_existing(key, |n| {
                *n -= 1;
                *n == 0
            }),
            None => {
                self.owner.overflow.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// One count shared by every caller (a tool's calls in flight).
pub struct Shared {
    max: u32,
    count: AtomicU32,
}

/// One call counted in a [`Shared`] count, until dropped.
#[must_use = "the call is counted only while the permit is held"]
pub struct SharedPermit(Arc<Shared>);

impl Shared {
    pub fn new(max: u32) -> Arc<Shared> {
        Arc::new(Shared {
            max,
            count: AtomicU32::new(0),
        })
    }

    pub fn try_acquire(self: &Arc<Self>) -> Option<SharedPermit> {
        try_add(&self.count, self.max).then(|| SharedPermit(self.clone()))
    }

    #[cfg(test)]
    pub fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }
}

impl Drop for SharedPermit {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CallerKey {
        CallerKey([n; 16])
    }

    #[test]
    fn each_caller_holds_at_most_its_share_and_forgets_at_zero() {
        let q = PerCaller::new(2, 100);
        let a1 = q.try_acquire(key(1)).unwrap();
        let a2 = q.try_acquire(key(1)).unwrap();
        assert_eq!(q.try_acquire(key(1)).err(), Some(Refused { overflow: false }));
        // Another caller is not affected.
        let b = q.try_acquire(key(2)).unwrap();
        assert_eq!((q.count(&key(1)), q.count(&key(2)), q.tracked()), (2, 1, 2));
        drop(a1);
        let a3 = q.try_acquire(key(1)).unwrap();
        drop((a2, a3, b));
        assert_eq!((q.count(&key(1)), q.tracked()), (0, 0), "entries removed at zero");
    }

    #[test]
    fn callers_past_the_cap_share_one_overflow_count() {
        let q = PerCaller::new(2, 2);
        let _a = q.try_acquire(key(1)).unwrap();
        let _b = q.try_acquire(key(2)).unwrap();
        let c = q.try_acquire(key(3)).unwrap();
        let _d = q.try_acquire(key(4)).unwrap();
        assert_eq!(q.try_acquire(key(5)).err(), Some(Refused { overflow: true }));
        assert_eq!((q.tracked(), q.overflow_count()), (2, 2));
        drop(c);
        assert_eq!(q.overflow_count(), 1);
        assert!(q.try_acquire(key(5)).is_ok());
    }

    #[test]
    fn a_shared_count_across_callers() {
        let tool = Shared::new(1);
        let p = tool.try_acquire().unwrap();
        assert!(tool.try_acquire().is_none());
        drop(p);
        assert_eq!(tool.count(), 0);
        assert!(tool.try_acquire().is_some());
    }

    #[test]
    fn concurrent_acquires_never_pass_the_share() {
        let q = PerCaller::new(3, 10);
        let held = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if let Ok(p) = q.try_acquire(key(9)) {
                            assert!(q.count(&key(9)) <= 3);
                            let mut held = held.lock().unwrap();
                            held.push(p);
                            if held.len() > 2 {
                                held.clear();
                            }
                        }
                    }
                });
            }
        });
        held.lock().unwrap().clear();
        assert_eq!((q.count(&key(9)), q.tracked()), (0, 0));
    }
}
