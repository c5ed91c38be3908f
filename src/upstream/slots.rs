//! The cap on HTTP/1.1 connections open to one backend (`[upstream]
//! max_connections_per_backend`): each open connection, idle or busy, holds a [`Slot`]; a
//! request that finds no idle connection and no free slot waits (`[upstream] queue_timeout`)
//! for either, so no client — an HTTP/2 one with a thousand streams included — can make the
//! router open more connections to a backend than the cap.
//!
//! The request path pays for this only when it opens a connection (one compare-and-swap) and
//! when it puts one back (one load, a wake-up only when somebody waits).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::defaults;

/// The open connections of one backend and those waiting for one.
pub struct ConnSlots {
    /// Connections open (idle in the pool or carrying a request).
    open: AtomicUsize,
    /// `max_connections_per_backend`; a reload may change it (lowering it closes nothing:
    /// connections beyond it end as they would, and no new one opens until below).
    limit: AtomicUsize,
    /// Requests waiting for a connection.
    waiting: AtomicUsize,
    /// Woken when a slot is freed or a connection goes back to the pool.
    freed: Notify,
    /// `mrtr_upstream_connections{backend}` and `mrtr_upstream_queued{backend}`.
    gauges: Option<SlotGauges>,
}

/// The per-backend gauges of [`ConnSlots`].
pub struct SlotGauges {
    pub open: prometheus::IntGauge,
    pub queued: prometheus::IntGauge,
}

/// One open connection's share of the cap, given back when the connection is dropped.
pub struct Slot(Arc<ConnSlots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        if let Some(g) = &self.0.gauges {
            g.open.dec();
        }
        self.0.wake_one();
    }
}

/// What a request waiting for a connection of a full backend may get.
pub enum Wait {
    /// A slot: open a connection with it.
    Slot(Slot),
    /// A slot was freed or a connection went back to the pool: look in the pool again.
    Retry,
    /// `queue_timeout` passed.
    Busy,
}

impl ConnSlots {
    pub fn new(gauges: Option<SlotGauges>) -> Arc<ConnSlots> {
        Arc::new(ConnSlots {
            open: AtomicUsize::new(0),
            limit: AtomicUsize::new(defaults::MAX_CONNECTIONS_PER_BACKEND),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
            gauges,
        })
    }

    pub fn set_limit(&self, limit: usize) {
        let before = self.limit.swap(limit.max(1), Ordering::AcqRel);
        if limit > before {
            self.freed.notify_waiters();
        }
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// More connections open than the cap allows.
    pub fn over_limit(&self) -> bool {
        self.open.load(Ordering::Acquire) > self.limit.load(Ordering::Acquire)
    }

    /// A slot if the backend is below its cap.
    pub fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let limit = self.limit.load(Ordering::Acquire);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()?;
        if let Some(g) = &self.gauges {
            g.open.inc();
        }
        Some(Slot(self.clone()))
    }

    /// A slot even past the limit: for a health check, which must not wait behind requests.
    pub fn take_beyond_limit(self: &Arc<Self>) -> Slot {
        self.open.fetch_add(1, Ordering::AcqRel);
        if let Some(g) = &self.gauges {
            g.open.inc();
        }
        Slot(self.clone())
    }

    /// Waits until `patience` for a slot, or for a connection put back into the pool (then
    /// [`Wait::Retry`]: the caller looks there first). `recheck` is the caller's look into the
    /// pool, made once this waiter is registered so that no wake-up falls between the two.
    pub async fn wait(self: &Arc<Self>, deadline: Instant, recheck: impl Fn() -> bool) -> Wait {
        let _queued = Queued::enter(self);
        let freed = self.freed.notified();
        let mut freed = std::pin::pin!(freed);
        freed.as_mut().enable();
        if let Some(slot) = self.try_take() {
            return Wait::Slot(slot);
        }
        if recheck() {
            return Wait::Retry;
        }
        match tokio::time::timeout_at(deadline, freed).await {
            Ok(()) => match self.try_take() {
                Some(slot) => Wait::Slot(slot),
                None => Wait::Retry,
            },
            Err(_) => Wait::Busy,
        }
    }

    /// A connection went back to the pool: a waiter may take it.
    pub fn connection_released(&self) {
        self.wake_one();
    }

    fn wake_one(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.freed.notify_one();
        }
    }
}

/// Counts a waiter for as long as it waits.
struct Queued<'a>(&'a ConnSlots);

impl<'a> Queued<'a> {
    fn enter(slots: &'a ConnSlots) -> Queued<'a> {
        slots.waiting.fetch_add(1, Ordering::AcqRel);
        if let Some(g) = &slots.gauges {
            g.queued.inc();
        }
        Queued(slots)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
        if let Some(g) = &self.0.gauges {
            g.queued.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn slots_stop_at_the_limit_and_come_back_on_drop() {
        let slots = ConnSlots::new(None);
        slots.set_limit(2);
        let a = slots.try_take().unwrap();
        let _b = slots.try_take().unwrap();
        assert!(slots.try_take().is_none());
        drop(a);
        let _c = slots.try_take().expect("the freed slot");
        assert_eq!(slots.open(), 2);
        assert!(!slots.over_limit());
        let _check = slots.take_beyond_limit();
        assert!(slots.over_limit());
    }

    #[tokio::test]
    async fn a_waiter_gets_the_freed_slot_or_times_out() {
        let slots = ConnSlots::new(None);
        slots.set_limit(1);
        let held = slots.try_take().unwrap();
        assert!(matches!(
            slots.wait(Instant::now() + Duration::from_millis(20), || false).await,
            Wait::Busy
        ));
        let waiter = tokio::spawn({
            let slots = slots.clone();
            async move {
                matches!(
                    slots.wait(Instant::now() + Duration::from_secs(10), || false).await,
                    Wait::Slot(_)
                )
            }
        });
        // The waiter registers before the slot is freed, or finds it free: either way it wins.
        while slots.waiting.load(Ordering::Acquire) == 0 && !waiter.is_finished() {
            tokio::task::yield_now().await;
        }
        drop(held);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_connection_put_back_wakes_a_waiter_to_look_in_the_pool() {
        let slots = ConnSlots::new(None);
        slots.set_limit(1);
        let _held = slots.try_take().unwrap();
        let waiter = tokio::spawn({
            let slots = slots.clone();
            async move {
                matches!(
                    slots.wait(Instant::now() + Duration::from_secs(10), || false).await,
                    Wait::Retry
                )
            }
        });
        while slots.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        slots.connection_released();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn the_recheck_runs_once_the_waiter_is_registered() {
        let slots = ConnSlots::new(None);
        slots.set_limit(1);
        let _held = slots.try_take().unwrap();
        let w = slots.wait(Instant::now() + Duration::from_secs(10), || true).await;
        assert!(matches!(w, Wait::Retry));
    }
}
